"""cluster.yaml: valid for the installed Ray's cluster launcher (its own schema, after the defaults are
filled in as `ray up` does), and the properties the README promises: CPU head + autoscaled GPU workers,
dashboard on the head's loopback, token auth on every node, the GPU extra installed after torch."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cfg() -> dict:
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def _validate(cfg: dict) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(cfg)))  # the raw file lacks launcher defaults: prepare first


def test_validates_against_rays_schema(cfg):
    _validate(cfg)


@pytest.mark.parametrize("breakage", ["min_workers_not_int", "unknown_head_type", "unknown_top_key"])
def test_the_validation_catches_broken_configs(cfg, breakage):
    import jsonschema

    bad = copy.deepcopy(cfg)
    if breakage == "min_workers_not_int":
        bad["available_node_types"]["gpu_worker"]["min_workers"] = "two"
    elif breakage == "unknown_head_type":
        bad["head_node_type"] = "no_such_type"
    else:
        bad["max_wrokers"] = 3
    with pytest.raises((jsonschema.ValidationError, ValueError)):
        _validate(bad)


def test_cpu_head_and_autoscaled_gpu_workers(cfg):
    assert cfg["provider"]["type"] != "local"  # local providers refuse available_node_types
    types = cfg["available_node_types"]
    head, worker = types[cfg["head_node_type"]], types["gpu_worker"]
    assert head["resources"] == {"CPU": 0}  # no tasks or actors on the head
    assert not head["node_config"]["InstanceType"].startswith(("g", "p"))  # a CPU instance
    assert worker["node_config"]["InstanceType"].startswith(("g5", "p4", "p5", "g6"))  # a GPU instance
    assert 0 <= worker["min_workers"] < worker["max_workers"] <= cfg["max_workers"]


def test_dashboard_on_loopback_and_token_auth_everywhere(cfg):
    head_start = " ".join(cfg["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start and "0.0.0.0" not in yaml.safe_dump(cfg)
    for cmds in (cfg["head_start_ray_commands"], cfg["worker_start_ray_commands"]):
        start = [c for c in cmds if "ray start" in c]
        assert start and all("RAY_AUTH_MODE=token" in c for c in start)
    # one token for the whole cluster: the submitter's, synced to every node
    assert cfg["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert cfg["file_mounts"]["~/dense-retrieval"] == "."
    assert "**/.venv" in cfg["rsync_exclude"]


def test_setup_installs_torch_first_then_the_gpu_extra(cfg):
    setup = [c for c in cfg["setup_commands"] if "make setup" in c]
    assert len(setup) == 1 and "FAISS=gpu" in setup[0]
    venv = setup[0].split("VENV=")[1].split()[0].replace("$HOME", "/home/ubuntu")
    assert all(venv.replace("/home/ubuntu", "$HOME") in c for c in cfg["head_start_ray_commands"] if "ray " in c)
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    # what `make setup FAISS=gpu` would run (dry run, nothing installed): torch, then faiss-cpu out, then .[gpu]
    dry = subprocess.run(["make", "-n", "-B", "setup", "FAISS=gpu", "VENV=/nonexistent/venv"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    torch_at = next(i for i, line in enumerate(dry) if "pip install" in line and "torch==" in line)
    cpu_out = next(i for i, line in enumerate(dry) if "uninstall" in line and "faiss-cpu" in line)
    pkg_at = next(i for i, line in enumerate(dry) if "-e \".[gpu" in line and "-c constraints.txt" in line)
    assert torch_at < cpu_out < pkg_at
