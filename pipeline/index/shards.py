"""Embedding shards on disk: one per corpus part, each complete or absent.

    emb_dir/embeddings.json        model + corpus identity, dim, dtype
    emb_dir/shard-00000.npy        (rows, dim) float32 or float16, memory-mappable
    emb_dir/shard-00000.pids.txt   one pid per line, same order as the vectors
    emb_dir/shard-00000.done       JSON {rows, dim, dtype, part}; written last

A shard without its `.done` marker is ignored (and rewritten on resume).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import InputError
from ..io_utils import write_json_atomic

META_NAME = "embeddings.json"


def shard_name(part_index: int) -> str:
    return f"shard-{part_index:05d}"


def write_shard(emb_dir: Path, part_index: int, pids: list[str], vectors: np.ndarray, part_file: str) -> None:
    """Vectors and ids first (each via temp + rename), the `.done` marker last."""
    name = shard_name(part_index)
    if len(pids) != len(vectors):
        raise ValueError(f"{name}: {len(pids)} ids vs {len(vectors)} vectors")
    if len(set(pids)) != len(pids):
        raise ValueError(f"{name}: duplicate ids inside one shard")
    for suffix, write in ((".npy", lambda f: np.save(f, vectors)),
                          (".pids.txt", lambda f: f.write("".join(p + "\n" for p in pids).encode("utf-8")))):
        tmp = emb_dir / f".tmp-{name}{suffix}"
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, emb_dir / f"{name}{suffix}")
    write_json_atomic(emb_dir / f"{name}.done", {"rows": len(pids), "dim": int(vectors.shape[1]),
                                                 "dtype": str(vectors.dtype), "part": part_file})


def completed_shards(emb_dir: Path) -> dict[int, dict]:
    out = {}
    for marker in sorted(Path(emb_dir).glob("shard-*.done")):
        idx = int(marker.stem.split("-")[1])
        out[idx] = json.loads(marker.read_text())
    return out


def load_meta(emb_dir: str | Path) -> dict:
    path = Path(emb_dir) / META_NAME
    if not path.exists():
        raise InputError(path, None, "no embeddings here: run `pipeline encode` first")
    return json.loads(path.read_text())


def iter_shards(emb_dir: str | Path, require_complete: bool = True) -> Iterator[tuple[list[str], np.ndarray]]:
    """Yield (pids, memory-mapped vectors) shard by shard, in part order."""
    emb_dir = Path(emb_dir)
    meta = load_meta(emb_dir)
    if require_complete and not meta.get("complete"):
        raise InputError(emb_dir / META_NAME, None, "encoding is not complete: run `pipeline encode` again to finish it")
    for idx in sorted(completed_shards(emb_dir)):
        name = shard_name(idx)
        vectors = np.load(emb_dir / f"{name}.npy", mmap_mode="r")
        pids = (emb_dir / f"{name}.pids.txt").read_text(encoding="utf-8").splitlines()
        if len(pids) != len(vectors):
            raise InputError(emb_dir / f"{name}.pids.txt", None, f"{len(pids)} ids for {len(vectors)} vectors")
        yield pids, vectors
