"""DPR-style answer matching and top-k accuracy (pipeline.eval.qa)."""

from __future__ import annotations

import unicodedata

import pytest

from pipeline.data.ingest import ingest
from pipeline.errors import PipelineError
from pipeline.eval.qa import dpr_tokens, fetch_passages, has_answer, qa_accuracy


def test_dpr_tokens_keep_punctuation_and_articles():
    # DPR's SimpleTokenizer: alphanumeric runs, and every other non-space character as its own token
    assert dpr_tokens("The Cat, sat on a MAT!") == ["the", "cat", ",", "sat", "on", "a", "mat", "!"]
    assert dpr_tokens("An apple-pie (1984)") == ["an", "apple", "-", "pie", "(", "1984", ")"]
    assert dpr_tokens("  ...  ") == [".", ".", "."]
    assert dpr_tokens("U.S. 2,000 can't") == ["u", ".", "s", ".", "2", ",", "000", "can", "'", "t"]
    assert dpr_tokens("\t\n \u00a0") == []                     # separators and controls are not tokens
    assert dpr_tokens("\u00abParis\u00bb") == ["\u00ab", "paris", "\u00bb"]
    assert dpr_tokens("Caf\u00e9") == ["cafe\u0301"]                # NFD: the accent is a mark inside the token


# Previously (before DPR's own rules) articles and punctuation were stripped, so "The Who" matched
# "who is the president", "Paris." matched "PARIS!" and "U S" matched "U.S.": all False now.
@pytest.mark.parametrize("passage, answers, expected", [
    ("The Eiffel Tower is in Paris.", ["paris"], True),                  # case
    ("It opened in 1889, in PARIS!", ["Paris"], True),
    ("It opened in 1889, in PARIS!", ["Paris."], False),                 # '.' is a token the passage lacks
    ("Paris. It opened", ["Paris."], True),
    ("who is the president", ["The Who"], False),                        # articles are kept
    ("The Who played Tommy", ["the who"], True),
    ("who played Tommy", ["The Who"], False),
    ("He wrote The Lord of the Rings.", ["Lord of the Rings"], True),
    ("lord of rings", ["The Lord of the Rings"], False),
    ("U.S. president", ["U.S."], True),                                  # punctuation as tokens
    ("U.S. president", ["U.S"], True),
    ("US president", ["U.S."], False),
    ("U.S. president", ["US"], False),
    ("U.S. president", ["U S"], False),
    ("about 2,000 troops", ["2,000"], True),                             # numbers with commas
    ("about 2000 troops", ["2,000"], False),
    ("about 2,000 troops", ["2000"], False),
    ("about 2,000 troops", ["2"], True),                                 # '2' ',' '000': '2' is a token
    ("an apple-pie", ["apple pie"], False),
    ("an apple-pie", ["apple-pie"], True),
    ("\u00abParis\u00bb est belle", ["Paris"], True),
    ("concatenate the strings", ["cat"], False),                         # token boundary
    ("a cat sat", ["cat"], True),
    ("cats sat", ["cat"], False),
    ("New York City is big", ["new york"], True),                        # multi-token
    ("New Jersey and York", ["new york"], False),                        # tokens must be contiguous
    ("York New", ["new york"], False),                                   # and in order
    ("nothing here", ["absent", "here"], True),                          # any answer
    ("nothing here", ["absent", "also absent"], False),
    ("anything", ["", "   "], False),                                    # answers without tokens match nothing
    ("", ["x"], False),
    ("\u6771\u4eac\u90fd", ["\u6771\u4eac"], False),                      # CJK runs are one token, as in DPR
])
def test_has_answer(passage, answers, expected):
    assert has_answer(passage, answers) is expected


@pytest.mark.parametrize("passage, answers, expected", [
    ("Rita Hayworth starred", [r"Rita\s+Hayworth|Margarita\s+Cansino"], True),   # CuratedTREC style, ignore case
    ("born Margarita  CANSINO", [r"Rita\s+Hayworth|Margarita\s+Cansino"], True),
    ("concatenate", ["cat"], True),                     # regex mode is a search, no token boundaries (as DPR)
    ("concatenate", [r"\bcat\b"], False),
    ("first line\nParis second", [r"^Paris"], True),     # MULTILINE
    ("Beyonce\u0301 sang", ["Beyonc\u00e9"], True),       # pattern and text both NFD
    ("anything", ["(unclosed"], False),                 # a pattern that does not compile matches nothing
    ("anything", ["(unclosed", "any"], True),
])
def test_has_answer_regex_mode(passage, answers, expected):
    assert has_answer(passage, answers, "regex") is expected


def test_unknown_match_type_is_refused():
    with pytest.raises(PipelineError, match="regex"):
        has_answer("x", ["x"], "exact")


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
    ingest([collection], "msmarco", out, variant="custom", part_rows=2, progress=False)  # pids p0.. are not MS MARCO integers
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
        # q3: '8,849' is the tokens 8 , 849; the passage says 8849: no hit
        "3": {"p5": 1.0},
        # q4: no run entry at all -> counts as unanswered
    }
    res = qa_accuracy(run, qa, out, ks=(1, 5, 20))
    # answered at k: q0 @1, q1 @3, q2 @6, q3 never, q4 missing; 5 questions
    assert res["metrics"]["Top-1"] == pytest.approx(1 / 5)
    assert res["metrics"]["Top-5"] == pytest.approx(2 / 5)
    assert res["metrics"]["Top-20"] == pytest.approx(3 / 5)
    assert res["queries"] == {"questions": 5, "in_run": 4, "answers_without_tokens": 0}
    assert res["match"] == "string"


def test_answer_based_mrr_and_map_by_hand(tiny_corpus, tmp_path):
    """DAR's appendix A: MRR = 1/rank of the first passage holding an answer in the top 100; MAP = the mean
    of the precision at each such passage's rank. Computed by hand for each question."""
    out, _ = tiny_corpus
    qa = tmp_path / "qa2.csv"
    qa.write_text("which cities are capitals\t[\"capital\"]\n"        # q0: p0 and p2 say 'capital'
                  "when was the eiffel tower completed\t['1889']\n"      # q1: p1
                  "which animal sat on the mat\t[\"cat\"]\n"            # q2: p4 (not 'concatenate')
                  "how tall is everest\t[\"8,849 metres\"]\n"          # q3: no passage
                  "what is the capital of spain\t[\"Madrid\"]\n",      # q4: not in the run
                  encoding="utf-8")
    run = {
        "0": {"p0": 0.9, "p1": 0.5, "p2": 0.1},                                 # ranks 1 and 3
        "1": {"p0": 0.9, "p1": 0.8, "p5": 0.1},                                 # rank 2
        "2": {"p3": 6.0, "p0": 5.0, "p1": 4.0, "p2": 3.0, "p5": 2.0, "p4": 1.0},  # rank 6
        "3": {"p5": 1.0},                                                       # none
    }
    res = qa_accuracy(run, qa, out, ks=(1,), per_query=True)
    rr = [1.0, 1 / 2, 1 / 6, 0.0, 0.0]
    ap = [(1 / 1 + 2 / 3) / 2, 1 / 2, 1 / 6, 0.0, 0.0]
    assert res["metrics"]["MRR@100"] == pytest.approx(sum(rr) / 5)
    assert res["metrics"]["MAP@100"] == pytest.approx(sum(ap) / 5)
    assert [res["per_query"][q]["MRR@100"] for q in "01234"] == pytest.approx(rr)
    assert [res["per_query"][q]["MAP@100"] for q in "01234"] == pytest.approx(ap)
    assert [res["per_query"][q]["Top-1"] for q in "01234"] == [1.0, 0.0, 0.0, 0.0, 0.0]
    # a shallower depth cuts both: at depth 2, q0 keeps only rank 1, q1 its rank 2, q2's rank 6 is gone
    res2 = qa_accuracy(run, qa, out, ks=(1,), rank_depth=2)
    assert res2["metrics"]["MRR@2"] == pytest.approx((1 + 1 / 2) / 5)
    assert res2["metrics"]["MAP@2"] == pytest.approx((1 + 1 / 2) / 5)
    assert "per_query" not in res2


def test_answer_ranks_measures():
    from pipeline.eval.qa import answer_ranks_measures

    assert answer_ranks_measures([]) == (0.0, 0.0)
    assert answer_ranks_measures([2, 4, 101], depth=100) == pytest.approx((0.5, (1 / 2 + 2 / 4) / 2))
    assert answer_ranks_measures([1, 2, 3]) == (1.0, 1.0)


def test_qa_accuracy_depth_limited_by_k(tiny_corpus):
    out, qa = tiny_corpus
    run = {"2": {"p3": 6.0, "p0": 5.0, "p1": 4.0, "p2": 3.0, "p5": 2.0, "p4": 1.0}}
    res = qa_accuracy(run, qa, out, ks=(1, 5))
    assert {k: res["metrics"][k] for k in ("Top-1", "Top-5")} == {"Top-1": 0.0, "Top-5": 0.0}
    # MRR and MAP look at the top 100 whatever the top-k cut-offs: q2's real cat at rank 6, over 5 questions
    assert res["metrics"]["MRR@100"] == pytest.approx(1 / 6 / 5) and res["metrics"]["MAP@100"] == pytest.approx(1 / 6 / 5)


def test_qa_accuracy_regex_mode(tiny_corpus, tmp_path):
    out, _ = tiny_corpus
    qa = tmp_path / "trec.csv"
    qa.write_text("capital of france\t[\"Par(is|ee)\"]\n"            # q0: regex hit at rank 1
                  "everest height\t[\"88\\\\d\\\\d\\\\s*metres\", \"(\"]\n"   # q1: '8849 metres'; '(' does not compile
                  "some cat\t[\"cat\"]\n",                              # q2: 'concatenate' at rank 1 matches in regex mode
                  encoding="utf-8")
    run = {"0": {"p0": 1.0}, "1": {"p5": 1.0}, "2": {"p3": 2.0, "p4": 1.0}}
    res = qa_accuracy(run, qa, out, ks=(1,), match_type="regex")
    assert res["metrics"]["Top-1"] == 1.0
    assert res["queries"]["answers_not_compiling"] == 1 and res["match"] == "regex"
    # the same file in string mode: q0 and q1 are patterns, not text; q2 'cat' is no token of rank 1
    m = qa_accuracy(run, qa, out, ks=(1, 2))["metrics"]
    assert (m["Top-1"], m["Top-2"]) == (0.0, pytest.approx(1 / 3))


def test_qa_accuracy_refuses_an_empty_run_or_one_matching_no_question(tiny_corpus):
    out, qa = tiny_corpus
    with pytest.raises(PipelineError, match="no results"):
        qa_accuracy({}, qa, out)
    with pytest.raises(PipelineError) as info:
        qa_accuracy({"q0": {"p0": 1.0}, "17": {"p0": 1.0}}, qa, out)
    assert "none of the run's 2 query ids" in str(info.value) and "0..4" in str(info.value)
