"""RCL's stages on local Ray with the tiny BERT: 2 entropy models run side by side and stop early
through the trainer's hook, regulator tables from the spine's Ray Data encoder actors, the final
model; a re-run reuses every stage."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from pipeline.recipes.rcl import run_rcl
from pipeline.train.config import load_train_config
from pipeline.train.methods.rcl import RegulatorTable

pytestmark = pytest.mark.integration



def test_rcl_all_stages_then_reuse(ray_session, tiny_model_dir, faq, tmp_path):
    job = load_train_config(None, [
        "loss.name=rcl", "loss.similarity=cos", f"model.name_or_path={tiny_model_dir}", "model.pooling=mean",
        "model.query_max_length=16", "model.doc_max_length=32", f"data.corpus={faq}",
        "train.num_workers=1", "train.cpus_per_worker=0.5", "train.batch_size=8", "train.max_steps=3",
        f"train.storage_path={tmp_path}", "train.name=rcl", "train.report_every=1",
        # an lr too small to move fp32 weights: the dev loss cannot improve, so with patience 1 every
        # entropy run stops early at its 2nd evaluation (step 2 of 3) through the trainer's hook
        "optim.lr=1e-12",
        f"validation.corpus={faq}", f"validation.qrels={faq}/qrels/test.trec",
        "rcl.entropy_lambdas=[0.01,0.04]", "rcl.eval_every=1", "rcl.patience=1", "rcl.dev_batches=2",
        "rcl.anisotropy_sentences=20", "rcl.encode.precision=fp32", "rcl.encode.shard_rows=64"])
    rec = run_rcl(job, progress=False)
    root = tmp_path / "rcl"
    assert set(rec["entropy_models"]) == {"entropy-0.01", "entropy-0.04"}
    for name in rec["entropy_models"]:
        st = rec["stages"][name]
        assert st["early_stopped"] is True and st["steps"] == 2 and st["selection"]["evals"] == 2
        assert json.loads((root / name / "summary.json").read_text())["stopped_early"] is True
        assert (root / name / "best").is_dir()
    tables = [RegulatorTable(p) for p in rec["stages"]["regulators"]["tables"]]
    assert len(tables) == 2 and tables[0].meta["digest"] != tables[1].meta["digest"]
    assert len(tables[0]) == tables[0].meta["queries"] + tables[0].meta["docs"]
    # stage 2 ran on the spine's Ray Data encoder actors: two complete embedding sets per model,
    # sharded (shard_rows 64), the sentences' ids the keys; each vector is what the frozen entropy
    # model embeds on that side (queries with the query length, documents with the document length)
    from pipeline.index.shards import load_meta
    from pipeline.models import BiEncoder

    t0 = tables[0]
    for side in ("query", "doc"):
        emb = load_meta(t0.folder / side)
        assert emb["complete"] and emb["shards"] >= 1
    assert t0.meta["layout"] == "shards" and len(t0.meta["files"]) >= 3
    from pipeline.data.training import read_examples_table

    ex = read_examples_table(root / "examples").to_pylist()[:3]
    frozen = BiEncoder.load(replace(job.model, name_or_path=t0.meta["model"]))
    qs, ds = [r["query"] for r in ex], [r["positive"] for r in ex]
    np.testing.assert_allclose(t0.lookup(qs, "query"), frozen.embed(qs, "query"), atol=1e-4)
    np.testing.assert_allclose(t0.lookup(ds, "doc"), frozen.embed(ds, "doc"), atol=1e-4)
    final = json.loads((root / "final" / "summary.json").read_text())
    assert final["steps"] == 3 and final["stopped_early"] is False
    # the final run's regulator term was active, reported beside the contrastive term
    assert any(h.get("regulator", 0) > 0 and "cl" in h and "entropy" in h for h in final["history"])
    assert (root / "final" / "model" / "modules.json").exists()

    # a re-run trains nothing: every stage record is reused as it was
    before = {p.name: p.stat().st_mtime_ns for p in (root / "stages").iterdir()}
    again = run_rcl(job, progress=False, train_fn=_refuse)
    assert again["final_model"] == rec["final_model"]
    assert {p.name: p.stat().st_mtime_ns for p in (root / "stages").iterdir()} == before
    assert all(np.isfinite(np.asarray(a)).all() for a in tables[0].arrays)
    assert set(rec["anisotropy"]) == {"base", "entropy-0.01", "entropy-0.04", "final"}
    assert all(-1 <= v <= 1 for v in rec["anisotropy"].values())


def _refuse(*a, **k):
    raise AssertionError("a complete stage was trained again")
