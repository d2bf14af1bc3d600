"""pipeline.eval.metrics against hand-computed values, a reference implementation and pytrec_eval.

Conventions checked (trec_eval's, docs/METHODS.md §7): the run is ranked by score
descending, ties broken by docid descending; averages are over the queries that
are judged and in the run; nDCG uses gain = grade, discount log2(rank + 1) and
the ideal ranking of all judged documents; binary measures count grade >= rel_level.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipeline.config import EvalConfig
from pipeline.data.readers import load_qrels
from pipeline.errors import InputError
from pipeline.eval.metrics import evaluate_files, evaluate_run
from pipeline.eval.runs import read_run

DATA = Path(__file__).resolve().parents[1] / "data"
REAL_RUN = DATA / "python_faq_minilm_top20.trec"
REAL_QRELS = DATA / "python_faq_all.qrels"

# --------------------------------------------------------------------------- (a) hand-computed

QRELS = {
    "q1": {"d1": 2, "d2": 1, "d3": 0, "d4": 1},
    "q2": {"d5": 1, "d6": 2},
    "q3": {"d8": 1, "d9": 2},
}
RUN = {
    # ranks: 1 d3(0)  2 d1(2)  3 x1  4 d2(1)  5 x2          (d4 not retrieved)
    "q1": {"d3": 0.9, "d1": 0.8, "x1": 0.7, "d2": 0.6, "x2": 0.5},
    # ranks 1-10 unjudged, 11 d6(2), 12 d5(1)
    "q2": {**{f"n{i:02d}": 2.0 - i / 100 for i in range(1, 11)}, "d6": 0.5, "d5": 0.4},
    # ranks: 1 d8(1)  2 d9(2)
    "q3": {"d8": 5.0, "d9": 4.0},
}
L2, L3, L5 = math.log2(2), math.log2(3), math.log2(5)

# nDCG@10 per query (gain = grade, discount log2(rank+1), ideal from all judged docs):
#   q1: DCG = 2/log2(3) + 1/log2(5) = 1.26186 + 0.43068 = 1.69254
#       IDCG (grades 2,1,1,0) = 2/1 + 1/log2(3) + 1/log2(4) = 3.13093      -> 0.54059
#   q2: nothing judged relevant in the top 10                                   -> 0
#   q3: DCG = 1/1 + 2/log2(3) = 2.26186; IDCG = 2/1 + 1/log2(3) = 2.63093  -> 0.85972
NDCG_Q1 = (2 / L3 + 1 / L5) / (2 / L2 + 1 / L3 + 1 / 2)
NDCG_Q3 = (1 + 2 / L3) / (2 + 1 / L3)

EXPECTED = {
    1: {
        # rel >= 1. q1 relevant {d1,d2,d4}, q2 {d5,d6}, q3 {d8,d9}
        # RR@10: q1 first relevant at rank 2, q2 none in the top 10, q3 rank 1
        "RR@10": (1 / 2 + 0 + 1) / 3,                              # 0.5
        "RR@100": (1 / 2 + 1 / 11 + 1) / 3,                        # 0.53030
        # AP: q1 (P@2 + P@4)/3 = (1/2 + 2/4)/3; q2 (1/11 + 2/12)/2; q3 (1/1 + 2/2)/2
        "AP@100": (1 / 3 + (1 / 11 + 2 / 12) / 2 + 1) / 3,         # 0.48737
        "R@1": (0 + 0 + 1 / 2) / 3,                                 # 0.16667
        "R@5": (2 / 3 + 0 + 1) / 3,                                 # 0.55556
        "R@10": (2 / 3 + 0 + 1) / 3,
        "R@100": (2 / 3 + 1 + 1) / 3,                               # 0.88889
        "nDCG@10": (NDCG_Q1 + 0 + NDCG_Q3) / 3,                     # 0.46677
    },
    2: {
        # rel >= 2: grade-1 docs no longer count. q1 {d1}, q2 {d6}, q3 {d9}
        "RR(rel=2)@10": (1 / 2 + 0 + 1 / 2) / 3,                          # 0.33333
        "RR(rel=2)@100": (1 / 2 + 1 / 11 + 1 / 2) / 3,
        "AP(rel=2)@100": (1 / 2 + 1 / 11 + 1 / 2) / 3,                    # q3: P@2 = 1/2
        "R(rel=2)@1": 0.0,
        "R(rel=2)@5": (1 + 0 + 1) / 3,
        "R(rel=2)@10": (1 + 0 + 1) / 3,
        "R(rel=2)@100": 1.0,
        "nDCG@10": (NDCG_Q1 + 0 + NDCG_Q3) / 3,                     # graded: unchanged
    },
}


@pytest.mark.parametrize("rel_level", [1, 2])
def test_hand_computed(rel_level):
    cfg = EvalConfig(recall_ks=(1, 5, 10, 100), rel_level=rel_level)
    got = evaluate_run(RUN, QRELS, cfg)["metrics"]
    assert set(got) == set(EXPECTED[rel_level])
    for name, value in EXPECTED[rel_level].items():
        assert got[name] == pytest.approx(value, abs=1e-6), name


def test_rel_level_changes_binary_measures():
    one = evaluate_run(RUN, QRELS, EvalConfig(recall_ks=(5,), rel_level=1))["metrics"]
    two = evaluate_run(RUN, QRELS, EvalConfig(recall_ks=(5,), rel_level=2))["metrics"]
    assert one["RR@10"] != pytest.approx(two["RR(rel=2)@10"])
    assert one["R@5"] != pytest.approx(two["R(rel=2)@5"])
    assert one["nDCG@10"] == pytest.approx(two["nDCG@10"])


def test_per_query():
    res = evaluate_run(RUN, QRELS, EvalConfig(recall_ks=(5,), per_query=True))
    per = res["per_query"]
    assert set(per) == {"q1", "q2", "q3"}
    assert per["q1"]["RR@10"] == pytest.approx(0.5)
    assert per["q2"]["RR@10"] == 0.0
    assert per["q2"]["RR@100"] == pytest.approx(1 / 11)
    assert per["q1"]["nDCG@10"] == pytest.approx(NDCG_Q1, abs=1e-6)
    assert per["q3"]["AP@100"] == pytest.approx(1.0)


def test_unjudged_run_queries_are_not_averaged_and_missing_ones_are_counted():
    run = {**RUN, "q-unjudged": {"d1": 1.0}}
    del run["q3"]
    qrels = {**QRELS, "q4": {"d1": 1}}
    res = evaluate_run(run, qrels, EvalConfig(recall_ks=(10,)))
    assert res["queries"] == {"judged": 4, "in_run": 3, "evaluated": 2, "judged_missing_from_run": 2}
    # averaged over q1 and q2 only (trec_eval without -c)
    assert res["metrics"]["RR@10"] == pytest.approx((1 / 2 + 0) / 2)
    assert res["metrics"]["RR@100"] == pytest.approx((1 / 2 + 1 / 11) / 2)


def test_ties_follow_trec_eval_order_in_every_measure():
    # Equal scores: trec_eval ranks docid descending, so 'b' (non-relevant) comes before 'a'.
    qrels = {"q": {"a": 1}}
    run = {"q": {"a": 1.0, "b": 1.0}}
    m = evaluate_run(run, qrels, EvalConfig(recall_ks=(1,)))["metrics"]
    assert m["RR@10"] == pytest.approx(0.5)
    assert m["RR@100"] == pytest.approx(0.5)
    assert m["AP@100"] == pytest.approx(0.5)
    assert m["R@1"] == 0.0
    assert m["nDCG@10"] == pytest.approx(1 / math.log2(3))


# --------------------------------------------------------------------------- (b) a real run


def _trec_order(docs: dict[str, float]) -> list[str]:
    """trec_eval's ranking: score descending, then docid descending."""
    return [d for d, _ in sorted(docs.items(), key=lambda x: (x[1], x[0]), reverse=True)]


def _reference(run, qrels, rel_level=1):
    """Straightforward per-query formulas, averaged over judged queries present in the run."""
    per = {"RR@10": [], "AP@100": [], "nDCG@10": [], "R@10": []}
    for qid, judged in qrels.items():
        if qid not in run:
            continue
        ranking = _trec_order(run[qid])
        relevant = {d for d, g in judged.items() if g >= rel_level}
        rr = 0.0
        for i, d in enumerate(ranking[:10], 1):
            if d in relevant:
                rr = 1 / i
                break
        per["RR@10"].append(rr)
        hits, precisions = 0, []
        for i, d in enumerate(ranking[:100], 1):
            if d in relevant:
                hits += 1
                precisions.append(hits / i)
        per["AP@100"].append(sum(precisions) / len(relevant) if relevant else 0.0)
        dcg = sum(judged.get(d, 0) / math.log2(i + 1) for i, d in enumerate(ranking[:10], 1) if judged.get(d, 0) > 0)
        ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:10]
        idcg = sum(g / math.log2(i + 1) for i, g in enumerate(ideal, 1))
        per["nDCG@10"].append(dcg / idcg if idcg else 0.0)
        per["R@10"].append(len(relevant & set(ranking[:10])) / len(relevant) if relevant else 0.0)
    return {k: sum(v) / len(v) for k, v in per.items()}


def _raw_run(path: Path) -> dict[str, dict[str, float]]:
    run: dict[str, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        q, _, d, _, s, _ = line.split()
        run.setdefault(q, {})[d] = float(s)
    return run


def _raw_qrels(path: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    for line in path.read_text().splitlines():
        q, _, d, r = line.split()
        qrels.setdefault(q, {})[d] = int(r)
    return qrels


def test_real_run_file_is_what_we_think():
    run, qrels = _raw_run(REAL_RUN), _raw_qrels(REAL_QRELS)
    assert len(run) == 176 and set(run) == set(qrels)
    assert all(len(docs) == 20 for docs in run.values())
    assert read_run(REAL_RUN) == run
    assert load_qrels(REAL_QRELS) == qrels
    # file rank order is the trec_eval order (no tied scores in this run)
    lines = [l.split() for l in REAL_RUN.read_text().splitlines()]
    for qid, docs in run.items():
        assert len(set(docs.values())) == len(docs)
        assert [l[2] for l in lines if l[0] == qid] == _trec_order(docs)


def test_real_run_matches_reference_and_pytrec_eval():
    pytrec_eval = pytest.importorskip("pytrec_eval")
    run, qrels = _raw_run(REAL_RUN), _raw_qrels(REAL_QRELS)
    ref = _reference(run, qrels)

    ev = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "map_cut_100", "ndcg_cut_10", "recall_10"})
    per = ev.evaluate(run)
    assert set(per) == set(qrels)
    te = {name: sum(v[key] for v in per.values()) / len(per)
          for name, key in [("AP@100", "map_cut_100"), ("nDCG@10", "ndcg_cut_10"), ("R@10", "recall_10")]}
    # trec_eval's recip_rank has no cut-off: MRR@10 <= it, and equal when every first hit is in the top 10
    rr_all = sum(v["recip_rank"] for v in per.values()) / len(per)
    for name in te:
        assert te[name] == pytest.approx(ref[name], abs=1e-6), name
    assert ref["RR@10"] <= rr_all + 1e-12

    got = evaluate_files(REAL_RUN, REAL_QRELS, EvalConfig(recall_ks=(10, 20)))
    for name in ("RR@10", "AP@100", "nDCG@10", "R@10"):
        assert got["metrics"][name] == pytest.approx(ref[name], abs=1e-6), name
    assert got["metrics"]["RR@100"] == pytest.approx(rr_all, abs=1e-6)  # top-20 run: RR@100 == RR
    assert got["queries"] == {"judged": 176, "in_run": 176, "evaluated": 176, "judged_missing_from_run": 0}
    assert got["run"] == str(REAL_RUN) and got["qrels"] == str(REAL_QRELS)
    # sanity: a sensible MiniLM run, not a degenerate one
    assert 0.3 < got["metrics"]["RR@10"] < 1.0
    assert got["metrics"]["R@10"] <= got["metrics"]["R@20"] <= 1.0


def test_real_run_with_ties_matches_pytrec_eval():
    """Round the scores to create many ties; every measure must rank them as trec_eval does."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    run = {q: {d: round(s, 1) for d, s in docs.items()} for q, docs in _raw_run(REAL_RUN).items()}
    qrels = _raw_qrels(REAL_QRELS)
    assert sum(len(docs) - len(set(docs.values())) for docs in run.values()) > 100
    ref = _reference(run, qrels)
    per = pytrec_eval.RelevanceEvaluator(qrels, {"map_cut_100", "ndcg_cut_10", "recall_10"}).evaluate(run)
    got = evaluate_run(run, qrels, EvalConfig(recall_ks=(10,)))["metrics"]
    for name, key in [("AP@100", "map_cut_100"), ("nDCG@10", "ndcg_cut_10"), ("R@10", "recall_10")]:
        te = sum(v[key] for v in per.values()) / len(per)
        assert ref[name] == pytest.approx(te, abs=1e-6), name
        assert got[name] == pytest.approx(te, abs=1e-6), name
    assert got["RR@10"] == pytest.approx(ref["RR@10"], abs=1e-6)


# --------------------------------------------------------------------------- (c) read_run errors


def _bad_run(tmp_path, bad_line):
    p = tmp_path / "run.trec"
    p.write_text("q1 Q0 d1 1 0.9 tag\nq1 Q0 d2 2 0.8 tag\n" + bad_line + "\n")
    return p


@pytest.mark.parametrize("bad_line, reason", [
    ("q1 Q0 d3 3 0.7", "found 5"),
    ("q1 Q0 d3 3 0.7 tag extra", "found 7"),
    ("q1 Q0 d3 3 high tag", "not a number"),
    ("q1 Q0 d1 3 0.7 tag", "twice"),
])
def test_read_run_errors(tmp_path, bad_line, reason):
    p = _bad_run(tmp_path, bad_line)
    with pytest.raises(InputError) as info:
        read_run(p)
    err = info.value
    assert Path(err.path) == p and err.line == 3
    assert f"{p}:3" in str(err)
    assert reason in err.reason


def test_read_run_ok(tmp_path):
    p = tmp_path / "run.trec"
    p.write_text("q1 Q0 d1 1 0.9 tag\n\nq2\tQ0\td1\t1\t-1.5e-3\ttag\r\nq1 Q0 d2 2 0.8 tag\n")
    assert read_run(p) == {"q1": {"d1": 0.9, "d2": 0.8}, "q2": {"d1": -0.0015}}


def test_evaluate_files_reads_beir_qrels(tmp_path):
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1 1 0.9 t\nq1 Q0 d2 2 0.8 t\nq2 Q0 d1 1 0.5 t\n")
    qrels = tmp_path / "test.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\nq2\td1\t1\nq3\td1\t1\n")
    res = evaluate_files(run, qrels, EvalConfig(recall_ks=(1,)))
    assert res["metrics"]["RR@10"] == pytest.approx((1 / 2 + 1) / 2)
    assert res["metrics"]["R@1"] == pytest.approx((0 + 1) / 2)
    assert res["queries"]["judged_missing_from_run"] == 1


def test_ignore_identical_ids_drops_the_query_itself():
    from pipeline.config import EvalConfig
    from pipeline.eval.metrics import evaluate_run

    run = {"a": {"a": 3.0, "b": 2.0, "c": 1.0}}
    qrels = {"a": {"b": 1}}
    assert evaluate_run(run, qrels, EvalConfig())["metrics"]["RR@10"] == 0.5
    assert evaluate_run(run, qrels, EvalConfig(ignore_identical_ids=True))["metrics"]["RR@10"] == 1.0


# --------------------------------------------------------------------------- (d) any ir-measures measure

import random  # noqa: E402

from pipeline.config import load_config  # noqa: E402
from pipeline.errors import ConfigError, PipelineError  # noqa: E402
from pipeline.eval.metrics import measure_name, measures_for, parse_measures  # noqa: E402

ASKED = "AP nDCG@10 RR@10 R@1000 P@10 Judged@10 RR nDCG AP@100 P@5 R@100"
# our reported name -> pytrec_eval (trec_eval) measure
TREC_EQUIV = {"AP": "map", "nDCG@10": "ndcg_cut_10", "R@1000": "recall_1000", "P@10": "P_10", "RR": "recip_rank",
              "nDCG": "ndcg", "AP@100": "map_cut_100", "P@5": "P_5", "R@100": "recall_100"}


def _deep_run(seed=7, n_queries=40, depth=1000):
    """A deep run with graded qrels, relevant documents beyond the run, unjudged documents and many ties."""
    rng = random.Random(seed)
    run, qrels = {}, {}
    for qi in range(n_queries):
        q = f"q{qi}"
        docs = [f"d{rng.randrange(5000)}" for _ in range(depth * 2)]
        docs = list(dict.fromkeys(docs))[:depth]
        run[q] = {d: round(rng.gauss(0, 1), 1) for d in docs}  # rounding: many tied scores
        judged = rng.sample(docs[:300], 12) + [f"unretrieved{qi}-{j}" for j in range(rng.randrange(4))]
        qrels[q] = {d: rng.choice([0, 1, 1, 2, 3]) for d in judged}
    return run, qrels


def _pytrec(run, qrels, keys, rel_level=1):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    per = pytrec_eval.RelevanceEvaluator(qrels, set(keys), relevance_level=rel_level).evaluate(run)
    return {k: sum(v[k] for v in per.values()) / len(per) for k in keys}


def _judged_at(run, qrels, k):
    return sum(sum(1 for d in _trec_order(run[q])[:k] if d in qrels[q]) / k for q in qrels if q in run) / \
        sum(1 for q in qrels if q in run)


@pytest.mark.parametrize("source", ["real", "deep"])
def test_any_measure_equals_pytrec_eval(source, tmp_path):
    if source == "real":
        run, qrels = _raw_run(REAL_RUN), _raw_qrels(REAL_QRELS)
    else:
        run, qrels = _deep_run()
    got = evaluate_run(run, qrels, EvalConfig(), measures=ASKED)["metrics"]
    assert list(got) == ASKED.split()  # ir-measures names, in the order asked
    te = _pytrec(run, qrels, TREC_EQUIV.values())
    for name, key in TREC_EQUIV.items():
        assert got[name] == pytest.approx(te[key], abs=1e-9), name
    # RR@10 and Judged@10 have no trec_eval counterpart: the reference formulas
    assert got["RR@10"] == pytest.approx(_reference(run, qrels)["RR@10"], abs=1e-9)
    assert got["Judged@10"] == pytest.approx(_judged_at(run, qrels, 10), abs=1e-9)
    if source == "deep":  # full-depth AP differs from AP@100 on a deep run: the cut-off is honoured
        assert got["AP"] != pytest.approx(got["AP@100"], abs=1e-4)


def test_rel_level_applies_to_asked_measures_as_trec_eval_relevance_level():
    run, qrels = _deep_run(seed=3)
    got = evaluate_run(run, qrels, EvalConfig(rel_level=2), measures="AP P@10 R@1000 nDCG@10")["metrics"]
    assert list(got) == ["AP(rel=2)", "P(rel=2)@10", "R(rel=2)@1000", "nDCG@10"]
    te = _pytrec(run, qrels, ["map", "P_10", "recall_1000"], rel_level=2)
    assert got["AP(rel=2)"] == pytest.approx(te["map"], abs=1e-9)
    assert got["P(rel=2)@10"] == pytest.approx(te["P_10"], abs=1e-9)
    assert got["R(rel=2)@1000"] == pytest.approx(te["recall_1000"], abs=1e-9)


def test_evaluate_files_with_measures_matches_pytrec_eval_on_a_run_file(tmp_path):
    run, qrels = _deep_run(seed=11, n_queries=15)
    rp, qp = tmp_path / "deep.trec", tmp_path / "deep.qrels"
    lines = [f"{q} Q0 {d} {i} {docs[d]} t" for q, docs in run.items() for i, d in enumerate(_trec_order(docs), 1)]
    random.Random(0).shuffle(lines)  # line order must not matter
    rp.write_text("\n".join(lines) + "\n")
    qp.write_text("".join(f"{q} 0 {d} {r}\n" for q, docs in qrels.items() for d, r in docs.items()))
    got = evaluate_files(rp, qp, EvalConfig(measures=("AP", "nDCG@10 P@10")))["metrics"]
    te = _pytrec(run, qrels, ["map", "ndcg_cut_10", "P_10"])
    assert got == pytest.approx({"AP": te["map"], "nDCG@10": te["ndcg_cut_10"], "P@10": te["P_10"]}, abs=1e-9)


def test_default_set_unchanged_and_named_by_ir_measures():
    assert list(measures_for(EvalConfig())) == ["RR@10", "nDCG@10", "AP@100", "RR@100", "R@10", "R@20", "R@100"]
    assert list(measures_for(EvalConfig(measures=()))) == list(measures_for(EvalConfig()))


@pytest.mark.parametrize("alias, name", [("MRR@10", "RR@10"), ("MAP@100", "AP@100"), ("MRR", "RR"),
                                         ("map", "AP"), ("ndcg_cut_10", "nDCG@10"), ("P_10", "P@10"),
                                         ("recall_1000", "R@1000"), ("RR@10", "RR@10")])
def test_legacy_and_trec_eval_names_are_accepted(alias, name):
    assert measure_name(alias) == name
    assert list(evaluate_run(RUN, QRELS, EvalConfig(), measures=alias)["metrics"]) == [name]


def test_duplicates_are_reported_once_and_params_with_spaces_parse():
    assert [str(m) for m in parse_measures("RR@10, MRR@10 nDCG(dcg='exp-log2')@10")] == \
        ["RR@10", "nDCG(dcg='exp-log2')@10"]


@pytest.mark.parametrize("bad", ["Foo@10", "nDCG@x", "P@0", "AP(foo=1)", "R@10.5", "RR(judged_only=True)@10"])
def test_bad_measure_is_a_config_error_naming_it(bad):
    with pytest.raises(ConfigError) as info:
        evaluate_run(RUN, QRELS, EvalConfig(), measures=f"AP {bad}")
    assert repr(bad) in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"eval.measures=[AP, \"{bad}\"]"])
    assert repr(bad) in str(info.value) and "eval.measures" in str(info.value)


# --------------------------------------------------------------------------- (e) run-file strictness


@pytest.mark.parametrize("score", ["nan", "NaN", "inf", "-inf", "Infinity"])
def test_non_finite_score_is_an_input_error(tmp_path, score):
    p = _bad_run(tmp_path, f"q1 Q0 d3 3 {score} tag")
    with pytest.raises(InputError) as info:
        read_run(p)
    assert info.value.line == 3 and f"{p}:3" in str(info.value) and "not a finite number" in info.value.reason


def test_empty_run_is_an_error(tmp_path):
    p = tmp_path / "empty.trec"
    p.write_text("\n\n")
    qrels = tmp_path / "q.qrels"
    qrels.write_text("q1 0 d1 1\n")
    with pytest.raises(PipelineError) as info:
        evaluate_files(p, qrels, EvalConfig())
    assert str(p) in str(info.value) and "no results" in str(info.value)


def test_run_matching_no_judged_query_is_an_error(tmp_path):
    p = tmp_path / "run.trec"
    p.write_text("1 Q0 d1 1 0.9 t\n2 Q0 d1 1 0.9 t\n")
    qrels = tmp_path / "q.qrels"
    qrels.write_text("q1 0 d1 1\nq2 0 d1 1\n")
    with pytest.raises(PipelineError) as info:
        evaluate_files(p, qrels, EvalConfig())
    msg = str(info.value)
    assert str(p) in msg and str(qrels) in msg and "none of the run's 2 query ids" in msg and "'q1'" in msg


def test_run_emptied_by_ignore_identical_ids_is_an_error():
    with pytest.raises(PipelineError, match="no results"):
        evaluate_run({"a": {"a": 1.0}}, {"a": {"b": 1}}, EvalConfig(ignore_identical_ids=True))


def test_partial_overlap_is_reported_not_refused():
    res = evaluate_run({"q1": RUN["q1"], "zz": {"d1": 1.0}}, QRELS, EvalConfig())
    assert res["queries"] == {"judged": 3, "in_run": 2, "evaluated": 1, "judged_missing_from_run": 2}


def test_measures_from_providers_that_need_numeric_query_ids():
    """gdeval (ERR@k) rejects 'q1'-style ids: queries are renumbered for ir-measures and mapped back."""
    import ir_measures

    res = evaluate_run(RUN, QRELS, EvalConfig(per_query=True), measures="ERR@10")
    num = {q: str(i) for i, q in enumerate(sorted(QRELS))}
    direct = ir_measures.iter_calc(
        [ir_measures.parse_measure("ERR@10")],
        [ir_measures.Qrel(num[q], d, r) for q, docs in QRELS.items() for d, r in docs.items()],
        [ir_measures.ScoredDoc(num[q], d, float(-i)) for q, docs in RUN.items() for i, d in enumerate(_trec_order(docs))])
    back = {v: k for k, v in num.items()}
    expected = {back[m.query_id]: m.value for m in direct}
    assert {q: v["ERR@10"] for q, v in res["per_query"].items()} == pytest.approx(expected)
    assert res["metrics"]["ERR@10"] == pytest.approx(sum(expected.values()) / 3)
    assert expected["q3"] > 0


def test_sum_measures_aggregate_as_ir_measures_does():
    res = evaluate_run(RUN, QRELS, EvalConfig(), measures="NumRet NumQ")["metrics"]
    assert res == {"NumRet": 5 + 12 + 2, "NumQ": 3}


@pytest.mark.parametrize("measures", ["AP nDCG@10 RR@10 R@1000 P@10 Judged@10 NumRet NumRel Bpref", None])
def test_per_query_aggregation_equals_ir_measures_aggregate(measures):
    run, qrels = _deep_run(seed=5, n_queries=12, depth=200)
    a = evaluate_run(run, qrels, EvalConfig(), measures)["metrics"]
    b = evaluate_run(run, qrels, EvalConfig(per_query=True), measures)
    assert b["metrics"] == pytest.approx(a, abs=1e-12)
    assert set(b["per_query"]) == set(qrels)
