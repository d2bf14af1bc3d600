"""`pipeline compare` / pipeline.eval.compare, and evaluate's --measures / --match and run strictness (CLI).

Values are checked against `evaluate_run` and pytrec_eval, p-values against scipy on
pytrec_eval's per-query numbers and against an exact enumeration of sign flips.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.config import EvalConfig
from pipeline.errors import PipelineError
from pipeline.eval.compare import compare_runs, format_comparison, paired_pvalue
from pipeline.eval.metrics import evaluate_run
from pipeline.eval.runs import read_run

DATA = Path(__file__).resolve().parents[1] / "data"
REAL_RUN = DATA / "python_faq_minilm_top20.trec"
REAL_QRELS = DATA / "python_faq_all.qrels"


def _qrels():
    out: dict[str, dict[str, int]] = {}
    for line in REAL_QRELS.read_text().splitlines():
        q, _, d, r = line.split()
        out.setdefault(q, {})[d] = int(r)
    return out


def _perturbed(run, seed, noise):
    rng = random.Random(seed)
    return {q: {d: s + rng.gauss(0, noise) for d, s in docs.items()} for q, docs in run.items()}


def _write_run(path: Path, run, fingerprint: str | None = None):
    lines = []
    for q, docs in run.items():
        for i, (d, s) in enumerate(sorted(docs.items(), key=lambda x: -x[1]), 1):
            lines.append(f"{q} Q0 {d} {i} {s!r} t")
    path.write_text("\n".join(lines) + "\n")
    if fingerprint:
        Path(str(path) + ".meta.json").write_text(json.dumps(
            {"corpus_fingerprint": fingerprint, "variant": "custom", "title_join": "{title} {text}",
             "n_queries": len(run), "top_k": 20}))
    return path


@pytest.fixture(scope="module")
def runs():
    base = read_run(REAL_RUN)
    return {"base": base, "noisy": _perturbed(base, 1, 0.05), "slight": _perturbed(base, 2, 0.005)}


def test_values_equal_evaluate_and_pvalues_equal_scipy_on_pytrec_eval(runs):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    import scipy.stats as st

    qrels = _qrels()
    res = compare_runs(runs, qrels, "nDCG@10 AP P@5", test="ttest")
    assert res["baseline"] == "base" and res["queries"] == 176 and res["measures"] == ["nDCG@10", "AP", "P@5"]
    for label, run in runs.items():
        assert res["runs"][label]["metrics"] == pytest.approx(
            evaluate_run(run, qrels, EvalConfig(), measures="nDCG@10 AP P@5")["metrics"], abs=1e-12)
    ev = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut_10", "map", "P_5"})
    per = {label: ev.evaluate(run) for label, run in runs.items()}
    qids = sorted(qrels)
    for label in ("noisy", "slight"):
        for name, key in [("nDCG@10", "ndcg_cut_10"), ("AP", "map"), ("P@5", "P_5")]:
            a = np.array([per["base"][q][key] for q in qids])
            b = np.array([per[label][q][key] for q in qids])
            vs = res["runs"][label]["vs_baseline"][name]
            assert vs["delta"] == pytest.approx(b.mean() - a.mean(), abs=1e-9)
            if np.any(b != a):
                assert vs["p_ttest"] == pytest.approx(st.ttest_rel(b, a).pvalue, rel=1e-6)
            else:  # identical per-query values (scipy: nan): reported as no evidence of a difference
                assert vs["p_ttest"] == 1.0
            assert vs["significant_ttest"] == (vs["p_ttest"] < 0.05)
    # the heavy noise is significant, and marked; the header names the test
    assert res["runs"]["noisy"]["vs_baseline"]["nDCG@10"]["p_ttest"] < 0.05
    table = format_comparison(res)
    assert "paired t-test (scipy.stats.ttest_rel)" in table.splitlines()[0]
    noisy_row = next(line for line in table.splitlines() if line.startswith("noisy"))
    assert "*" in noisy_row


def test_randomization_test_is_exact_on_few_queries():
    """With 2^n <= resamples scipy enumerates every sign flip: equal to a brute-force enumeration."""
    rng = np.random.default_rng(0)
    a = rng.random(9)
    b = a + rng.normal(0.15, 0.2, 9)
    d = b - a
    observed = abs(d.mean())
    flips = [abs((d * np.array(s)).mean()) for s in itertools.product([1, -1], repeat=len(d))]
    exact = sum(f >= observed - 1e-12 for f in flips) / len(flips)
    assert paired_pvalue("randomization", b, a, resamples=10_000) == pytest.approx(exact, rel=1e-9)
    # identical values: no evidence at all
    assert paired_pvalue("randomization", a, a) == 1.0 and paired_pvalue("ttest", a, a) == 1.0
    assert paired_pvalue("ttest", a[:1], b[:1]) is None


def test_both_tests_and_identical_runs(runs):
    res = compare_runs({"a": runs["base"], "same": runs["base"], "noisy": runs["noisy"]}, _qrels(), "RR@10",
                       test="both", resamples=2000)
    same = res["runs"]["same"]["vs_baseline"]["RR@10"]
    assert same == {"delta": 0.0, "p_ttest": 1.0, "significant_ttest": False,
                    "p_randomization": 1.0, "significant_randomization": False}
    noisy = res["runs"]["noisy"]["vs_baseline"]["RR@10"]
    assert noisy["p_randomization"] < 0.05 and noisy["significant_randomization"]
    text = format_comparison(res)
    assert "paired randomization test (scipy.stats.permutation_test), 2000 resamples" in text
    assert "p(t) RR@10" in text and "p(rand) RR@10" in text
    md = format_comparison(res, markdown=True)
    assert "| run | RR@10 | Δ RR@10 | p(t) RR@10 | p(rand) RR@10 |" in md


def test_queries_are_paired_over_those_every_run_answers(runs):
    partial = {q: d for i, (q, d) in enumerate(runs["noisy"].items()) if i % 4}
    res = compare_runs({"base": runs["base"], "partial": partial}, _qrels(), "nDCG@10")
    assert res["queries"] == len(partial)
    assert any("left out" in n and "of base" in n for n in res["notes"])
    common = {q: runs["base"][q] for q in partial}
    assert res["runs"]["base"]["metrics"]["nDCG@10"] == pytest.approx(
        evaluate_run(common, _qrels(), EvalConfig(), "nDCG@10")["metrics"]["nDCG@10"], abs=1e-12)


def test_runs_over_different_corpora_are_refused_unless_allowed(tmp_path, runs):
    a = _write_run(tmp_path / "a.trec", runs["base"], "fp-one")
    b = _write_run(tmp_path / "b.trec", runs["noisy"], "fp-two")
    c = _write_run(tmp_path / "c.trec", runs["slight"], "fp-one")
    with pytest.raises(PipelineError, match="different corpora"):
        compare_runs({"a": a, "b": b}, REAL_QRELS)
    res = compare_runs({"a": a, "b": b}, REAL_QRELS, allow_mixed=True)
    assert format_comparison(res).startswith("WARNING: results come from different corpora")
    same = compare_runs({"a": a, "c": c}, REAL_QRELS)
    assert same["warning"] is None and same["notes"] == []
    assert not format_comparison(same).startswith("WARNING")


def test_errors(runs):
    with pytest.raises(PipelineError, match="share no judged query"):
        compare_runs({"a": {"q-design-001": {"x": 1.0}}, "b": {"q-design-002": {"x": 1.0}}}, _qrels())
    with pytest.raises(PipelineError, match="none of the run's"):
        compare_runs({"a": runs["base"], "b": {"zz": {"x": 1.0}}}, _qrels())
    with pytest.raises(PipelineError, match="not one of"):
        compare_runs({"a": runs["base"]}, _qrels(), test="wilcoxon")


# --------------------------------------------------------------------------- CLI


def test_cli_compare_table_and_json(tmp_path, capsys, runs):
    a = _write_run(tmp_path / "a.trec", runs["base"], "fp")
    b = _write_run(tmp_path / "b.trec", runs["noisy"], "fp")
    out = tmp_path / "cmp.json"
    rc = main(["compare", str(a), str(b), "--qrels", str(REAL_QRELS), "--measures", "RR@10 nDCG@10",
               "--test", "both", "--resamples", "500", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "paired t-test" in text and "paired randomization test" in text and "Δ nDCG@10" in text
    res = json.loads(out.read_text())
    assert res["measures"] == ["RR@10", "nDCG@10"] and res["baseline"] == "a.trec"
    assert set(res["runs"]) == {"a.trec", "b.trec"} and res["resamples"] == 500
    assert res["runs"]["a.trec"]["metrics"]["RR@10"] == pytest.approx(0.8644, abs=5e-4)
    # replacing our own comparison needs --overwrite
    rc = main(["compare", str(a), str(b), "--qrels", str(REAL_QRELS), "--json", str(out)])
    assert rc == 2 and "--overwrite" in capsys.readouterr().err
    rc = main(["compare", str(a), str(b), "eval.rel_level=2", "--qrels", str(REAL_QRELS), "--json", str(out),
               "--overwrite", "--set", "eval.measures=[AP]"])
    assert rc == 0 and json.loads(out.read_text())["measures"] == ["AP(rel=2)"]


def test_cli_compare_mixed_corpora(tmp_path, capsys, runs):
    a = _write_run(tmp_path / "a.trec", runs["base"], "fp-one")
    b = _write_run(tmp_path / "b.trec", runs["noisy"], "fp-two")
    rc = main(["compare", str(a), str(b), "--qrels", str(REAL_QRELS)])
    assert rc == 2 and "different corpora" in capsys.readouterr().err
    rc = main(["compare", str(a), str(b), "--qrels", str(REAL_QRELS), "--allow-mixed"])
    assert rc == 0 and capsys.readouterr().out.startswith("WARNING: results come from different corpora")


def test_cli_evaluate_measures(tmp_path, capsys):
    out = tmp_path / "m.json"
    rc = main(["evaluate", "--run", str(REAL_RUN), "--qrels", str(REAL_QRELS), "--measures",
               "AP nDCG@10 RR@10 R@1000 P@10 Judged@10", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "R@1000 is cut at that depth" in text
    assert text.splitlines()[0].split()[1:] == ["AP", "nDCG@10", "RR@10", "R@1000", "P@10", "Judged@10"]
    assert set(json.loads(out.read_text())["metrics"]) == {"AP", "nDCG@10", "RR@10", "R@1000", "P@10", "Judged@10"}
    cfg = tmp_path / "c.yaml"
    cfg.write_text("eval:\n  measures: [AP, P@5]\n")
    rc = main(["evaluate", "--run", str(REAL_RUN), "--qrels", str(REAL_QRELS), "--config", str(cfg)])
    text = capsys.readouterr().out
    assert rc == 0 and "P@5" in text.splitlines()[0] and "RR@10" not in text


@pytest.mark.parametrize("args, message", [
    (["--measures", "AP nDCG@ten"], "'nDCG@ten'"),
    (["eval.measures=Bogus"], "'Bogus'"),
])
def test_cli_bad_measure_exits_2(capsys, args, message):
    rc = main(["evaluate", "--run", str(REAL_RUN), "--qrels", str(REAL_QRELS)] + args)
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("content, message", [
    ("q-design-001 Q0 d1 1 0.5 t\nq-design-001 Q0 d2 2 nan t\n", ":2: score nan"),
    ("q-design-001 Q0 d1 1 inf t\n", ":1: score inf"),
    ("", "holds no results"),
    ("\n \n", "holds no results"),
    ("1 Q0 d1 1 0.5 t\n2 Q0 d1 1 0.5 t\n", "none of the run's 2 query ids"),
])
def test_cli_evaluate_refuses_bad_runs(tmp_path, capsys, content, message):
    run = tmp_path / "run.trec"
    run.write_text(content)
    out = tmp_path / "m.json"
    rc = main(["evaluate", "--run", str(run), "--qrels", str(REAL_QRELS), "--json", str(out)])
    captured = capsys.readouterr()
    assert rc == 2 and message in captured.err and str(run) in captured.err
    assert captured.out == "" and not out.exists()  # no table of nan/0.0, nothing written


def test_cli_evaluate_qa_match(tmp_path, capsys):
    from pipeline.data.ingest import ingest

    (tmp_path / "c.tsv").write_text("p0\tThe Who played Tommy.\np1\twho is the president\n")
    ingest([tmp_path / "c.tsv"], "msmarco", tmp_path / "corpus", variant="custom", progress=False)
    qa = tmp_path / "qa.csv"
    qa.write_text("which band\t[\"The Who\"]\n")
    run = tmp_path / "run.trec"
    run.write_text("0 Q0 p1 1 2.0 t\n0 Q0 p0 2 1.0 t\n")
    base = ["evaluate", "--run", str(run), "--qa", str(qa), "--corpus", str(tmp_path / "corpus"), "eval.qa_ks=[1,2]"]
    assert main(base) == 0
    # Top-1, Top-2, MRR@100, MAP@100: 'who is the president' is no hit, the answer is at rank 2
    assert capsys.readouterr().out.splitlines()[2].split()[1:] == ["0.0000", "1.0000", "0.5000", "0.5000"]
    assert main(base + ["--match", "regex"]) == 0  # regex "The Who" matches only p0 too (case-insensitive search)
    assert capsys.readouterr().out.splitlines()[2].split()[1:] == ["0.0000", "1.0000", "0.5000", "0.5000"]
    qa.write_text("which band\t[\"who\"]\n")
    assert main(base + ["--match", "regex"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[1:] == ["1.0000", "1.0000", "1.0000", "1.0000"]


def test_cli_evaluate_flags_of_the_other_mode_are_refused(tmp_path, capsys):
    rc = main(["evaluate", "--run", str(REAL_RUN), "--qrels", str(REAL_QRELS), "--match", "regex"])
    assert rc == 2 and "--match applies to --qa" in capsys.readouterr().err
    rc = main(["evaluate", "--run", str(REAL_RUN), "--qa", str(tmp_path / "qa.csv"), "--corpus", str(tmp_path),
               "--measures", "AP"])
    assert rc == 2 and "--measures applies to --qrels" in capsys.readouterr().err
