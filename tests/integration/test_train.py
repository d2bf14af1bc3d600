"""Ray Train on local Ray: 2 CPU workers, tiny BERT, the bundled Python FAQ training split."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fixtures import dpr_job
import torch
from listening import ListenWatch

from pipeline.models.checkpoint import list_checkpoints
from pipeline.train.trainer import train

pytestmark = pytest.mark.integration



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
    same step count, same batches in the same order (none lost or repeated), same weights; whether
    the examples are held in the object store or read from files by the workers."""
    common = ("loss.name=dar", "loss.n_perturb=2", "train.max_steps=6", "train.checkpoint_every=2",
              "train.log_batches=true", "train.keep_checkpoints=3")
    ref = train(dpr_job(tiny_model_dir, faq, tmp_path, "ref", *common), progress=False)
    assert ref["steps"] == 6 and ref["steps_per_epoch"] == 6 and ref["global_batch"] == 16

    job = dpr_job(tiny_model_dir, faq, tmp_path, "killed", *common, "train.fail_at_step=5")
    with pytest.raises(Exception, match="simulated failure"):
        train(job, progress=False)
    assert [s for s, _ in list_checkpoints(tmp_path / "killed")] == [2, 4]
    # resume: auto; the resumed run's workers read the examples' Parquet parts themselves (the
    # first runs held them in the object store): the same rows in the same order either way
    resumed = train(dpr_job(tiny_model_dir, faq, tmp_path, "killed", *common, "train.fail_at_step=5",
                            "data.materialize=never", "data.streaming=files"), progress=False)
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


def test_training_reduces_loss_and_saves_loadable_model(ray_session, tiny_model_dir, faq, tmp_path, capsys):
    from transformers import AutoModel

    from pipeline.config import ModelConfig
    from pipeline.index.validate import Validator
    from pipeline.models import BiEncoder

    job = dpr_job(tiny_model_dir, faq, tmp_path, "dpr", "train.epochs=4", "optim.lr=5e-4", "data.shuffle_window=64",
                  "train.eval_every=12")
    # every socket of every process this 2-worker run starts (torch's store, gloo) listens on loopback only
    with ListenWatch(os.getpid()) as watch:
        # fp32 passages on both sides (validation here, encode below): on a CPU with native bf16 the default
        # is bf16 on both, whose rounding reorders this random tiny model's near-tied scores (nDCG@10 ~0.03)
        summary = train(job, validate_fn=Validator(str(faq), qrels=str(faq / "qrels" / "test.trec"), precision="fp32"),
                        progress=True)
    out = capsys.readouterr().out
    print(f"\n[loopback] 2-worker train: {watch.summary()}")
    # the validation's encoding shows progress in the run's output, step rates leave validation out,
    # and the summary line says how the wall time split
    for step in (12, 24):
        assert f"[train] dpr step {step} validation: encoding 0/176 passages" in out, out
        assert f"[train] dpr step {step} validation: encoding 176/176 passages" in out, out
    import re

    assert not re.search(r"(?<![\d.])0\.00 steps/s", out), out  # (a rate of 10.00 steps/s is not a zero rate)
    done = [ln for ln in out.splitlines() if ln.startswith("[train] done: dpr")]
    assert len(done) == 1 and all(f"{k} " in done[0] for k in ("start-up", "training", "validation", "checkpoints",
                                                               "export")), done
    assert set(summary["time_split"]) == {"start-up", "training", "validation", "checkpoints", "export"}
    # the parts add up to the wall time the line prints (both from the command's start)
    assert abs(sum(summary["time_split"].values()) - summary["wall_seconds"]) < 1.0, summary["time_split"]
    watch.assert_loopback_only("RayTrainWorker")
    losses = [h["loss"] for h in summary["history"] if "loss" in h]
    assert len(losses) == summary["steps"] == 24
    # lower at the end than at the start: by how much is the dropout draws' luck at batch 16 (the last six
    # steps' mean over the first six's: 0.77-0.96 over seeds 3-5, with SDPA's dropout and threshold-dropout alike)
    assert sum(losses[-6:]) < sum(losses[:6])
    assert 0.0 <= summary["final_metrics"]["val_metric"] <= 1.0
    AutoModel.from_pretrained(summary["model"], local_files_only=True)  # plain transformers loads it
    model = BiEncoder.load(ModelConfig(name_or_path=summary["model"]))
    assert model.pooling == "cls" and model.embed(["a question"], "query").shape == (1, 32)
    # the validation encoded as encode would here, and said so; its figure is the spine's on the exported model
    lines = [ln for ln in out.splitlines() if ln.startswith("[train] dpr step 24 validation: RR@10")]
    assert len(lines) == 1 and "passages at " in lines[0] and "by torch fp32 on 2 workers (88 passages per worker" in lines[0], lines
    _spine_matches_validation(summary, faq, tmp_path, capsys)


def _spine_matches_validation(summary: dict, faq: Path, tmp_path: Path, capsys) -> None:
    """`pipeline encode` -> `index` -> `retrieve` -> `evaluate` on the exported model, with every other default,
    gives the last validation's figures (within 0.002): training's doc length here is 64 tokens, the
    export's 256, and encode runs OpenVINO where the validation ran torch."""
    from pipeline.cli import main

    work = tmp_path / "spine"
    assert main(["encode", "--corpus", str(faq), "--out", str(work / "emb"), "--model", summary["model"],
                 "encode.precision=fp32"]) == 0
    assert main(["index", "--embeddings", str(work / "emb"), "--out", str(work / "index")]) == 0
    assert main(["retrieve", "--index", str(work / "index"), "--queries", str(faq / "queries.tsv"),
                 "--out", str(work / "run.trec"), "--top-k", "100"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--run", str(work / "run.trec"), "--qrels", str(faq / "qrels" / "test.trec"),
                 "--json", str(work / "metrics.json"), "--measures", "nDCG@10 RR@10"]) == 0
    reported = json.loads((work / "metrics.json").read_text())
    figures = reported.get("metrics", reported)
    val = summary["final_metrics"]
    assert abs(figures["nDCG@10"] - val["val_nDCG@10"]) <= 0.002, (figures, val)
    assert abs(figures["RR@10"] - val["val_RR@10"]) <= 0.002, (figures, val)


def test_kill_right_after_a_checkpoint_resumes_from_it_and_trains_no_batch_twice(ray_session, tiny_model_dir, faq,
                                                                                   tmp_path):
    """Killed the moment step 4's checkpoint is complete (Ray's own snapshot may not list it yet):
    the driver announces step-4 and the workers use step-4, so steps 1..6 each run exactly once."""
    common = ("loss.name=dpr", "train.max_steps=6", "train.checkpoint_every=2", "train.log_batches=true",
              "train.keep_checkpoints=5")
    job = dpr_job(tiny_model_dir, faq, tmp_path, "cut", *common, "train.fail_after_checkpoint=4")
    with pytest.raises(Exception, match="simulated failure right after the checkpoint"):
        train(job, progress=False)
    assert [s for s, _ in list_checkpoints(tmp_path / "cut")][-1] == 4
    resumed = train(job, progress=False)
    assert resumed["resumed_from"].endswith("step-00000004") and resumed["final_metrics"]["train_steps_run"] == 2
    steps = _steps(tmp_path / "cut")
    assert sorted(steps) == list(range(1, 7)) and all(len(v) == 2 for v in steps.values())  # 2 ranks, once each

    # a changed loss config is refused, not resumed at a data position that means something else
    from pipeline.errors import PipelineError

    other = dpr_job(tiny_model_dir, faq, tmp_path, "cut", *common, "loss.temperature=0.5")
    with pytest.raises(PipelineError, match=r"differs in the loss settings: loss.temperature \(1.0 in the checkpoint, "
                                            r"0.5 now\)"):
        train(other, progress=False)


class _SwitchingProvider:
    """Version 1 from the start; version 2 appears at the third poll (rank 0 polls)."""

    def __init__(self, root, corpus):
        from pipeline.data.negatives import VersionedNegatives

        self.inner = VersionedNegatives(root, corpus)
        self.polls = 0

    def latest_version(self):
        self.polls += 1
        return 1 if self.polls < 3 else self.inner.latest_version()

    def load(self, version):
        return self.inner.load(version)


def test_negatives_provider_versions_switch_and_resume(tiny_model_dir, faq, tmp_path):
    """The trainer's side of a negatives provider (versions seen, loaded in the background, swapped in at a poll,
    recorded per step and in the checkpoint a resume continues from), trained in this process (train.runner=local:
    what is asserted is the loop's, not Ray Train's; the provider inside Ray Train workers, beside a live refresher
    actor, is test_ance_refresher's)."""
    import pyarrow.parquet as pq

    from pipeline.data.negatives import publish_version

    qrels = [line.split() for line in (faq / "qrels" / "train.trec").read_text().splitlines()]
    judged = {}
    for q, _, d, _ in qrels:
        judged.setdefault(q, set()).add(d)
    from pipeline.data.manifest import load_manifest

    pids = [p for part in load_manifest(faq)["parts"] for p in pq.read_table(faq / part["file"]).column("pid").to_pylist()]
    # the negatives before any version: a run file (BM25 or dense in real use)
    run = tmp_path / "initial.trec"
    run.write_text("".join(f"{q} Q0 {p} {r + 1} {10 - r} init\n" for q, js in judged.items()
                           for r, p in enumerate([p for p in pids if p not in js][:3])))
    root = tmp_path / "negs"
    for v in (1, 2):
        negs = {q: [p for p in pids if p not in js][v * 3:v * 3 + 3] for q, js in judged.items()}
        publish_version(root, v, negs, {"checkpoint_step": 2 * v, "dev_metric": 0.1 * v})
    common = ("loss.name=dpr", "data.hard_negatives=1", f"data.negatives_run={run}", "train.max_steps=6", "train.checkpoint_every=2",
              "train.log_batches=true", "train.negatives_poll_every=2", "train.num_workers=1",
              "train.cpus_per_worker=1", "train.keep_checkpoints=5", "train.runner=local")
    job = dpr_job(tiny_model_dir, faq, tmp_path, "ance_like", *common, "train.fail_after_checkpoint=4")
    with pytest.raises(Exception, match="simulated failure"):
        train(job, negatives_provider=_SwitchingProvider(root, faq), progress=False)
    # polls at steps 0 (v1 seen: loads in the background), 2 (v1 swapped in), 4 (v2 seen: loads):
    # steps 1-2 ran on the initial negatives, 3-4 on v1, and the checkpoint of step 4 records v1
    from pipeline.models.checkpoint import read_state

    assert read_state(tmp_path / "ance_like" / "step-00000004")["negatives_version"] == 1
    summary = train(job, negatives_provider=_SwitchingProvider(root, faq), progress=False)
    log = [json.loads(x) for x in (tmp_path / "ance_like" / "batch_log" / "rank0.jsonl").read_text().splitlines()]
    used = {r["step"]: r["negatives_version"] for r in log}
    assert sorted(used) == list(range(1, 7))
    assert [used[s] for s in range(1, 5)] == [None, None, 1, 1]  # swapped at the poll after it was seen
    # resumed with v1 (from the checkpoint); the resumed run's first poll at step 4 (its 1st) still says v1,
    # its second (step 6 is past the end) never happens: so v1 throughout, recorded per step
    assert used[5] == 1 and used[6] == 1
    assert summary["final_metrics"]["negatives_version"] == 1
    assert summary["final_metrics"]["negatives_staleness"] == 6 - 2
    assert summary["final_metrics"]["refresher_dev_metric"] == pytest.approx(0.1)


def test_ray_data_streams_ids_form_examples_with_their_texts(ray_session, faq, tmp_path):
    """data.streaming=ray-data: each worker's stream is its rows (idx % world == rank) in file order,
    with the texts of their positive and hard negatives gathered from the store's passages."""
    import pyarrow.parquet as pq

    from pipeline.data.manifest import load_manifest
    from pipeline.data.readers import read_qrels
    from pipeline.data.training import build_examples, read_examples_table
    from pipeline.train.config import TrainDataConfig
    from pipeline.train.trainer import _datasets

    pids = [p for part in load_manifest(faq)["parts"] for p in pq.read_table(faq / part["file"])["pid"].to_pylist()]
    judged: dict[str, set] = {}
    for r in read_qrels(faq / "qrels" / "train.trec"):
        judged.setdefault(r["qid"], set()).add(r["docid"])
    run = tmp_path / "run.trec"  # 3 unjudged passages per query as its hard negatives
    run.write_text("".join(f"{q} Q0 {d} {k} {-k} x\n" for q, js in judged.items()
                           for k, d in enumerate([p for p in pids if p not in js][hash(q) % 50:][:3], 1)))
    out = tmp_path / "examples"
    meta = build_examples(TrainDataConfig(source="qrels", corpus=str(faq), negatives_run=str(run)), out, progress=False)
    assert meta["form"] == "ids" and meta["examples"] > 100
    rows = read_examples_table(out).to_pylist()
    assert all(isinstance(r["positive"], str) and len(r["negatives"]) == 3 for r in rows)
    for rank, ds in enumerate(_datasets(out, 2, "idx", meta["digest"]).values()):
        got = [r for b in ds.iter_batches(batch_size=64, batch_format="pyarrow") for r in b.to_pylist()]
        assert got == [r for r in rows if r["idx"] % 2 == rank]


def test_training_stops_at_the_first_non_finite_step(ray_session, tiny_model_dir, faq, tmp_path):
    """A learning rate that blows the weights up: the run stops at the first step whose loss (or
    gradient) is NaN/inf, naming the step and the term, and every checkpoint it leaves is finite
    (no NaN checkpoint, no exported model, no summary claiming a result)."""
    from safetensors.torch import load_file

    from pipeline.errors import PipelineError

    job = dpr_job(tiny_model_dir, faq, tmp_path, "diverge", "optim.lr=1e30", "optim.warmup_ratio=0",
                  "train.max_steps=6", "train.checkpoint_every=1", "train.keep_checkpoints=6")
    with pytest.raises(PipelineError) as e:
        train(job, progress=False)
    msg = str(e.value)
    assert "training stopped at step" in msg and ("loss went non-finite in nll" in msg or "gradient norm" in msg
                                                  or "weights hold NaN or inf" in msg), msg
    assert "nothing of this step was applied" in msg or "no checkpoint is written" in msg
    steps = [s for s, _ in list_checkpoints(tmp_path / "diverge")]
    assert steps and max(steps) < 6, steps
    for _, ckpt in list_checkpoints(tmp_path / "diverge"):
        for name, w in load_file(str(ckpt / "model" / "model.safetensors")).items():
            assert torch.isfinite(w).all(), (ckpt.name, name)
    assert f"step-{max(steps):08d}" in msg  # the kept checkpoint is named
    assert not (tmp_path / "diverge" / "model").exists() and not (tmp_path / "diverge" / "summary.json").exists()


def _local_job(tiny_model_dir, faq, storage, name, *extra):
    return dpr_job(tiny_model_dir, faq, storage, name, "train.num_workers=1", "train.batch_size=16",
                   "train.runner=local", *extra)


def test_the_local_runner_resumes_exactly_and_equals_ray_trains_batches(ray_session, tiny_model_dir, faq, tmp_path):
    """train.runner=local (one worker in this process, no Ray Train) trains the batches Ray's one worker
    trains, to the same weights; killed after a checkpoint and run again, it resumes from it and trains
    each remaining batch once; checkpoints are written in place and rotated to train.keep_checkpoints."""
    common = ("loss.name=dar", "loss.n_perturb=2", "train.max_steps=6", "train.checkpoint_every=2",
              "train.log_batches=true", "train.keep_checkpoints=2", "train.torch_threads=1")
    ref = train(_local_job(tiny_model_dir, faq, tmp_path, "ref", *common), progress=False)
    assert ref["steps"] == 6 and not list((tmp_path / "ref").glob(".tmp-checkpoint-*"))
    assert [s for s, _ in list_checkpoints(tmp_path / "ref")] == [4, 6]  # rotated: the newest 2 kept
    on_ray = train(dpr_job(tiny_model_dir, faq, tmp_path, "ray", "train.num_workers=1", "train.batch_size=16",
                           "train.runner=ray", *common), progress=False)
    assert _steps(tmp_path / "ray") == _steps(tmp_path / "ref")  # the runner decides who trains, not what
    a, b = _weights(tmp_path / "ref"), _weights(tmp_path / "ray")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    assert on_ray["final_metrics"]["loss"] == pytest.approx(ref["final_metrics"]["loss"], rel=1e-4)

    job = _local_job(tiny_model_dir, faq, tmp_path, "killed", *common, "train.fail_at_step=5")
    with pytest.raises(RuntimeError, match="simulated failure at step 5"):
        train(job, progress=False)
    assert [s for s, _ in list_checkpoints(tmp_path / "killed")] == [2, 4]
    resumed = train(job, progress=False)
    assert resumed["resumed_from"].endswith("step-00000004") and resumed["final_metrics"]["train_steps_run"] == 2
    assert _steps(tmp_path / "killed") == _steps(tmp_path / "ref")  # every step once, the same batches
    c = _weights(tmp_path / "killed")
    for k in a:
        torch.testing.assert_close(a[k], c[k], rtol=1e-5, atol=1e-6)


def test_a_local_retry_resumes_from_the_checkpoint_the_run_started_from(tiny_model_dir, faq, tmp_path, capsys):
    """train.resume=<a checkpoint outside the run> and a failure before the run's first checkpoint: the
    local runner's retry (train.max_failures) started again from the base model at step 0; it resumes
    from the same checkpoint the first attempt started from, at its step and with its weights."""
    common = ("train.max_steps=6", "train.torch_threads=1", "train.log_batches=true")
    train(_local_job(tiny_model_dir, faq, tmp_path, "ref", *common, "train.checkpoint_every=2",
                     "train.keep_checkpoints=3"), progress=False)
    start = tmp_path / "ref" / "step-00000002"
    capsys.readouterr()
    out = train(_local_job(tiny_model_dir, faq, tmp_path / "elsewhere", "cont", *common, f"train.resume={start}",
                           "train.fail_at_step=4", "train.max_failures=1"), progress=True)
    printed = capsys.readouterr().out
    assert f"the loop failed (attempt 1 of 2); resuming from {start}" in printed
    assert out["resumed_from"] == str(start) and out["steps"] == 6
    assert out["final_metrics"]["train_steps_run"] == 4  # the retry started at step 2, not 0
    ref_steps, cont_steps = _steps(tmp_path / "ref"), _steps(tmp_path / "elsewhere" / "cont")
    assert sorted(cont_steps) == [3, 4, 5, 6]  # step 3 by both attempts, no step of the base model's start
    assert all(b == ref_steps[s][0] for s, batches in cont_steps.items() for b in batches)
    a, c = _weights(tmp_path / "ref"), _weights(tmp_path / "elsewhere" / "cont")
    for k in a:  # from step 2's weights: the uninterrupted run's
        torch.testing.assert_close(a[k], c[k], rtol=1e-5, atol=1e-6)


def test_the_runner_auto_rule_and_refusals(tiny_model_dir, faq, tmp_path, monkeypatch):
    import sys

    from pipeline.errors import ConfigError
    from pipeline.train.trainer import resolve_runner

    one = _local_job(tiny_model_dir, faq, tmp_path, "x", "train.runner=auto")
    ray_mod = sys.modules.get("ray")
    expected = "ray" if ray_mod is not None and ray_mod.is_initialized() else "local"  # a Ray in this process: ray
    assert resolve_runner(one) == expected
    assert resolve_runner(dpr_job(tiny_model_dir, faq, tmp_path, "x")) == "ray"  # 2 workers
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert resolve_runner(one) == "ray"  # a cluster
    with pytest.raises(ConfigError, match=r"train.runner=local .*ray.address / RAY_ADDRESS"):
        resolve_runner(_local_job(tiny_model_dir, faq, tmp_path, "x"))
    monkeypatch.delenv("RAY_ADDRESS")
    with pytest.raises(ConfigError, match=r"train.num_workers=2 \(local runs one worker\)"):
        resolve_runner(dpr_job(tiny_model_dir, faq, tmp_path, "x", "train.runner=local"))
    with pytest.raises(ConfigError, match="a storage URI"):
        resolve_runner(_local_job(tiny_model_dir, faq, "s3://b/p", "x"))
