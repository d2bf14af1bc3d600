"""The matrix's rules (pipeline/reproduce/checks.py) on small matrices, the loader's new keys (tolerance_evidence,
paired cells, a family's uncovered figures), and the shipped matrix keeping every rule."""

from __future__ import annotations

import pytest
import yaml

from pipeline.errors import ConfigError
from pipeline.reproduce import load_matrix
from pipeline.reproduce.checks import check_rules


def _cell(cid: str, expected, tolerance: float, evidence: dict | None = None, **extra) -> dict:
    cell = {"id": cid, "title": cid, "data": ["faq"],
            "commands": ["pipeline evaluate --run {work}/run.trec --qrels {work}/q.trec --json {work}/m.json"],
            "metric": {"name": "nDCG@10", "file": "m.json", "key": "metrics.nDCG@10"},
            "expected": expected, "tolerance": tolerance, "tolerance_why": "test", "source": "test",
            "hardware": {"class": "2-core CPU", "wall": "1 min"}}
    if evidence is not None:
        cell["tolerance_evidence"] = evidence
    cell.update(extra)
    return cell


def _matrix(tmp_path, cells: list[dict], **family):
    folder = tmp_path / "matrix"
    folder.mkdir(exist_ok=True)
    doc = {"family": "tiny", "title": "tiny", "datasets": {"faq": {"layout": "a BEIR folder", "bundled": "python_faq"}},
           "cells": cells, **family}
    (folder / "tiny.yaml").write_text(yaml.safe_dump(doc))
    return load_matrix(folder)


def _ev(kind: str, width: float) -> dict:
    return {"kind": kind, "width": width, "note": "test"}


def _problems(tmp_path, cells, cell_id=None):
    problems = check_rules(_matrix(tmp_path, cells))
    return [p for p in problems if cell_id is None or p.startswith(f"{cell_id}:")]


@pytest.mark.parametrize("kind, factor", [("seeds", 2), ("resolution", 3), ("reproduction_gap", 1),
                                          ("published_rounding", 1)])
def test_a_tolerance_wider_than_its_evidence_allows_fails(tmp_path, kind, factor):
    at_limit = _cell("at-limit", 0.5, factor * 0.004, _ev(kind, 0.004))
    wider = _cell("wider", 0.5, factor * 0.004 * 1.1, _ev(kind, 0.004))
    problems = _problems(tmp_path, [at_limit, wider])
    assert problems == [p for p in problems if p.startswith("wider:")] and len(problems) == 1
    assert "wider than its evidence allows" in problems[0] and kind in problems[0]


def test_three_queries_worth_holds_exactly_despite_floating_point(tmp_path):
    """3 x (1/300) is 0.009999999999999998; a width written to six digits (0.00333333) still allows 0.01."""
    cells = [_cell("exact", 0.6, 0.01, _ev("resolution", 1 / 300)), _cell("written", 0.6, 0.01,
                                                                          _ev("resolution", 0.00333333))]
    assert _problems(tmp_path, cells) == []


def test_a_cell_without_tolerance_evidence_fails(tmp_path):
    problems = _problems(tmp_path, [_cell("bare", 0.5, 0.001), _cell("backed", 0.5, 0.001, _ev("resolution", 0.01))])
    assert len(problems) == 1 and problems[0].startswith("bare: no tolerance_evidence")


def test_a_cell_without_a_figure_still_needs_evidence(tmp_path):
    assert _problems(tmp_path, [_cell("no-figure", None, 0.01)], "no-figure")
    assert not _problems(tmp_path, [_cell("no-figure", None, 0.01, _ev("resolution", 0.004))])


def test_a_method_cell_a_no_op_would_pass_fails_and_its_paired_form_passes(tmp_path):
    base = _cell("base", 0.4321, 0.0115, _ev("reproduction_gap", 0.0115))
    method = _cell("method", 0.4418, 0.0115, _ev("reproduction_gap", 0.0115), baseline="base")
    problems = _problems(tmp_path, [base, method])
    assert len(problems) == 1 and problems[0].startswith("method: its baseline base's figure 0.4321 lies inside")
    paired = dict(method, paired=True, published_difference=0.0097)
    (zero,) = _problems(tmp_path, [base, paired])  # its claim is the difference: +0.0097 ± 0.0115 lets 0 pass
    assert zero.startswith("method: its claim is the difference +0.0097, and +0.0097 ± 0.0115 lets a difference "
                           "of 0 (a method that does nothing) pass")
    paired = dict(paired, tolerance=0.0096)
    assert _problems(tmp_path, [base, paired]) == []
    # narrowing with evidence is the other way out: the baseline then lies outside
    narrowed = _cell("method", 0.4418, 0.005, _ev("reproduction_gap", 0.005), baseline="base")
    assert _problems(tmp_path, [base, narrowed]) == []


def test_a_paired_cell_s_published_difference_must_agree_with_the_two_figures(tmp_path):
    base = _cell("base", 0.338, 0.0005, _ev("published_rounding", 0.0005))
    ok = _cell("titled", 0.353, 0.0005, _ev("published_rounding", 0.0005), baseline="base", paired=True,
               published_difference=0.015)
    assert _problems(tmp_path, [base, ok]) == []
    swapped = dict(ok, published_difference=-0.015)
    (problem,) = _problems(tmp_path, [base, swapped])
    assert problem.startswith("titled: published_difference -0.015 disagrees")


def test_a_baseline_must_exist_and_measure_the_same_metric(tmp_path):
    ev = _ev("resolution", 0.01)
    lost = _cell("method", 0.5, 0.01, ev, baseline="nowhere")
    assert _problems(tmp_path, [lost]) == ["method: baseline nowhere is not a cell of the matrix"]
    other = _cell("base", 0.3, 0.01, ev, metric={"name": "RR@10", "file": "m.json", "key": "metrics.RR@10"})
    (problem,) = _problems(tmp_path, [other, dict(lost, baseline="base")])
    assert "measures RR@10, the cell nDCG@10" in problem


@pytest.mark.parametrize("change, message", [
    ({"tolerance_evidence": {"kind": "vibes", "width": 0.01, "note": "x"}}, "tolerance_evidence.kind must be one of"),
    ({"tolerance_evidence": {"kind": "seeds", "width": 0.01}}, "needs exactly kind, width and note"),
    ({"tolerance_evidence": {"kind": "seeds", "width": -1, "note": "x"}}, "width must be a finite number >= 0"),
    ({"tolerance_evidence": {"kind": "seeds", "width": 0.01, "note": " "}}, "note must say where"),
    ({"paired": True, "baseline": "b"}, "a paired cell needs published_difference"),
    ({"paired": True, "published_difference": 0.01}, "a paired cell needs baseline"),
    ({"published_difference": 0.01}, "belongs to a paired cell"),
    ({"paired": "yes"}, "paired must be true or false"),
    ({"published_difference": float("nan"), "paired": True, "baseline": "b"}, "published_difference must be a finite"),
])
def test_the_loader_refuses_a_malformed_new_key_naming_the_cell(tmp_path, change, message):
    cell = _cell("bad-cell", 0.5, 0.01, _ev("resolution", 0.01), **change)
    with pytest.raises(ConfigError, match=message) as e:
        _matrix(tmp_path, [cell])
    assert "bad-cell" in str(e.value)


def test_a_family_lists_its_uncovered_figures_and_the_loader_checks_them(tmp_path):
    entries = [{"figures": "Table 7 (memory and time)", "count": 15, "reason": "not built"},
               {"figures": "an average", "reason": "no command averages"}]
    m = _matrix(tmp_path, [_cell("c", 0.5, 0.01, _ev("resolution", 0.01))], uncovered=entries)
    assert m.families["tiny"]["uncovered"] == entries
    for bad, message in [([{"figures": "x"}], "needs figures and reason"),
                         ([{"figures": "x", "reason": "y", "count": 0}], "count must be a whole number"),
                         ([{"figures": "", "reason": "y"}], "non-empty text"), ({"figures": "x"}, "must be a list")]:
        with pytest.raises(ConfigError, match=message):
            _matrix(tmp_path, [_cell("c", 0.5, 0.01, _ev("resolution", 0.01))], uncovered=bad)


def test_the_shipped_matrix_keeps_every_rule():
    m = load_matrix()
    assert check_rules(m) == []
    cells = [c for c in m.cells.values() if not c.experiment]
    assert all(c.tolerance_evidence for c in cells)
    # every method cell of the papers' tables names its baseline, and a paired one says the paper's difference
    method = [c for c in cells if c.baseline]
    assert len(method) >= 41
    for c in method:
        base = m.cells[c.baseline]
        if c.paired:
            assert c.expected - base.expected == pytest.approx(c.published_difference, abs=0.0011), c.id
        elif c.expected is not None and base.expected is not None:
            assert abs(c.expected - base.expected) > c.tolerance, c.id


def test_the_shipped_matrix_carries_the_corrections_of_the_outside_read():
    """Issue 40: DPR-Single's top-100, RCL's table numbers and encoder, DAR's query counts."""
    m = load_matrix()
    assert m.cells["dpr-released-nq-test-top100"].expected == pytest.approx(0.8610)
    assert "0.8610" in m.cells["dpr-released-nq-test-top100"].source
    for c in m.cells.values():
        if c.family == "rcl":
            assert any("SRoBERTa" in d for d in c.deviations), c.id
            assert ("Table 2" in c.source) == c.id.startswith("rcl-faq-"), c.id
            if c.id.startswith("rcl-faq-"):
                assert "assumed" in c.notes, c.id
        if c.id.startswith("dar-t2-msmarco-"):
            assert any("6,591" in d or "32,927" in d for d in c.deviations), c.id
        if "nq-dev" in c.data:
            assert any("6,515" in d and "8,757" in d for d in c.deviations), c.id
    # every family of the papers says what no cell reproduces, and why
    for fam in ("rcl", "authorship", "nq", "msmarco", "beir"):
        assert m.families[fam]["uncovered"], fam


def test_an_identify_key_no_layout_counts_is_refused_when_the_matrix_loads(tmp_path):
    """authorship `training_samples`/`authors` and the NQ JSON's `questions_in_json` were reported as not counted
    and never checked, and a misspelt key turned its check off: the loader refuses a key the dataset's layout
    does not count."""
    def load(identify, layout="a BEIR folder"):
        folder = tmp_path / "m"
        folder.mkdir(exist_ok=True)
        doc = {"family": "tiny", "title": "tiny", "datasets": {"d": {"layout": layout, "get": "x",
                                                                    "identify": identify}},
               "cells": [_cell("c", 0.5, 0.001, _ev("resolution", 0.01))]}
        doc["cells"][0]["data"] = ["d"]
        (folder / "tiny.yaml").write_text(yaml.safe_dump(doc))
        return load_matrix(folder)

    load({"passages": 5, "test_queries": 3, "test_judgements_sha256": "ab12"})
    load({"questions_in_json": 4}, layout="DPR's retriever training file")
    for identify, layout in [({"pasages": 5}, "a BEIR folder"), ({"training_samples": 9}, "authorship records"),
                             ({"judged_queries": 43}, "TREC DL 2019 queries (qid<TAB>text)")]:
        with pytest.raises(ConfigError, match=f"identify {next(iter(identify))} cannot be counted for its layout"):
            load(identify, layout)


def test_judgements_shuffled_between_queries_are_not_the_dataset(tmp_path):
    """The data check compared counts only: NFCorpus with its test judgements shuffled passed as NFCorpus. The
    judgements' digest (sorted triples: any order or layout of the same judgements is the same) tells them apart."""
    from pipeline.data.identify import check_identity
    from pipeline.effects.identity import judgements_digest
    from pipeline.errors import PipelineError

    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "b"}\n')
    lines = ["query-id\tcorpus-id\tscore", "q1\td1\t1", "q2\td2\t1"]
    (folder / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
    want = judgements_digest(folder / "qrels" / "test.tsv")
    spec = {"layout": "a BEIR folder", "identify": {"passages": 2, "test_queries": 2, "test_judgements_sha256": want}}
    assert check_identity("d", spec, str(folder)) == []
    (folder / "qrels" / "test.tsv").write_text("\n".join([lines[0], lines[2], lines[1]]) + "\n")  # reordered: same
    assert check_identity("d", spec, str(folder)) == []
    (folder / "qrels" / "test.tsv").write_text("\n".join([lines[0], "q1\td2\t1", "q2\td1\t1"]) + "\n")
    with pytest.raises(PipelineError, match="test_judgements_sha256 .* other judgements than the dataset's"):
        check_identity("d", spec, str(folder))


def test_questions_in_a_dpr_json_are_counted_streaming(tmp_path):
    from pipeline.data.identify import count

    path = tmp_path / "biencoder.json"
    path.write_text('[{"question": "a", "positive_ctxs": [{"text": "x"}], "negative_ctxs": []},'
                    ' {"question": "b", "positive_ctxs": [], "hard_negative_ctxs": [{"text": "y"}, {"text": "z"}]}]')
    assert count(path, "questions_in_json") == 2
    path.write_text("not json")
    assert count(path, "questions_in_json") == 0
