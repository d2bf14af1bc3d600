"""Authorship evaluation: R@8 / MRR against a hand-computed case, query/target protocol, table, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipeline.eval.authorship import collect, evaluate_records, format_table, queries_and_targets

# texts placed on the unit circle: cosine order = angular distance order
ANGLES = {"qA1": 12, "qA2": 57, "tA3": 10, "tA4": 100, "qB1": 300, "tB2": 50, "tC1": 20, "qD1": 32, "tD2": 200,
          "tD3": 60, "qF1": 302, "tF2": 322, **{f"e{k}": 280 + 5 * k for k in range(10)}}
AUTHOR = {"qA1": "A", "qA2": "A", "tA3": "A", "tA4": "A", "qB1": "B", "tB2": "B", "tC1": "C", "qD1": "D",
          "tD2": "D", "tD3": "D", "qF1": "F", "tF2": "F", **{f"e{k}": f"E{k}" for k in range(10)}}
# file order: each author's queries come first among its texts
ORDER = ["qA1", "e0", "qB1", "qA2", "tC1", "e1", "qD1", "tA3", "e2", "tB2", "qF1", "e3", "tD2", "tA4", "e4", "e5",
         "tD3", "e6", "tF2", "e7", "e8", "e9"]


def _records():
    return [{"text": t, "author": AUTHOR[t], "topic": "x"} for t in ORDER]


def _dense(texts):
    return np.array([[math.cos(math.radians(ANGLES[t])), math.sin(math.radians(ANGLES[t]))] for t in texts],
                    dtype=np.float32)


def test_queries_are_first_half_per_author_in_file_order():
    recs = _records()
    qi, ti = queries_and_targets(recs)
    assert sorted(recs[i]["text"] for i in qi) == ["qA1", "qA2", "qB1", "qD1", "qF1"]
    targets = {recs[i]["text"] for i in ti}
    assert {"tA3", "tA4", "tB2", "tC1", "tD2", "tD3", "tF2"} <= targets  # C's single text is a distractor target
    assert all(f"e{k}" in targets for k in range(10))
    # int(0.5 n): 3 texts -> 1 query, 1 text -> 0 queries
    three = [{"text": str(i), "author": "z", "topic": "t"} for i in range(3)]
    assert queries_and_targets(three) == ([0], [1, 2])


def test_r8_and_mrr_hand_computed():
    # qA1: tA3 first (RR 1). qA2: tD3, tB2, tC1, tA4 (RR 1/4). qB1: ten distractors closer than tB2 (miss, RR 0).
    # qD1: tC1, tB2, tA3, tD3 (RR 1/4). qF1: eight distractors closer than tF2, rank 9 (R@8 miss, RR 1/9).
    r = evaluate_records(_records(), _dense)
    assert r["queries"] == 5 and r["targets"] == 17 and r["distractors"] == 11
    assert math.isclose(r["R@8"], 3 / 5)
    assert math.isclose(r["MRR"], (1 + 0.25 + 0 + 0.25 + 1 / 9) / 5, rel_tol=1e-6)


def test_sparse_path_agrees_with_faiss_path():
    from scipy import sparse

    r_dense = evaluate_records(_records(), _dense)
    r_sparse = evaluate_records(_records(), lambda texts: sparse.csr_matrix(_dense(texts)))
    assert math.isclose(r_dense["R@8"], r_sparse["R@8"]) and math.isclose(r_dense["MRR"], r_sparse["MRR"])


def test_table_means_over_seeds_with_counts(tmp_path):
    paths = []
    for i, (label, r8) in enumerate([("CL", 0.5), ("CL", 0.7), ("CL+ARR", 0.6), ("TF-IDF", 0.4)]):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps({"system": {"label": label}, "source_sha256": "s",
                                 "cross_topic_test": {"R@8": r8, "MRR": r8 / 2},
                                 "same_topic_test": {"R@8": r8 + 0.1, "MRR": r8 / 3}}))
        paths.append(p)
    out = format_table(collect(paths))
    lines = out.splitlines()
    assert [ln.split("|")[1].strip() for ln in lines[2:]] == ["TF-IDF", "CL", "CL+ARR"]  # the paper's row order
    assert "0.600 ± 0.141 (n=2)" in lines[3] and "(n=1)" in lines[4]
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"system": {"label": "BOW"}, "source_sha256": "t", "cross_topic_test": {"R@8": 0, "MRR": 0}}))
    from pipeline.errors import PipelineError

    with pytest.raises(PipelineError, match="different corpora"):
        collect(paths + [bad])


def test_cli_split_evaluate_table_and_errors(tmp_path, capsys):
    from pipeline.cli import main

    src = tmp_path / "recs.jsonl"
    recs = []
    for a in range(24):
        for k in range(6 if a < 12 else 2 + a % 3):
            t = (a + k) % 3 if a < 12 else (a + k) % 6
            recs.append({"body": f"w{a % 5} says {k % 4} words {a % 7} t{t}", "who": f"a{a}", "topic": f"t{t}"})
    src.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    args = ["authorship", "split", "--input", str(src), "--out", str(tmp_path / "s"), "authorship.text_column=body",
            "authorship.author_column=who", "authorship.author_fraction=0.5", "authorship.topic_fraction=0.5",
            "authorship.train_fraction=1.0"]
    assert main(args) == 0
    assert main(["authorship", "evaluate", "--split", str(tmp_path / "s"), "--baseline", "tfidf", "--json",
                 str(tmp_path / "tfidf.json")]) == 0
    res = json.loads((tmp_path / "tfidf.json").read_text())
    assert set(res) >= {"cross_topic_test", "same_topic_test"} and {"R@8", "MRR"} <= set(res["cross_topic_test"])
    assert main(["authorship", "table", str(tmp_path / "tfidf.json")]) == 0
    assert "| TF-IDF |" in capsys.readouterr().out
    assert main(["authorship", "table", str(tmp_path / "tf*.json")]) == 0  # a pattern the shell did not expand
    assert "| TF-IDF |" in capsys.readouterr().out
    assert main(["authorship", "table", str(tmp_path / "none*.json")]) == 2  # one that matches nothing: named
    assert "none*.json" in capsys.readouterr().err
    # errors: exit 2 with a message, no traceback
    (tmp_path / "bad.jsonl").write_text('{"text": "x", "author": "a"}\n')
    assert main(["authorship", "split", "--input", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1" in err and "missing field 'topic'" in err and "Traceback" not in err
    assert main(["authorship", "split", "--input", str(src), "--out", str(tmp_path / "c"),
                 "authorship.text_column=body", "authorship.author_column=who", "authorship.author_fraction=1.0",
                 "authorship.train_fraction=1.0"]) == 2  # every author seen: no test split
    assert "too small to evaluate" in capsys.readouterr().err
    assert main(["authorship", "evaluate", "--split", str(tmp_path), "--baseline", "bow"]) == 2
    assert "not an authorship split" in capsys.readouterr().err
