"""How the pipeline reaches Ray: with no address it starts its own local Ray (never the cluster a `ray
start` on this machine recorded, which may be another user's or dead: Ray then printed "Failed to connect
to GCS" for ~14 minutes); a cluster address is checked first and a failure is one ConfigError naming it.
No Ray is started here: ray.init is replaced where the test gets that far."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pipeline import ray_runtime
from pipeline.config import RayConfig
from pipeline.errors import ConfigError

JOBS = Path(__file__).resolve().parents[2] / "jobs"


class Stop(Exception):
    pass


@pytest.fixture
def ray_init(monkeypatch):
    """ray.init replaced: records its keyword arguments and stops there (nothing starts)."""
    import ray
    from ray._private import ray_constants

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # (restored after: force_loopback sets them)
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        raise Stop

    monkeypatch.setattr(ray, "init", init)
    return calls


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


def test_no_address_starts_a_local_ray_never_a_recorded_cluster(ray_init, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(Stop):
        ray_runtime.init_ray(RayConfig())
    assert ray_init[0]["address"] == "local" and ray_init[0]["_node_ip_address"] == "127.0.0.1"
    with pytest.raises(Stop):
        ray_runtime.init_ray(RayConfig(address="local"))
    assert ray_init[1]["address"] == "local"


@pytest.mark.parametrize("how", ["config", "env"])
def test_an_address_where_nothing_listens_is_one_error_naming_it_and_ray_is_never_asked(ray_init, monkeypatch, how):
    addr = f"127.0.0.1:{closed_port()}"
    if how == "env":
        monkeypatch.setenv("RAY_ADDRESS", addr)
    cfg = RayConfig(address=addr if how == "config" else None)
    key = "ray.address" if how == "config" else "RAY_ADDRESS"
    with pytest.raises(ConfigError, match=rf"^{key}={addr}: no Ray cluster answers at {addr}: nothing listens there "
                                          r"\(connection refused\)"):
        ray_runtime.init_ray(cfg)
    assert ray_init == []


def test_rays_own_connection_attempts_are_bounded_and_a_failure_is_a_config_error(monkeypatch):
    import ray

    seen = {}

    def init(**kwargs):
        import os

        seen["attempts"] = os.environ.get("RAY_gcs_server_port_wait_time_s")
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}")

    monkeypatch.delenv("RAY_gcs_server_port_wait_time_s", raising=False)
    monkeypatch.setattr(ray, "init", init)
    with socket.socket() as s:  # something accepts there (so the address check passes), but it is no Ray
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        addr = f"127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(ConfigError, match=rf"^ray.address={addr}: cannot connect to a Ray cluster there "
                                              rf"\(Failed to connect to Ray cluster at {addr}\)"):
            ray_runtime.connect_ray(addr)
    assert seen["attempts"] == str(ray_runtime.CONNECT_ATTEMPTS)
    import os

    assert "RAY_gcs_server_port_wait_time_s" not in os.environ  # only while connecting


def test_address_forms():
    assert ray_runtime.gcs_host_port("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert ray_runtime.gcs_host_port("ray://head:10001") == ("head", 10001)
    assert ray_runtime.gcs_host_port("[::1]:6379") == ("::1", 6379)
    assert ray_runtime.gcs_host_port("http://head:8265") is None  # a form Ray resolves itself
    assert ray_runtime.gcs_host_port("head") is None


def test_the_train_smoke_test_fails_with_one_error_line_when_the_cluster_does_not_answer(tmp_path, monkeypatch,
                                                                                         capsys, ray_init):
    """jobs/train.py --smoke-test with a RAY_ADDRESS where no cluster answers: exit 2, one error line, at once."""
    import importlib

    monkeypatch.syspath_prepend(str(JOBS))
    smoke = importlib.import_module("smoke")
    addr = f"127.0.0.1:{closed_port()}"
    monkeypatch.setenv("RAY_ADDRESS", addr)
    assert smoke.run("train", ["--smoke-test", "--out", str(tmp_path / "smoke")], smoke=smoke.smoke_train) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: RAY_ADDRESS={addr}: no Ray cluster answers at {addr}: nothing listens there "
                      "(connection refused). Start the cluster (ray start --head), fix the address, or leave "
                      "ray.address and RAY_ADDRESS unset to start a local Ray"]
    assert ray_init == []
