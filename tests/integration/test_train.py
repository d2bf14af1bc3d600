"""Ray Train on local Ray: 2 CPU workers, tiny BERT, the bundled Python FAQ training split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline.data.ingest import ingest
from pipeline.demo import demo_data_dir
from pipeline.models.checkpoint import list_checkpoints
from pipeline.train.config import load_train_config
from pipeline.train.trainer import train

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def faq(tmp_path_factory):
    out = tmp_path_factory.mktemp("faq") / "corpus"
    ingest([demo_data_dir()], "beir", out, progress=False)
    return out


def _job(tiny_model_dir, faq, storage, name, *extra):
    return load_train_config(None, [
        f"model.name_or_path={tiny_model_dir}", "model.pooling=cls", "model.query_max_length=32",
        "model.doc_max_length=64", f"data.corpus={faq}", "train.num_workers=2", "train.cpus_per_worker=0.5",
        "train.batch_size=8", f"train.storage_path={storage}", f"train.name={name}", "train.report_every=1",
        "optim.lr=1e-4", "train.seed=3", *extra])


def _weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "model" / "model.safetensors"))


def _steps(run: Path) -> dict[int, list]:
    out: dict[int, list] = {}
    for rank_file in sorted((run / "batch_log").glob("rank*.jsonl")):
        for line in rank_file.read_text().splitlines():
            rec = json.loads(line)
            out.setdefault(rec["step"], []).append(rec["idx"])
    return out


def test_kill_and_resume_matches_uninterrupted(ray_session, tiny_model_dir, faq, tmp_path):
    """A run killed after its step-4 checkpoint, resumed, ends where an uninterrupted run ends:
    same step count, same batches in the same order (none lost or repeated), same weights."""
    common = ("loss.name=dar", "loss.n_perturb=2", "train.max_steps=6", "train.checkpoint_every=2",
              "train.log_batches=true", "train.keep_checkpoints=3")
    ref = train(_job(tiny_model_dir, faq, tmp_path, "ref", *common), progress=False)
    assert ref["steps"] == 6 and ref["steps_per_epoch"] == 6 and ref["global_batch"] == 16

    job = _job(tiny_model_dir, faq, tmp_path, "killed", *common, "train.fail_at_step=5")
    with pytest.raises(Exception, match="simulated failure"):
        train(job, progress=False)
    assert [s for s, _ in list_checkpoints(tmp_path / "killed")] == [2, 4]
    resumed = train(job, progress=False)  # resume: auto
    assert resumed["resumed_from"].endswith("step-00000004")
    assert resumed["steps"] == 6 and resumed["final_metrics"]["train_steps_run"] == 2

    ref_steps, run_steps = _steps(tmp_path / "ref"), _steps(tmp_path / "killed")
    assert sorted(run_steps) == list(range(1, 7))  # each step once: nothing repeated or skipped
    for step in range(1, 7):
        assert sorted(map(sorted, run_steps[step])) == sorted(map(sorted, ref_steps[step]))
    state = torch.load(tmp_path / "killed" / "step-00000006" / "training_state.pt", weights_only=False)
    assert max(s["step"] for s in state["optimizer"]["state"].values()) == 6
    a, b = _weights(tmp_path / "ref"), _weights(tmp_path / "killed")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)

    # a complete run is not trained again: same final checkpoint, no new batches
    again = train(job, progress=False)
    assert again["steps"] == 6 and again["checkpoint"] == resumed["checkpoint"]
    assert _steps(tmp_path / "killed") == run_steps


def test_training_reduces_loss_and_saves_loadable_model(ray_session, tiny_model_dir, faq, tmp_path):
    from transformers import AutoModel

    from pipeline.config import ModelConfig
    from pipeline.index.validate import Validator
    from pipeline.models import BiEncoder

    job = _job(tiny_model_dir, faq, tmp_path, "dpr", "train.epochs=4", "optim.lr=5e-4", "data.shuffle_window=64")
    summary = train(job, validate_fn=Validator(str(faq), qrels=str(faq / "qrels" / "test.trec")), progress=False)
    losses = [h["loss"] for h in summary["history"] if "loss" in h]
    assert len(losses) == summary["steps"] == 24
    assert sum(losses[-6:]) / 6 < sum(losses[:6]) / 6 * 0.9
    assert 0.0 <= summary["final_metrics"]["val_metric"] <= 1.0
    AutoModel.from_pretrained(summary["model"], local_files_only=True)  # plain transformers loads it
    model = BiEncoder.load(ModelConfig(name_or_path=summary["model"]))
    assert model.pooling == "cls" and model.embed(["a question"], "query").shape == (1, 32)
