"""ir_datasets identifiers as inputs: read only from a (fake) local ir_datasets home, never downloaded.

ir_datasets fixes its home when first imported, so every check runs the CLI in a subprocess
with IR_DATASETS_HOME pointing at a home built here with the exact files ir_datasets expects
(beir/scifact's source.zip; msmarco-passage's extracted collection, dev/small queries and qrels).
Every subprocess has a timeout: a download attempt offline would hang, and must fail the test.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

DOCS = [{"_id": "d1", "title": "T1", "text": "alpha beta"}, {"_id": "d2", "title": "", "text": "gamma"},
        {"_id": "d3", "title": "T3", "text": "delta epsilon"}]
QUERIES = [{"_id": "q1", "text": "what alpha"}, {"_id": "q2", "text": "gamma?"}]
COLLECTION = "0\tThe presence of communication.\n1\tThe Manhattan Project and its atomic bomb.\n2\tCaf\u00e9 culture.\n"
MS_QUERIES = "1048585\twhat is paula deen brother\n2\tAndrogen receptor define\n"
MS_QRELS = "1048585\t0\t1\t1\n2\t0\t0\t1\n"
PSGS = ("id\ttext\ttitle\n1\tThe Who are an English rock band formed in London.\tThe Who\n"
        "2\tAaron is a prophet, high priest, and the brother of Moses.\tAaron\n"
        "3\tParis is the capital of France.\tParis\n")
NQ_DEV = [
    {"question": "who is the brother of moses", "answers": ["Aaron"],
     "positive_ctxs": [{"passage_id": "2", "score": 1000, "title": "Aaron", "text": "..."}],
     "hard_negative_ctxs": [{"passage_id": "1", "score": 10}], "negative_ctxs": [{"passage_id": "3", "score": 0}]},
    {"question": "capital of france", "answers": ["Paris"],
     "positive_ctxs": [{"passage_id": "3", "score": 12.5}], "hard_negative_ctxs": [], "negative_ctxs": []},
]


@pytest.fixture(scope="module")
def irds(tmp_path_factory):
    """A fake ir_datasets home and the same data as plain files."""
    root = tmp_path_factory.mktemp("irds")
    home, files = root / "home", root / "files"
    sci = files / "scifact"
    (sci / "qrels").mkdir(parents=True)
    (sci / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (sci / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    (sci / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    (sci / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq2\td2\t1\n")
    (home / "beir" / "scifact").mkdir(parents=True)
    with zipfile.ZipFile(home / "beir" / "scifact" / "source.zip", "w") as z:  # ir_datasets' download cache path
        for f in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "qrels/train.tsv"):
            z.write(sci / f, "scifact/" + f)
    ms = home / "msmarco-passage"
    (ms / "dev" / "small").mkdir(parents=True)
    (ms / "collection.tsv").write_text(COLLECTION, encoding="utf-8")  # ir_datasets' extracted copy
    (ms / "irds_version.txt").write_text("v2")
    (ms / "dev" / "small" / "queries.tsv").write_text(MS_QUERIES)
    (ms / "dev" / "small" / "qrels").write_text(MS_QRELS)
    dpr = home / "dpr-w100"  # DPR's psgs_w100.tsv and biencoder-nq-dev.json, gzipped, at ir_datasets' cache paths
    dpr.mkdir(parents=True)
    with gzip.open(dpr / "docs.tsv.gz", "wt", encoding="utf-8") as f:
        f.write(PSGS)
    with gzip.open(dpr / "nq-dev.json.gz", "wt", encoding="utf-8") as f:
        json.dump(NQ_DEV, f)
    (files / "psgs_w100.tsv").write_text(PSGS, encoding="utf-8")
    (files / "nq-dev.csv").write_text("".join(f"{r['question']}\t{json.dumps(r['answers'])}\n" for r in NQ_DEV))
    for name, text in (("collection.tsv", COLLECTION), ("queries.tsv", MS_QUERIES), ("qrels.tsv", MS_QRELS)):
        (files / name).write_text(text, encoding="utf-8")
    return {"root": root, "home": home, "files": files}


def cli(irds, *commands, cwd=None, timeout=90, extra_env=None, pre=""):
    """Run `pipeline.cli.main` on each argv in one subprocess; [(rc, stdout, stderr)]."""
    code = pre + (
        "import contextlib, io, json, sys\n"
        "from pipeline.cli import main\n"
        "res = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    out, err = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "        try:\n"
        "            rc = main(argv)\n"
        "        except SystemExit as e:\n"
        "            rc = e.code\n"
        "    res.append([rc, out.getvalue(), err.getvalue()])\n"
        "print('RESULT' + json.dumps(res))\n")
    env = {**os.environ, "IR_DATASETS_HOME": str(irds["home"]), **(extra_env or {})}
    p = subprocess.run([sys.executable, "-c", code, json.dumps([list(map(str, c)) for c in commands])],
                       capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd or irds["root"])
    assert "RESULT" in p.stdout, p.stderr[-3000:]
    return json.loads(p.stdout.split("RESULT", 1)[1])


def _rows(folder: Path) -> list[dict]:
    return [r for part in sorted((folder / "corpus").glob("part-*.parquet")) for r in pq.read_table(part).to_pylist()]


def test_beir_identifier_ingest_equals_the_folder(irds, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    (rc1, _, err1), (rc2, _, err2) = cli(
        irds, ["ingest", "beir/scifact/test", "--out", a],
        ["ingest", irds["files"] / "scifact", "--format", "beir", "--out", b,
         "--queries", "beir/scifact/test", "--qrels", "beir/scifact/test"])
    assert rc1 == 0 and rc2 == 0, err1 + err2
    assert _rows(a) == _rows(b) and [r["pid"] for r in _rows(a)] == ["d1", "d2", "d3"]
    assert _rows(a)[0]["title"] == "T1"
    # beir/scifact/test: the test queries only (ir_datasets filters them by the test qrels)
    assert (a / "queries.tsv").read_text() == (b / "queries.tsv").read_text() == "q1\twhat alpha\n"
    assert (a / "qrels" / "test.trec").read_text() == (b / "qrels" / "test.trec").read_text() == "q1 0 d1 1\n"
    ma = json.loads((a / "manifest.json").read_text())
    assert ma["ir_datasets"] == "beir/scifact/test" and ma["format"] == "irds" and ma["variant"] == "beir-scifact"
    assert ma["sources"][0]["ir_datasets"] == "beir/scifact/test"
    assert ma["queries"]["source"] == ma["qrels"]["test"]["source"] == "beir/scifact/test"
    mb = json.loads((b / "manifest.json").read_text())
    assert mb["queries"]["ir_datasets"] == "beir/scifact/test" and mb["queries"]["count"] == 1


def test_msmarco_identifiers_equal_the_files_in_ingest_evaluate_compare(irds, tmp_path):
    f = irds["files"]
    a, b = tmp_path / "a", tmp_path / "b"
    run = tmp_path / "run.trec"
    run.write_text("1048585 Q0 1 1 2.0 t\n1048585 Q0 0 2 1.0 t\n2 Q0 1 1 3.0 t\n2 Q0 0 2 1.0 t\n")
    run2 = tmp_path / "run2.trec"
    run2.write_text("1048585 Q0 0 1 2.0 t\n1048585 Q0 1 2 1.0 t\n2 Q0 0 1 3.0 t\n2 Q0 1 2 1.0 t\n")
    res = cli(irds,
              ["ingest", "msmarco-passage/dev/small", "--out", a],
              ["ingest", f / "collection.tsv", "--format", "msmarco", "--out", b, "--queries", f / "queries.tsv",
               "--qrels", f"dev-small={f / 'qrels.tsv'}"],
              ["evaluate", "--run", run, "--qrels", "msmarco-passage/dev/small", "--json", tmp_path / "e1.json"],
              ["evaluate", "--run", run, "--qrels", f / "qrels.tsv", "--json", tmp_path / "e2.json"],
              ["compare", run, run2, "--qrels", "msmarco-passage/dev/small", "--json", tmp_path / "c1.json"],
              ["compare", run, run2, "--qrels", f / "qrels.tsv", "--json", tmp_path / "c2.json"])
    assert all(rc == 0 for rc, _, _ in res), [r[2] for r in res]
    assert _rows(a) == _rows(b) and _rows(a)[2]["text"] == "Caf\u00e9 culture."
    assert (a / "queries.tsv").read_text() == (b / "queries.tsv").read_text()
    assert (a / "qrels" / "dev-small.trec").read_text() == (b / "qrels" / "dev-small.trec").read_text()
    ma = json.loads((a / "manifest.json").read_text())
    assert ma["ir_datasets"] == "msmarco-passage/dev/small" and ma["variant"] == "msmarco-official"
    e1, e2 = (json.loads((tmp_path / n).read_text()) for n in ("e1.json", "e2.json"))
    assert e1["metrics"] == e2["metrics"] and e1["qrels"] == "msmarco-passage/dev/small"
    c1, c2 = (json.loads((tmp_path / n).read_text()) for n in ("c1.json", "c2.json"))
    assert c1["qrels"] == "msmarco-passage/dev/small"
    assert json.dumps(c1["runs"], sort_keys=True) == json.dumps(c2["runs"], sort_keys=True)


def test_missing_files_are_named_and_nothing_is_downloaded(irds, tmp_path):
    # any socket connection in the subprocess is a test failure (the guard must refuse before one)
    pre = ("import socket\n"
           "def _boom(*a, **k):\n"
           "    raise SystemExit('NETWORK ATTEMPT')\n"
           "socket.socket.connect = _boom\nsocket.create_connection = _boom\n")
    out = tmp_path / "out"
    (tmp_path / "r.trec").write_text("1 Q0 d1 1 1.0 t\n")
    probe = tmp_path / "probe.py"
    probe.write_text(pre + (
        "from pipeline.data import irds\nimport ir_datasets\n"
        "try:\n"
        "    with irds.no_network('beir/nfcorpus/dev'):\n"
        "        next(iter(ir_datasets.load('beir/nfcorpus/dev').docs_iter()))\n"
        "except irds.PipelineError as e:\n"
        "    print('GUARD', e)\n"))
    res = cli(irds, ["ingest", "beir/nfcorpus/dev", "--out", out],
              ["evaluate", "--run", tmp_path / "r.trec", "--qrels", "msmarco-passage/trec-dl-2019"],
              ["ingest", "beir/scifactt/test", "--out", out],
              pre=pre, timeout=60)
    (rc1, _, err1), (rc2, _, err2), (rc3, _, err3) = res
    assert rc1 == 2 and err1.startswith("error: ") and "Traceback" not in err1
    assert str(irds["home"] / "beir" / "nfcorpus" / "source.zip") in err1 and "nfcorpus.zip" in err1
    assert not out.exists()
    assert rc2 == 2 and str(irds["home"] / "msmarco-passage" / "trec-dl-2019" / "qrels") in err2
    assert rc3 == 2 and "nor an ir_datasets identifier" in err3 and "beir/scifact/test" in err3
    # the runtime guard alone (no static check first): an error naming the file, not a request
    p = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "IR_DATASETS_HOME": str(irds["home"])})
    assert "GUARD" in p.stdout and "nfcorpus/source.zip" in p.stdout, p.stdout + p.stderr
    assert "NETWORK ATTEMPT" not in p.stdout + p.stderr


def test_a_migration_that_would_delete_a_placed_file_is_refused(irds, tmp_path):
    ms = irds["home"] / "msmarco-passage"
    (ms / "irds_version.txt").unlink()
    try:
        (rc, _, err), = cli(irds, ["ingest", "msmarco-passage/dev/small", "--out", tmp_path / "o"])
        assert rc == 2 and "would delete" in err and str(ms / "irds_version.txt") in err
        assert (ms / "collection.tsv").read_text(encoding="utf-8") == COLLECTION  # not deleted
    finally:
        (ms / "irds_version.txt").write_text("v2")


def test_an_existing_path_wins_over_an_identifier(irds, tmp_path):
    # a qrels file at ./beir/scifact/test (relative to the working directory) is read as a file
    (tmp_path / "beir" / "scifact").mkdir(parents=True)
    (tmp_path / "beir" / "scifact" / "test").write_text("q9 0 d9 1\n")
    run = tmp_path / "run.trec"
    run.write_text("q9 Q0 d9 1 1.0 t\nq1 Q0 d1 1 1.0 t\n")
    (rc, out, err), = cli(irds, ["evaluate", "--run", run, "--qrels", "beir/scifact/test", "--json",
                                 tmp_path / "m.json"], cwd=tmp_path)
    assert rc == 0, err
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["queries"]["judged"] == 1 and m["qrels"] == "beir/scifact/test"
    assert "q9" in (tmp_path / "beir" / "scifact" / "test").read_text()


@pytest.mark.slow
def test_retrieve_queries_identifier_equals_the_file(irds, tmp_path, tiny_model_dir):
    import faiss
    from dataclasses import asdict, replace

    from pipeline.config import ModelConfig
    from pipeline.models import BiEncoder

    model = BiEncoder.load(ModelConfig(name_or_path=str(tiny_model_dir), pooling="mean", normalize=True))
    texts = [d["text"] for d in DOCS]
    vecs = model.embed(texts, "doc")
    index = faiss.IndexFlatIP(vecs.shape[1])
    index.add(vecs)
    idx = tmp_path / "index"
    idx.mkdir()
    faiss.write_index(index, str(idx / "index.faiss"))
    (idx / "pids.txt").write_text("".join(d["_id"] + "\n" for d in DOCS))
    resolved = replace(model.cfg, pooling=model.pooling, normalize=model.normalize)
    (idx / "index.json").write_text(json.dumps({
        "factory": "Flat", "metric": "ip", "ntotal": len(DOCS), "dim": int(vecs.shape[1]),
        "model_config": asdict(resolved), "model": {"path": str(tiny_model_dir)}, "corpus_fingerprint": "test"}))
    (tmp_path / "q.tsv").write_text("q1\twhat alpha\n")
    by_id = ["retrieve", "--index", idx, "--queries", "beir/scifact/test", "--out", tmp_path / "a.trec", "--top-k", "3"]
    res = cli(irds, by_id,
              ["retrieve", "--index", idx, "--queries", tmp_path / "q.tsv", "--out", tmp_path / "b.trec", "--top-k", "3"])
    assert all(rc == 0 for rc, _, _ in res), [r[2] for r in res]
    before = (tmp_path / "a.trec.meta.json").read_bytes()
    (rc, out, err), = cli(irds, by_id)  # the same again: the run is kept, named by its identifier
    assert rc == 0 and "[retrieve] unchanged" in out, err
    assert (tmp_path / "a.trec.meta.json").read_bytes() == before
    assert (tmp_path / "a.trec").read_text() == (tmp_path / "b.trec").read_text()
    assert len((tmp_path / "a.trec").read_text().splitlines()) == 3
    meta = json.loads((tmp_path / "a.trec.meta.json").read_text())
    assert meta["queries"] == "beir/scifact/test" and meta["n_queries"] == 1


def test_dpr_w100_ingest_and_qa_equal_the_dpr_files(irds, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run = tmp_path / "run.trec"
    run.write_text("0 Q0 1 1 2.0 t\n0 Q0 2 2 1.0 t\n1 Q0 3 1 3.0 t\n")
    res = cli(irds, ["ingest", "dpr-w100/natural-questions/dev", "--out", a],
              ["ingest", irds["files"] / "psgs_w100.tsv", "--format", "dpr-wiki", "--out", b],
              ["evaluate", "--run", run, "--qa", "dpr-w100/natural-questions/dev", "--corpus", a,
               "--json", tmp_path / "qa1.json"],
              ["evaluate", "--run", run, "--qa", irds["files"] / "nq-dev.csv", "--corpus", b,
               "--json", tmp_path / "qa2.json"])
    assert all(rc == 0 for rc, _, _ in res), [r[2] for r in res]
    assert _rows(a) == _rows(b) and _rows(a)[0] == {"pid": "1", "title": "The Who",
                                                    "text": "The Who are an English rock band formed in London."}
    m = json.loads((a / "manifest.json").read_text())
    assert m["variant"] == "wiki-dpr" and m["title_join"] == "{title} [SEP] {text}"
    assert (a / "queries.tsv").read_text() == "0\twho is the brother of moses\n1\tcapital of france\n"
    # DPR's relevance levels as ir_datasets maps them: 2 gold (score 1000), 1 other positives, 0 hard, -1 negatives
    assert (a / "qrels" / "natural-questions-dev.trec").read_text() == "0 0 2 2\n0 0 1 0\n0 0 3 -1\n1 0 3 1\n"
    qa1, qa2 = (json.loads((tmp_path / n).read_text()) for n in ("qa1.json", "qa2.json"))
    assert qa1["metrics"] == qa2["metrics"] and qa1["qa"] == "dpr-w100/natural-questions/dev"
    assert qa1["metrics"]["Top-1"] == 0.5 and qa1["metrics"]["Top-5"] == 1.0


def test_network_guard_nests_in_any_order(tmp_path, monkeypatch):
    """Overlapping readers (generators) may finish in any order: the originals come back after the last."""
    if "ir_datasets" not in sys.modules:  # its import makes folders in its home: not the user's
        monkeypatch.setenv("IR_DATASETS_HOME", str(tmp_path / "irds-home"))
    from ir_datasets.util import download as dl

    from pipeline.data import irds as m

    orig = dl.Download.__dict__["path"], dl.RequestsDownload.__dict__["__iter__"]
    a, b = m.no_network("x/a"), m.no_network("x/b")
    a.__enter__()
    b.__enter__()
    assert dl.Download.__dict__["path"] is not orig[0]
    with pytest.raises(m.PipelineError, match="x/b"):
        next(iter(dl.RequestsDownload("http://127.0.0.1:9/none")))
    a.__exit__(None, None, None)  # the first one ends first
    assert dl.Download.__dict__["path"] is not orig[0]  # still guarded while b reads
    b.__exit__(None, None, None)
    assert (dl.Download.__dict__["path"], dl.RequestsDownload.__dict__["__iter__"]) == orig


@pytest.mark.slow
def test_training_validation_takes_identifiers(irds, tmp_path, tiny_model_dir):
    # the trainer's validator (index/validate.py) resolves --queries/--qrels identifiers like the CLI does
    f = irds["files"]
    (rc, _, err), = cli(irds, ["ingest", f / "collection.tsv", "--format", "msmarco", "--out", tmp_path / "c"])
    assert rc == 0, err
    code = (
        "import json, sys\n"
        "from pipeline.config import ModelConfig\n"
        "from pipeline.index.validate import Validator\n"
        "from pipeline.models import BiEncoder\n"
        "c, model_dir, q, r = sys.argv[1:]\n"
        "m = BiEncoder.load(ModelConfig(name_or_path=model_dir, pooling='mean', normalize=True))\n"
        "a = Validator(c, queries='msmarco-passage/dev/small', qrels='msmarco-passage/dev/small')(m)\n"
        "b = Validator(c, queries=q, qrels=r)(m)\n"
        "print('RESULT' + json.dumps([a, b]))\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c"), str(tiny_model_dir), str(f / "queries.tsv"),
                        str(f / "qrels.tsv")], capture_output=True, text=True, timeout=90,
                       env={**os.environ, "IR_DATASETS_HOME": str(irds["home"])})
    assert "RESULT" in p.stdout, p.stderr[-3000:]
    a, b = json.loads(p.stdout.split("RESULT", 1)[1])
    for r in (a, b):
        r.pop("val_seconds"), r.pop("validation_rate")  # timings
    assert a == b and 0 <= a["val_metric"] <= 1
