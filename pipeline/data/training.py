"""Training examples: (query, positive[, hard negatives]) from DPR JSON, or qrels + corpus (+ a TREC run).

Sources
- DPR retriever training JSON (`question`, `answers`, `positive_ctxs`, `negative_ctxs`,
  `hard_negative_ctxs`; ctx = `title`, `text`, `passage_id`), read as a stream: the
  top-level array is decoded object by object, never loaded whole.
- BEIR / MS MARCO: an ingested corpus, its queries and a qrels split; one example per
  (query, relevant passage); hard negatives from a TREC run (BM25 or dense) with every
  judged-relevant passage removed.

Output (what the training workers read, or Ray Data streams into them), in one of two forms:

    texts (DPR JSON, sentence pairs: the texts come with the examples)
    examples/part-00000.parquet  idx, qid, query, positive, negatives (list<string>)

    ids (qrels + corpus: every text is a corpus passage, most of them named by many examples)
    examples/part-00000.parquet  idx, qid, query, positive_row, negative_rows (list<int64>)
    examples/passages.arrow      pid, text: each passage the examples name, once (Arrow IPC,
                                 uncompressed, memory-mapped by every reader: one copy per machine)

    examples/examples.json       source, counts, skipped (with reasons), title join, digest; written last

Readers see the texts form either way (`resolve_examples`, `iter_example_tables`,
`read_examples_table`): an ids batch gets its texts gathered from the mapped file when it is read.
Document texts are stored already title-joined with the corpus's template.
"""

from __future__ import annotations

import json
import os
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
from .corpus import PassageStore, PassageTexts
from .manifest import join_title, load_manifest
from .readers import load_queries, read_qrels, read_run_file
from .run_table import negatives_by_query

EXAMPLES_META = "examples.json"
PASSAGES_FILE = "passages.arrow"
SCHEMA = pa.schema([("idx", pa.int64()), ("qid", pa.string()), ("query", pa.string()),
                    ("positive", pa.string()), ("negatives", pa.list_(pa.string()))])
ID_SCHEMA = pa.schema([("idx", pa.int64()), ("qid", pa.string()), ("query", pa.string()),
                       ("positive_row", pa.int64()), ("negative_rows", pa.list_(pa.int64()))])


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
                         batch: int = 2_000, store_path: str | Path | None = None, per_query: int = 0,
                         positives_seed: int = 0) -> Iterator[pa.Table]:
    """The examples of `qrels_examples` as Arrow tables of `batch` rows, in qid order. With `per_query` > 0
    each query keeps that many of its positives (`pick_positives`).

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


def resolve_examples(batch: pa.Table | pa.RecordBatch, texts: PassageTexts | None) -> pa.Table:
    """An examples batch in the texts form: an ids batch (positive_row, negative_rows) gets its texts
    from `texts` (the store's mapped `passages.arrow`); a texts batch is returned as it is. Columns
    other than the two id columns are kept."""
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    if "positive_row" not in table.schema.names:
        return table
    if texts is None:
        raise PipelineError(f"training examples in the ids form need their {PASSAGES_FILE}")
    n = table.num_rows
    negs = table["negative_rows"].combine_chunks() if n else pa.array([], pa.list_(pa.int64()))
    flat = pc.list_flatten(negs).to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = pc.list_value_length(negs).to_numpy(zero_copy_only=False).astype(np.int64)
    got = texts.take(np.concatenate([table["positive_row"].to_numpy().astype(np.int64), flat]))
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    out = {}
    for name in table.schema.names:
        if name == "positive_row":
            out["positive"] = got.slice(0, n)
        elif name == "negative_rows":
            out["negatives"] = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), got.slice(n))
        else:
            out[name] = table[name]
    return pa.table(out)


_OPEN_PASSAGES: dict[tuple, PassageTexts] = {}


def store_pids_digest(texts: PassageTexts) -> str:
    """sha256 of a store's passage ids in row order (cheap: the ids column, not the texts)."""
    import hashlib

    h = hashlib.sha256()
    for chunk in texts.table["pid"].chunks:
        h.update("\n".join(chunk.to_pylist()).encode())
        h.update(b"\n")
    return h.hexdigest()


def _store_error(path, reason: str, examples_dir) -> PipelineError:
    return PipelineError(f"{path}: the training examples store was altered after it was built ({reason}); "
                         f"training on it would pair queries with other passages. Restore it, or delete "
                         f"{examples_dir} and run again to rebuild it from the sources")


def check_store(examples_dir, meta: dict | None = None, full: bool = False) -> None:
    """Refuse a training examples store that is not what `examples.json` says it is: every file there
    with its recorded size, the passages' ids in their recorded order (cheap, every reader), and with
    `full` every file's sha256 (the driver, when a run starts or resumes). A store made before files were
    recorded is taken as it is."""
    from .. import storage as st

    if meta is None:
        try:
            meta = (st.read_json(examples_dir / EXAMPLES_META) if isinstance(examples_dir, st.RemotePath)
                    else json.loads((examples_dir / EXAMPLES_META).read_text()))
        except (OSError, ValueError):
            return  # no store here (yet): the caller builds or reports it
    for name, rec in (meta.get("files") or {}).items():
        path = examples_dir / name
        try:
            size = path.stat().st_size
        except OSError:
            raise _store_error(path, "it is missing", examples_dir) from None
        if size != rec["bytes"]:
            raise _store_error(path, f"{size:,} bytes, {rec['bytes']:,} when built", examples_dir)
        if full and not isinstance(path, st.RemotePath) and sha256_file(path) != rec["sha256"]:
            raise _store_error(path, "its content differs from the sha256 recorded when it was built", examples_dir)
    if meta.get("passages_pids_sha256") and not isinstance(examples_dir, st.RemotePath):
        try:
            got = store_pids_digest(PassageTexts(examples_dir / PASSAGES_FILE))
        except (OSError, pa.ArrowInvalid) as e:
            raise _store_error(examples_dir / PASSAGES_FILE, f"unreadable: {str(e).splitlines()[0][:200]}",
                               examples_dir) from None
        if got != meta["passages_pids_sha256"]:
            raise _store_error(examples_dir / PASSAGES_FILE, "its passages are not the ones, in the order, it was "
                               "built with", examples_dir)


def open_passages(examples_dir, digest: str | None = None) -> PassageTexts | None:
    """The example store's `passages.arrow` memory-mapped (kept open for the process's next batches),
    or None for a store in the texts form. A store on remote storage (a `RemotePath`) is copied once
    per machine into the temp folder under its digest: never a copy made for other examples."""
    import os

    from ..storage import RemotePath

    src = examples_dir / PASSAGES_FILE
    if isinstance(examples_dir, RemotePath):
        if digest is None:
            from .. import storage as st

            try:
                digest = st.read_json(examples_dir / EXAMPLES_META).get("digest")
            except (OSError, ValueError):
                digest = None
        if not digest or not src.exists():
            return None
        key = ("remote", digest)
        if key not in _OPEN_PASSAGES:
            import pyarrow.fs as pafs

            local = Path(tempfile.gettempdir()) / "pipeline-examples" / digest / PASSAGES_FILE
            if not local.exists():
                local.parent.mkdir(parents=True, exist_ok=True)
                part = local.with_name(f".{PASSAGES_FILE}.{os.getpid()}.part")
                pafs.copy_files(src.path, str(part), source_filesystem=src.fs,
                                destination_filesystem=pafs.LocalFileSystem())
                os.replace(part, local)
            _OPEN_PASSAGES[key] = PassageTexts(local)
        return _OPEN_PASSAGES[key]
    try:
        info = os.stat(src)
    except FileNotFoundError:
        return None
    key = (str(Path(src).resolve()), info.st_ino, info.st_mtime_ns, info.st_size)  # a rebuilt store is another key
    if key not in _OPEN_PASSAGES:
        check_store(Path(examples_dir))  # sizes and the passages' ids: an altered store is refused, by name
        while len(_OPEN_PASSAGES) >= 4:  # a few stores open at most (tests, trials in one worker)
            _OPEN_PASSAGES.pop(next(iter(_OPEN_PASSAGES)))
        _OPEN_PASSAGES[key] = PassageTexts(src)
    return _OPEN_PASSAGES[key]


def iter_example_tables(examples_dir, batch_size: int = 1024, columns: list[str] | None = None) -> Iterator[pa.Table]:
    """The examples of a store (either form, local or a `RemotePath`), part after part, in the texts
    form, `batch_size` rows at a time."""
    from ..storage import RemotePath

    texts = open_passages(examples_dir)
    for path in sorted(examples_dir.glob("part-*.parquet"), key=lambda p: p.name):
        if isinstance(path, RemotePath):
            f = pq.ParquetFile(path.fs.open_input_file(path.path))
        else:
            f = pq.ParquetFile(str(path), memory_map=True)
        for batch in f.iter_batches(batch_size=batch_size):
            table = resolve_examples(batch, texts)
            yield table.select(columns) if columns else table


def read_examples_table(examples_dir) -> pa.Table:
    """Every example of a store in the texts form, as one table (for stores that fit in memory)."""
    parts = list(iter_example_tables(examples_dir, batch_size=65_536))
    return pa.concat_tables(parts) if parts else SCHEMA.empty_table()


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
                   skipped: dict | None = None, passages: str | Path | None = None) -> dict:
    """Write examples as Parquet parts with a running `idx`; the meta file marks completion.
    Rows go out `batch_rows` at a time (a row group each), so memory holds one batch, not a part;
    an Arrow table among the examples (columns qid, query, positive, negatives) is one row group.
    With `passages` (the Arrow file the tables' rows point into: the ids form), the tables carry
    positive_row, negative_rows, and the file is moved into the store once every example is out."""
    out = Path(out)
    n = 0
    schema = ID_SCHEMA if passages is not None else SCHEMA
    batch_rows = min(part_rows, 5_000)
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        buf: list[dict] = []
        parts, in_part, writer = 0, 0, None

        def flush():
            nonlocal buf, parts, in_part, writer
            if buf:
                if writer is None:
                    writer = pq.ParquetWriter(tmp / f"part-{parts:05d}.parquet", schema)
                writer.write_table(pa.Table.from_pylist(buf, schema=schema))
                in_part += len(buf)
                buf = []
            if writer is not None and (in_part >= part_rows or not more):
                writer.close()
                writer, parts, in_part = None, parts + 1, 0

        def write_table(table: pa.Table) -> None:  # a batch already in Arrow: written as it is
            nonlocal n, parts, in_part, writer
            flush()
            if writer is None:
                writer = pq.ParquetWriter(tmp / f"part-{parts:05d}.parquet", schema)
            idx = pa.array(np.arange(n, n + table.num_rows, dtype=np.int64))
            writer.write_table(pa.table([idx] + [table[f] for f in schema.names[1:]], schema=schema))
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
        files = sorted(tmp.glob("part-*.parquet"))
        extra = {}
        if passages is not None:
            os.replace(passages, tmp / PASSAGES_FILE)
            files.append(tmp / PASSAGES_FILE)
            texts = PassageTexts(tmp / PASSAGES_FILE)
            extra = {"form": "ids", "passages": PASSAGES_FILE, "passages_rows": len(texts),
                     "passages_pids_sha256": store_pids_digest(texts)}
        digest = sha256_files(files)
        # what the store is, file by file: checked (sizes and the passages' ids cheaply by every reader,
        # every byte by the driver when a run starts or resumes), so an altered store is refused
        extra["files"] = {f.name: {"bytes": f.stat().st_size, "sha256": sha256_file(f)} for f in files}
        meta = {**meta, "examples": n, "parts": parts, "skipped": dict(skipped or {}), "digest": digest, **extra}
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
        if data_cfg.positives_per_query:  # absent otherwise: examples built before the key existed stay reusable
            meta.update(positives_per_query=data_cfg.positives_per_query, positives_seed=data_cfg.positives_seed,
                        positives_rule="highest grade first, ties drawn by (positives_seed, qid)")
    meta["need_negatives"] = data_cfg.hard_negatives > 0
    meta["sources_sha256"] = {str(s): sha256_file(s) for s in sources if Path(s).exists()}
    meta_path = out / EXAMPLES_META
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if {k: old.get(k) for k in meta} == meta:
            check_store(out, old, full=True)  # reused (a resume, a re-run): every byte as it was built
            return old
    skipped: dict = {}
    if data_cfg.source == "dpr-json":
        examples = dpr_json_examples(data_cfg.path, data_cfg.title_join, data_cfg.negatives, skipped,
                                     need_negatives=data_cfg.hard_negatives > 0)
    else:
        # The ids form: each passage's text stored once, the examples name its row (a 500k-pair set
        # of 1 positive + 10 negatives would otherwise carry 5.5M texts, most of them repeats). The
        # next batch of 2,000 is looked up while this one is written (a thread; DPR JSON comes an
        # example at a time, where a hand-off per item would cost more).
        out.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".passages-", dir=out.parent))
        try:
            store = scratch / PASSAGES_FILE
            examples = _read_ahead(qrels_example_tables(
                data_cfg.corpus, queries, qrels, data_cfg.negatives_run, data_cfg.negatives_depth, data_cfg.rel_level,
                skipped=skipped, need_negatives=data_cfg.hard_negatives > 0, store_path=store,
                per_query=data_cfg.positives_per_query, positives_seed=data_cfg.positives_seed))
            result = write_examples(examples, out, meta, skipped=skipped, passages=store)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if progress:
            skip = f", skipped {skipped}" if skipped else ""
            rule = (f"positives: grade >= {data_cfg.rel_level}, "
                    + (f"{data_cfg.positives_per_query} per query (highest grade, ties drawn with positives_seed "
                       f"{data_cfg.positives_seed})" if data_cfg.positives_per_query else "every one")
                    + (f"; hard negatives: top {data_cfg.negatives_depth} of {data_cfg.negatives_run} minus judged"
                       if data_cfg.negatives_run else "; no hard negatives"))
            print(f"[train-data] {result['examples']:,} examples from {meta['source']} ({rule}){skip} "
                  f"naming {result['passages_rows']:,} distinct passages -> {out}", flush=True)
        return result
    result = write_examples(examples, out, meta, skipped=skipped)
    if progress:
        skip = f", skipped {skipped}" if skipped else ""
        print(f"[train-data] {result['examples']:,} examples from {meta['source']}{skip} -> {out}", flush=True)
    return result
