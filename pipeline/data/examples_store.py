"""The training examples store: its two forms, how it is written, read and checked.

What the training workers read (or Ray Data streams into them), in one of two forms:

    texts (DPR JSON, sentence pairs: the texts come with the examples)
    examples/part-00000.parquet  idx, qid, query, positive, negatives (list<string>)

    ids (qrels + corpus: every text is a corpus passage, most of them named by many examples)
    examples/part-00000.parquet  idx, qid, query, positive_row, negative_rows (list<int64>)
    examples/passages.arrow      pid, text: each passage the examples name, once (Arrow IPC,
                                 uncompressed, memory-mapped by every reader: one copy per machine)

    examples/examples.json       source, counts, skipped (with reasons), title join, digest, every
                                 file's size and sha256; written last (`write_examples`)

Readers see the texts form either way (`resolve_examples`, `iter_example_tables`,
`read_examples_table`): an ids batch gets its texts gathered from the mapped file when it is read
(`open_passages`). A store altered after it was built is refused by name (`check_store`).
Document texts are stored already title-joined with the corpus's template.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import PipelineError
from ..io_utils import atomic_path, remove_path, replace_dir, sha256_file, sha256_files
from .corpus import PassageTexts

EXAMPLES_META = "examples.json"
PASSAGES_FILE = "passages.arrow"
SCHEMA = pa.schema([("idx", pa.int64()), ("qid", pa.string()), ("query", pa.string()),
                    ("positive", pa.string()), ("negatives", pa.list_(pa.string()))])
ID_SCHEMA = pa.schema([("idx", pa.int64()), ("qid", pa.string()), ("query", pa.string()),
                       ("positive_row", pa.int64()), ("negative_rows", pa.list_(pa.int64()))])


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
    per machine into the staging folder (`$PIPELINE_STAGING_DIR`, a cache) under its digest: never a copy made
    for other examples."""
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

            from ..storage import staging_root

            local = staging_root() / "examples-passages" / digest / PASSAGES_FILE
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


TEACHER_FIELDS = [pa.field("teacher_positive", pa.float64()), pa.field("teacher_negatives", pa.list_(pa.float64()))]


def write_examples(examples: Iterator[dict | pa.Table], out: str | Path, meta: dict, part_rows: int = 50_000,
                   skipped: dict | None = None, passages: str | Path | None = None,
                   counts: dict | None = None, teacher: bool = False) -> dict:
    """Write examples as Parquet parts with a running `idx`; the meta file marks completion.
    Rows go out `batch_rows` at a time (a row group each), so memory holds one batch, not a part;
    an Arrow table among the examples (columns qid, query, positive, negatives) is one row group.
    With `passages` (the Arrow file the tables' rows point into: the ids form), the tables carry
    positive_row, negative_rows, and the file is moved into the store once every example is out."""
    out = Path(out)
    n = 0
    schema = ID_SCHEMA if passages is not None else SCHEMA
    if teacher:  # a teacher's scores of each example's positive and negatives (distillation)
        for f in TEACHER_FIELDS:
            schema = schema.append(f)
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
        meta = {**meta, "examples": n, "parts": parts, "skipped": dict(skipped or {}), **dict(counts or {}),
                "digest": digest, **extra}
        (tmp / EXAMPLES_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def store_digest(examples_dir: Path, meta: dict) -> str:
    """The examples' digest: the one their meta records, else the sha256 of their files."""
    if meta.get("digest"):
        return meta["digest"]
    folder = Path(examples_dir)
    return sha256_files(sorted(folder.glob("part-*.parquet")) + sorted(folder.glob(PASSAGES_FILE)))


RESUME_STAGING = ".examples-resume"


def stage_for_resume(examples_dir: Path) -> Path:
    """Where a resumed run builds its examples, so that a resume refused for its examples (another
    negatives run, other judgements) leaves the run's own as they were: a folder beside them holding
    hard links to their files, which the build reuses as it would the run's (the same check of every
    byte) or rebuilds in its place. The run's folder itself where there is nothing to protect, or where
    the filesystem makes no hard links."""
    if not (examples_dir / EXAMPLES_META).is_file():
        return examples_dir
    staged = examples_dir.parent / RESUME_STAGING
    remove_path(staged)  # a killed resume's
    try:
        for src in sorted(examples_dir.rglob("*")):
            dst = staged / src.relative_to(examples_dir)
            if src.is_dir():
                dst.mkdir(parents=True, exist_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.link(src, dst)
    except OSError:
        remove_path(staged)
        return examples_dir
    return staged


def settle_staged(staged: Path, examples_dir: Path, accepted: bool) -> None:
    """After the resume's identity check: a refused resume's build is dropped; an accepted one that
    rebuilt (the same digest the checkpoint records, from changed sources or a damaged store) replaces
    the run's examples; one that reused them leaves them as they are."""
    if staged == examples_dir:
        return
    reused = (staged / EXAMPLES_META).exists() and os.path.samefile(staged / EXAMPLES_META,
                                                                     examples_dir / EXAMPLES_META)
    if not accepted or reused:
        remove_path(staged)
        return
    replace_dir(staged, examples_dir)
