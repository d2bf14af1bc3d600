"""An index's passage ids, looked up by row without a Python string per passage.

`pids.txt` (one id per line, in the index's row order) is memory-mapped and only the line ends
are kept: 8 bytes per passage (21M Wikipedia passages: 168 MB, where a list of strings takes
~1.5 GB). A row's id is decoded when asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import InputError

_CHUNK = 1 << 24  # bytes scanned at a time (line ends, UTF-8 check): bounded memory while loading


class PidTable(Sequence):
    """Read-only sequence of the ids in a newline-separated file (what `splitlines()` would give
    for `\\n` line ends). Raises InputError when the file is not UTF-8."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        size = self.path.stat().st_size
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
        self._bytes = self._data.base if size else b""  # the mmap itself: slices are bytes, fast to decode
        self._cr = False
        ends, tail = [], b""
        for lo in range(0, size, _CHUNK):
            block = self._data[lo:lo + _CHUNK]
            ends.append(np.flatnonzero(block == 10).astype(np.int64) + lo)
            self._cr = self._cr or bool((block == 13).any())
            raw = tail + block.tobytes()  # UTF-8 checked up to the block's last newline (never inside a character)
            cut = raw.rfind(b"\n") + 1 if lo + _CHUNK < size else len(raw)
            try:
                raw[:cut].decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(self.path, None, f"not UTF-8 ({e.reason})") from None
            tail = raw[cut:]
        ends = np.concatenate(ends) if ends else np.zeros(0, np.int64)
        if size and (not len(ends) or ends[-1] != size - 1):  # a last line without its newline
            ends = np.append(ends, size)
        self._ends = ends

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self._ends)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} of {n}")
        start = int(self._ends[i - 1]) + 1 if i else 0
        end = int(self._ends[i])
        text = self._bytes[start:end].decode("utf-8")
        return text[:-1] if self._cr and text.endswith("\r") else text

    def take(self, rows) -> list[str]:
        """The ids of `rows` (valid row numbers, e.g. FAISS hits), decoded in one pass."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self._ends)):
            raise IndexError(f"rows outside 0..{len(self._ends) - 1}")
        ends = self._ends[rows]
        starts = np.where(rows > 0, self._ends[np.maximum(rows - 1, 0)] + 1, 0)
        b = self._bytes
        out = [b[s:e].decode("utf-8") for s, e in zip(starts.tolist(), ends.tolist())]
        if self._cr:
            out = [t[:-1] if t.endswith("\r") else t for t in out]
        return out

    def __eq__(self, other) -> bool:
        if not isinstance(other, (Sequence, PidTable)) or isinstance(other, str) or len(other) != len(self):
            return NotImplemented if not isinstance(other, Sequence) else False
        return all(a == b for a, b in zip(self, other))

    __hash__ = None  # mutable-looking sequences are not hashed (as list)

    def tolist(self) -> list[str]:
        return [self[i] for i in range(len(self))]
