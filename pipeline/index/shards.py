"""Embedding shards on disk: slices of corpus parts, each complete or absent.

    emb_dir/embeddings.json                 model + corpus identity, dim, dtype, the shard list
    emb_dir/shard-00000-000000.npy          (rows, dim) float32 or float16, memory-mappable
    emb_dir/shard-00000-000000.pids.txt     one pid per line, same order as the vectors
    emb_dir/shard-00000-000000.done         JSON: the layout it was made from; written last

A shard is rows [start, end) of one corpus part (`encode.shard_rows` rows, the last
slice of a part shorter). Its `.done` marker records the part's file name and row
count, the row range and the sha256 of its pids, so a shard made from another part
layout (a re-ingest with different `--part-rows`) is never taken for this one. A
shard without its `.done` marker is ignored (and rewritten on resume). Files are
written under unique temporary names and renamed into place, so two writers of
the same shard (a retried task) can never leave a mixture.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import InputError
from ..io_utils import write_json_atomic

META_NAME = "embeddings.json"
SHARD_RE = re.compile(r"^shard-(\d+)(?:-(\d+))?\.done$")
# the layout fields a `.done` marker must agree on with the plan for the shard to be reused
LAYOUT_KEYS = ("part", "part_rows", "start", "end", "pids_sha256")


def shard_name(part_index: int, start: int = 0) -> str:
    return f"shard-{part_index:05d}-{start:09d}"


def pids_digest(pids) -> str:
    """sha256 of the pids, one per line (the exact bytes of a shard's `.pids.txt`)."""
    h = hashlib.sha256()
    for p in pids:
        h.update(str(p).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def plan_part(part_index: int, part_file: str, pids: list[str], shard_rows: int) -> list[dict]:
    """The shard specs of one part: consecutive row ranges of `shard_rows` rows."""
    specs = []
    for start in range(0, len(pids), shard_rows):
        end = min(len(pids), start + shard_rows)
        specs.append({"name": shard_name(part_index, start), "part_index": part_index, "part": part_file,
                      "part_rows": len(pids), "start": start, "end": end,
                      "pids_sha256": pids_digest(pids[start:end])})
    return specs


def layout_matches(done: dict, spec: dict) -> bool:
    return all(done.get(k) == spec[k] for k in LAYOUT_KEYS)


def _write_file(path: Path, write) -> None:
    tmp = path.parent / f".tmp-{path.name}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_shard(emb_dir: str | Path, spec: dict, pids: list[str], vectors: np.ndarray, **info) -> dict:
    """Vectors and ids first (each via a unique temp file + rename), the `.done` marker last.

    Refuses pids that are not the ones the spec was planned from. Returns the marker.
    """
    emb_dir = Path(emb_dir)
    name = spec["name"]
    if len(pids) != len(vectors) or len(pids) != spec["end"] - spec["start"]:
        raise ValueError(f"{name}: {len(pids)} ids, {len(vectors)} vectors, {spec['end'] - spec['start']} planned")
    if pids_digest(pids) != spec["pids_sha256"]:
        raise ValueError(f"{name}: the pids read from {spec['part']} rows {spec['start']}-{spec['end']} are not "
                         "the ones planned (the corpus changed during the run?)")
    _write_file(emb_dir / f"{name}.npy", lambda f: np.save(f, vectors))
    _write_file(emb_dir / f"{name}.pids.txt", lambda f: f.write("".join(f"{p}\n" for p in pids).encode("utf-8")))
    marker = {**{k: spec[k] for k in LAYOUT_KEYS}, "rows": len(pids), "dim": int(vectors.shape[1]),
              "dtype": str(vectors.dtype), **info}
    write_json_atomic(emb_dir / f"{name}.done", marker)
    return marker


def completed_shards(emb_dir: str | Path) -> dict[str, dict]:
    """name -> `.done` marker of every shard that has one (any layout)."""
    out = {}
    for marker in Path(emb_dir).glob("shard-*.done"):
        if SHARD_RE.match(marker.name):
            try:
                out[marker.name[:-len(".done")]] = json.loads(marker.read_text())
            except (OSError, ValueError):
                continue  # a marker being replaced or damaged: treated as absent
    return out


def remove_shard(emb_dir: str | Path, name: str) -> None:
    """Marker first, so a kill half-way leaves an ignored shard, never a wrong complete one."""
    for suffix in (".done", ".npy", ".pids.txt"):
        (Path(emb_dir) / f"{name}{suffix}").unlink(missing_ok=True)


def stray_files(emb_dir: str | Path, keep: set[str]) -> list[Path]:
    """Shard files not belonging to a shard in `keep`, and temporaries of killed writers."""
    out = []
    for p in Path(emb_dir).iterdir():
        if p.name.startswith(".tmp-shard-"):
            out.append(p)
        elif p.name.startswith("shard-"):
            stem = p.name.split(".", 1)[0]
            if stem not in keep:
                out.append(p)
    return out


def verify_shards(emb_dir: str | Path, specs: list[dict], total_rows: int) -> list[str]:
    """Problems that keep `specs` from being exactly the corpus: [] when every shard is
    present, made from this layout, its ids file holds exactly the planned pids, its
    vectors have one row per pid, and the rows add up to the manifest's count."""
    emb_dir = Path(emb_dir)
    done = completed_shards(emb_dir)
    problems = []
    rows = 0
    for spec in specs:
        name = spec["name"]
        marker = done.get(name)
        if marker is None:
            problems.append(f"{name} missing")
            continue
        if not layout_matches(marker, spec):
            problems.append(f"{name} was made from another part layout")
            continue
        try:
            raw = (emb_dir / f"{name}.pids.txt").read_bytes()
            vectors = np.load(emb_dir / f"{name}.npy", mmap_mode="r")
        except (OSError, ValueError) as e:
            problems.append(f"{name} unreadable: {e}")
            continue
        if hashlib.sha256(raw).hexdigest() != spec["pids_sha256"]:
            problems.append(f"{name}.pids.txt does not hold the planned pids")
        if vectors.shape[0] != spec["end"] - spec["start"]:
            problems.append(f"{name}.npy has {vectors.shape[0]} rows, expected {spec['end'] - spec['start']}")
        rows += spec["end"] - spec["start"]
    if not problems and rows != total_rows:
        problems.append(f"shards hold {rows} rows, the manifest {total_rows}")
    return problems


def load_meta(emb_dir: str | Path) -> dict:
    path = Path(emb_dir) / META_NAME
    if not path.exists():
        raise InputError(path, None, "no embeddings here: run `pipeline encode` first")
    return json.loads(path.read_text())


def iter_shards(emb_dir: str | Path, require_complete: bool = True) -> Iterator[tuple[list[str], np.ndarray]]:
    """Yield (pids, memory-mapped vectors) shard by shard, in corpus order.

    Only the shards the encoding listed in its metadata are read, so files of
    another layout or of a killed writer are never mixed in.
    """
    emb_dir = Path(emb_dir)
    meta = load_meta(emb_dir)
    if require_complete and not meta.get("complete"):
        raise InputError(emb_dir / META_NAME, None, "encoding is not complete: run `pipeline encode` again to finish it")
    done = completed_shards(emb_dir)
    if "shard_names" in meta:
        names = [n for n in meta["shard_names"] if n in done or require_complete]
    else:  # an embedding set written before shards were slices: every marked shard, in order
        names = sorted(done, key=lambda n: [int(x) for x in n.split("-")[1:]])
    for name in names:
        if name not in done:
            raise InputError(emb_dir / f"{name}.done", None, "shard listed as complete is missing: run `pipeline encode` again")
        vectors = np.load(emb_dir / f"{name}.npy", mmap_mode="r")
        pids = (emb_dir / f"{name}.pids.txt").read_text(encoding="utf-8").splitlines()
        if len(pids) != len(vectors):
            raise InputError(emb_dir / f"{name}.pids.txt", None, f"{len(pids)} ids for {len(vectors)} vectors")
        yield pids, vectors
