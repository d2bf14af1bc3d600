"""DPR-style top-k answer accuracy (METHODS.md §7).

A question is answered at k when one of its top-k passages contains an answer
string as a token sequence. Normalisation: Unicode NFD, lower-case, tokens are
runs of letters/digits/marks (DPR's SimpleTokenizer alphanumeric tokens, so
punctuation is stripped), and the articles a/an/the are dropped (SQuAD style).
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import regex

from ..data.corpus import fetch_passages
from ..data.readers import read_dpr_qa

_TOKEN = regex.compile(r"[\p{L}\p{N}\p{M}]+")
_ARTICLES = {"a", "an", "the"}


def normalize_tokens(text: str) -> list[str]:
    text = unicodedata.normalize("NFD", text).lower()
    return [t for t in _TOKEN.findall(text) if t not in _ARTICLES]


def has_answer(passage: str, answers: list[str]) -> bool:
    tokens = normalize_tokens(passage)
    for answer in answers:
        ans = normalize_tokens(answer)
        if not ans:
            continue
        n = len(ans)
        for i in range(len(tokens) - n + 1):
            if tokens[i:i + n] == ans:
                return True
    return False


def qa_accuracy(run: dict[str, dict[str, float]], qa_path: str | Path, corpus_dir: str | Path,
                ks: tuple[int, ...] = (1, 5, 20, 100)) -> dict:
    """Top-k accuracy for a run whose qids are the DPR QA file's 0-based row indices."""
    questions = {q["qid"]: q for q in read_dpr_qa(qa_path)}
    ranked = {q: [d for d, _ in sorted(docs.items(), key=lambda x: -x[1])] for q, docs in run.items()}
    kmax = max(ks)
    needed = {d for q in questions for d in ranked.get(q, [])[:kmax]}
    texts = fetch_passages(corpus_dir, needed, join="none")  # DPR's has_answer: passage text, no title
    first_hit: dict[str, int | None] = {}
    for qid, q in questions.items():
        first_hit[qid] = None
        for rank, pid in enumerate(ranked.get(qid, [])[:kmax], 1):
            if has_answer(texts.get(pid, ""), q["answers"]):
                first_hit[qid] = rank
                break
    n = len(questions)
    metrics = {f"Top-{k}": sum(1 for r in first_hit.values() if r is not None and r <= k) / n for k in ks}
    return {"metrics": metrics, "queries": {"questions": n, "in_run": len(set(run) & set(questions))}}
