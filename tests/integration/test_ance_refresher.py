"""ANCE on local Ray: the refresher publishes versions while training runs, the trainer switches
to them, a killed refresher is restarted (training never stops), and every version is complete."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from listening import ListenWatch


pytestmark = pytest.mark.integration



def test_refresher_runs_beside_training_and_survives_a_kill(ray_session, tiny_model_dir, faq, tmp_path, monkeypatch):
    import ray

    import pipeline.index.refresher as refresher_mod
    from pipeline.recipes.ance import run_ance
    from pipeline.data.negatives import MARKER, list_versions
    from pipeline.data.readers import load_qrels
    from pipeline.train.config import load_train_config

    handles = []
    real_start = refresher_mod.start_refresher

    def spy(*a, **kw):
        h = real_start(*a, **kw)
        handles.append(h)
        return h

    monkeypatch.setattr(refresher_mod, "start_refresher", spy)
    versions = tmp_path / "ance" / "negatives"
    killed = {}

    training_over = threading.Event()

    def kill_after_first_version():  # waits as long as training runs (progress), not a fixed time
        while not training_over.is_set() and not list_versions(versions):
            time.sleep(0.1)
        if handles and list_versions(versions):
            killed["at_version"] = list_versions(versions)[-1]
            ray.kill(handles[0], no_restart=False)  # a crash: Ray restarts the actor

    threading.Thread(target=kill_after_first_version, daemon=True).start()
    job = load_train_config(None, [
        f"model.name_or_path={tiny_model_dir}", "model.pooling=mean", "model.normalize=true",
        "model.query_max_length=32", "model.doc_max_length=64", f"data.corpus={faq}", "data.hard_negatives=1",
        "loss.name=ance", "loss.in_batch_negatives=true", "train.num_workers=1", "train.cpus_per_worker=1",
        "train.batch_size=8", "train.max_steps=40", "train.report_every=4", "train.negatives_poll_every=2",
        "train.step_sleep_s=0.5",
        f"train.storage_path={tmp_path}", "train.name=ance", "train.keep_checkpoints=2", "optim.lr=1e-4",
        "ance.refresh_every=4", "ance.top_k=30", "ance.negatives=5", "ance.cpus=1", "ance.poll_seconds=0.2",
        "ance.precision=fp32", f"ance.dev_qrels={faq / 'qrels' / 'test.trec'}", "ance.keep_versions=2"])
    with ListenWatch(os.getpid()) as watch:  # trainer, refresher and all they start: loopback only
        try:
            summary = run_ance(job, progress=False)
        finally:
            training_over.set()
    print(f"\n[loopback] ANCE run: {watch.summary()}")
    watch.assert_loopback_only("RayTrainWorker", "IndexRefresher")

    assert summary["steps"] == 40  # training never stopped
    used = summary["negatives_versions"]
    print(json.dumps({"used": used, "refresher": summary.get("refresher"), "wall": summary["wall_seconds"]},
                     default=str)[:3000])
    assert len(used) >= 2 and used[0]["at_step"] >= 0 and used[-1]["at_step"] > 0  # switched while training
    assert [u["version"] for u in used] == sorted({u["version"] for u in used})  # only ever newer
    assert all(u["checkpoint_step"] <= u["at_step"] for u in used)  # staleness >= 0
    assert summary["final_metrics"]["negatives_staleness"] >= 0
    assert "at_version" in killed, "the refresher published no negatives version while training ran, so it was " \
                                   f"never killed (versions: {list_versions(versions)})"
    assert used[-1]["version"] > killed["at_version"]  # the restarted refresher went on
    # whenever a marker exists the version is complete; positives never negatives
    import pyarrow.parquet as pq

    judged = load_qrels(faq / "qrels" / "train.trec")
    for v in list_versions(versions):
        folder = versions / f"v-{v:06d}"
        assert (folder / MARKER).exists() and (folder / "meta.json").exists()
        for row in pq.read_table(folder / "negatives.parquet").to_pylist():
            assert not set(row["negatives"]) & set(judged[row["qid"]])
        meta = json.loads((folder / "meta.json").read_text())
        assert 0.0 <= meta["dev_metric"] <= 1.0
    assert len(list_versions(versions)) <= 2  # keep_versions
