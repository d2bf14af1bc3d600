"""Training examples from qrels: an ingested corpus (BEIR, MS MARCO), its queries and a qrels split,
one example per (query, relevant passage), optionally capped per query (`pick_positives`); hard
negatives from a TREC run with every judged-relevant passage removed (`run_negatives`); a query the run
names no unjudged passage for is left out (counted), or given unjudged passages drawn at random from the
corpus (`random_negatives`), so that every query trains.

The examples come as Arrow tables in the ids form (rows of the store's `passages.arrow`, which
`qrels_example_tables` fills from the corpus) or the texts form; `examples_store` has both forms.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InputError, PipelineError
from .corpus import PassageStore, corpus_pids
from .examples_store import PASSAGES_FILE, resolve_examples
from .readers import load_queries, read_qrels
from .run_negatives import run_negatives


def qrels_examples(corpus_dir: str | Path, queries: str | Path, qrels: str | Path,
                   negatives_run: str | Path | None = None, depth: int = 100, rel_level: int = 1,
                   max_negatives: int = 30, skipped: dict | None = None,
                   need_negatives: bool = False, scratch: str | Path | None = None,
                   batch: int = 2_000) -> Iterator[dict]:
    """One example per (query, relevant passage) from an ingested corpus + qrels (+ a TREC run):
    `qrels_example_tables`' rows as dicts."""
    for table in qrels_example_tables(corpus_dir, queries, qrels, negatives_run, depth, rel_level, max_negatives,
                                      skipped, need_negatives, scratch, batch):
        yield from table.to_pylist()


def qrels_example_tables(corpus_dir: str | Path, queries: str | Path, qrels: str | Path,
                         negatives_run: str | Path | None = None, depth: int = 100, rel_level: int = 1,
                         max_negatives: int = 30, skipped: dict | None = None,
                         need_negatives: bool = False, scratch: str | Path | None = None,
                         batch: int = 2_000, store_path: str | Path | None = None, per_query: int = 0,
                         positives_seed: int = 0, missing_negatives: str = "skip",
                         drawn: dict | None = None) -> Iterator[pa.Table]:
    """The examples of `qrels_examples` as Arrow tables of `batch` rows, in qid order. With `per_query` > 0
    each query keeps that many of its positives (`pick_positives`). With `need_negatives`, a query whose
    run lines are all judged (or that the run lacks) is left out and counted in `skipped["no_negatives"]`
    (`missing_negatives="skip"`), or takes `max_negatives` unjudged passages drawn at random from the corpus
    (`"random"`, seeded by `positives_seed` and the query id): their examples are counted in
    `drawn["random_negatives"]`.

    With `store_path`, the ids form: the texts of every positive and negative are copied once into
    the Arrow file `store_path` (kept: the caller's), and the tables carry rows of that file
    (qid, query, positive_row, negative_rows). Without it, the texts form (qid, query, positive,
    negatives), gathered from such a file under `scratch`, removed at the end.

    Memory grows with the number of queries (their texts, judged ids and negative ids), not with
    the run's lines or the passages' texts: a run grouped by query is read a query at a time, and the
    passages' texts live in the memory-mapped file (no Python string per text)."""
    skipped = skipped if skipped is not None else {}
    qtext = load_queries(queries)
    # per query, its positives and its judged passages as tuples (most queries have one or two: a
    # tuple costs a fraction of a set's or a list's memory, at 500k queries that counts)
    positives: dict[str, tuple[str, ...]] = {}
    judged: dict[str, tuple[str, ...]] = {}
    grades: dict[str, tuple[int, ...]] = {}
    for r in read_qrels(qrels):
        q, d = r["qid"], r["docid"]
        seen = judged.get(q, ())
        if d in seen:
            raise InputError(qrels, r["line"], f"duplicate judgement for query {q!r}, doc {d!r}")
        judged[q] = seen + (d,)
        if r["rel"] >= rel_level:
            if q not in qtext:
                raise InputError(qrels, r["line"], f"query {q!r} is not in {queries}")
            positives[q] = positives.get(q, ()) + (d,)
            if per_query:
                grades[q] = grades.get(q, ()) + (int(r["rel"]),)
    if per_query:
        positives = pick_positives(positives, grades, per_query, positives_seed, skipped)
        del grades
    # per query, its negatives' ids as one tab-joined string (a tenth of a list of strings' memory)
    negs = run_negatives(negatives_run, positives, judged, depth, max_negatives) if negatives_run else {}
    if need_negatives and missing_negatives == "random":
        lacking = [q for q in positives if not negs.get(q)]
        if lacking:
            negs.update(random_negatives(corpus_dir, lacking, judged, max_negatives, positives_seed))
            if drawn is not None:
                drawn["random_negatives"] = sum(len(positives[q]) for q in lacking if negs.get(q))
    del judged

    def needed():
        chunk: list[str] = []
        for q, ps in positives.items():
            chunk.extend(ps)
            if negs.get(q):
                chunk.extend(negs[q].split("\t"))
            if len(chunk) >= 100_000:
                yield pc.unique(pa.array(chunk, pa.string()))
                chunk = []
        if chunk:
            yield pc.unique(pa.array(chunk, pa.string()))

    need = pa.concat_arrays(list(needed()) or [pa.array([], pa.string())])
    tmp = None
    if store_path is None:
        if scratch is not None:
            Path(scratch).mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".passages-", dir=scratch))
    try:
        store = PassageStore(corpus_dir, need, store_path or tmp / PASSAGES_FILE, join=None)
        del need
        if len(store.missing):
            raise PipelineError(f"{len(store.missing)} qrels/run passages are not in {corpus_dir}, "
                                f"e.g. {sorted(store.missing.to_pylist()[:50])[:3]}")
        pending: list[tuple[str, str, list[str]]] = []

        def emit():
            if not pending:
                return
            n = len(pending)
            ids = [pid for _, pid, _ in pending] + [p for _, _, ns in pending for p in ns]
            rows, _ = store.rows(pa.array(ids, pa.string()))  # every one found: checked above
            offsets = np.zeros(n + 1, dtype=np.int32)
            np.cumsum([len(ns) for _, _, ns in pending], out=offsets[1:])
            table = pa.table({"qid": pa.array([q for q, _, _ in pending], pa.string()),
                              "query": pa.array([qtext[q] for q, _, _ in pending], pa.string()),
                              "positive_row": pa.array(rows[:n], pa.int64()),
                              "negative_rows": pa.ListArray.from_arrays(pa.array(offsets, pa.int32()),
                                                                        pa.array(rows[n:], pa.int64()))})
            yield table if store_path is not None else resolve_examples(table, store.texts)
            pending.clear()

        for qid in sorted(positives):
            qnegs = negs[qid].split("\t") if negs.get(qid) else []
            if need_negatives and not qnegs:
                skipped["no_negatives"] = skipped.get("no_negatives", 0) + len(positives[qid])
                continue
            for pid in positives[qid]:
                pending.append((qid, pid, qnegs))
            if len(pending) >= batch:
                yield from emit()
        yield from emit()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def random_negatives(corpus_dir: str | Path, qids: list[str], judged: dict[str, tuple[str, ...]], k: int,
                     seed: int) -> dict[str, str]:
    """{qid: tab-joined ids} of `k` passages drawn at random from the corpus, none judged for the query (the
    DPR paper's "random" negatives): a draw seeded by (`seed`, the query id), so it depends neither on the
    order of the queries nor on which other queries lack negatives. Reads the corpus's pid column once."""
    import hashlib

    pids = corpus_pids(corpus_dir)
    out = {}
    for q in qids:
        out_of = set(judged.get(q, ()))
        free = len(pids) - len(out_of)
        if free <= 0:
            continue  # every passage is judged for it: nothing to draw (left out as before)
        digest = hashlib.sha256(f"random-negatives\0{seed}\0{q}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        want = min(k, free)
        picked: list[str] = []
        seen: set[int] = set()
        while len(picked) < want:  # judged passages are few against a corpus: a draw rarely repeats
            for i in rng.integers(0, len(pids), size=2 * (want - len(picked)) + len(out_of)).tolist():
                if i in seen:
                    continue
                seen.add(i)
                pid = pids[i].as_py()
                if pid not in out_of:
                    picked.append(pid)
                    if len(picked) == want:
                        break
        out[q] = "\t".join(picked)
    return out


def pick_positives(positives: dict[str, tuple[str, ...]], grades: dict[str, tuple[int, ...]], per_query: int,
                   seed: int, skipped: dict | None = None) -> dict[str, tuple[str, ...]]:
    """Each query's `per_query` positives of highest grade; among equal grades a draw seeded by (`seed`, the
    query id), so it does not depend on the order of the qrels file nor on the other queries. The positives
    left out are counted in `skipped["positives_over_cap"]`."""
    import hashlib

    out = {}
    dropped = 0
    for q, docs in positives.items():
        if len(docs) <= per_query:
            out[q] = docs
            continue
        digest = hashlib.sha256(f"{seed}\0{q}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        tiebreak = rng.permutation(len(docs))
        order = sorted(range(len(docs)), key=lambda i: (-grades[q][i], tiebreak[i]))
        out[q] = tuple(docs[i] for i in order[:per_query])
        dropped += len(docs) - per_query
    if dropped and skipped is not None:
        skipped["positives_over_cap"] = skipped.get("positives_over_cap", 0) + dropped
    return out
