"""RCL method without Ray: regulator tables as frozen side inputs, gradients reach only the final
model, the `rcl:` section, the dev split, and stage records reused on re-run (stubbed training)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.errors import ConfigError, PipelineError
from pipeline.losses.base import resolve_similarity
from pipeline.models import BiEncoder
from pipeline.recipes.rcl import EarlyStop, run_rcl
from pipeline.recipes.rcl_regulators import write_regulator_table
from pipeline.train.config import load_train_config
from pipeline.train.methods import StepContext, check_frozen, get_method
from pipeline.train.methods.rcl import RegulatorTable, text_key

def test_the_stages_that_train_alone_train_in_this_process(tmp_path, monkeypatch):
    """With the trainer itself (no injected train_fn) and train.runner=auto: the initial and final models, each
    trained alone, train in this process (runner "local"); the entropy models, side by side, as Ray Train runs
    (the trainer's own choice: no runner given). train.runner=ray or several workers keep every stage on Ray."""
    import pipeline.ray_runtime as ray_runtime
    import pipeline.recipes.rcl as rcl
    import pipeline.train.trainer as trainer

    calls: dict[str, str | None] = {}

    def fake_train(job, validate_fn=None, progress=True, runner=None):
        calls[job.train.name] = runner
        run = Path(job.train.storage_path) / job.train.name
        (run / "model").mkdir(parents=True, exist_ok=True)
        (run / "model" / "modules.json").write_text(json.dumps([job.train.name, job.loss.entropy_lambda]))
        return {"steps": 1, "wall_seconds": 0.0}

    monkeypatch.setattr(trainer, "train", fake_train)
    monkeypatch.setattr(ray_runtime, "init_ray", lambda *a, **k: None)  # (no Ray: the stages' runners are asserted)
    monkeypatch.setattr(ray_runtime, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(rcl, "build_regulators",
                        lambda models, job, ex, out, progress=True: [str(out / Path(p).parent.name) for p in models.values()])
    monkeypatch.setattr(rcl, "dev_pairs", lambda job, limit=None: [("q", "d")])
    monkeypatch.setattr(type(get_method("rcl")), "build_examples",
                        lambda self, job, out, progress=True: {"digest": "x", "examples": 4})
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for runner, workers, lone in (("auto", 1, "local"), ("ray", 1, None), ("auto", 2, None)):
        calls.clear()
        job = load_train_config(None, ["loss.name=rcl", f"train.storage_path={tmp_path}", f"train.name=r-{runner}-{workers}",
                                       "rcl.entropy_lambdas=[0.01,0.02]", "rcl.entropy_init=initial", "rcl.eval_every=2",
                                       "validation.corpus=unused", f"train.runner={runner}", f"train.num_workers={workers}",
                                       "rcl.anisotropy_sentences=0"])
        run_rcl(job, progress=False, validator_fn=lambda j: None)
        assert calls == {"initial": lone, "entropy-0.01": None, "entropy-0.02": None, "final": lone}


ROWS = [{"idx": i, "qid": f"q{i}", "query": f"question number {i} about python",
         "positive": f"answer {i}: the python documentation says {i * 7}", "negatives": []} for i in range(4)]


def _job(tiny_model_dir, *extra):
    return load_train_config(None, ["loss.name=rcl", "loss.similarity=cos", f"model.name_or_path={tiny_model_dir}",
                                    "model.pooling=mean", "model.query_max_length=16", "model.doc_max_length=16",
                                    "train.batch_size=4", *extra])


def test_section_and_loss_block_are_rcls_own():
    job = load_train_config(None, ["loss.name=rcl", "rcl.entropy_lambdas=[0.01,0.05]", "loss.regulator_reduce=mean"])
    assert job.section("rcl").entropy_lambdas == (0.01, 0.05) and job.loss.regulator_reduce == "mean"
    assert job.section("rcl").patience == 3 and job.section("rcl").entropy_init == "base"
    with pytest.raises(ConfigError, match="rcl.patience"):
        load_train_config(None, ["loss.name=rcl", "rcl.patience=0"])
    with pytest.raises(ConfigError, match="entropy_init"):
        load_train_config(None, ["loss.name=rcl", "rcl.entropy_init=final"])
    with pytest.raises(ConfigError):
        load_train_config(None, ["loss.name=dpr", "rcl.patience=2"])  # another method's section is refused
    with pytest.raises(ConfigError, match="loss.entropy_lambda"):
        load_train_config(None, ["loss.name=dpr", "loss.entropy_lambda=0.1"])


def test_final_model_gets_gradients_entropy_models_none(tiny_model_dir, tmp_path):
    """Eq. 3 through the method's forward/assemble/loss: the regulator tables come from two frozen
    entropy models; after backward only the trained model's parameters have gradients."""
    job = _job(tiny_model_dir)
    cfg = job.model
    entropy = [BiEncoder.load(cfg) for _ in range(2)]
    tables = []
    for k, m in enumerate(entropy):
        with torch.no_grad():  # make the two entropy models differ
            for p in m.parameters():
                p.add_(0.01 * (k + 1) * torch.randn_like(p))
        d = tmp_path / f"m{k}"
        m.save(d)
        write_regulator_table(replace(cfg, name_or_path=str(d)), [r["query"] for r in ROWS],
                              [r["positive"] for r in ROWS], tmp_path / f"t{k}", digest=f"d{k}")
        tables.append(str(tmp_path / f"t{k}"))
    job = _job(tiny_model_dir, f"rcl.regulator_tables={json.dumps(tables)}")
    method = get_method("rcl")
    side = method.side_inputs(job, torch.device("cpu"))
    check_frozen(side)
    assert len(side["regulators"]) == 2
    # the table holds exactly what the frozen model embeds
    t0 = RegulatorTable(tables[0])
    ref = BiEncoder.load(replace(cfg, name_or_path=str(tmp_path / "m0"))).embed([ROWS[1]["query"]], "query")
    np.testing.assert_allclose(t0.lookup([ROWS[1]["query"]], "query"), ref, atol=1e-5)

    model = BiEncoder.load(cfg)
    model.train()
    ctx = StepContext(job=job, device=torch.device("cpu"), rank=0, world=1, step=0, rng=random.Random(0), side=side)
    batch = method.assemble(method.forward(model, ROWS, ctx), ctx)
    assert batch["reg_q"].shape[:2] == (2, 4) and batch["reg_docs"].shape[:2] == (2, 4)
    assert not batch["reg_q"].requires_grad and not batch["reg_docs"].requires_grad
    loss_cfg = resolve_similarity(job.loss, True)
    loss, terms = method.loss(batch, loss_cfg)
    assert set(terms) == {"cl", "entropy", "regulator"} and float(terms["regulator"]) > 0
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    for m in entropy:
        assert all(p.grad is None for p in m.parameters())
    # without tables the same batch is plain eq. 1
    plain = method.assemble(method.forward(model, ROWS, replace(ctx, side={})), replace(ctx, side={}))
    assert "reg_q" not in plain


def test_unknown_text_is_a_clear_error(tiny_model_dir, tmp_path):
    write_regulator_table(_job(tiny_model_dir).model, ["a question"], ["an answer"], tmp_path / "t")
    t = RegulatorTable(tmp_path / "t")
    assert t.row[text_key("a question", "query")] == (0, 0) and t.row[text_key("an answer", "doc")] == (0, 1)
    with pytest.raises(PipelineError, match="no regulator vector"):
        t.lookup(["an answer"], "query")  # the side is part of the key
    (tmp_path / "t2").mkdir()
    with pytest.raises(PipelineError, match="not a complete regulator table"):
        RegulatorTable(tmp_path / "t2")


def test_early_stop_keeps_the_best_and_stops_after_patience(tiny_model_dir, tmp_path):
    job = _job(tiny_model_dir)
    pairs = [(r["query"], r["positive"]) for r in ROWS]
    stop = EarlyStop(tmp_path, pairs, job.loss, 4, patience=2)
    model = BiEncoder.load(job.model)
    first = stop(model)
    assert (tmp_path / "best").is_dir() and first["val_bad_evals"] == 0
    assert "stop" not in first
    second = stop(model)
    assert second["val_bad_evals"] == 1 and "stop" not in second  # same model: no improvement
    third = stop(model)  # patience reached: the trainer's early-stop hook ends the run
    assert third["stop"] is True and third["val_bad_evals"] == 2
    assert json.loads((tmp_path / "early_stop.json").read_text())["best_eval"] == 1


def test_stages_are_reused_on_rerun(tmp_path):
    """Stubbed training (no Ray): a second run_rcl trains nothing; a changed setting is refused."""
    calls: list[str] = []

    def fake_train(job, validate_fn=None, progress=True):
        calls.append(job.train.name)
        run = Path(job.train.storage_path) / job.train.name
        (run / "model").mkdir(parents=True, exist_ok=True)
        (run / "model" / "modules.json").write_text(json.dumps([job.train.name, job.loss.entropy_lambda]))
        return {"steps": 1, "wall_seconds": 0.0}

    import pipeline.recipes.rcl as rcl

    orig = rcl.build_regulators
    rcl.build_regulators = lambda models, job, ex, out, progress=True: [str(out / Path(p).parent.name) for p in models.values()]
    orig_examples = get_method("rcl").build_examples
    try:
        type(get_method("rcl")).build_examples = lambda self, job, out, progress=True: {"digest": "x", "examples": 4}
        job = load_train_config(None, ["loss.name=rcl", f"train.storage_path={tmp_path}", "train.name=r",
                                       "rcl.entropy_lambdas=[0.01,0.02]", "rcl.entropy_init=initial",
                                       "rcl.eval_every=2", "validation.corpus=unused"])
        rcl.dev_pairs = lambda job, limit=None: [("q", "d")]
        rec = run_rcl(job, progress=False, train_fn=fake_train, validator_fn=lambda j: None)
        assert sorted(calls) == ["entropy-0.01", "entropy-0.02", "final", "initial"]
        assert rec["stages"]["final"]["inputs"]["tables"] == [str(tmp_path / "r" / "regulators" / n)
                                                              for n in ("entropy-0.01", "entropy-0.02")]
        calls.clear()
        again = run_rcl(job, progress=False, train_fn=fake_train, validator_fn=lambda j: None)
        assert calls == [] and again["final_model"] == rec["final_model"]
        # a stage whose inputs changed is refused, not silently reused
        with pytest.raises(PipelineError, match="other inputs"):
            run_rcl(replace(job, optim=replace(job.optim, lr=1e-3)), progress=False, train_fn=fake_train,
                    validator_fn=lambda j: None)
    finally:
        rcl.build_regulators = orig
        type(get_method("rcl")).build_examples = orig_examples
        import importlib

        importlib.reload(rcl)


def test_stage2_inputs_for_the_spines_encoder(tiny_model_dir, tmp_path):
    """Stage 2's sentence corpus is one `pipeline encode` reads (ids = text keys), rewritten only
    when its sentences change; the query side is the document side with the query's prefix and
    length, and a model with separate towers is left to the fallback (None)."""
    from pipeline.data.manifest import load_manifest
    from pipeline.recipes.rcl_regulators import side_model_cfg, write_sentence_corpus

    out = tmp_path / "sentences" / "query"
    m = write_sentence_corpus(["b question", "a question"], "query", out, "examples")
    assert load_manifest(out)["fingerprint"] == m["fingerprint"] and m["rows"] == 2
    import pyarrow.parquet as pq

    t = pq.read_table(out / "corpus" / "part-00000.parquet").to_pylist()
    assert [r["pid"] for r in t] == [text_key("b question", "query"), text_key("a question", "query")]
    before = (out / "manifest.json").stat().st_mtime_ns
    assert write_sentence_corpus(["b question", "a question"], "query", out, "examples") == m
    assert (out / "manifest.json").stat().st_mtime_ns == before  # unchanged sentences: reused
    assert write_sentence_corpus(["c"], "query", out, "examples")["fingerprint"] != m["fingerprint"]
    assert load_manifest(out)["rows"] == 1

    job = _job(tiny_model_dir, "model.query_prefix='query: '", "model.doc_prefix='passage: '",
               "model.query_max_length=12", "model.doc_max_length=40")
    q = side_model_cfg(job.model, "query")
    assert (q.doc_prefix, q.doc_max_length) == ("query: ", 12)
    assert side_model_cfg(job.model, "doc") == job.model
    # what the spine's encoder computes under that config is the query side of the model
    text = "a fairly long question " * 8
    ref = BiEncoder.load(job.model).embed([text], "query")
    np.testing.assert_allclose(BiEncoder.load(q).embed([text], "doc"), ref, atol=1e-5)
    assert not np.allclose(BiEncoder.load(job.model).embed([text], "doc"), ref, atol=1e-3)
    separate = replace(job.model, query_name_or_path=str(tiny_model_dir))
    assert side_model_cfg(separate, "query") is None


def test_a_model_with_identical_sides_is_encoded_in_one_pass(tiny_model_dir, tmp_path):
    """Same tower, head, prefix and length on both sides: one corpus holds the queries and the
    documents under their own keys (one encoding pass); any difference keeps two passes."""
    from pipeline.recipes.rcl_regulators import sides_identical, write_sentence_corpus

    assert sides_identical(_job(tiny_model_dir).model)  # 16 / 16, no prefixes
    assert not sides_identical(_job(tiny_model_dir, "model.doc_max_length=32").model)
    assert not sides_identical(_job(tiny_model_dir, "model.query_prefix='q: '").model)
    m = write_sentence_corpus(["q1", "q2"], "both", tmp_path / "both", "ex", docs=["d1"])
    assert m["counts"] == {"query": 2, "doc": 1} and m["rows"] == 3
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "both" / "corpus" / "part-00000.parquet").to_pylist()
    assert [r["pid"] for r in rows] == [text_key("q1", "query"), text_key("q2", "query"), text_key("d1", "doc")]
    assert [r["text"] for r in rows] == ["q1", "q2", "d1"]


def test_object_store_storage_is_refused_before_any_stage(tmp_path):
    # RCL's stages live in a folder; an s3:// storage_path is a clear error, not a local folder named 's3:'
    job = load_train_config(None, ["loss.name=rcl", "train.storage_path=s3://bucket/runs", "train.name=r"])
    with pytest.raises(ConfigError, match="s3://bucket/runs"):
        run_rcl(job, train_fn=lambda *a, **k: pytest.fail("trained"), validator_fn=lambda job: None)
    assert not Path("s3:").exists()
