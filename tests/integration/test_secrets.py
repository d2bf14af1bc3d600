"""Credentials stay secret everywhere: planted in the environment of `pipeline encode` (Ray's encoder
actors) and `pipeline train` (Ray Train's workers), they reach no file the runs or Ray's session leave
(a sweep's own local Ray, started with them in its environment, is scanned in test_tune.py)."""

from __future__ import annotations

import pytest
from fixtures import files_holding

pytestmark = pytest.mark.integration

SECRETS = {"AWS_ACCESS_KEY_ID": "AKIAPLANTEDENCODE001", "AWS_SECRET_ACCESS_KEY": "planted-secret-encode-7f6e5d",
           "AWS_SESSION_TOKEN": "planted-token-train-4c3b2a", "GOOGLE_APPLICATION_CREDENTIALS": "/planted/gcp.json"}


def test_encode_and_train_leave_no_planted_credential_in_any_file(ray_session, tiny_model_dir, faq, tmp_path,
                                                                  monkeypatch, capsys):
    from pathlib import Path

    import ray

    from pipeline.cli import main

    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    assert main(["encode", "--corpus", str(faq), "--out", str(tmp_path / "emb"), "--model", str(tiny_model_dir),
                 "encode.runner=ray", "encode.num_actors=1", "encode.cpus_per_actor=1", "encode.backend=torch"]) == 0
    assert main(["train", "--config", "jobs/configs/dpr.yaml", f"model.name_or_path={tiny_model_dir}",
                 "model.pooling=mean", "model.normalize=true", f"data.corpus={faq}", "validation.dev_split=0",
                 f"train.storage_path={tmp_path / 'runs'}", "train.name=s", "train.max_steps=2",
                 "train.cpus_per_worker=1", "train.num_workers=1"]) == 0
    session = Path(ray._private.worker._global_node.get_session_dir_path())
    assert list(session.rglob("raylet.out")) and list((tmp_path / "runs" / "s").rglob("*.json"))
    seen = capsys.readouterr()
    assert not [s for s in SECRETS.values() if s in seen.out + seen.err]
    assert files_holding([tmp_path, session], SECRETS.values()) == []
