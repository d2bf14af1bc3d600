"""Random access to an ingested corpus by pid (streams the Parquet parts with a pid filter)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import progress
from .manifest import join_title, load_manifest


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
