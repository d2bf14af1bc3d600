"""TREC run files (`qid Q0 docid rank score tag`): read into {qid: {docid: score}}, written atomically.

`pipeline retrieve`, in-training validation and the FAQ evaluation write runs with `write_run`;
the metrics read them with `read_run`, or query by query with `iter_run_groups` (bounded memory) (line parsing and its errors: `data/readers.read_run_file`).
A run written again into a run this tool wrote (`RunOutput`) is computed beside it and kept when the lines
are the same; other lines, or a request its `<run>.meta.json` says is another, are refused.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Iterator

import numpy as np

from ..data.readers import read_run_file
from ..errors import InputError, NonFiniteError
from ..io_utils import atomic_path, is_rerun, refuse_different, request_differs, same_output, scratch_beside


class RunNotGrouped(Exception):
    """A query's lines are not contiguous in the run (its group closed, then it came back)."""


def iter_run_groups(path: str | Path) -> Iterator[tuple[str, dict[str, float]]]:
    """TREC run -> (qid, {docid: score}) one query at a time, for runs whose lines are grouped by
    query (as `pipeline retrieve`, trec_eval's inputs and most tools write them): memory holds one
    query's lines. Checks as `read_run`; raises RunNotGrouped when a query comes back after
    another one (the caller then reads the run whole)."""
    closed: set[str] = set()
    qid, docs = None, {}
    for r in read_run_file(path):
        if r["qid"] != qid:
            if qid is not None:
                yield qid, docs
                closed.add(qid)
            qid, docs = r["qid"], {}
            if qid in closed:
                raise RunNotGrouped(qid)
        if not math.isfinite(r["score"]):
            raise InputError(path, r["line"], f"score {r['score']!r} of document {r['docid']!r} is not a finite number")
        if r["docid"] in docs:
            raise InputError(path, r["line"], f"document {r['docid']!r} appears twice for query {r['qid']!r}")
        docs[r["docid"]] = r["score"]
    if qid is not None:
        yield qid, docs


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


class RunWriter:
    """A TREC run written batch by batch into a temporary file that becomes `path` only when the
    `with` block ends without an error: memory holds one batch, and a failed run leaves nothing."""

    def __init__(self, path: str | Path, tag: str):
        self.path, self.tag, self.lines = path, tag, 0
        self._atomic = self._file = None

    def __enter__(self) -> "RunWriter":
        self._atomic = atomic_path(self.path)
        tmp = self._atomic.__enter__()
        self._file = open(tmp, "w", encoding="utf-8")
        return self

    def write(self, qids, pids, scores: np.ndarray, ids: np.ndarray) -> int:
        """Rows of `scores`/`ids` (as FAISS returns them; -1 = no hit) for `qids`; `pids[row]` names a hit."""
        out, tag = [], self.tag
        bad = ~np.isfinite(np.asarray(scores)) & (np.asarray(ids) >= 0)
        if bad.any():
            qi = int(np.flatnonzero(bad.any(axis=1))[0])
            raise NonFiniteError(f"{self.path}: non-finite scores (NaN or inf) for query {qids[qi]}; "
                                 "a run cannot rank by them (nothing was written)")
        take = getattr(pids, "take", None)  # a PidTable decodes a batch of rows at once
        for qi, qid in enumerate(qids):
            rows = np.asarray(ids[qi])
            keep = rows >= 0
            hit_rows = rows[keep]
            names = take(hit_rows) if take is not None else [pids[r] for r in hit_rows.tolist()]
            out.extend(f"{qid} Q0 {name} {rank} {score:.6f} {tag}\n"
                       for rank, (name, score) in enumerate(zip(names, np.asarray(scores[qi])[keep].tolist()), 1))
        self._file.write("".join(out))
        self.lines += len(out)
        return len(out)

    def __exit__(self, *exc) -> bool:
        self._file.close()
        return bool(self._atomic.__exit__(*exc))


def write_run(path: str | Path, qids: list[str], pids, scores: np.ndarray, ids: np.ndarray, tag: str) -> int:
    """TREC run `qid Q0 docid rank score tag`, atomically. Returns lines written."""
    with RunWriter(path, tag) as w:
        w.write(qids, pids, scores, ids)
    return w.lines


class RunOutput:
    """Where a verb writes its run (`target()`): `run_path` itself, or, when `run_path` already holds a run this
    tool wrote and `overwrite` is off, a scratch file beside it that `unchanged` compares with it. A re-run whose
    `<run>.meta.json` records another request (`asked`: top_k, queries, ...) is refused before any work."""

    def __init__(self, run_path: str | Path, overwrite: bool, asked: dict | None = None):
        self.path = Path(run_path)
        self.rerun = is_rerun(run_path, "run", overwrite)
        if self.rerun and (differs := request_differs(self.meta(), asked or {})):
            refuse_different(run_path, "run", differs)

    def meta(self) -> dict:
        """The `<run>.meta.json` already there ({} when none is readable)."""
        try:
            meta = json.loads(Path(str(self.path) + ".meta.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return meta if isinstance(meta, dict) else {}

    @contextlib.contextmanager
    def target(self) -> Iterator[Path]:
        if not self.rerun:
            yield self.path
            return
        with scratch_beside(self.path) as scratch:
            yield scratch

    def unchanged(self, written: Path) -> bool:
        """On a re-run: True when `written` holds the very lines of the run there (which is kept as it is); other
        lines are refused. False when this was no re-run (`written` is the run)."""
        if not self.rerun:
            return False
        if not same_output(written, self.path):
            refuse_different(self.path, "run", "other lines: the index, the model or the queries changed since")
        return True
