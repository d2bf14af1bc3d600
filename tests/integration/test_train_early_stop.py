"""The trainer's early-stop hook: `validate_fn` returning {"stop": True} ends the run on every
rank at that step, with a checkpoint marked stopped_early that a re-run reuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.models.checkpoint import latest_checkpoint, read_state
from pipeline.train.config import load_train_config
from pipeline.train.trainer import train

pytestmark = pytest.mark.integration



def _rank_steps(run: Path) -> dict[str, list[int]]:
    return {f.name: [json.loads(line)["step"] for line in f.read_text().splitlines()]
            for f in sorted((run / "batch_log").glob("rank*.jsonl"))}


def test_validation_hook_stops_every_rank_and_rerun_reuses(ray_session, tiny_model_dir, faq, tmp_path, capsys):
    job = load_train_config(None, [
        f"model.name_or_path={tiny_model_dir}", "model.pooling=cls", "model.query_max_length=16",
        "model.doc_max_length=32", f"data.corpus={faq}", "train.num_workers=2", "train.cpus_per_worker=0.5",
        "train.batch_size=4", f"train.storage_path={tmp_path}", "train.name=stop", "train.max_steps=8",
        "train.eval_every=1", "train.checkpoint_every=5", "train.report_every=1", "train.log_batches=true",
        "optim.lr=1e-4"])
    calls = tmp_path / "calls.txt"

    def stop_at_third(model):  # runs on rank 0 only; a nested function is pickled by value
        with open(calls, "a") as f:
            f.write("x\n")
        n = len(calls.read_text().splitlines())
        return {"val_metric": float(n), "stop": n >= 3}

    summary = train(job, validate_fn=stop_at_third, progress=True)
    out = capsys.readouterr().out
    assert "stopped early at step 3/8" in out
    assert summary["steps"] == 3 and summary["total_steps"] == 8 and summary["stopped_early"] is True
    run = tmp_path / "stop"
    final = latest_checkpoint(run)
    assert final.name == "step-00000003" and read_state(final)["stopped_early"] is True
    assert summary["final_metrics"]["train_steps_run"] == 3
    # both ranks trained steps 1..3 and nothing after: the decision reached every rank at step 3
    assert _rank_steps(run) == {"rank0.jsonl": [1, 2, 3], "rank1.jsonl": [1, 2, 3]}
    assert len(calls.read_text().splitlines()) == 3
    assert (run / "model" / "config.json").exists() or (run / "model" / "modules.json").exists()

    # a re-run reuses the stopped run: no training, no validation, same checkpoint
    again = train(job, validate_fn=stop_at_third, progress=True)
    assert "(stopped early by its validation hook); nothing to train" in capsys.readouterr().out
    assert again["steps"] == 3 and again["stopped_early"] is True and again["checkpoint"] == summary["checkpoint"]
    assert _rank_steps(run) == {"rank0.jsonl": [1, 2, 3], "rank1.jsonl": [1, 2, 3]}
    assert len(calls.read_text().splitlines()) == 3
