"""The local Ray the CLI starts: loopback only, and gone when the CLI is gone, however it ends.

Each test starts its own local Ray in a subprocess through `pipeline.ray_runtime.init_ray`
(the session's Ray fixture cannot be used: the CLI's start-up path is what is tested).
Run under the Ray lock: `flock /tmp/ray-tests.lock .venv/bin/python -m pytest -q tests/integration/test_ray_local.py`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from fixtures import short_temp_dir
from listening import cmdline, is_loopback, listening
from subprocs import terminal_signals

REPO = Path(__file__).resolve().parents[2]

DRIVER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from pipeline.config import RayConfig
    from pipeline.ray_runtime import init_ray
    import ray

    def run(cfg):
        init_ray(cfg)
        @ray.remote
        def f(x):
            return os.getpid()
        @ray.remote
        class A:
            def pid(self):
                return os.getpid()
        a = A.remote()
        ray.get([f.remote(i) for i in range(2)] + [a.pid.remote()])  # workers and an actor up
        print("ready", flush=True)
        time.sleep(float(sys.argv[1]))

    if sys.argv[2] == "cli":  # through the CLI's main(), as `pipeline ...` runs
        from pipeline import cli
        from pipeline.cli import spine
        spine.cmd_encode = lambda args: run(RayConfig(num_cpus=2, dashboard=args.model == "dash",
                                                    temp_dir=sys.argv[3]))
        sys.exit(cli.main(["encode", "--corpus", "c", "--out", "o", "--model", sys.argv[4]]))
    run(RayConfig(num_cpus=2, temp_dir=sys.argv[3], dashboard=sys.argv[4] == "dash"))
""")


def start_driver(tmp_path: Path, sleep: float, mode: str = "cli", dashboard: bool = False):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(repo=str(REPO)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["RAY_AUTH_MODE"] = "disabled"
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # init_ray must set it itself
    temp = short_temp_dir("rayt-")
    # a terminal's Ctrl-C and hangup, not a background job's (`terminal_signals`)
    p = subprocess.Popen([sys.executable, str(script), str(sleep), mode, str(temp), "dash" if dashboard else "x"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                         preexec_fn=terminal_signals)
    line = p.stdout.readline().strip()
    if line != "ready":
        p.kill()
        raise AssertionError(f"driver did not start: {line!r}\n{p.stderr.read()[-3000:]}")
    return p, temp


def tree(pid: int) -> list[psutil.Process]:
    procs = psutil.Process(pid).children(recursive=True)
    return [p for p in procs if "pipeline.ray_runtime" not in cmdline(p) and not _is_watchdog(p)]


def _is_watchdog(p) -> bool:
    c = cmdline(p)  # the watchdog is `python -c <script>` (pipeline.ray_runtime._WATCHDOG)
    return " -c " in c and "driver = psutil.Process(pid)" in c


def assert_listens_on_loopback_only(p, dashboard: bool) -> None:
    """Every socket the CLI's process and its Ray's listen on is a loopback one (with the dashboard on or off)."""
    procs = [psutil.Process(p.pid)] + tree(p.pid)
    names = {q.name() for q in procs}
    assert {"gcs_server", "raylet"} <= names and any("DashboardAgent" in n for n in names), names
    socks = listening(procs)
    assert len(socks) >= 6, socks  # driver, gcs, raylet, agents, workers: all listen somewhere
    exposed = [s for s in socks if not is_loopback(s[2])]
    print(f"\n[loopback] dashboard={dashboard}: {len(socks)} listening sockets in "
          f"{len({s[0] for s in socks})} of {len(procs)} processes: "
          + ", ".join(sorted({s[1] for s in socks})) + f"; beyond loopback: {len(exposed)}")
    assert exposed == [], f"listening beyond loopback: {exposed}"
    if dashboard:
        assert any(s[3] == 8265 or "dashboard" in cmdline(psutil.Process(s[0])) for s in socks)


def survivors(procs, wait: float = 20.0) -> list[str]:
    deadline = time.time() + wait
    while True:
        alive = []
        for q in procs:
            try:
                if q.is_running() and q.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{q.pid} {q.name()} {cmdline(q)[:160]}")
            except psutil.NoSuchProcess:
                pass
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.5)


# (signal, dashboard): two of the Rays are first checked to listen on loopback only, one with the dashboard on
ENDINGS = [("SIGTERM", False), ("SIGINT", True), ("SIGHUP", None), ("SIGKILL", None), ("SIGKILL-2", None),
           ("SIGKILL-3", None), ("exit", None)]


@pytest.mark.parametrize("sig,loopback_dashboard", ENDINGS, ids=[s if d is None else f"{s}-loopback-dashboard-{d}"
                                                                 for s, d in ENDINGS])
def test_cli_ray_is_gone_when_the_cli_is(tmp_path, sig, loopback_dashboard):
    """However the CLI ends, no process of its Ray survives it (DashboardAgent, RuntimeEnvAgent,
    workers, gcs, raylet), and the driver exits without a traceback. Before two of the endings, every
    socket of the CLI's Ray is checked to listen on loopback only (the dashboard off, then on)."""
    p, temp = start_driver(tmp_path, sleep=0 if sig in ("exit", "error") else 120,
                           dashboard=bool(loopback_dashboard))
    if loopback_dashboard is not None:
        try:
            assert_listens_on_loopback_only(p, loopback_dashboard)
        except BaseException:
            p.kill()
            raise
    procs = tree(p.pid)
    assert any("RuntimeEnvAgent" in q.name() for q in procs), [q.name() for q in procs]
    sig = sig.split("-")[0]  # SIGKILL is tried three times: workers may be starting at the kill
    if sig != "exit":  # "exit": the command returns normally
        os.kill(p.pid, getattr(signal, sig))
    rc = p.wait(60)
    err = p.stderr.read()
    # a SIGKILLed driver cannot stop Ray: its processes notice the driver's death themselves (the
    # raylet polls for it), which takes longer on a loaded machine; the guarantee is that they go
    left = survivors(procs, wait=90.0 if sig == "SIGKILL" else 20.0)
    assert left == [], f"{sig}: survived the driver: {left}"
    if sig not in ("SIGKILL",):
        assert "Traceback" not in err, err[-2000:]
    if sig == "SIGINT":
        assert rc == 130 and "interrupted" in err
    if sig == "exit":
        assert rc == 0


def test_error_exit_stops_ray(tmp_path):
    """A PipelineError raised after Ray started: exit 2, message, and Ray is stopped."""
    script = tmp_path / "err.py"
    temp = short_temp_dir("rayerr-")
    script.write_text(textwrap.dedent(f"""
        import os, sys, psutil
        sys.path.insert(0, {str(REPO)!r})
        from pipeline import cli
        from pipeline.config import RayConfig
        from pipeline.errors import PipelineError
        from pipeline.ray_runtime import init_ray
        def boom(args):
            init_ray(RayConfig(num_cpus=2, temp_dir={str(temp)!r}))
            kids = [q for q in psutil.Process().children(recursive=True)]
            print(" ".join(str(q.pid) + ":" + str(q.create_time()) for q in kids), flush=True)
            raise PipelineError("boom after Ray started")
        from pipeline.cli import spine
        spine.cmd_encode = boom
        sys.exit(cli.main(["encode", "--corpus", "c", "--out", "o"]))
    """))
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "error: boom after Ray started" in r.stderr and "Traceback" not in r.stderr
    procs = []
    for tok in r.stdout.split():
        pid, ct = tok.split(":")
        try:
            q = psutil.Process(int(pid))
            if abs(q.create_time() - float(ct)) < 0.01:
                procs.append(q)
        except psutil.NoSuchProcess:
            pass
    assert survivors(procs) == []


@pytest.mark.parametrize("n,cpu", [(1, 1.0), (2, 0.5), (4, 0.25)])
def test_every_encode_shape_the_check_accepts_runs(ray_session, tmp_path, n, cpu):
    """check_resources(count=n, free_whole_cpu=True) accepts these on 2 CPUs: each must finish
    (1 x 1.5 and 3 x 0.5, which it refuses, wait forever; tests/unit/test_ray_runtime.py)."""
    import threading

    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray
    from ray.data import ActorPoolStrategy

    from pipeline.ray_runtime import check_resources

    check_resources("encode", n * cpu, count=n, free_whole_cpu=True)  # accepted on this cluster

    class _Encoder:  # stands in for the encoder actor: the same Ray Data shape (defined here: pickled by value)
        def __call__(self, batch):
            return {"id": batch["id"] * 2}

    files = []
    for i in range(3):
        f = tmp_path / f"part-{i}.parquet"
        pq.write_table(pa.table({"id": list(range(i * 100, i * 100 + 100))}), f)
        files.append(str(f))
    ds = ray.data.read_parquet(files).repartition(8).map_batches(
        _Encoder, batch_size=16, num_cpus=cpu, compute=ActorPoolStrategy(size=n))
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("rows", sum(len(b["id"]) for b in ds.iter_batches())),
                         daemon=True)
    t.start()
    t.join(120)
    assert out.get("rows") == 300, f"{n} x {cpu} CPU did not finish in 120 s (hang)"
