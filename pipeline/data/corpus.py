"""Random access to an ingested corpus by pid (streams the Parquet parts with a pid filter)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import progress
from .manifest import join_title, join_titles, load_manifest


def fetch_passages(corpus_dir: str | Path, pids, join: str | None = "none") -> dict[str, str]:
    """{pid: text} for the pids asked for; `join` applies a title-join template (None = manifest's)."""
    manifest = load_manifest(corpus_dir)
    join = manifest["title_join"] if join is None else join
    want = list(pids)
    out: dict[str, str] = {}
    if not want:
        return out
    parts = manifest["parts"]
    progress.update("reading corpus parts", 0, len(parts))
    for i, part in enumerate(parts, 1):
        table = pq.read_table(Path(corpus_dir) / part["file"], filters=pc.field("pid").isin(want))
        progress.update("reading corpus parts", i, len(parts))
        for pid, title, text in zip(table["pid"].to_pylist(), table["title"].to_pylist(), table["text"].to_pylist()):
            out[pid] = join_title(title, text, join)
    return out


def corpus_pids(corpus_dir: str | Path) -> pa.Array:
    """Every pid of an ingested corpus, in its parts' order, as one Arrow string array (no Python string per
    passage)."""
    manifest = load_manifest(corpus_dir)
    return pa.concat_arrays([pq.read_table(Path(corpus_dir) / part["file"], columns=["pid"])["pid"]
                             .combine_chunks().cast(pa.string()) for part in manifest["parts"]]
                            or [pa.array([], pa.string())])


class PassageStore:
    """The texts of many passages (e.g. every positive and hard negative of 500k training examples),
    copied from the corpus parts in one pass into an Arrow file at `path` and read back memory-mapped:
    the process holds the ids' lookup table, never a Python string per passage. `get` takes a batch
    of pids; a pid the corpus lacks comes back as None."""

    def __init__(self, corpus_dir: str | Path, pids: pa.Array, path: str | Path, join: str | None = "none"):
        manifest = load_manifest(corpus_dir)
        join = manifest["title_join"] if join is None else join
        want = pc.unique(pids.cast(pa.string()))
        self.path = Path(path)
        schema = pa.schema([("pid", pa.string()), ("text", pa.string())])
        parts = manifest["parts"]
        progress.update("reading corpus parts", 0, len(parts))
        with pa.OSFile(str(self.path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for i, part in enumerate(parts, 1):
                table = pq.read_table(Path(corpus_dir) / part["file"], columns=["pid", "title", "text"])
                table = table.filter(pc.is_in(table["pid"], value_set=want))
                text = join_titles(table["title"], table["text"], join)
                writer.write_table(pa.table({"pid": table["pid"], "text": text}, schema=schema))
                del table, text
                progress.update("reading corpus parts", i, len(parts))
        self.texts = PassageTexts(self.path)
        self._table = self.texts.table
        self._pids = self._table["pid"].combine_chunks() if self._table.num_rows else pa.array([], pa.string())
        self.missing = pc.filter(want, pc.invert(pc.is_in(want, value_set=self._pids)))
        # pid -> row by binary search in the sorted pids: one sort here instead of a hash table built
        # at every lookup. Keys are the pids' integer values when every pid is a plain decimal number
        # (MS MARCO, DPR Wikipedia: 8 B a pid, fast compares), else their UTF-8 bytes (fixed width)
        keys, valid = _int_keys(self._pids)
        self._numeric = bool(valid.all())
        if self._numeric:
            order = np.argsort(keys, kind="stable")
            self._sorted = keys[order]
        else:
            order = pc.sort_indices(self._pids).to_numpy().astype(np.int64)
            self._sorted = np.array([p.encode("utf-8") for p in self._pids.take(pa.array(order)).to_pylist()],
                                    dtype=bytes) if len(order) else np.zeros(0, dtype="S1")
        self._order = order

    def __len__(self) -> int:
        return self._table.num_rows

    def __getitem__(self, i: int) -> str:
        return self._table["text"][i].as_py()

    def take(self, pids) -> pa.ChunkedArray:
        """The texts of `pids` (a list or an Arrow array) as Arrow, nulls for pids the store lacks."""
        rows, found = self.rows(pids)
        if not len(self._sorted):
            return pa.chunked_array([pa.nulls(len(rows), pa.string())], pa.string())
        return pa.chunked_array([self.texts.take(rows, found)], pa.string())

    def rows(self, pids) -> tuple[np.ndarray, np.ndarray]:
        """(row in the store's file, found) per pid; the row is meaningless where not found."""
        if not len(self._sorted):
            return np.zeros(len(pids), dtype=np.int64), np.zeros(len(pids), dtype=bool)
        if self._numeric:
            want, valid = _int_keys(pids if isinstance(pids, pa.Array) else pa.array(pids, pa.string()))
        else:
            if isinstance(pids, pa.Array):
                pids = pids.to_pylist()
            want = np.array([p.encode("utf-8") for p in pids], dtype=bytes) if len(pids) else np.zeros(0, "S1")
            valid = True
        pos = np.minimum(np.searchsorted(self._sorted, want), len(self._sorted) - 1)
        found = (self._sorted[pos] == want) & valid
        return self._order[pos], found

    def get(self, pids: list[str]) -> list[str | None]:
        return self.take(pids).to_pylist()


_DECIMAL = r"^(0|[1-9][0-9]{0,17})$"  # a pid that is exactly an int64's decimal form (no sign, no leading 0)


def _int_keys(pids: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int64 value, is a plain decimal pid) per pid; the value is -1 where it is not."""
    pids = pids.cast(pa.string())
    plain = pc.fill_null(pc.match_substring_regex(pids, _DECIMAL), False)
    mask = plain.to_numpy(zero_copy_only=False)
    keys = np.full(len(pids), -1, dtype=np.int64)
    if mask.any():
        keys[mask] = pc.cast(pids.filter(plain), pa.int64()).to_numpy(zero_copy_only=False)
    return keys, mask


class PassageTexts:
    """An Arrow file of passage texts (column `text`, e.g. a `PassageStore`'s or a training example
    store's `passages.arrow`), memory-mapped: every process that opens it shares the page cache, none
    holds a copy. `take` gathers texts by row."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.table = pa.ipc.open_file(pa.memory_map(str(self.path), "r")).read_all()
        self._chunks = self.table["text"].chunks
        self._starts = np.cumsum([0] + [len(c) for c in self._chunks])

    def __len__(self) -> int:
        return self.table.num_rows

    def take(self, rows: np.ndarray, found: np.ndarray | None = None) -> pa.Array:
        """The texts at `rows` (null where not `found`), taken chunk by chunk from the mapped file:
        a ChunkedArray's own take concatenates every chunk first (the whole file, at every call)."""
        rows = np.asarray(rows, dtype=np.int64)
        if found is None:
            found = np.ones(len(rows), dtype=bool)
        chunks, starts = self._chunks, self._starts
        chunk_of = np.searchsorted(starts, rows, side="right") - 1
        order = np.argsort(chunk_of, kind="stable")
        bounds = np.searchsorted(chunk_of[order], np.arange(len(chunks) + 1))
        pieces = [chunks[c].take(pa.array(rows[order[lo:hi]] - starts[c]))
                  for c, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])) if lo < hi]
        if not pieces:
            return pa.nulls(len(rows), pa.string())
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[order] = np.arange(len(order))
        return pa.concat_arrays(pieces).take(pa.array(inverse, pa.int64(), mask=~found))
