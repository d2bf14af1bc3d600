"""DPR top-k answer accuracy (docs/METHODS.md §7), with DPR's own answer matching.

A question is answered at k when one of its top-k passages contains one of its answers,
decided as DPR's `has_answer` (dpr/data/qa_validation.py) decides it:

* `string` (NQ, TriviaQA, WebQuestions): passage and answer are Unicode-NFD normalised and
  split by DPR's SimpleTokenizer — a token is a run of letters/digits/combining marks, or
  any single other character that is not a separator or control character, so punctuation
  is kept as tokens and nothing (articles included) is dropped; tokens are lower-cased and
  the answer's token sequence must occur contiguously in the passage's.
  "The Who" does not match "who is the president"; "U.S." does not match "US".
* `regex` (CuratedTREC): each answer is a regular expression (the `regex` module, flags
  IGNORECASE | UNICODE | MULTILINE), searched in the NFD-normalised passage text.
  A pattern that does not compile matches nothing (as in DPR); qa_accuracy counts them.

One deliberate difference: an answer with no tokens (empty or only whitespace) matches
nothing here, where DPR's loop would count it as found in every passage.
Only the passage text is searched, not its title (DPR's `check_answer`).

Beside top-k accuracy, the answer-based ranking measures of the DAR paper (appendix A, "Metrics";
its Table 6) over the top `rank_depth` (100) passages, a passage being correct when it holds an answer:
* `MRR@100`: the reciprocal rank of the first correct passage (0 when none is in the top 100);
* `MAP@100`: the mean, over the correct passages in the top 100, of the precision at each one's rank
  (0 when none is): average precision whose relevant set is the correct passages retrieved, since a
  QA file names no passage as relevant.
Both are averaged over every question of the file, as top-k accuracy is.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from pathlib import Path

import regex

from ..data.corpus import fetch_passages
from ..data.readers import read_dpr_qa
from ..errors import PipelineError

MATCH_TYPES = ("string", "regex")

# DPR's SimpleTokenizer: alphanumeric runs (letters, numbers, marks) or one non-space character.
_TOKEN = regex.compile(r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]", flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)
_REGEX_FLAGS = regex.IGNORECASE | regex.UNICODE | regex.MULTILINE


def dpr_tokens(text: str) -> list[str]:
    """NFD-normalised, lower-cased tokens of DPR's SimpleTokenizer (punctuation kept, articles kept)."""
    return [t.lower() for t in _TOKEN.findall(unicodedata.normalize("NFD", text))]


@lru_cache(maxsize=65536)
def _answer_tokens(answer: str) -> tuple[str, ...]:
    return tuple(dpr_tokens(answer))


@lru_cache(maxsize=65536)
def compile_answer_regex(pattern: str):
    """DPR's regex mode pattern (NFD-normalised), or None when it does not compile."""
    try:
        return regex.compile(unicodedata.normalize("NFD", pattern), flags=_REGEX_FLAGS)
    except (regex.error, TypeError, ValueError, OverflowError, RecursionError):
        return None


def _contains(tokens: list[str], seq: tuple[str, ...]) -> bool:
    n = len(seq)
    if n == 0:
        return False
    seq_list, first = list(seq), seq[0]
    return any(tokens[i] == first and tokens[i:i + n] == seq_list for i in range(len(tokens) - n + 1))


def has_answer(passage: str, answers: list[str], match_type: str = "string") -> bool:
    """Whether `passage` contains one of `answers`, as DPR's has_answer decides."""
    if match_type == "string":
        tokens = dpr_tokens(passage)
        return any(_contains(tokens, _answer_tokens(a)) for a in answers)
    if match_type == "regex":
        text = unicodedata.normalize("NFD", passage)
        for a in answers:
            pattern = compile_answer_regex(a)
            if pattern is not None and pattern.search(text) is not None:
                return True
        return False
    raise PipelineError(f"answer match type {match_type!r} is not one of {list(MATCH_TYPES)}")


def answer_ranks_measures(hits: list[int], depth: int = 100) -> tuple[float, float]:
    """(reciprocal rank, average precision) of one question whose correct passages sit at the 1-based
    ranks `hits` (ascending), both over the top `depth`: RR = 1/first rank; AP = mean over the correct
    passages of (correct passages up to its rank) / its rank; (0, 0) when none is in the top `depth`."""
    hits = [r for r in hits if r <= depth]
    if not hits:
        return 0.0, 0.0
    return 1.0 / hits[0], sum(i / r for i, r in enumerate(hits, 1)) / len(hits)


def qa_accuracy(run: dict[str, dict[str, float]], qa_path: str | Path, corpus_dir: str | Path,
                ks: tuple[int, ...] = (1, 5, 20, 100), match_type: str = "string", rank_depth: int = 100,
                per_query: bool = False) -> dict:
    """Top-k accuracy, MRR@rank_depth and MAP@rank_depth for a run whose qids are the DPR QA file's
    0-based row indices.

    Averages over every question of the QA file (a question missing from the run counts
    as unanswered, as in DPR). A run that holds no results, or none for this file's
    questions, is an error. `per_query`: also every question's values (`per_query`, by qid).
    """
    if match_type not in MATCH_TYPES:
        raise PipelineError(f"answer match type {match_type!r} is not one of {list(MATCH_TYPES)}")
    questions = {q["qid"]: q for q in read_dpr_qa(qa_path)}
    if not questions:
        raise PipelineError(f"{qa_path}: no questions")
    if not any(run.values()):
        raise PipelineError("the run holds no results, nothing to evaluate")
    in_run = {q for q, docs in run.items() if docs and q in questions}
    if not in_run:
        sample = ", ".join(repr(q) for q in sorted(run)[:5])
        raise PipelineError(f"none of the run's {len(run)} query ids ({sample}{', ...' if len(run) > 5 else ''}) "
                            f"is a question of {qa_path} (ids are the file's 0-based row numbers 0..{len(questions) - 1})")
    # trec_eval's order: score descending, ties by docid descending
    ranked = {q: [d for d, _ in sorted(docs.items(), key=lambda x: (x[1], x[0]), reverse=True)]
              for q, docs in run.items()}
    depth = max(max(ks), rank_depth)
    needed = {d for q in questions for d in ranked.get(q, [])[:depth]}
    texts = fetch_passages(corpus_dir, needed, join="none")  # DPR's has_answer: passage text, no title
    hits: dict[str, list[int]] = {}  # every question's ranks (1-based, ascending) of passages holding an answer
    for qid, q in questions.items():
        hits[qid] = [rank for rank, pid in enumerate(ranked.get(qid, [])[:depth], 1)
                     if has_answer(texts.get(pid, ""), q["answers"], match_type)]
    n = len(questions)
    per: dict[str, dict[str, float]] = {}
    for qid, h in hits.items():
        rr, ap = answer_ranks_measures(h, rank_depth)
        per[qid] = {**{f"Top-{k}": float(bool(h) and h[0] <= k) for k in ks},
                    f"MRR@{rank_depth}": rr, f"MAP@{rank_depth}": ap}
    names = [f"Top-{k}" for k in ks] + [f"MRR@{rank_depth}", f"MAP@{rank_depth}"]
    metrics = {m: sum(v[m] for v in per.values()) / n for m in names}
    queries = {"questions": n, "in_run": len(in_run)}
    if match_type == "regex":
        queries["answers_not_compiling"] = sum(compile_answer_regex(a) is None
                                               for q in questions.values() for a in q["answers"])
    else:
        queries["answers_without_tokens"] = sum(not dpr_tokens(a) for q in questions.values() for a in q["answers"])
    result = {"metrics": metrics, "queries": queries, "match": match_type, "rank_depth": rank_depth}
    if per_query:
        result["per_query"] = per
    return result
