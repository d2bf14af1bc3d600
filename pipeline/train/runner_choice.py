"""Where a training run's loop runs, decided and checked first thing, before anything is written,
uploaded or reached over the network:

    resolve_runner   `train.runner`: ray or local (auto: local for one worker when nothing asks for Ray);
                     `local` with something that needs Ray is refused with the key that needs it
    check_runner     the same refusal for a caller that chose the runner (a Tune trial: tune/drivers.py)
    check_device     what the run asks of the device: GPUs on a machine without one, fp16 (training or
                     validation) on CPU workers, bf16 on a CPU without it; returns the precision the
                     workers will train in where this machine decides it (part of the run's identity)
"""

from __future__ import annotations

import os
import sys

from ..errors import ConfigError, PipelineError
from ..storage import is_uri


def _ray_running() -> bool:
    ray_mod = sys.modules.get("ray")
    return ray_mod is not None and ray_mod.is_initialized()


def needs_ray(job, connect: bool = True) -> list[str]:
    """What in `job` only Ray Train can run (with `connect`, also a cluster to connect to)."""
    tc = job.train
    return [why for why, bad in (
        (f"train.num_workers={tc.num_workers} (local runs one worker)", tc.num_workers != 1),
        ("a storage URI as train.storage_path", is_uri(tc.storage_path)),
        ("data.streaming=ray-data", job.data.streaming == "ray-data"),
        ("ray.address / RAY_ADDRESS (a cluster)", connect and bool(job.ray.address or os.environ.get("RAY_ADDRESS"))))
        if bad]


def check_runner(job, runner: str) -> str:
    """A caller's own choice of runner (a Tune trial that trains in its own process, already inside Ray, so
    a cluster's address asks for nothing): `local` with what only Ray Train runs is refused, naming it."""
    if runner not in ("local", "ray"):
        raise ValueError(f"runner {runner!r}: local or ray")
    needs = needs_ray(job, connect=False) if runner == "local" else []
    if needs:
        raise ConfigError(f"the local runner trains one worker in this process; {', '.join(needs)} "
                          "needs train.runner=ray")
    return runner


def resolve_runner(job) -> str:
    """`train.runner`: `ray` or `local` (auto: local for one worker when nothing asks for Ray)."""
    tc = job.train
    if tc.runner == "ray":
        return "ray"
    needs = needs_ray(job)
    if tc.runner == "local":
        if needs:
            raise ConfigError(f"train.runner=local trains one worker in this process; {', '.join(needs)} "
                              "needs train.runner=ray")
        return "local"
    if needs or _ray_running():
        return "ray"  # several workers, a cluster, a Tune trial or a recipe that runs Ray (ANCE's refresher)
    return "local"


def _on_a_cluster(job, runner: str) -> bool:
    """The workers may run on other machines than this one: a cluster we connect to, or a Ray in this
    process with more than one node (a Tune trial on a cluster). Their devices are then Ray's to check."""
    if runner == "local":
        return False
    if job.ray.address or os.environ.get("RAY_ADDRESS"):
        return True
    if _ray_running():
        import ray

        return len([n for n in ray.nodes() if n.get("Alive")]) > 1
    return False


def check_device(job, runner: str) -> str | None:
    """Refuse what the workers' device cannot do, before anything is written; return the precision the
    run trains in ("bf16", "fp16", "fp32") where this machine decides it, else None (a cluster's workers,
    or GPUs a Ray in this process hands its workers but this process does not see)."""
    from ..device import gpu_here
    from .loop import resolve_amp

    tc = job.train
    cluster = _on_a_cluster(job, runner)
    if not tc.use_gpu:  # CPU workers, wherever they run
        if job.validation.precision == "fp16":
            raise PipelineError("validation.precision=fp16 needs GPU workers (train.use_gpu=true): validation "
                                "encodes on the training workers, which run on CPUs here; validation.precision=auto "
                                "(bf16 where the CPU has it natively) or fp32")
        if tc.amp == "fp16" or not cluster:  # bf16's native check and auto's choice need the workers' CPU
            return resolve_amp(tc.amp, "cpu")
        return None
    if cluster:
        return None  # the cluster's GPUs: Ray's resource check refuses a cluster without them
    if runner != "local" and _ray_running():
        # Ray in this process (e.g. a Tune trial) hands GPUs to its workers, not to this process: ask Ray
        import ray

        if ray.cluster_resources().get("GPU", 0) <= 0:
            raise PipelineError(_no_gpu(tc, "the Ray this process runs in has no GPU"))
        return None
    if not gpu_here():
        raise PipelineError(_no_gpu(tc, "no CUDA GPU is visible on this machine (torch.cuda.is_available() "
                                        "is false)"))
    return resolve_amp(tc.amp, "cuda")


def _no_gpu(tc, why: str) -> str:
    fp16 = " (train.amp=fp16 needs one too; on a CPU train.amp=auto trains in bf16 where the CPU has it natively)" \
        if tc.amp == "fp16" else ""
    return (f"train.use_gpu=true: {why}, so training cannot run on one{fp16}; train.use_gpu=false trains on "
            "the CPU (or ray.address= a cluster with GPUs)")
