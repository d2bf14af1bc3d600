"""Training examples: (query, positive[, hard negatives]) from DPR JSON, or qrels + corpus (+ a TREC run).

Sources
- DPR retriever training JSON (`question`, `answers`, `positive_ctxs`, `negative_ctxs`,
  `hard_negative_ctxs`; ctx = `title`, `text`, `passage_id`), read as a stream: the
  top-level array is decoded object by object, never loaded whole.
- BEIR / MS MARCO: an ingested corpus, its queries and a qrels split; one example per
  (query, relevant passage); hard negatives from a TREC run (BM25 or dense) with every
  judged-relevant passage removed.

Output (what Ray Data streams into the training workers):

    examples/part-00000.parquet  idx, qid, query, positive, negatives (list<string>)
    examples/examples.json       source, counts, skipped (with reasons), title join; written last

Document texts are stored already title-joined with the corpus's template.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..progress import inherit as inherit_progress
from ..errors import InputError, PipelineError
from ..io_utils import atomic_path, sha256_file, sha256_files
from .corpus import PassageStore
from .manifest import join_title, load_manifest
from .readers import load_queries, read_qrels, read_run_file
from .run_table import negatives_by_query

EXAMPLES_META = "examples.json"
SCHEMA = pa.schema([("idx", pa.int64()), ("qid", pa.string()), ("query", pa.string()),
                    ("positive", pa.string()), ("negatives", pa.list_(pa.string()))])


def iter_json_array(path: str | Path, chunk_size: int = 1 << 20) -> Iterator[tuple[int, int, dict]]:
    """Stream the objects of a top-level JSON array: yields (index, line, object).

    Memory holds one object (plus a chunk) at a time. Separators are checked: objects
    must be separated by single commas, and nothing may follow the closing bracket.
    """
    path = Path(path)
    decoder = json.JSONDecoder()
    if not path.exists():
        raise InputError(path, None, "file not found")
    with open(path, "r", encoding="utf-8-sig", errors="strict") as f:
        buf, pos, line, idx = "", 0, 1, 0
        state = "start"  # start -> value -> sep -> value ... -> end

        def more() -> bool:
            nonlocal buf, pos
            try:
                chunk = f.read(chunk_size)
            except UnicodeDecodeError as e:
                raise InputError(path, line, f"invalid UTF-8: {e.reason}") from None
            if not chunk:
                return False
            buf = buf[pos:] + chunk
            pos = 0
            return True

        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                line += buf[pos] == "\n"
                pos += 1
            if pos >= len(buf):
                if more():
                    continue
                if state == "end":
                    return
                raise InputError(path, line, "unexpected end of file (unterminated JSON array)")
            ch = buf[pos]
            if state == "end":
                raise InputError(path, line, f"unexpected {ch!r} after the closing ']'")
            if state == "start":
                if ch != "[":
                    raise InputError(path, line, "expected a JSON array of examples ('[' at the start)")
                state, pos = "first", pos + 1
                continue
            if ch == "]" and state in ("first", "sep"):
                state, pos = "end", pos + 1
                continue
            if state == "sep":
                if ch != ",":
                    raise InputError(path, line, f"expected ',' or ']' between examples, found {ch!r}")
                state, pos = "value", pos + 1
                continue
            while True:
                try:
                    obj, end = decoder.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as e:
                    # Incomplete at the end of the buffer: read on. An error inside the buffer is real.
                    truncated = e.pos >= len(buf) - 1 or e.msg.startswith("Unterminated string")
                    if truncated and more():
                        continue
                    raise InputError(path, line + buf.count("\n", pos, e.pos), f"invalid JSON: {e.msg}") from None
            if not isinstance(obj, dict):
                raise InputError(path, line, "each array element must be a JSON object")
            yield idx, line, obj
            line += buf.count("\n", pos, end)
            pos, idx, state = end, idx + 1, "sep"


def _ctx_text(ctx: dict, join: str) -> str:
    return join_title(ctx.get("title") or "", ctx.get("text") or "", join)


def dpr_json_examples(path: str | Path, join: str = "{title} [SEP] {text}", negatives: str = "hard",
                      skipped: dict | None = None, need_negatives: bool = False) -> Iterator[dict]:
    """Examples from DPR training JSON. `negatives`: 'hard' (hard_negative_ctxs, falling back to
    negative_ctxs), 'random' (negative_ctxs) or 'both'. Questions without a positive are skipped
    and counted in `skipped` (as DPR's own loader does)."""
    skipped = skipped if skipped is not None else {}
    for i, line, obj in iter_json_array(path):
        if "question" not in obj or "positive_ctxs" not in obj:
            raise InputError(path, line, f"example {i}: missing 'question' or 'positive_ctxs'")
        if not obj["positive_ctxs"]:
            skipped["no_positive"] = skipped.get("no_positive", 0) + 1
            continue
        first = obj["positive_ctxs"][0]
        if not isinstance(first, dict) or not str(first.get("text") or "").strip():
            raise InputError(path, line, f"example {i}: the first positive context has no 'text'")
        hard = obj.get("hard_negative_ctxs") or []
        rand = obj.get("negative_ctxs") or []
        negs = {"hard": hard or rand, "random": rand, "both": hard + rand}[negatives]
        if need_negatives and not negs:
            skipped["no_negatives"] = skipped.get("no_negatives", 0) + 1
            continue
        yield {"qid": str(obj.get("id", i)), "query": obj["question"],
               "positive": _ctx_text(obj["positive_ctxs"][0], join),
               "negatives": [_ctx_text(c, join) for c in negs]}


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
                         batch: int = 2_000) -> Iterator[pa.Table]:
    """The examples of `qrels_examples` as Arrow tables of `batch` rows (qid, query, positive,
    negatives), in qid order.

    Memory grows with the number of queries (their texts, judged ids and negative ids), not with
    the run's lines or the passages' texts: a run grouped by query is read a query at a time, and the
    texts of every positive and negative are copied once into a memory-mapped Arrow file under
    `scratch` (removed at the end) and gathered from it in Arrow (no Python string per text)."""
    skipped = skipped if skipped is not None else {}
    qtext = load_queries(queries)
    # per query, its positives and its judged passages as tuples (most queries have one or two: a
    # tuple costs a fraction of a set's or a list's memory, at 500k queries that counts)
    positives: dict[str, tuple[str, ...]] = {}
    judged: dict[str, tuple[str, ...]] = {}
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
    # per query, its negatives' ids as one tab-joined string (a tenth of a list of strings' memory)
    negs = _run_negatives(negatives_run, positives, judged, depth, max_negatives) if negatives_run else {}
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
    if scratch is not None:
        Path(scratch).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".passages-", dir=scratch))
    try:
        store = PassageStore(corpus_dir, need, tmp / "passages.arrow", join=None)
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
            texts = store.take(ids).combine_chunks()
            offsets = np.zeros(n + 1, dtype=np.int32)
            np.cumsum([len(ns) for _, _, ns in pending], out=offsets[1:])
            negatives = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), texts.slice(n))
            yield pa.table({"qid": pa.array([q for q, _, _ in pending], pa.string()),
                            "query": pa.array([qtext[q] for q, _, _ in pending], pa.string()),
                            "positive": texts.slice(0, n), "negatives": negatives})
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
        shutil.rmtree(tmp, ignore_errors=True)


def _run_negatives(run: str | Path, positives: dict[str, tuple[str, ...]], judged: dict[str, tuple[str, ...]], depth: int,
                   max_negatives: int) -> dict[str, str]:
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


def write_examples(examples: Iterator[dict | pa.Table], out: str | Path, meta: dict, part_rows: int = 50_000,
                   skipped: dict | None = None) -> dict:
    """Write examples as Parquet parts with a running `idx`; the meta file marks completion.
    Rows go out `batch_rows` at a time (a row group each), so memory holds one batch, not a part;
    an Arrow table among the examples (columns qid, query, positive, negatives) is one row group."""
    out = Path(out)
    n = 0
    batch_rows = min(part_rows, 5_000)
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        buf: list[dict] = []
        parts, in_part, writer = 0, 0, None

        def flush():
            nonlocal buf, parts, in_part, writer
            if buf:
                if writer is None:
                    writer = pq.ParquetWriter(tmp / f"part-{parts:05d}.parquet", SCHEMA)
                writer.write_table(pa.Table.from_pylist(buf, schema=SCHEMA))
                in_part += len(buf)
                buf = []
            if writer is not None and (in_part >= part_rows or not more):
                writer.close()
                writer, parts, in_part = None, parts + 1, 0

        def write_table(table: pa.Table) -> None:  # a batch already in Arrow: written as it is
            nonlocal n, parts, in_part, writer
            flush()
            if writer is None:
                writer = pq.ParquetWriter(tmp / f"part-{parts:05d}.parquet", SCHEMA)
            idx = pa.array(np.arange(n, n + table.num_rows, dtype=np.int64))
            writer.write_table(pa.table([idx] + [table[f] for f in SCHEMA.names[1:]], schema=SCHEMA))
            n += table.num_rows
            in_part += table.num_rows
            if in_part >= part_rows:
                writer.close()
                writer, parts, in_part = None, parts + 1, 0

        more = True
        try:
            for ex in examples:
                if isinstance(ex, pa.Table):
                    write_table(ex)
                    continue
                buf.append({"idx": n, **ex})
                n += 1
                if len(buf) >= batch_rows:
                    flush()
            more = False
            flush()
        finally:
            if writer is not None:
                writer.close()
        if n == 0:
            raise PipelineError(f"no training examples from {meta.get('source')}")
        digest = sha256_files(sorted(tmp.glob("part-*.parquet")))
        meta = {**meta, "examples": n, "parts": parts, "skipped": dict(skipped or {}), "digest": digest}
        (tmp / EXAMPLES_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def _read_ahead(items: Iterator, depth: int = 2) -> Iterator:
    """`items`, produced by a thread of their own at most `depth` ahead of the consumer. The
    producer's error is raised here; a consumer that stops early stops (and closes) the producer."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    on_behalf = inherit_progress()  # the producer's progress goes where the consumer's would

    def produce() -> None:
        try:
            with on_behalf():
                for item in items:
                    while not stop.is_set():
                        try:
                            q.put((item, None), timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        break
        except BaseException as e:  # handed to the consumer, raised there
            q.put((end, e))
            return
        finally:
            if hasattr(items, "close"):
                items.close()  # a generator's cleanup (e.g. its scratch folder) runs now
        q.put((end, None))

    worker = threading.Thread(target=produce, name="examples-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item, error = q.get()
            if item is end:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get(timeout=0.1)
            except queue.Empty:
                pass
        worker.join()


def build_examples(data_cfg, out: str | Path, progress: bool = True) -> dict:
    """Build (or reuse, when the sources are unchanged) the training examples for `data_cfg`."""
    out = Path(out)
    if data_cfg.source == "dpr-json":
        if not data_cfg.path:
            raise PipelineError("data.source=dpr-json needs data.path (the DPR training JSON)")
        sources = [data_cfg.path]
        meta = {"source": "dpr-json", "path": str(Path(data_cfg.path).resolve()), "title_join": data_cfg.title_join,
                "negatives": data_cfg.negatives}
    else:
        if not data_cfg.corpus:
            raise PipelineError("data.source=qrels needs data.corpus (an ingested corpus folder)")
        corpus = Path(data_cfg.corpus)
        manifest = load_manifest(corpus)
        queries = data_cfg.queries or str(corpus / "queries.tsv")
        qrels = data_cfg.qrels or str(corpus / "qrels" / "train.trec")
        sources = [queries, qrels] + ([data_cfg.negatives_run] if data_cfg.negatives_run else [])
        meta = {"source": "qrels", "corpus": str(corpus.resolve()), "corpus_fingerprint": manifest["fingerprint"],
                "variant": manifest["variant"], "title_join": manifest["title_join"], "queries": str(queries),
                "qrels": str(qrels), "negatives_run": data_cfg.negatives_run, "depth": data_cfg.negatives_depth,
                "rel_level": data_cfg.rel_level}
    meta["need_negatives"] = data_cfg.hard_negatives > 0
    meta["sources_sha256"] = {str(s): sha256_file(s) for s in sources if Path(s).exists()}
    meta_path = out / EXAMPLES_META
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if {k: old.get(k) for k in meta} == meta:
            return old
    skipped: dict = {}
    if data_cfg.source == "dpr-json":
        examples = dpr_json_examples(data_cfg.path, data_cfg.title_join, data_cfg.negatives, skipped,
                                     need_negatives=data_cfg.hard_negatives > 0)
    else:
        # the next batch of 2,000 is gathered while this one is compressed and written (both release
        # the GIL); DPR JSON comes an example at a time, where a hand-off per item would cost more
        examples = _read_ahead(qrels_example_tables(
            data_cfg.corpus, queries, qrels, data_cfg.negatives_run, data_cfg.negatives_depth, data_cfg.rel_level,
            skipped=skipped, need_negatives=data_cfg.hard_negatives > 0, scratch=out.parent))
    result = write_examples(examples, out, meta, skipped=skipped)
    if progress:
        skip = f", skipped {skipped}" if skipped else ""
        print(f"[train-data] {result['examples']:,} examples from {meta['source']}{skip} -> {out}", flush=True)
    return result
