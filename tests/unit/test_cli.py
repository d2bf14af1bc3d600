"""The `pipeline` console script: verbs, exit codes and user-facing errors (no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.cli import main

DATA = Path(__file__).parent.parent / "data"


def test_evaluate_prints_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "m.json"
    rc = main(["evaluate", "--run", str(DATA / "python_faq_minilm_top20.trec"),
               "--qrels", str(DATA / "python_faq_all.qrels"), "--json", str(out), "eval.recall_ks=[5,20]"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "RR@10" in text and "R@20" in text and "evaluated 176" in text
    metrics = json.loads(out.read_text())["metrics"]
    assert set(metrics) == {"RR@10", "nDCG@10", "AP@100", "RR@100", "R@5", "R@20"}
    assert abs(metrics["RR@10"] - 0.8644) < 5e-4  # the demo's zero-shot MiniLM number


def test_bad_input_exits_2_with_file_and_line(tmp_path, capsys):
    src = tmp_path / "collection.tsv"
    src.write_bytes(b"1\tfine\n2\tbad \xff byte\n")
    rc = main(["ingest", str(src), "--format", "msmarco", "--out", str(tmp_path / "c")])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"{src}:2:" in err and "UTF-8" in err
    assert not (tmp_path / "c").exists()  # nothing half-written


def test_unknown_override_is_a_clear_error(tmp_path, capsys):
    rc = main(["evaluate", "--run", "x", "--qrels", "y", "eval.nope=1"])
    assert rc == 2 and "eval.nope" in capsys.readouterr().err


def test_ingest_then_qrels_check(tmp_path, capsys):
    (tmp_path / "c.tsv").write_text("d1\tone\nd2\ttwo\n")
    (tmp_path / "q.trec").write_text("q1 0 d1 1\nq1 0 d9 1\n")
    rc = main(["ingest", str(tmp_path / "c.tsv"), "--format", "msmarco", "--out", str(tmp_path / "out"),
               "--variant", "custom", "--qrels", f"dev={tmp_path / 'q.trec'}"])
    err = capsys.readouterr().err
    assert rc == 2 and "q.trec:2:" in err and "'d9'" in err
