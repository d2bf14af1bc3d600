"""DPR-style answer matching and top-k accuracy (pipeline.eval.qa)."""

from __future__ import annotations

import unicodedata

import pytest

from pipeline.data.ingest import ingest
from pipeline.eval.qa import fetch_passages, has_answer, normalize_tokens, qa_accuracy


def test_normalize_tokens():
    assert normalize_tokens("The Cat, sat on a MAT!") == ["cat", "sat", "on", "mat"]
    assert normalize_tokens("An apple-pie (1984)") == ["apple", "pie", "1984"]
    assert normalize_tokens("  ...  ") == []
    # articles only as whole tokens
    assert normalize_tokens("Theatre anthem") == ["theatre", "anthem"]


@pytest.mark.parametrize("passage, answers, expected", [
    ("The Eiffel Tower is in Paris.", ["paris"], True),                  # case
    ("It opened in 1889, in PARIS!", ["Paris."], True),                  # punctuation both sides
    ("He wrote The Lord of the Rings.", ["Lord of the Rings"], True),    # articles dropped both sides
    ("lord of rings", ["The Lord of the Rings"], True),
    ("U.S. president", ["U S"], True),
    ("concatenate the strings", ["cat"], False),                         # token boundary
    ("a cat sat", ["cat"], True),
    ("cats sat", ["cat"], False),
    ("New York City is big", ["new york"], True),                        # multi-token
    ("New Jersey and York", ["new york"], False),                        # tokens must be contiguous
    ("York New", ["new york"], False),                                   # and in order
    ("nothing here", ["absent", "here"], True),                          # any answer
    ("nothing here", ["absent", "also absent"], False),
    ("anything", ["the", "..."], False),                                 # answers that normalise to nothing
    ("", ["x"], False),
])
def test_has_answer(passage, answers, expected):
    assert has_answer(passage, answers) is expected


def test_has_answer_unicode_composed_vs_decomposed():
    composed = "Wilhelm Conrad R\u00f6ntgen won"       # o-umlaut as one code point
    decomposed = unicodedata.normalize("NFD", composed)  # o + combining diaeresis
    assert composed != decomposed
    for passage in (composed, decomposed):
        for answer in ("R\u00f6ntgen", unicodedata.normalize("NFD", "R\u00f6ntgen"), "R\u00d6NTGEN"):
            assert has_answer(passage, [answer])
    # an accent is not dropped: "Rontgen" is a different token
    assert not has_answer(composed, ["Rontgen"])
    assert has_answer("Caf\u00e9 de Flore", ["cafe\u0301"])


@pytest.fixture
def tiny_corpus(tmp_path):
    collection = tmp_path / "collection.tsv"
    collection.write_text(
        "p0\tParis is the capital of France.\n"
        "p1\tThe Eiffel Tower was completed in 1889.\n"
        "p2\tBerlin is the capital of Germany.\n"
        "p3\tThe concatenate function joins strings.\n"
        "p4\tA cat sat on the mat.\n"
        "p5\tMount Everest is 8849 metres tall.\n",
        encoding="utf-8",
    )
    out = tmp_path / "corpus"
    ingest([collection], "msmarco", out, part_rows=2, progress=False)
    qa = tmp_path / "qa.csv"
    qa.write_text(
        "what is the capital of france\t[\"Paris\"]\n"                # q0
        "when was the eiffel tower completed\t['1889']\n"              # q1
        "which animal sat on the mat\t[\"cat\", \"feline\"]\n"         # q2
        "how tall is everest\t[\"8,849 metres\", \"29,032 ft\"]\n"     # q3
        "what is the capital of spain\t[\"Madrid\"]\n",                # q4
        encoding="utf-8",
    )
    return out, qa


def test_fetch_passages(tiny_corpus):
    out, _ = tiny_corpus
    assert fetch_passages(out, {"p1", "p4", "missing"}) == {
        "p1": "The Eiffel Tower was completed in 1889.",
        "p4": "A cat sat on the mat.",
    }


def test_qa_accuracy(tiny_corpus):
    out, qa = tiny_corpus
    run = {
        # q0: answer at rank 1
        "0": {"p0": 0.9, "p2": 0.5, "p1": 0.1},
        # q1: answer at rank 3 (scores, not insertion order, decide the rank)
        "1": {"p1": 0.2, "p0": 0.9, "p2": 0.8, "p5": 0.1},
        # q2: 'cat' only inside 'concatenate' at rank 1; the real cat at rank 6
        "2": {"p3": 6.0, "p0": 5.0, "p1": 4.0, "p2": 3.0, "p5": 2.0, "p4": 1.0},
        # q3: '8,849' normalises to tokens 8 849, the passage says 8849: no hit
        "3": {"p5": 1.0},
        # q4: no run entry at all -> counts as unanswered
    }
    res = qa_accuracy(run, qa, out, ks=(1, 5, 20))
    # answered at k: q0 @1, q1 @3, q2 @6, q3 never, q4 missing; 5 questions
    assert res["metrics"]["Top-1"] == pytest.approx(1 / 5)
    assert res["metrics"]["Top-5"] == pytest.approx(2 / 5)
    assert res["metrics"]["Top-20"] == pytest.approx(3 / 5)
    assert res["queries"] == {"questions": 5, "in_run": 4}


def test_qa_accuracy_depth_limited_by_k(tiny_corpus):
    out, qa = tiny_corpus
    run = {"2": {"p3": 6.0, "p0": 5.0, "p1": 4.0, "p2": 3.0, "p5": 2.0, "p4": 1.0}}
    res = qa_accuracy(run, qa, out, ks=(1, 5))
    assert res["metrics"] == {"Top-1": 0.0, "Top-5": 0.0}
