"""Pre-flight resource checks (no Ray: node shapes are given) and the loopback switch."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ResourceError
from pipeline.ray_runtime import check_resources

TWO_CORES = [{"CPU": 2.0, "GPU": 0.0}]


def encode_check(n, cpu, nodes=TWO_CORES, gpu=0.0):
    """The call encode makes: n actors beside Ray Data's read tasks (one whole CPU)."""
    check_resources("encode", n * cpu, n * gpu, count=n, free_whole_cpu=True, nodes=nodes)


# Every shape accepted here was run on the 2-core machine (tests/integration/test_ray_local.py
# runs the accepted ones through Ray Data); every refused one hangs there (docs/RAY.md §5).
@pytest.mark.parametrize("n,cpu,ok", [
    (1, 1.0, True), (2, 0.5, True), (1, 0.5, True), (1, 0.25, True), (4, 0.25, True),
    (1, 1.5, False),  # the reported hang: 0.5 CPU left, the read task wants 1
    (3, 0.5, False), (2, 1.0, False), (1, 2.0, False), (1, 3.0, False), (5, 0.25, False),
])
def test_encode_shapes_on_two_cores(n, cpu, ok):
    if ok:
        encode_check(n, cpu)
    else:
        with pytest.raises(ResourceError, match="encode"):
            encode_check(n, cpu)


def test_actor_larger_than_any_node_is_refused():
    nodes = [{"CPU": 2.0, "GPU": 0.0}, {"CPU": 2.0, "GPU": 0.0}]
    with pytest.raises(ResourceError, match="do not fit"):
        check_resources("encode", 3.0, count=1, nodes=nodes)
    encode_check(2, 1.0, nodes)  # one per node... or both on one: either way a node keeps a whole CPU


def test_gpus_are_counted_per_node():
    nodes = [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 4.0, "GPU": 1.0}]
    encode_check(2, 1.0, nodes, gpu=1.0)
    with pytest.raises(ResourceError, match="GPU"):
        encode_check(3, 1.0, nodes, gpu=1.0)
    with pytest.raises(ResourceError, match="do not fit"):
        check_resources("encode", 1.0, 2.0, count=1, nodes=nodes)


def test_summed_check_kept_for_trainers():
    check_resources("train", 1.0, keep_free_cpus=1.0, nodes=TWO_CORES)
    with pytest.raises(ResourceError, match="kept free"):
        check_resources("train", 1.5, keep_free_cpus=1.0, nodes=TWO_CORES)


def test_force_loopback_switches_ray_cluster_mode_off(monkeypatch):
    from ray._private import ray_constants, services

    from pipeline.ray_runtime import force_loopback

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    force_loopback()
    import os

    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    # what ray.init does with _node_ip_address="127.0.0.1": it stays loopback
    assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"


def test_raylet_worker_startup_notices_go_to_a_log_not_the_terminal(tmp_path):
    from pipeline.ray_runtime import raylet_filter

    printed = []
    log = tmp_path / "notices.log"
    show = raylet_filter(lambda data, ignore_prefix: printed.append(data["lines"]), str(log))
    notice = ("WARNING: 8 PYTHON worker processes have been started on node: abc with address: 127.0.0.1, "
              "which is 4x the maximum expected startup concurrency (2).")
    show({"lines": [notice], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    show({"lines": ["a task failed: out of memory", notice], "pid": "raylet", "is_err": False}, False)
    assert printed == [["a task failed: out of memory"]]  # everything else still reaches the user
    assert log.read_text().count("PYTHON worker processes") == 2


def test_a_hanging_ray_shutdown_is_bounded(monkeypatch, capsys):
    import time

    import ray

    import pipeline.ray_runtime as rr

    monkeypatch.setattr(rr, "_started_local", True)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "shutdown", lambda: time.sleep(30))
    t0 = time.time()
    assert rr.shutdown_local_ray(timeout=0.3) is False
    assert time.time() - t0 < 5 and "did not stop within 0 s" in capsys.readouterr().err
    assert rr.shutdown_local_ray() is True  # nothing left to stop


@pytest.mark.slow
@pytest.mark.parametrize("how,rc", [("error", 2), ("hangup", 129), ("ok", 0)])
def test_the_cli_exits_with_its_status_when_ray_will_not_stop(tmp_path, how, rc):
    """`pipeline` ends with the status it had even when Ray's shutdown hangs (the watchdog cleans up)."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "cli.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        import pipeline.ray_runtime as rr
        from pipeline import cli
        from pipeline.cli import spine
        from pipeline.errors import PipelineError
        import functools, time, ray
        rr._started_local = True                    # as if this command had started a local Ray
        ray.is_initialized = lambda: True
        ray.shutdown = lambda *a, **k: time.sleep(600)  # ... whose shutdown hangs
        rr.shutdown_local_ray = functools.partial(rr.shutdown_local_ray, timeout=1.0)
        def cmd(args):
            print("working", flush=True)
            if {how!r} == "error":
                raise PipelineError("boom")
            if {how!r} == "hangup":
                os.kill(os.getpid(), signal.SIGHUP)
        spine.cmd_encode = cmd
        sys.exit(cli.main(["encode", "--corpus", "c", "--out", "o"]))
    """))
    from subprocs import terminal_signals

    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                       preexec_fn=terminal_signals)
    assert r.returncode == rc, r.stderr
    assert "did not stop within 1 s" in r.stderr
    assert "working" in r.stdout and "Traceback" not in r.stderr
    if how == "error":
        assert "error: boom" in r.stderr


def test_the_progress_clock_skips_a_folder_removed_while_it_scans(tmp_path, monkeypatch):
    """A run renames its temporary version folders into place while a test's clock scans its files:
    a folder listed and gone before it is read is skipped, never a FileNotFoundError (CI hit one)."""
    import os

    from subprocs import tree_state

    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "a").write_bytes(b"12345")
    (tmp_path / ".tmp-v-000001").mkdir()
    (tmp_path / ".tmp-v-000001" / "b").write_bytes(b"1")
    real = os.scandir

    def renamed_before_read(path="."):
        if str(path).endswith(".tmp-v-000001"):
            (tmp_path / ".tmp-v-000001" / "b").unlink()
            (tmp_path / ".tmp-v-000001").rmdir()
        return real(path)

    monkeypatch.setattr(os, "scandir", renamed_before_read)
    assert tree_state(tmp_path) == (1, 5)
