"""`pipeline info`: summaries of the folders and files the tool writes, made here by its own writers."""

from __future__ import annotations

import json

import pytest
from fixtures import random_embeddings

from pipeline.cli import main
from pipeline.config import IndexConfig
from pipeline.data.ingest import ingest
from pipeline.index.faiss_index import build_index
from pipeline.info import describe
from pipeline.models.checkpoint import finalize_checkpoint


@pytest.fixture()
def project(tmp_path):
    """corpus (ingest), emb (shards + embeddings.json as encode writes them), index (build_index), run, metrics."""
    raw = tmp_path / "collection.tsv"
    raw.write_text("".join(f"{i}\tpassage number {i}\n" for i in range(10)))
    (tmp_path / "q.tsv").write_text("1\tq one\n2\tq two\n")
    (tmp_path / "qrels.tsv").write_text("1 0 3 1\n2 0 4 1\n")
    corpus = tmp_path / "proj"
    ingest([raw], "msmarco", corpus, part_rows=6, queries=tmp_path / "q.tsv", qrels={"dev": tmp_path / "qrels.tsv"},
           progress=False)
    emb = random_embeddings(corpus, corpus / "emb")
    build_index(emb, corpus / "index", IndexConfig(), progress=False)
    (corpus / "run.trec").write_text("1 Q0 3 1 2.0 t\n1 Q0 4 2 1.0 t\n2 Q0 4 1 3.0 t\n")
    assert main(["evaluate", "--run", str(corpus / "run.trec"), "--qrels", str(tmp_path / "qrels.tsv"),
                 "--json", str(corpus / "metrics.json")]) == 0
    return corpus


def test_a_project_folder_lists_what_it_holds(project, capsys):
    items = {i["kind"]: i for i in describe(project)}
    assert set(items) >= {"corpus", "embeddings", "index", "run", "metrics (pipeline evaluate)"}
    c = items["corpus"]["fields"]
    assert c["passages"] == "10 in 2 part(s)" and c["complete"] == "yes" and "msmarco-official" in c["variant"]
    assert c["queries"].startswith("2 ") and c["qrels"] == "dev (2 judgements)"
    e = items["embeddings"]["fields"]
    assert e["shards"] == "3 of 3 done (10 of 10 rows)" and e["complete"] == "yes" and "dim 8" in e["vectors"]
    ix = items["index"]["fields"]
    assert ix["type"] == "Flat (ip)" and ix["vectors"].startswith("10 x dim 8") and ix["model"] == "/models/x"
    r = items["run"]["fields"]
    assert (r["queries"], r["rows"]) == ("2", "3") and r["depth"].startswith("2 per query")
    assert "RR@10 1.0000" in items["metrics (pipeline evaluate)"]["fields"]["metrics"]
    assert main(["info", str(project)]) == 0
    out = capsys.readouterr().out
    assert "[corpus]" in out and "[embeddings]" in out and "[index]" in out


def test_incomplete_embeddings_say_what_is_missing(project):
    marker = sorted((project / "emb").glob("shard-*.done"))[-1]
    marker.unlink()
    meta = json.loads((project / "emb" / "embeddings.json").read_text())
    (project / "emb" / "embeddings.json").write_text(json.dumps({**meta, "complete": False}))
    (item,) = describe(project / "emb")
    assert item["fields"]["complete"].startswith("no: 1 of 3 shards missing")
    assert item["fields"]["shards"].startswith("2 of 3 done")


def test_training_run_checkpoint_and_sweep(tmp_path, capsys):
    run = tmp_path / "train" / "dar"
    for step in (2, 4):
        ck = run / f"step-{step:08d}"
        (ck / "model").mkdir(parents=True)
        (ck / "model" / "w.bin").write_bytes(b"x" * 10)
        finalize_checkpoint(ck, {"step": step, "epoch": 0, "total_steps": 6, "metrics": {"loss": 1.5, "lr": 1e-5,
                                                                                          "val_metric": 0.25}})
    (run / "config.yaml").write_text("loss:\n  name: dar\n")
    (item,) = describe(run)
    f = item["fields"]
    assert item["kind"] == "training run" and f["method"] == "dar"
    assert f["steps"].startswith("4 of 6 done (not finished") and "val_metric 0.2500" in f["last metrics"]
    assert "lr" not in f["last metrics"] and f["final model"] == "not exported yet"
    (run / "step-00000004" / "model" / "w.bin").write_bytes(b"y")  # size differs from state.json: incomplete
    (ck_item,) = describe(run / "step-00000004")
    assert ck_item["kind"] == "checkpoint" and ck_item["fields"]["complete"].startswith("NO")
    assert "1 incomplete" in describe(run)[0]["fields"]["checkpoints"]
    (run / "model").mkdir()
    (run / "summary.json").write_text(json.dumps({
        "method": "dar", "steps": 6, "total_steps": 6, "world_size": 2, "batch_per_worker": 8, "global_batch": 16,
        "examples": 100, "final_metrics": {"loss": 1.0, "val_metric": 0.3, "steps_per_s": 2.0}, "wall_seconds": 9.5}))
    f = describe(run)[0]["fields"]
    assert f["steps"] == "6 of 6 (finished)" and f["final metrics"] == "loss 1.0000, val_metric 0.3000"
    assert f["final model"] == str(run / "model") and f["batch"].startswith("16 (2 worker(s) x 8)")
    assert "trained in" not in f  # a summary from before precision and attention were recorded
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "precision": "bf16", "attention": "threshold-dropout"}))
    assert describe(run)[0]["fields"]["trained in"] == "bf16, attention threshold-dropout"

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "events.jsonl").write_text('{"event": "start", "trial": "t1"}\n{"event": "result", "trial": "t1"}\n')
    assert describe(sweep)[0]["fields"]["trials"] == "1 seen, 1 results reported"
    (sweep / "summary.json").write_text(json.dumps({
        "trials": 2, "statuses": {"terminated": 1, "early-stopped": 1, "error": 0}, "metric": "val_metric",
        "mode": "max", "best": {"trial": "t1", "params": {"optim.lr": 1e-5}, "metric": 0.4, "steps": 6}}))
    (sweep / "best.yaml").write_text("{}\n")
    s = describe(sweep)[0]
    assert s["kind"] == "sweep" and s["fields"]["trials"] == "2 (terminated 1, early-stopped 1)"
    assert s["fields"]["best"].startswith("t1: val_metric 0.4 at step 6, optim.lr=1e-05")


def test_unknown_folder_says_what_it_looked_for(tmp_path, capsys):
    (tmp_path / "notes.md").write_text("hello")
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "looked for a corpus (manifest.json)" in err and "index.json" in err
    assert main(["info", str(tmp_path / "nope")]) == 2


def test_a_bm25_run_says_its_scorer_and_the_queries_it_found_nothing_for(project, tmp_path):
    """A BM25 run has no index ("index None" was shown): its scorer, the judgements whose queries it searched,
    and how many of them got no hit at all (a word no passage holds), from what `pipeline bm25` writes."""
    (tmp_path / "qrels.tsv").write_text("1 0 3 1\n2 0 4 1\n")
    (tmp_path / "q.tsv").write_text("1\tpassage number three\n2\tzebra\n")
    out = tmp_path / "bm25.trec"
    assert main(["bm25", "--corpus", str(project), "--queries", str(tmp_path / "q.tsv"), "--qrels",
                 str(tmp_path / "qrels.tsv"), "--out", str(out), "--top-k", "5"]) == 0
    f = describe(out)[0]["fields"]
    assert f["queries"] == "1 of 2 searched (1 with no hit)" and "index" not in f
    assert f["scored by"].startswith("BM25 (bm25s ") and f["queries judged in"] == str(tmp_path / "qrels.tsv")
