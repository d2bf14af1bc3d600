"""TREC run files (`qid Q0 docid rank score tag`): read into {qid: {docid: score}}, written atomically.

`pipeline retrieve`, in-training validation and the FAQ evaluation write runs with `write_run`;
the metrics read them with `read_run` (line parsing and its errors: `data/readers.read_run_file`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..data.readers import read_run_file
from ..errors import InputError
from ..io_utils import atomic_path


def read_run(path: str | Path) -> dict[str, dict[str, float]]:
    """TREC run -> {qid: {docid: score}}; malformed lines fail with file:line.

    A score that is not a finite number (nan, inf) is refused: it has no place in a ranking
    and would make the metrics depend on line order.
    """
    run: dict[str, dict[str, float]] = {}
    for r in read_run_file(path):
        if not math.isfinite(r["score"]):
            raise InputError(path, r["line"], f"score {r['score']!r} of document {r['docid']!r} is not a finite number")
        docs = run.setdefault(r["qid"], {})
        if r["docid"] in docs:
            raise InputError(path, r["line"], f"document {r['docid']!r} appears twice for query {r['qid']!r}")
        docs[r["docid"]] = r["score"]
    return run


def write_run(path: str | Path, qids: list[str], pids: list[str], scores: np.ndarray, ids: np.ndarray,
              tag: str) -> int:
    """TREC run `qid Q0 docid rank score tag`, atomically. Returns lines written."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for qi, qid in enumerate(qids):
            rank = 0
            for score, row in zip(scores[qi], ids[qi]):
                if row < 0:
                    continue
                rank += 1
                f.write(f"{qid} Q0 {pids[row]} {rank} {float(score):.6f} {tag}\n")
                n += 1
    return n
