"""The reproduction matrix as data (repro/*.yaml): every cell checked (schema, data, each command parsed by
the real CLI and its config loaded), the cells the project promises are there, the runner's exit codes
and result file, and docs/reproductions.md rendered from the matrix as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main
from pipeline.cli import build_parser
from pipeline.cli.reproduce import check_command

PARSER = build_parser()
from pipeline.errors import ConfigError
from pipeline.reproduce import load_matrix, render_report

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def matrix():
    return load_matrix()


@pytest.mark.slow
def test_every_cell_parses_with_the_real_cli_and_configs(matrix):
    n = 0
    for cell in matrix.cells.values():
        if cell.experiment:
            continue  # an experiment's commands: test_check_parses_the_experiments_commands
        values = {d: f"/data/{d}" for d in cell.data} | {"work": "/tmp/w"}
        for command in cell.commands:
            check_command(command.format(**values), PARSER)
            n += 1
    assert n > 500


@pytest.mark.slow
def test_check_parses_every_command_from_another_folder_and_keeps_the_rules(tmp_path, monkeypatch, capsys):
    """Relative configs are read from the repository wherever check runs; the matrix keeps its own rules."""
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "check"]) == 0
    assert "every one parses" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="optim.lr"):
        check_command("pipeline train --config jobs/configs/dpr.yaml optim.lr=-5", PARSER)
    with pytest.raises(ConfigError, match="exists neither here nor in the repository"):
        check_command("pipeline train --config jobs/configs/nope.yaml", PARSER)


def test_the_rules_refuse_a_cell_a_no_op_would_pass_and_a_tolerance_that_lets_zero_pass(tmp_path, tiny_model_dir):
    from pipeline.reproduce.checks import check_rules

    folder = _tiny_matrix(tmp_path, tiny_model_dir, expected=0.5)
    doc = yaml.safe_load((folder / "tiny.yaml").read_text())
    base = dict(doc["cells"][0], id="tiny-base", expected=0.495)
    method = dict(doc["cells"][0], id="tiny-method", expected=0.5, tolerance=0.01, baseline="tiny-base")
    zero = dict(doc["cells"][0], id="tiny-zero", expected=0.011, tolerance=0.015)
    doc["cells"] = [base, method, zero]
    (folder / "tiny.yaml").write_text(yaml.safe_dump(doc))
    problems = check_rules(load_matrix(folder))
    assert any(p.startswith("tiny-method: its baseline tiny-base") for p in problems)
    assert any(p.startswith("tiny-zero:") and "lets a figure of 0 pass" for p in problems)
    assert not any(p.startswith("tiny-base") for p in problems)


def test_the_matrix_holds_the_cells_the_project_promises(matrix):
    ids = set(matrix.cells)
    beir = {"arguana", "climate-fever", "dbpedia-entity", "fever", "fiqa", "hotpotqa", "msmarco", "nfcorpus", "nq", "quora",
            "scidocs", "scifact", "webis-touche2020", "trec-covid"}
    assert {f"beir-{b}-minilm" for b in beir} <= ids
    assert len([i for i in ids if i.startswith("beir-cqadupstack-")]) == 12
    assert matrix.cells["beir-scifact-minilm"].expected == pytest.approx(0.64508)
    assert matrix.cells["stsb-minilm"].expected == pytest.approx(0.82032)
    assert matrix.cells["ance-released-msmarco-dev-rr10"].expected == 0.330
    assert matrix.cells["ance-released-msmarco-dev-r1000"].expected == 0.959
    assert {"dpr-released-nq-test-top20", "dpr-released-nq-test-top100"} <= ids
    for table in ("t1", "t2", "t6", "t8"):  # the DAR paper's tables
        assert any(i.startswith(f"dar-{table}-") for i in ids), table
    assert len([i for i in ids if i.startswith("arr-t2-")]) == 42 and len([i for i in ids if i.startswith("arr-t3-")]) == 28
    assert len([i for i in ids if i.startswith("tale-t1-dpr-cls-")]) == 8  # the two MS MARCOs, dense rows
    assert any(i.startswith("rcl-sts-") for i in ids) and any(i.startswith("rcl-faq-") for i in ids)
    assert {"faq-minilm-zero-shot", "faq-minilm-int8"} <= ids
    assert all(c.project for c in matrix.cells.values() if c.family in ("faq", "project"))
    # a published figure names its source; a GPU-scale cell says so and is never dropped
    for c in matrix.cells.values():
        assert c.source and c.tolerance_why and c.hardware["class"] and c.hardware["wall"], c.id
        assert c.runs_here or c.hardware["class"] != "2-core CPU" or c.family == "authorship", c.id


def test_list_json_is_the_matrix_as_data(capsys):
    assert main(["reproduce", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    keys = {"id", "title", "data", "metric", "expected", "tolerance", "hardware", "source", "status"}
    assert len(rows) > 150 and all(keys <= set(r) for r in rows)
    faq = next(r for r in rows if r["id"] == "faq-minilm-zero-shot")
    assert faq["data_present"] == {"python_faq": True} and faq["metric"] == "nDCG@10"


def _tiny_matrix(tmp_path: Path, tiny_model_dir: Path, expected: float) -> Path:
    folder = tmp_path / "matrix"
    folder.mkdir(parents=True)
    work = "{work}"
    doc = {"family": "tiny", "title": "tiny",
           "datasets": {"faq": {"layout": "a BEIR folder", "bundled": "python_faq"},
                        "tiny": {"layout": "a model folder", "get": "tests' tiny BERT"}},
           "cells": [{"id": "tiny-faq", "title": "tiny BERT on the FAQ", "data": ["faq", "tiny"],
                      "commands": [f"pipeline ingest {{faq}} --out {work}/corpus",
                                   f"pipeline encode --corpus {work}/corpus --out {work}/emb --model {{tiny}} "
                                   "model.pooling=mean model.normalize=true encode.backend=torch encode.runner=local",
                                   f"pipeline index --embeddings {work}/emb --out {work}/index",
                                   f"pipeline retrieve --index {work}/index --queries {work}/corpus/queries.tsv "
                                   f"--out {work}/run.trec --top-k 10",
                                   f"pipeline evaluate --run {work}/run.trec --qrels {work}/corpus/qrels/test.trec "
                                   f"--measures nDCG@10 --json {work}/m.json"],
                      "metric": {"name": "nDCG@10", "file": "m.json", "key": "metrics.nDCG@10"},
                      "expected": expected, "tolerance": 0.001, "tolerance_why": "test", "source": "test",
                      "tolerance_evidence": {"kind": "resolution", "width": 0.01, "note": "test"},
                      "hardware": {"class": "2-core CPU", "wall": "1 min"}}]}
    (folder / "tiny.yaml").write_text(yaml.safe_dump(doc))
    return folder


@pytest.mark.parametrize("change, message", [
    ({"bogus": 1}, "unknown key"),
    ({"data": ["faq", "tiny", "nope"]}, "data 'nope' is not a dataset"),
    ({"commands": ["pipeline encode --corpus {elsewhere}"]}, "names elsewhere"),
    ({"commands": ["python train.py"]}, "is a `pipeline ...` command"),
    ({"hardware": {"class": "a toaster", "wall": "1 min"}}, "hardware needs class"),
    ({"metric": {"name": "x"}}, "metric needs name, file and key"),
    ({"tolerance": float("inf")}, "tolerance must be a finite number"),
    ({"expected": float("nan")}, "expected must be a finite number"),
    ({"expected": True}, "expected must be a finite number"),
])
def test_a_malformed_cell_is_refused_naming_it(tmp_path, tiny_model_dir, change, message):
    folder = _tiny_matrix(tmp_path, tiny_model_dir, expected=0.5)
    doc = yaml.safe_load((folder / "tiny.yaml").read_text())
    doc["cells"][0].update(change)
    (folder / "tiny.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=message):
        load_matrix(folder)


def test_a_command_the_cli_refuses_is_named():
    with pytest.raises(ConfigError, match="the CLI refuses it"):
        check_command("pipeline encode --no-such-flag x", PARSER)
    with pytest.raises(ConfigError, match="train.batch_size"):
        check_command("pipeline train --config jobs/configs/dpr.yaml train.batch_size=0", PARSER)


def test_the_committed_page_is_the_matrix_rendered(matrix):
    """docs/reproductions.md is `pipeline reproduce report`'s output for the matrix and its records."""
    from pipeline.cli.reproduce import REPORT_MARK

    assert (ROOT / "docs" / "reproductions.md").read_text() == REPORT_MARK + "\n" + render_report(matrix, None)


def test_the_page_does_not_go_stale_with_the_next_commit(matrix, monkeypatch):
    """The committed page names a result's commit, never its distance from HEAD (which every commit changes, so a
    clone would render another page); `reproduce status` in the terminal says that distance."""
    from pipeline import provenance
    from pipeline.reproduce import status as status_mod

    pages = []
    for n in (3, 8):
        status_mod._age.cache_clear()
        monkeypatch.setattr(provenance, "commits_since", lambda sha, n=n: n)
        monkeypatch.setattr(provenance, "changed_since", lambda sha, paths, n=n: n > 5)
        pages.append(render_report(matrix, None))
    status_mod._age.cache_clear()
    assert pages[0] == pages[1] and "before HEAD," not in pages[0]


def test_an_empty_or_missing_matrix_folder_is_one_error(tmp_path, capsys):
    assert main(["reproduce", "list", "--matrix", str(tmp_path)]) == 2
    assert main(["reproduce", "list", "--matrix", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "no reproduction matrix here" in err and "not a folder" in err


@pytest.mark.slow
def test_report_never_replaces_a_file_it_did_not_write(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("mine")
    assert main(["reproduce", "report", "--out", str(readme)]) == 2
    assert readme.read_text() == "mine" and "not a page" in capsys.readouterr().err
    page = tmp_path / "page.md"
    assert main(["reproduce", "report", "--out", str(page), "--html", str(readme)]) == 2
    assert not page.exists() and readme.read_text() == "mine"
    assert main(["reproduce", "report", "--out", str(page), "--html", str(tmp_path / "p.html")]) == 0
    assert main(["reproduce", "report", "--out", str(page), "--html", str(tmp_path / "p.html")]) == 0  # its own


def test_a_result_file_counts_only_for_its_own_cell_and_definition(tmp_path, matrix):
    import json

    from pipeline.reproduce.status import cell_digest, cell_status, status_word

    cell = matrix.cells["faq-minilm-zero-shot"]
    other = matrix.cells["faq-minilm-int8"]
    work = tmp_path / "runs"
    (work / other.id).mkdir(parents=True)
    fake = {"cell": cell.id, "cell_digest": cell_digest(cell), "got": cell.expected, "date": "2999-01-01",
            "machine": {"cpu": "x"}, "commit": None}
    (work / other.id / "result.json").write_text(json.dumps(fake))  # copied into another cell's folder
    assert cell_status(other, work, tmp_path / "nomatrix") is None
    (work / cell.id).mkdir()
    (work / cell.id / "result.json").write_text(json.dumps({**fake, "cell_digest": "0" * 16}))
    assert status_word(cell_status(cell, work, tmp_path / "nomatrix"), cell) == "stale"
    (work / cell.id / "result.json").write_text(json.dumps(fake))
    assert status_word(cell_status(cell, work, tmp_path / "nomatrix"), cell) == "passed"
