"""Starting and checking Ray: local by default, bound to 127.0.0.1, resources checked up front.

Ray 2.60 hangs quietly when tasks ask for more CPUs/GPUs than the cluster has,
and Ray Data deadlocks when actors take every CPU (STACK.md §5, §8). Every Ray
step here sums its requests with `check_resources` before starting.
"""

from __future__ import annotations

import logging
import os

from .config import RayConfig
from .errors import ResourceError


def init_ray(cfg: RayConfig | None = None, runtime_env: dict | None = None) -> None:
    """Connect to `cfg.address` (or $RAY_ADDRESS), else start a local Ray on 127.0.0.1.

    The local Ray's dashboard is off unless `cfg.dashboard`, and then it binds
    127.0.0.1 only: nothing the pipeline starts is reachable from other hosts.
    """
    import ray

    if ray.is_initialized():
        return
    cfg = cfg or RayConfig()
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, runtime_env=runtime_env, logging_level=logging.WARNING)
        return
    kwargs: dict = {}
    if cfg.object_store_memory_mb:
        kwargs["object_store_memory"] = cfg.object_store_memory_mb * 1024 * 1024
    if cfg.temp_dir:
        kwargs["_temp_dir"] = os.path.abspath(cfg.temp_dir)
    ray.init(
        num_cpus=cfg.num_cpus,
        num_gpus=cfg.num_gpus,
        include_dashboard=cfg.dashboard,
        dashboard_host="127.0.0.1",
        _node_ip_address="127.0.0.1",
        runtime_env=runtime_env,
        logging_level=logging.WARNING,
        log_to_driver=True,
        **kwargs,
    )


def cluster_resources() -> dict[str, float]:
    import ray

    res = ray.cluster_resources()
    return {"CPU": float(res.get("CPU", 0)), "GPU": float(res.get("GPU", 0))}


def check_resources(what: str, cpus: float, gpus: float = 0.0, keep_free_cpus: float = 0.0) -> None:
    """Fail fast when `cpus`/`gpus` (plus CPUs kept free for Ray Data's read tasks) exceed the cluster."""
    res = cluster_resources()
    problems = []
    if cpus + keep_free_cpus > res["CPU"] + 1e-9:
        extra = f" + {keep_free_cpus:g} kept free for read tasks" if keep_free_cpus else ""
        problems.append(f"{cpus:g} CPUs{extra} asked, the cluster has {res['CPU']:g}")
    if gpus > res["GPU"] + 1e-9:
        problems.append(f"{gpus:g} GPUs asked, the cluster has {res['GPU']:g}")
    if problems:
        raise ResourceError(
            f"{what}: {'; '.join(problems)}. Lower the actor/worker count or the per-actor "
            "resources (fractional CPUs are fine, e.g. encode.cpus_per_actor=0.5); Ray would otherwise wait forever."
        )
