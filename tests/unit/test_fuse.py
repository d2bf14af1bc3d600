"""`pipeline fuse` (#61): reciprocal rank fusion, interpolation and averaging with pyserini's definitions: hand-
computed values, and on random runs the steps of pyserini's TrecRun (rescore, then merge by sum over the first
`depth` lines of each run, sorted by score then docid, cut to k) done in pandas as it does them."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.cli import main
from pipeline.errors import InputError
from pipeline.eval.fuse import fuse, read_ranked

A = "q1 Q0 d1 1 10.0 bm25\nq1 Q0 d2 2 8.0 bm25\nq1 Q0 d3 3 8.0 bm25\nq2 Q0 d9 1 3.0 bm25\n"
B = "q1 Q0 d3 1 0.9 dense\nq1 Q0 d4 2 0.5 dense\nq1 Q0 d1 3 0.1 dense\nq3 Q0 d5 1 0.7 dense\nq3 Q0 d6 2 0.7 dense\n"


def _runs(tmp_path):
    (tmp_path / "a.trec").write_text(A)
    (tmp_path / "b.trec").write_text(B)
    return [read_ranked(tmp_path / n, 1000) for n in ("a.trec", "b.trec")]


def test_rrf_and_interpolation_as_computed_by_hand(tmp_path):
    runs = _runs(tmp_path)
    rrf = fuse(runs, "rrf")
    assert [d for d, _ in rrf["q1"]] == ["d1", "d3", "d2", "d4"]  # d1 and d3 tie (1/61 + 1/63): docid order
    assert rrf["q1"][0][1] == pytest.approx(1 / 61 + 1 / 63) and rrf["q1"][2][1] == pytest.approx(1 / 62)
    assert rrf["q3"] == [("d5", pytest.approx(1 / 61)), ("d6", pytest.approx(1 / 62))]
    inter = dict(fuse(runs, "interpolate", weights=[0.3, 0.7])["q1"])
    # min-max per query: a = {d1: 1, d2: 0, d3: 0}, b = {d3: 1, d4: 0.5, d1: 0}
    assert inter == pytest.approx({"d3": 0.7, "d4": 0.35, "d1": 0.3, "d2": 0.0})
    assert dict(fuse(runs, "interpolate", weights=[0.3, 0.7])["q3"]) == pytest.approx({"d5": 0.7, "d6": 0.7})
    raw = dict(fuse(runs, "interpolate", weights=[0.5, 0.5], normalize=False)["q1"])
    assert raw == pytest.approx({"d1": 5.05, "d2": 4.0, "d3": 4.45, "d4": 0.25})
    assert dict(fuse(runs, "average")["q1"]) == pytest.approx(raw)
    assert [d for d, _ in fuse(runs, "rrf", k=2)["q1"]] == ["d1", "d3"]


def _pyserini_steps(frames, method, rrf_k=60, weights=None, depth=1000, k=1000):
    """pyserini.trectools.TrecRun's rescore and merge(SUM), step by step, in pandas."""
    scored = []
    for i, df in enumerate(frames):
        df = df.copy()
        if method == "rrf":
            df["score"] = 1 / (rrf_k + df["rank"].values)
        elif method == "normalize":
            df["score"] = df.groupby("topic")["score"].transform(
                lambda g: np.ones_like(g.values) if g.max() - g.min() == 0 else (g - g.min()) / (g.max() - g.min()))
            df["score"] = df["score"] * weights[i]
        else:
            df["score"] = df["score"].values * weights[i]
        scored.append(df.groupby("topic", sort=False).head(depth)[["topic", "docid", "score"]])
    merged = pd.concat(scored, ignore_index=True).groupby(["topic", "docid"], as_index=False, sort=False)["score"].sum()
    merged = merged.sort_values(["topic", "score", "docid"], ascending=[True, False, True], ignore_index=True)
    merged = merged.groupby("topic", sort=False).head(k)
    return {t: list(zip(g["docid"], g["score"])) for t, g in merged.groupby("topic")}


@pytest.mark.parametrize("method", ["rrf", "interpolate-raw", "interpolate"])
def test_random_runs_fuse_as_pyserini_fuses_them(tmp_path, method):
    rng = np.random.default_rng(5)
    frames, paths = [], []
    for r in range(3 if method == "rrf" else 2):
        rows = []
        for q in range(6):
            docs = rng.choice(200, size=int(rng.integers(5, 60)), replace=False)
            scores = np.round(np.sort(rng.uniform(0, 20, len(docs)))[::-1], 2)  # rounded: ties happen
            rows += [(f"q{q}", "Q0", f"d{d}", i + 1, s, "t") for i, (d, s) in enumerate(zip(docs, scores))]
        df = pd.DataFrame(rows, columns=["topic", "q0", "docid", "rank", "score", "tag"])
        path = tmp_path / f"r{r}.trec"
        df.to_csv(path, sep=" ", header=False, index=False)
        frames.append(df)
        paths.append(path)
    runs = [read_ranked(p, 40) for p in paths]
    weights = [0.3, 0.7]
    if method == "rrf":
        ours, theirs = fuse(runs, "rrf", k=25), _pyserini_steps(frames, "rrf", depth=40, k=25)
    elif method == "interpolate-raw":
        ours = fuse(runs, "interpolate", weights=weights, normalize=False, k=25)
        theirs = _pyserini_steps(frames, "scale", weights=weights, depth=40, k=25)
    else:
        # pyserini normalises each run over its whole list, then takes the depth: read them whole here too
        runs = [read_ranked(p, None) for p in paths]
        ours = fuse(runs, "interpolate", weights=weights, k=25)
        theirs = _pyserini_steps(frames, "normalize", weights=weights, depth=10_000, k=25)
    assert sorted(ours) == sorted(theirs)
    for q in ours:
        assert [d for d, _ in ours[q]] == [d for d, _ in theirs[q]]
        assert np.allclose([s for _, s in ours[q]], [s for _, s in theirs[q]], rtol=0, atol=1e-12)


def test_the_fused_run_is_a_run_evaluate_and_compare_take_and_bad_input_is_named(tmp_path, capsys):
    _runs(tmp_path)
    (tmp_path / "qrels.trec").write_text("q1 0 d3 1\nq1 0 d1 1\nq3 0 d6 1\n")
    out = tmp_path / "fused.trec"
    assert main(["fuse", str(tmp_path / "a.trec"), str(tmp_path / "b.trec"), "--out", str(out)]) == 0
    meta = json.loads((tmp_path / "fused.trec.meta.json").read_text())
    assert meta["method"] == "rrf" and meta["rrf_k"] == 60 and len(meta["fused_from"]) == 2
    assert main(["evaluate", str(tmp_path / "qrels.trec"), str(out)]) == 0
    assert main(["compare", str(tmp_path / "a.trec"), str(out), "--qrels", str(tmp_path / "qrels.trec")]) == 0
    capsys.readouterr()
    assert main(["fuse", str(tmp_path / "a.trec"), str(tmp_path / "b.trec"), "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    (tmp_path / "mine.txt").write_text("notes")
    assert main(["fuse", str(tmp_path / "a.trec"), str(tmp_path / "b.trec"), "--out", str(tmp_path / "mine.txt")]) == 2
    assert (tmp_path / "mine.txt").read_text() == "notes"
    (tmp_path / "dup.trec").write_text("q1 Q0 d1 1 2.0 x\nq1 Q0 d1 2 1.0 x\n")
    with pytest.raises(InputError, match="dup.trec:2: document .d1. is ranked twice"):
        read_ranked(tmp_path / "dup.trec", 1000)
    assert main(["fuse", str(tmp_path / "a.trec"), "--out", str(tmp_path / "x.trec")]) == 2
    assert main(["fuse", str(tmp_path / "a.trec"), str(tmp_path / "b.trec"), "--out", str(tmp_path / "y.trec"),
                 "--method", "interpolate", "--weights", "1"]) == 2
    assert "1 weights for 2 runs" in capsys.readouterr().err
