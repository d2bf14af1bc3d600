"""A TREC run's hard negatives per query (BM25 or dense): its top `depth` by score minus every
judged passage. A plain run is read column-wise in blocks (`run_table`); any other by the line reader
here: grouped by query a query at a time, an interleaved one whole."""

from __future__ import annotations

from pathlib import Path

from .readers import read_run_file
from .run_table import negatives_by_query


def run_negatives(run: str | Path, positives: dict[str, tuple[str, ...]], judged: dict[str, tuple[str, ...]],
                  depth: int, max_negatives: int) -> dict[str, str]:
    """{qid: tab-joined negative ids}: the run's top `depth` by score (not its rank column, which may
    be 0- or 1-based), minus every judged passage, at most `max_negatives`; for the queries with
    positives. A plain run (one space between fields, as most tools write) is read column-wise in
    blocks (`run_table`); any other is read line by line: grouped by query a query at a time, an
    interleaved one whole."""
    fast = negatives_by_query(run, positives, judged, depth, max_negatives)
    if fast is not None:
        return fast
    negs: dict[str, str] = {}

    def close(q: str, lst: list[tuple[float, str]]) -> None:
        out = set(judged[q])
        top = [d for _, d in sorted(lst)[:depth] if d not in out]
        negs[q] = "\t".join(top[:max_negatives])

    seen: set[str] = set()
    cur, lst = None, []
    for r in read_run_file(run):
        q = r["qid"]
        if q != cur:
            if cur is not None and lst:
                close(cur, lst)
            if q in seen:
                break  # interleaved: read it whole below
            seen.add(q)
            cur, lst = q, []
        if q in positives:
            lst.append((-r["score"], r["docid"]))
    else:
        if cur is not None and lst:
            close(cur, lst)
        return negs
    negs.clear()
    ranked: dict[str, list[tuple[float, str]]] = {}
    for r in read_run_file(run):
        if r["qid"] in positives:
            ranked.setdefault(r["qid"], []).append((-r["score"], r["docid"]))
    for q, lst in ranked.items():
        close(q, lst)
    return negs
