"""Starting, checking and stopping Ray: local by default, loopback only, resources checked up front.

* **Loopback only.** Ray 2.60 turns `_node_ip_address="127.0.0.1"` into the machine's
  routable address (`services.resolve_ip_for_localhost`), and then gcs_server, raylet,
  workers and the driver listen on all interfaces. Ray keeps a node on loopback only when
  its "cluster" mode is off (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, the switch Ray uses on
  macOS/Windows): the node IP is then 127.0.0.1, the C++ servers bind 127.0.0.1
  (`listen_to_localhost_only`), and the agents and dashboard bind the node IP. `init_ray`
  sets it, for the driver and every process Ray starts, before a local start.
  tests/integration/test_ray_local.py lists every listening socket of every Ray process.
* **Stopped however the CLI exits.** Ray's own atexit hook and SIGTERM handler cover a
  normal exit, an error, Ctrl-C and SIGTERM (`shutdown_local_ray` is also called by the
  CLI). A SIGKILLed driver runs no code, and Ray's agents (DashboardAgent,
  RuntimeEnvAgent) outlive it: a small watchdog process records the driver's process tree
  and ends it when the driver is gone.
* **Local unless told, a cluster bounded.** With no `ray.address` / RAY_ADDRESS a new local Ray starts
  (`address="local"`), never the cluster a `ray start` recorded in /tmp/ray/ray_current_cluster (Ray's
  default, which retried a dead one for ~14 minutes); a cluster address must accept a connection within
  15 s and Ray's own GCS attempts are cut to 2 (`connect_ray`): a failure is one ConfigError naming it.
* **Resources.** Ray 2.60 hangs quietly when tasks ask for more CPUs/GPUs than a node
  has, and Ray Data deadlocks unless one whole CPU stays free for its read tasks
  (docs/RAY.md §5, §8). `check_resources` refuses such shapes before anything starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys

from .config import RayConfig
from .errors import ConfigError, ResourceError

LOOPBACK = "127.0.0.1"
_started_local = False
_watchdog: subprocess.Popen | None = None


def force_loopback() -> None:
    """Make a local Ray node (this process and all it starts) use and bind 127.0.0.1 only."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read by ray_constants at import
    try:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False  # ray may already be imported in this process
    except ImportError:  # pragma: no cover - ray is a dependency
        pass


def init_ray(cfg: RayConfig | None = None, runtime_env: dict | None = None) -> None:
    """Connect to `cfg.address` (or $RAY_ADDRESS), else start a local Ray on 127.0.0.1 only.

    The local Ray's dashboard is off unless `cfg.dashboard`, and then it binds
    127.0.0.1 as well: nothing the pipeline starts is reachable from other hosts.
    A local Ray started here is shut down when the process exits, however it exits.
    """
    global _started_local
    import ray

    if ray.is_initialized():
        return
    cfg = cfg or RayConfig()
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    if address and address != "local":  # "local" = start one here, as with no address
        key = "ray.address" if cfg.address else "RAY_ADDRESS"
        connect_ray(address, key, runtime_env)
        _quiet_raylet_notices()
        return
    force_loopback()
    # Ray 2.60 warns on every local start that token auth is on; docs/RAY.md §1 documents it.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    kwargs: dict = {}
    if cfg.object_store_memory_mb:
        kwargs["object_store_memory"] = cfg.object_store_memory_mb * 1024 * 1024
    if cfg.temp_dir:
        kwargs["_temp_dir"] = os.path.abspath(cfg.temp_dir)
    ray.init(
        # "local": a new Ray here, never the cluster a `ray start` on this machine recorded in
        # /tmp/ray/ray_current_cluster (Ray's choice for no address), which may be another user's, or dead
        # (then Ray retried "Failed to connect to GCS" for ~14 minutes)
        address="local",
        num_cpus=cfg.num_cpus,
        num_gpus=cfg.num_gpus,
        include_dashboard=cfg.dashboard,
        dashboard_host=LOOPBACK,
        _node_ip_address=LOOPBACK,
        runtime_env=runtime_env,
        logging_level=logging.WARNING,
        log_to_driver=cfg.log_to_driver,
        **kwargs,
    )
    _started_local = True
    _quiet_ray_data()
    _quiet_raylet_notices()
    start_watchdog()


CONNECT_TIMEOUT_S = 15.0  # how long a cluster's address may take to accept a connection
CONNECT_ATTEMPTS = 2  # Ray's own attempts (~40 s each) at a GCS that accepts but does not answer


def gcs_host_port(address: str, temp_dir: str | None = None) -> tuple[str, int] | None:
    """(host, port) the driver connects to for `address` (host:port, ray://host:port, or "auto": the
    cluster a `ray start` on this machine recorded); None for a form Ray resolves itself."""
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address

        try:
            address = canonicalize_bootstrap_address("auto", temp_dir)
        except ConnectionError as e:
            raise ConfigError(f"ray.address=auto: {e}") from None
        if address is None:
            return None
    scheme, sep, rest = address.partition("://")
    if sep and scheme != "ray":
        return None
    host, colon, port = (rest if sep else address).rstrip("/").rpartition(":")
    if not colon or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


def check_reachable(address: str, key: str = "ray.address", timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A ConfigError naming `address` unless something accepts a connection there within `timeout_s`."""
    import socket

    target = gcs_host_port(address)
    if target is None:
        return
    host, port = target
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return
    except ConnectionRefusedError:
        why = "nothing listens there (connection refused)"
    except socket.gaierror as e:
        why = f"the host is unknown ({e.strerror or e})"
    except (socket.timeout, TimeoutError):
        why = f"no answer within {timeout_s:g} s"
    except OSError as e:
        why = e.strerror or str(e)
    raise ConfigError(f"{key}={address}: no Ray cluster answers at {host}:{port}: {why}. Start the cluster "
                      "(ray start --head), fix the address, or leave ray.address and RAY_ADDRESS unset to start a "
                      "local Ray")


def connect_ray(address: str, key: str = "ray.address", runtime_env: dict | None = None,
                timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """ray.init(address=...) bounded: the address must accept a connection within `timeout_s`, and Ray's
    own attempts at its GCS are CONNECT_ATTEMPTS (not its default 20 of ~35 s each, which printed "Failed to
    connect to GCS" for ~12 minutes); a failure is one ConfigError naming the address."""
    import ray

    check_reachable(address, key, timeout_s)
    previous = os.environ.get("RAY_gcs_server_port_wait_time_s")
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(CONNECT_ATTEMPTS))  # read as Ray connects
    try:
        ray.init(address=address, runtime_env=runtime_env, logging_level=logging.WARNING)
    except ConnectionError as e:
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise ConfigError(f"{key}={address}: cannot connect to a Ray cluster there ({first[:300]}); check that "
                          "its head runs the same Ray version and is reachable from here, or leave ray.address "
                          "and RAY_ADDRESS unset to start a local Ray") from None
    finally:
        if previous is None:
            os.environ.pop("RAY_gcs_server_port_wait_time_s", None)


def _quiet_ray_data() -> None:
    """Ray Data's per-dataset INFO lines and its "progress bars disabled" notice are noise in a user's
    terminal (our steps print their own progress); they stay in the session's ray-data.log."""
    import ray.data  # noqa: F401  (configures its loggers first, so the level below sticks)

    logging.getLogger("ray.data").setLevel(logging.ERROR)


# Raylet notices the driver prints that say nothing a user can act on: on a small machine every Tune
# sweep or RCL run starts more worker processes (fractional-CPU actors) than the raylet "expects".
RAYLET_NOISE = ("worker processes have been started on node",)


def raylet_filter(print_fn, log_path: str | None):
    """`print_fn` (Ray's driver-side printer of raylet messages) without the lines in RAYLET_NOISE,
    which go to `log_path` instead."""
    def filtered(data, ignore_prefix, *args, **kwargs):
        lines = data.get("lines") or []
        keep = [ln for ln in lines if not any(n in str(ln) for n in RAYLET_NOISE)]
        if len(keep) < len(lines) and log_path:
            with contextlib.suppress(OSError), open(log_path, "a") as f:
                f.writelines(f"{ln}\n" for ln in lines if ln not in keep)
        if keep or not lines:
            return print_fn({**data, "lines": keep} if lines else data, ignore_prefix, *args, **kwargs)
        return None

    filtered.pipeline_filter = True
    return filtered


def _quiet_raylet_notices() -> None:
    """Route RAYLET_NOISE lines to the session's logs/pipeline-raylet-notices.log (Ray's error
    listener thread looks its printer up by name at each message)."""
    import ray._private.worker as worker

    if getattr(worker.print_to_stdstream, "pipeline_filter", False):
        return
    log_path = None
    with contextlib.suppress(Exception):
        log_path = os.path.join(worker._global_node.get_logs_dir_path(), "pipeline-raylet-notices.log")
    worker.print_to_stdstream = raylet_filter(worker.print_to_stdstream, log_path)


def shutdown_local_ray(timeout: float = 30.0) -> bool:
    """Stop the local Ray this process started (no-op for a cluster connection or none).

    Returns False when `ray.shutdown()` has not returned within `timeout` seconds (seen once on a
    loaded 2-core machine after a SIGHUP): the caller then exits anyway, and the watchdog ends
    what is left of this Ray once the driver is gone."""
    global _started_local
    if not _started_local:
        return True
    import threading

    import ray

    _started_local = False
    if not ray.is_initialized():
        return True
    done = threading.Event()

    def stop() -> None:
        try:
            ray.shutdown()
        finally:
            done.set()

    threading.Thread(target=stop, name="ray-shutdown", daemon=True).start()
    if done.wait(timeout):
        return True
    print(f"[ray] the local Ray did not stop within {timeout:.0f} s; exiting anyway (the watchdog ends its "
          "processes)", file=sys.stderr, flush=True)
    return False


# The watchdog: a separate process (own session, so a Ctrl-C to the terminal's process
# group reaches the driver first) that remembers the driver's descendants every
# half second and, once the driver is gone, terminates those still running (same pid
# *and* start time, so a recycled pid is never touched) and the workers of its raylets
# started since (RAY_RAYLET_PID in their environment), then kills what is left.
_WATCHDOG = r"""
import sys, time
import psutil
pid, interval = int(sys.argv[1]), float(sys.argv[2])
me = psutil.Process()
try:
    driver = psutil.Process(pid)
except psutil.Error:
    sys.exit(0)
known = {}
raylets = set()  # pids of this driver's raylets: their workers carry RAY_RAYLET_PID
def alive(p):
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
while alive(driver):
    try:
        kids = driver.children(recursive=True)
    except psutil.Error:
        kids = []
    fresh = {}
    for p in kids + list(known.values()):
        if p.pid != me.pid and p.pid not in fresh and alive(p):
            fresh[p.pid] = p
            try:
                if p.name() == "raylet":
                    raylets.add(str(p.pid))
            except psutil.Error:
                pass
    known = fresh
    time.sleep(interval)
time.sleep(1.0)  # let Ray's own shutdown (atexit, fate-sharing) finish first
procs = {}
for p in list(known.values()):
    if alive(p):
        procs[p.pid] = p
        try:
            for c in p.children(recursive=True):
                procs.setdefault(c.pid, c)
        except psutil.Error:
            pass
# workers started in the last interval, orphaned when their raylet died: found by the
# RAY_RAYLET_PID Ray puts in the environment of every worker and agent it starts
if raylets:
    for p in psutil.process_iter():
        if p.pid in procs or p.pid == me.pid:
            continue
        try:
            if p.environ().get("RAY_RAYLET_PID") in raylets:
                procs[p.pid] = p
        except psutil.Error:
            pass
procs = [p for p in procs.values() if p.pid != me.pid]
for p in procs:
    try:
        p.terminate()
    except psutil.Error:
        pass
_, left = psutil.wait_procs(procs, timeout=5)
for p in left:
    try:
        p.kill()
    except psutil.Error:
        pass
"""


def start_watchdog(interval: float = 0.5) -> None:
    """Start (once per process) the watchdog that ends this driver's Ray processes if it is killed."""
    global _watchdog
    if _watchdog is not None and _watchdog.poll() is None:
        return
    try:
        _watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(interval)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)
    except OSError as e:  # never fatal: Ray's own shutdown paths still work
        print(f"[ray] could not start the clean-up watchdog ({e}); a SIGKILLed run may leave "
              "Ray agents behind", file=sys.stderr)


# --------------------------------------------------------------------------- resources

def cluster_resources() -> dict[str, float]:
    import ray

    res = ray.cluster_resources()
    return {"CPU": float(res.get("CPU", 0)), "GPU": float(res.get("GPU", 0))}


def node_resources() -> list[dict[str, float]]:
    """Total CPUs/GPUs of every alive node (what each single actor or task can get at most)."""
    import ray

    out = []
    for n in ray.nodes():
        if n.get("Alive", n.get("alive", True)):
            r = n.get("Resources", {})
            out.append({"CPU": float(r.get("CPU", 0)), "GPU": float(r.get("GPU", 0))})
    return out or [cluster_resources()]


def _place(nodes: list[dict[str, float]], count: int, cpu: float, gpu: float) -> list[dict[str, float]] | None:
    """First-fit placement of `count` equal actors; the nodes' free resources after, or None."""
    free = [dict(n) for n in nodes]
    for _ in range(count):
        for n in sorted(free, key=lambda n: (n["GPU"] < gpu, -n["CPU"])):
            if n["CPU"] + 1e-9 >= cpu and n["GPU"] + 1e-9 >= gpu:
                n["CPU"] -= cpu
                n["GPU"] -= gpu
                break
        else:
            return None
    return free


def check_resources(what: str, cpus: float, gpus: float = 0.0, keep_free_cpus: float = 0.0, *,
                    count: int | None = None, free_whole_cpu: bool = False,
                    nodes: list[dict[str, float]] | None = None) -> None:
    """Refuse up front a resource shape Ray would wait on forever.

    `cpus`/`gpus` are the totals asked; `keep_free_cpus` more CPUs must stay free
    (summed over the cluster). With `count`, the request is `count` equal actors or
    workers of `cpus/count`, `gpus/count` each, and each must fit on one node. With
    `free_whole_cpu` (Ray Data beside an actor pool: its read tasks ask for one whole
    CPU), after the actors are placed some node must still have one whole CPU free:
    on 2 cores, 1 actor x 1 CPU and 2 x 0.5 pass, 1 x 1.5 and 3 x 0.5 are refused.
    `nodes` (each {"CPU", "GPU"}) defaults to the connected cluster's nodes.
    """
    if nodes is None:
        nodes = node_resources() if count is not None else [cluster_resources()]
    total_cpu = sum(n["CPU"] for n in nodes)
    total_gpu = sum(n["GPU"] for n in nodes)
    problems = []
    if cpus + keep_free_cpus > total_cpu + 1e-9:
        extra = f" + {keep_free_cpus:g} kept free for read tasks" if keep_free_cpus else ""
        problems.append(f"{cpus:g} CPUs{extra} asked, the cluster has {total_cpu:g}")
    if gpus > total_gpu + 1e-9:
        problems.append(f"{gpus:g} GPUs asked, the cluster has {total_gpu:g}")
    if count is not None and not problems:
        each_cpu, each_gpu = cpus / count, gpus / count
        free = _place(nodes, count, each_cpu, each_gpu)
        if free is None:
            biggest = max(n["CPU"] for n in nodes)
            problems.append(f"{count} x ({each_cpu:g} CPU, {each_gpu:g} GPU) do not fit on the nodes "
                            f"(largest node: {biggest:g} CPUs)")
        elif free_whole_cpu and not any(n["CPU"] + 1e-9 >= 1.0 for n in free):
            left = max(n["CPU"] for n in free)
            problems.append(f"{count} x {each_cpu:g} CPU leave {left:g} CPU free on the best node, but Ray Data's "
                            "read tasks need one whole CPU beside the actors")
    if problems:
        raise ResourceError(
            f"{what}: {'; '.join(problems)}. Lower the actor/worker count or the per-actor "
            "resources (fractional CPUs are fine, e.g. encode.cpus_per_actor=0.5); Ray would otherwise wait forever."
        )
