"""`pipeline reproduce run` end to end: the FAQ cells of the matrix run as a user runs them and must pass
(in every CI run), and the runner's exit codes, result file and refusals on a small matrix of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main

pytestmark = pytest.mark.integration

RUN = Path(__file__).resolve().parents[1] / "data" / "python_faq_minilm_top20.trec"


def test_the_faq_cells_run_and_pass(tmp_path, capsys):
    """The matrix's bundled cells (MiniLM zero-shot, fp32 and int8) through every step of the CLI."""
    assert main(["reproduce", "run", "faq-minilm-zero-shot", "faq-minilm-int8", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for cell in ("faq-minilm-zero-shot", "faq-minilm-int8"):
        result = json.loads((tmp_path / cell / "result.json").read_text())
        assert result["passed"] and abs(result["difference"]) <= result["tolerance"], result
        assert [s["rc"] for s in result["steps"]] == [0] * 5
        assert f"[reproduce] {cell}: nDCG@10" in out and "PASSED" in out

def test_run_compares_writes_its_result_and_exits_0_1_or_2(tmp_path, tiny_model_dir, capsys):
    folder = _tiny_matrix(tmp_path, tiny_model_dir, expected=2.0)  # unreachable: ran and missed
    args = ["reproduce", "run", "tiny-faq", "--matrix", str(folder), "--work", str(tmp_path / "w")]
    assert main(args) == 2  # the model is a dataset it was not given
    err = capsys.readouterr().err
    assert "cell tiny-faq needs dataset run: a TREC run of the FAQ's queries; get it from tests/data" in err
    assert main(args + ["--data", f"run={RUN}", "--record"]) == 1
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "w" / "tiny-faq" / "result.json").read_text())
    assert result["passed"] is False and 0 <= result["got"] <= 1 and result["expected"] == 2.0
    assert result["difference"] == pytest.approx(result["got"] - 2.0) and len(result["steps"]) == 2
    assert result["machine"]["cpu"] and result["versions"]["torch"] and "MISSED" in out
    assert (folder / "results" / "tiny-faq.json").exists()  # --record: what list and report show
    got = result["got"]
    folder2 = _tiny_matrix(tmp_path / "b", tiny_model_dir, expected=round(got, 4))
    assert main(["reproduce", "run", "tiny-faq", "--matrix", str(folder2), "--work", str(tmp_path / "w2"),
                 "--data", f"run={RUN}"]) == 0
    assert "PASSED" in capsys.readouterr().out
    # a folder the runner did not make is never used (nor emptied)
    (tmp_path / "w3" / "tiny-faq").mkdir(parents=True)
    (tmp_path / "w3" / "tiny-faq" / "mine.txt").write_text("keep")
    assert main(["reproduce", "run", "tiny-faq", "--matrix", str(folder2), "--work", str(tmp_path / "w3"),
                 "--data", f"run={RUN}"]) == 2
    assert (tmp_path / "w3" / "tiny-faq" / "mine.txt").read_text() == "keep"
    assert main(["reproduce", "list", "--matrix", str(folder)]) == 0
    assert "missed" in capsys.readouterr().out
    # a finished run kept in the matrix afterwards, without running it again
    (folder / "results" / "tiny-faq.json").unlink()
    assert main(["reproduce", "record", "tiny-faq", "--matrix", str(folder), "--work", str(tmp_path / "w")]) == 0
    kept = json.loads((folder / "results" / "tiny-faq.json").read_text())
    assert kept["got"] == result["got"] and str(tmp_path) not in json.dumps(kept)  # paths as placeholders
    assert main(["reproduce", "record", "tiny-faq", "--matrix", str(folder), "--work", str(tmp_path / "none")]) == 2


def test_paths_with_spaces_quotes_and_equals_stay_one_argument(tmp_path, tiny_model_dir, capsys):
    import shutil

    odd = tmp_path / "my data's \"x\" key=value"
    odd.mkdir()
    shutil.copy(RUN, odd / "run file.trec")
    first = _tiny_matrix(tmp_path / "a", tiny_model_dir, expected=2.0)
    work = tmp_path / "work dir 'q' a=b"
    assert main(["reproduce", "run", "tiny-faq", "--matrix", str(first), "--work", str(work),
                 "--data", f"run={odd / 'run file.trec'}"]) == 1
    got = json.loads((work / "tiny-faq" / "result.json").read_text())["got"]
    assert 0 < got <= 1 and "unrecognized arguments" not in capsys.readouterr().err


def test_the_data_is_checked_before_the_first_command(tmp_path, tiny_model_dir, capsys):
    folder = _tiny_matrix(tmp_path, tiny_model_dir, expected=0.5)
    doc = yaml.safe_load((folder / "tiny.yaml").read_text())
    doc["datasets"]["faq"]["identify"] = {"passages": 5183, "test_queries": 300}  # SciFact's counts
    (folder / "tiny.yaml").write_text(yaml.safe_dump(doc))
    work = tmp_path / "w"
    assert main(["reproduce", "run", "tiny-faq", "--matrix", str(folder), "--work", str(work),
                 "--data", f"run={RUN}"]) == 2
    err = capsys.readouterr().err
    assert "not the dataset the cell names" in err and "passages 176 (expected 5,183)" in err
    assert not work.exists()  # nothing ran


def test_data_inside_the_work_folder_is_refused_and_kept(tmp_path, tiny_model_dir, capsys):
    import shutil

    folder = _tiny_matrix(tmp_path, tiny_model_dir, expected=0.5)
    work = tmp_path / "w"
    assert main(["reproduce", "run", "tiny-faq", "--matrix", str(folder), "--work", str(work),
                 "--data", f"run={RUN}"]) in (0, 1)
    inside = work / "tiny-faq" / "corpus" / "run.trec"
    shutil.copy(RUN, inside)
    assert main(["reproduce", "run", "tiny-faq", "--matrix", str(folder), "--work", str(work),
                 "--data", f"run={inside}"]) == 2
    assert "inside (or holding) the cell's work folder" in capsys.readouterr().err and inside.exists()
    # a user's notes in an earlier work folder: refused, never deleted
    (work / "tiny-faq" / "notes.txt").write_text("mine")
    assert main(["reproduce", "run", "tiny-faq", "--matrix", str(folder), "--work", str(work),
                 "--data", f"run={RUN}"]) == 2
    assert (work / "tiny-faq" / "notes.txt").read_text() == "mine" and inside.exists()
    assert "notes.txt, which this cell's commands did not make" in capsys.readouterr().err


def test_no_figure_exits_3_and_an_unreadable_metric_writes_a_failed_result(tmp_path, tiny_model_dir, capsys):
    folder = _tiny_matrix(tmp_path, tiny_model_dir, expected=0.5)
    doc = yaml.safe_load((folder / "tiny.yaml").read_text())
    doc["cells"][0]["expected"] = None
    (folder / "tiny.yaml").write_text(yaml.safe_dump(doc))
    args = ["reproduce", "run", "tiny-faq", "--matrix", str(folder), "--data", f"run={RUN}"]
    assert main(args + ["--work", str(tmp_path / "w")]) == 3
    assert "no figure to compare with (exit 3)" in capsys.readouterr().out
    doc["cells"][0]["metric"]["key"] = "metrics.nope"
    (folder / "tiny.yaml").write_text(yaml.safe_dump(doc))
    assert main(args + ["--work", str(tmp_path / "w")]) == 2
    result = json.loads((tmp_path / "w" / "tiny-faq" / "result.json").read_text())
    assert result["passed"] is False and "cannot read metrics.nope" in result["error"]
    assert result["runtime"]["cpu_threads"] and result["code_digest"]


def _tiny_matrix(tmp_path: Path, tiny_model_dir: Path, expected: float) -> Path:
    """A one-cell matrix of its own: the bundled FAQ ingested, a given TREC run evaluated on it."""
    folder = tmp_path / "matrix"
    folder.mkdir(parents=True)
    work = "{work}"
    doc = {"family": "tiny", "title": "tiny",
           "datasets": {"faq": {"layout": "a BEIR folder", "bundled": "python_faq"},
                        "run": {"layout": "a TREC run of the FAQ's queries", "get": "tests/data"}},
           "cells": [{"id": "tiny-faq", "title": "a run of the FAQ, evaluated", "data": ["faq", "run"],
                      "commands": [f"pipeline ingest {{faq}} --out {work}/corpus",
                                   f"pipeline evaluate --run {{run}} --qrels {work}/corpus/qrels/test.trec "
                                   f"--measures nDCG@10 --json {work}/m.json"],
                      "metric": {"name": "nDCG@10", "file": "m.json", "key": "metrics.nDCG@10"},
                      "expected": expected, "tolerance": 0.001, "tolerance_why": "test", "source": "test",
                      "hardware": {"class": "2-core CPU", "wall": "1 min"}}]}
    (folder / "tiny.yaml").write_text(yaml.safe_dump(doc))
    return folder


def test_a_work_folder_of_an_unknown_user_or_an_empty_data_folder_is_one_line(tmp_path, capsys):
    assert main(["reproduce", "run", "faq-minilm-zero-shot", "--work", "~nosuchuser42/x"]) == 2
    assert "~nosuchuser42 is not a user of this machine" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["reproduce", "run", "beir-scifact-minilm", "--data", f"scifact={tmp_path / 'empty'}",
                 "--work", str(tmp_path / "w")]) == 2
    assert "passages 0 (expected 5,183)" in capsys.readouterr().err and not (tmp_path / "w").exists()



def test_a_paired_cell_passes_only_a_real_difference_and_fails_a_no_op(tmp_path, tiny_model_dir, capsys):
    """A paired cell is judged as the difference to its baseline with a paired test over queries: a method whose
    run is its baseline's (a no-op) misses; one that ranks every judged answer first passes."""
    qrels = Path(__file__).resolve().parents[2] / "pipeline" / "resources" / "python_faq" / "qrels" / "test.tsv"
    best = tmp_path / "best.trec"
    lines = [ln.split("\t") for ln in qrels.read_text().splitlines()[1:] if ln.strip()]
    best.write_text("".join(f"{q} Q0 {d} 1 10.0 best\n" for q, d, *_ in lines))
    folder = _tiny_matrix(tmp_path, tiny_model_dir, expected=0.5)
    doc = yaml.safe_load((folder / "tiny.yaml").read_text())
    base = dict(doc["cells"][0], id="tiny-base", expected=0.8, tolerance=0.5)
    doc["datasets"]["method"] = {"layout": "a TREC run", "get": "the test"}
    method = dict(doc["cells"][0], id="tiny-method", data=["faq", "method"], expected=1.0, tolerance=0.02,
                  baseline="tiny-base", paired=True)
    method["commands"] = [c.replace("{run}", "{method}") for c in method["commands"]]
    work = tmp_path / "w"
    args = ["reproduce", "run", "tiny-method", "--matrix", str(folder), "--data", f"run={RUN}"]
    method["published_difference"] = 0.1
    doc["cells"] = [base, method]
    (folder / "tiny.yaml").write_text(yaml.safe_dump(doc))
    # the published difference is what ranking every judged answer first gains over the baseline run
    assert main(["reproduce", "run", "tiny-base", "--matrix", str(folder), "--data", f"run={RUN}",
                 "--work", str(tmp_path / "probe")]) in (0, 1)
    gain = 1.0 - json.loads((tmp_path / "probe" / "tiny-base" / "result.json").read_text())["got"]
    method["published_difference"] = round(gain, 4)
    doc["cells"] = [base, method]
    (folder / "tiny.yaml").write_text(yaml.safe_dump(doc))
    assert main(args + ["--data", f"method={best}", "--work", str(work)]) == 0
    verdict = json.loads((work / "tiny-method" / "result.json").read_text())["paired"]
    assert verdict["passed"] and verdict["p_randomization"] < 0.05 and verdict["difference"] == pytest.approx(gain)
    assert main(args + ["--data", f"method={RUN}", "--work", str(tmp_path / "noop")]) == 1  # the no-op
    verdict = json.loads((tmp_path / "noop" / "tiny-method" / "result.json").read_text())["paired"]
    assert not verdict["passed"] and verdict["difference"] == 0 and "MISSED" in capsys.readouterr().out


def test_a_paired_qa_cell_is_tested_over_questions(tmp_path, capsys):
    """A paired cell scored by `evaluate --qa` (DAR's Table 6: answer-based MRR over the top 100) is tested over
    the per-question values its evaluate step writes (eval.per_query=true): a method that ranks each question's
    answer passage first passes, a no-op (the baseline's own run) misses with a difference of 0."""
    n = 30
    coll = tmp_path / "collection.tsv"
    coll.write_text("".join(f"p{i}\tpassage {i} mentions answerword{i} once.\n" for i in range(n)), encoding="utf-8")
    qa = tmp_path / "qa.csv"
    qa.write_text("".join(f"question {i}\t[\"answerword{i}\"]\n" for i in range(n)), encoding="utf-8")

    def run(rank: int, path: Path) -> Path:  # question i's answer passage at `rank`, four others around it
        rows = []
        for i in range(n):
            others = [f"p{(i + j) % n}" for j in range(1, 5)]
            docs = others[:rank - 1] + [f"p{i}"] + others[rank - 1:]
            rows += [f"{i} Q0 {d} {r} {10 - r} t\n" for r, d in enumerate(docs, 1)]
        path.write_text("".join(rows))
        return path

    base_run, best_run = run(5, tmp_path / "base.trec"), run(1, tmp_path / "best.trec")
    folder = tmp_path / "matrix"
    folder.mkdir()
    cell = {"title": "a QA run", "data": ["coll", "qa", "run"],
            "commands": ["pipeline ingest {coll} --format msmarco --variant custom --out {work}/c",
                         "pipeline evaluate --run {run} --qa {qa} --corpus {work}/c --json {work}/m.json "
                         "eval.per_query=true"],
            "metric": {"name": "MRR@100", "file": "m.json", "key": "metrics.MRR@100"},
            "tolerance": 0.01, "tolerance_why": "test", "source": "test",
            "hardware": {"class": "2-core CPU", "wall": "1 min"}}
    doc = {"family": "tinyqa", "title": "tiny QA",
           "datasets": {k: {"layout": k, "get": "the test"} for k in ("coll", "qa", "run", "method")},
           "cells": [dict(cell, id="qa-base", expected=0.2),
                     dict(cell, id="qa-method", data=["coll", "qa", "method"], expected=1.0, baseline="qa-base",
                          paired=True, published_difference=0.8,
                          commands=[c.replace("{run}", "{method}") for c in cell["commands"]])]}
    (folder / "tinyqa.yaml").write_text(yaml.safe_dump(doc))
    args = ["reproduce", "run", "qa-method", "--matrix", str(folder), "--data", f"coll={coll}", "--data", f"qa={qa}",
            "--data", f"run={base_run}"]
    assert main(args + ["--data", f"method={best_run}", "--work", str(tmp_path / "w")]) == 0
    verdict = json.loads((tmp_path / "w" / "qa-method" / "result.json").read_text())["paired"]
    assert verdict["difference"] == pytest.approx(0.8) and verdict["p_randomization"] < 0.05 and verdict["passed"]
    assert main(args + ["--data", f"method={base_run}", "--work", str(tmp_path / "noop")]) == 1
    verdict = json.loads((tmp_path / "noop" / "qa-method" / "result.json").read_text())["paired"]
    assert verdict["difference"] == 0 and not verdict["test_agrees_on_sign"] and not verdict["passed"]
    capsys.readouterr()
    # without per-question values the test is not possible, and the cell says why
    for c in doc["cells"]:
        c["commands"][1] = c["commands"][1].replace(" eval.per_query=true", "")
    (folder / "tinyqa.yaml").write_text(yaml.safe_dump(doc))
    assert main(args + ["--data", f"method={best_run}", "--work", str(tmp_path / "w2")]) == 1
    assert "evaluate --qa --per-query writes them" in capsys.readouterr().out
