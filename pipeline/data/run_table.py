"""A TREC run's top lines per query, read column-wise with pyarrow's CSV reader.

`readers.read_run_file` reads a run a line at a time in Python, naming the file and line of
anything wrong. For the hard-negative mining of a big training set (a 10-deep run over 500k
queries is 5M lines) that costs ~1-3 µs a line; this module reads the same file in blocks of Arrow
columns instead (pyarrow's CSV reader) and keeps only the lines of the wanted queries. A run grouped
by query (as every tool writes one) is finished a block at a time, so memory holds a block; an
interleaved one keeps each block's top `depth` per query and merges them (memory: queries x depth).

It takes only the plain form most tools write (fields separated by one space, LF line ends, UTF-8,
no BOM, not compressed). Anything else, and any line it cannot parse, returns None: the caller
then reads the file with the line reader, which accepts every well-formed run (tabs, runs of
spaces, CRLF, gzip) and refuses a bad line with its number and reason.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

COLUMNS = ["qid", "q0", "docid", "rank", "score", "tag"]
BLOCK_BYTES = 32 << 20


def plain_file(path: Path) -> bool:
    """Uncompressed, no BOM, no CR or NUL byte anywhere (memchr speed over the mapped file)."""
    try:
        with open(path, "rb") as f:
            if f.read(3) == b"\xef\xbb\xbf" or path.suffix in (".gz", ".bz2", ".xz", ".zst"):
                return False
            f.seek(0, 2)
            if f.tell() == 0:
                return False
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                return m.find(b"\r") < 0 and m.find(b"\x00") < 0 and m[:2] != b"\x1f\x8b"
    except (OSError, ValueError):
        return False


def _rank_in_group(keys: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Position of each row within its run of equal keys (rows sorted by key)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    codes = pc.dictionary_encode(keys).indices.to_numpy(zero_copy_only=False)
    n = len(codes)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.ones(n, dtype=bool)
    starts[1:] = codes[1:] != codes[:-1]
    first = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    return np.arange(n) - first


def _top(table: pa.Table, depth: int) -> pa.Table:
    """Per qid its `depth` best lines: score descending, ties by docid (as `sorted((-score, docid))`)."""
    if table.num_rows == 0:
        return table
    table = table.take(pc.sort_indices(table, sort_keys=[("qid", "ascending"), ("score", "descending"),
                                                        ("docid", "ascending")]))
    return table.filter(pa.array(_rank_in_group(table["qid"]) < depth))


class _NotPlain(Exception):
    """The file is not in the plain form: the line reader takes it."""


class _Interleaved(Exception):
    """A query's lines come back after other queries': read the file whole instead."""


def _blocks(path: Path, qids: pa.Array):
    """The run's lines of the wanted queries, block by block: tables of qid, docid, score."""
    types = {"qid": pa.string(), "q0": pa.string(), "docid": pa.string(), "rank": pa.int64(),
             "score": pa.float64(), "tag": pa.string()}
    try:
        reader = pacsv.open_csv(
            str(path),
            read_options=pacsv.ReadOptions(column_names=COLUMNS, block_size=BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(delimiter=" ", quote_char=False, double_quote=False,
                                              escape_char=False, newlines_in_values=False, ignore_empty_lines=True),
            convert_options=pacsv.ConvertOptions(column_types=types, null_values=[], strings_can_be_null=False,
                                                  quoted_strings_can_be_null=False, check_utf8=True))
        for batch in reader:
            block = pa.Table.from_batches([batch])
            if block["score"].null_count or block["rank"].null_count or \
                    pc.any(pc.equal(pc.utf8_length(block["qid"]), 0)).as_py() or \
                    pc.any(pc.equal(pc.utf8_length(block["docid"]), 0)).as_py():
                raise _NotPlain  # an empty field: the line reader names the line
            block = block.select(["qid", "docid", "score"])
            yield block.filter(pc.is_in(block["qid"], value_set=qids))
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError):
        raise _NotPlain from None


def _finish(top: pa.Table, judged_keys: pa.Array, max_negatives: int, out: dict[str, str]) -> None:
    """`top` (sorted, each query's top lines) minus judged lines, at most `max_negatives` a query,
    tab-joined into `out`; a query whose every top line is judged gets an empty entry."""
    sep = "\x1f"  # never inside an id (ids carry no control character)
    out.update(dict.fromkeys(pc.unique(top["qid"]).to_pylist(), ""))
    keys = pc.binary_join_element_wise(top["qid"], top["docid"], sep)
    top = top.filter(pc.invert(pc.is_in(keys, value_set=judged_keys)))
    top = top.filter(pa.array(_rank_in_group(top["qid"]) < max_negatives))
    qid = top["qid"].combine_chunks()
    codes = pc.dictionary_encode(qid).indices.to_numpy(zero_copy_only=False)
    n = len(codes)
    if n == 0:
        return
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    offsets = pa.array(np.r_[starts, n].astype(np.int32), pa.int32())
    joined = pc.binary_join(pa.ListArray.from_arrays(offsets, top["docid"].combine_chunks()), "\t")
    out.update(zip(qid.take(pa.array(starts)).to_pylist(), joined.to_pylist()))


def _grouped(path: Path, qids: pa.Array, judged_keys: pa.Array, depth: int, max_negatives: int) -> dict[str, str]:
    """A run grouped by query, a block at a time: every query but a block's last is complete and
    finished there; the last one's lines carry over to the next block. Memory: a block."""
    out: dict[str, str] = {}
    carry = None
    for block in _blocks(path, qids):
        if carry is not None:
            block = pa.concat_tables([carry, block])
        if block.num_rows == 0:
            continue
        qid = block["qid"].combine_chunks()
        codes = pc.dictionary_encode(qid).indices.to_numpy(zero_copy_only=False)
        changes = np.flatnonzero(codes[1:] != codes[:-1]) + 1
        firsts = qid.take(pa.array(np.r_[0, changes])).to_pylist()
        if len(firsts) != len(set(firsts)) or any(q in out for q in firsts):
            raise _Interleaved
        last = int(changes[-1]) if len(changes) else 0
        carry = block.slice(last)
        if last:
            _finish(_top(block.slice(0, last), depth), judged_keys, max_negatives, out)
    if carry is not None and carry.num_rows:
        _finish(_top(carry, depth), judged_keys, max_negatives, out)
    return out


def _whole(path: Path, qids: pa.Array, judged_keys: pa.Array, depth: int, max_negatives: int) -> dict[str, str]:
    """Any order: each block's top `depth` per query is kept and merged at the end (memory: the
    wanted queries x depth lines)."""
    kept = [_top(block, depth) for block in _blocks(path, qids)]
    out: dict[str, str] = {}
    if kept:
        _finish(_top(pa.concat_tables(kept).combine_chunks(), depth), judged_keys, max_negatives, out)
    return out


def negatives_by_query(path: str | Path, positives: dict[str, tuple[str, ...]],
                       judged: dict[str, tuple[str, ...]], depth: int, max_negatives: int) -> dict[str, str] | None:
    """{qid: tab-joined negative ids} as `training._run_negatives` makes them (its top `depth` by
    score, minus every judged passage, at most `max_negatives`), or None: not a plain file, read
    it line by line."""
    path = Path(path)
    if not plain_file(path):
        return None
    qids = pa.array(list(positives), pa.string())
    judged_keys = pa.array([q + "\x1f" + d for q, ds in judged.items() if q in positives for d in ds], pa.string())
    try:
        try:
            return _grouped(path, qids, judged_keys, depth, max_negatives)
        except _Interleaved:
            return _whole(path, qids, judged_keys, depth, max_negatives)
    except _NotPlain:
        return None
