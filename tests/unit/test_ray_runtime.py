"""Pre-flight resource checks (no Ray: node shapes are given) and the loopback switch."""

from __future__ import annotations

import pytest

from pipeline.errors import ResourceError
from pipeline.ray_runtime import check_resources

TWO_CORES = [{"CPU": 2.0, "GPU": 0.0}]


def encode_check(n, cpu, nodes=TWO_CORES, gpu=0.0):
    """The call encode makes: n actors beside Ray Data's read tasks (one whole CPU)."""
    check_resources("encode", n * cpu, n * gpu, count=n, free_whole_cpu=True, nodes=nodes)


# Every shape accepted here was run on the 2-core machine (tests/integration/test_ray_local.py
# runs the accepted ones through Ray Data); every refused one hangs there (STACK.md).
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
