"""Training with `train.storage_path` on an object store: moto's S3 server and gcp-storage-emulator's
GCS on 127.0.0.1 (real S3 / GCS protocols through pyarrow's S3FileSystem / GcsFileSystem), tiny
BERT, 2 Ray Train workers."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import gcs_emulator
import pytest
from fixtures import dpr_job
import s3_emulator
import torch
from s3_emulator import uri

from pipeline import storage
from pipeline.models.checkpoint import list_checkpoints, read_state
from pipeline.train.trainer import train

pytestmark = pytest.mark.integration


def _expected_batches(job, run_dir) -> dict[int, list]:
    """What an uninterrupted run trains on, step by step: the method's own sampler over the
    examples, per rank (the loop's data path without Ray)."""

    from pipeline.train.methods import get_method

    method = get_method(job.loss.name)
    from pipeline.data.training import read_examples_table

    table = read_examples_table(storage.staging_dir(run_dir) / "examples")
    world, spe = job.train.num_workers, json.loads((run_dir / "summary.json").read_text())["steps_per_epoch"]
    out: dict[int, list] = {}
    for rank in range(world):
        rows = [r for r in table.to_pylist() if r["idx"] % world == rank]
        rows.sort(key=lambda r: r["idx"])
        for i, batch in enumerate(method.batches(iter(rows), job, 0, rank, spe)):
            out.setdefault(i + 1, []).append(sorted(int(r["idx"]) for r in batch))
    return out


def _worker_scratch() -> set[str]:
    """The training workers' folders in the machine's temporary folder (a remote run's batch log, the local
    copy of a remote checkpoint)."""
    tmp = Path(tempfile.gettempdir())
    return {p.name for pattern in ("batch-log-*", "ckpt-*") for p in tmp.glob(pattern)}


@pytest.mark.parametrize("store", ["s3", "gs"])
def test_object_store_kill_resume_export(ray_session, tiny_model_dir, faq, tmp_path, store):
    """Killed right after its step-4 checkpoint on s3:// (gs://), resumed (reading the examples from
    the store this time): steps 1..6 each trained once, on the batches an uninterrupted run takes;
    the optimizer continued (6 steps); the final model and summary are on the store."""
    corpus = faq
    emu = {"s3": s3_emulator, "gs": gcs_emulator}[store]
    root = emu.uri(emu.make_bucket(), "runs")
    common = ("loss.name=dpr", "train.max_steps=6", "train.checkpoint_every=2", "train.log_batches=true",
              "train.keep_checkpoints=2")
    job = dpr_job(tiny_model_dir, corpus, root, "s3run", *common, "train.fail_after_checkpoint=4")
    scratch_before = _worker_scratch()
    with pytest.raises(Exception, match="simulated failure right after the checkpoint"):
        train(job, progress=False)
    run = storage.resolve(root) / "s3run"
    assert [s for s, _ in list_checkpoints(run)] == [2, 4]
    assert (run / "examples" / "examples.json").exists() and not (run / "summary.json").exists()

    resumed = train(dpr_job(tiny_model_dir, corpus, root, "s3run", *common, "train.fail_after_checkpoint=4",
                         "data.materialize=never"), progress=False)
    assert resumed["resumed_from"].startswith(f"{store}://") and "step-00000004" in resumed["resumed_from"]
    assert resumed["steps"] == 6 and resumed["final_metrics"]["train_steps_run"] == 2
    # the workers' local copies (the batch log, the checkpoint resumed from) are gone, failed run and resumed
    assert _worker_scratch() - scratch_before == set()

    steps: dict[int, list] = {}
    for rank_file in sorted((run / "batch_log").iterdir(), key=lambda p: p.name):
        for line in rank_file.read_text().splitlines():
            rec = json.loads(line)
            steps.setdefault(rec["step"], []).append(sorted(rec["idx"]))
    assert sorted(steps) == list(range(1, 7)) and all(len(v) == 2 for v in steps.values())  # once per rank
    expected = _expected_batches(job, run)
    for step in range(1, 7):
        assert sorted(steps[step]) == sorted(expected[step])

    final = run / "step-00000006"
    assert read_state(final)["step"] == 6
    local = storage.download_dir(final, tmp_path / "final")
    state = torch.load(local / "training_state.pt", weights_only=False)
    assert max(s["step"] for s in state["optimizer"]["state"].values()) == 6
    # the export: on S3 (complete: summary.json is written after it) and a local copy that loads
    assert resumed["model"].startswith(f"{store}://") and (run / "model" / "model.safetensors").is_file()
    assert json.loads((run / "summary.json").read_text())["steps"] == 6
    from pipeline.config import ModelConfig
    from pipeline.models import BiEncoder

    model = BiEncoder.load(ModelConfig(name_or_path=resumed["model_local"]))
    assert model.embed(["a question"], "query").shape == (1, 32)
    from safetensors.torch import load_file

    a = load_file(str(local / "model" / "model.safetensors"))
    b = load_file(str(storage.download_dir(run / "model", tmp_path / "exported") / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_missing_bucket_fails_before_training(tiny_model_dir, tmp_path):
    from pipeline.errors import ConfigError

    job = dpr_job(tiny_model_dir, tmp_path, uri("no-such-bucket-here", "runs"), "x")
    with pytest.raises(ConfigError, match=r"storage s3://no-such-bucket-here/runs/x.*the driver.*bucket does not exist"):
        train(job, progress=False)


def test_ance_refuses_a_missing_bucket_before_its_refresher_starts(ray_session, tiny_model_dir, faq, tmp_path):
    from pipeline.recipes.ance import run_ance
    from pipeline.errors import ConfigError

    job = dpr_job(tiny_model_dir, faq, uri("no-such-bucket-here", "runs"), "a", "loss.name=ance",
               "train.num_workers=1", "train.cpus_per_worker=1", "ance.cpus=0.5")
    with pytest.raises(ConfigError, match=r"storage s3://no-such-bucket-here/runs/a.*bucket does not exist"):
        run_ance(job, progress=False)
