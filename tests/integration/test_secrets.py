"""Credentials stay secret everywhere: in the environment of `pipeline encode` (Ray actors) and
`pipeline train` (Ray Train workers) they reach no file the run or its Ray leaves (the sweep's case is
in test_tune.py), and in every spelling of a URI they reach no error line."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fixtures import files_holding

pytestmark = pytest.mark.integration

SECRETS = {"AWS_ACCESS_KEY_ID": "AKIAPLANTEDENCODE001", "AWS_SECRET_ACCESS_KEY": "planted-secret-encode-7f6e5d",
           "AWS_SESSION_TOKEN": "planted-token-train-4c3b2a", "GOOGLE_APPLICATION_CREDENTIALS": "/planted/gcp.json"}


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1", **SECRETS}
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_encode_and_train_leave_no_planted_credential_in_any_file(tiny_model_dir, faq, tmp_path):
    ray_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    r = _run("encode", "--corpus", str(faq), "--out", str(tmp_path / "emb"), "--model", str(tiny_model_dir),
             "encode.runner=ray", "encode.num_actors=1", "encode.cpus_per_actor=1", "encode.backend=torch",
             "ray.num_cpus=2", f"ray.temp_dir={ray_dir}")
    assert r.returncode == 0, r.stderr
    r = _run("train", "--config", "jobs/configs/dpr.yaml", f"model.name_or_path={tiny_model_dir}",
             "model.pooling=mean", "model.normalize=true", f"data.corpus={faq}", "validation.dev_split=0",
             f"train.storage_path={tmp_path / 'runs'}", "train.name=s", "train.max_steps=2",
             "train.cpus_per_worker=1", "train.num_workers=1", "ray.num_cpus=2", f"ray.temp_dir={ray_dir}")
    assert r.returncode == 0, r.stderr
    assert list(ray_dir.rglob("raylet.out")) and list((tmp_path / "runs" / "s").rglob("*.json"))
    seen = r.stdout + r.stderr
    assert not [s for s in SECRETS.values() if s in seen]
    assert files_holding([tmp_path, ray_dir], SECRETS.values()) == []
