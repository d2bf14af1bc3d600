"""Embedding shards on disk: slices of corpus parts, each complete or absent.

    emb_dir/embeddings.json                 model + corpus identity, dim, dtype, the shard list
    emb_dir/shard-00000-000000.npy          (rows, dim) float32 or float16, memory-mappable
    emb_dir/shard-00000-000000.pids.txt     one pid per line, same order as the vectors
    emb_dir/shard-00000-000000.done         JSON: the layout it was made from; written last

A shard is rows [start, end) of one corpus part (`encode.shard_rows` rows, the last
slice of a part shorter). Its `.done` marker records the part's file name and row
count, the row range and the sha256 of its pids, so a shard made from another part
layout (a re-ingest with different `--part-rows`) is never taken for this one. A
shard without its `.done` marker is ignored (and rewritten on resume). Every vector
is usable (`first_bad_row`): none is written, indexed or reused holding a NaN, an inf
or a component beyond ±MAX_COMPONENT. Files are
written under unique temporary names and renamed into place, so two writers of
the same shard (a retried task) can never leave a mixture.

`emb_dir` is a local path, a `file://` URI (a shared filesystem) or any object-store
URI `pipeline.storage` resolves (`s3://…`, `gs://…`): there each file is one object,
which appears only when its upload has finished, and the `.done` marker still comes
last, so the same rules hold (a shard is complete with its marker, or it is ignored).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import InputError, NonFiniteError
from ..io_utils import save_npy
from ..io_utils import write_json_atomic as _write_json_local
from ..storage import Location, RemotePath, resolve
from ..storage import write_json_atomic as _write_json_remote

META_NAME = "embeddings.json"
# The largest magnitude a vector component may have, wherever vectors are written (encode), read for
# indexing (index, `pipeline info`, a re-run of encode reusing a shard) or searched with (retrieve,
# Searcher). FAISS scores in float32 (largest 3.4e38): an inner product, a squared norm or a squared L2
# distance of D-dimensional vectors whose components are at most B in magnitude is at most 4·D·B², finite
# for B = 1e15 up to D = 8.5e7. A finite but huge component (3e38) would make every score with its vector
# inf or NaN, and FAISS drops such a passage from every result list without a word. The pipeline's
# models give normalised vectors (every |x_i| <= 1) or unnormalised ones (BERT CLS, mean pooling: norms
# in the tens), so a component beyond 1e15 is damage (a shard written over, a broken model), never an
# embedding; float16 storage (largest 65504) is always within it.
MAX_COMPONENT = 1e15
NON_FINITE = "a non-finite value (NaN or inf)"  # what `first_bad_row` says of a NaN or inf
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


def location(emb_dir: str | os.PathLike | Location) -> Location:
    """A local `Path` or a `RemotePath` for a folder of embeddings (path or URI)."""
    return emb_dir if isinstance(emb_dir, (Path, RemotePath)) else resolve(emb_dir)


def write_json(path: Location, obj) -> None:
    """Complete or absent, on either kind of location."""
    (_write_json_remote if isinstance(path, RemotePath) else _write_json_local)(path, obj)


def _write_file(path: Location, write) -> None:
    if isinstance(path, RemotePath):  # one object: complete or absent (or temp + move on other filesystems)
        buf = io.BytesIO()
        write(buf)
        path.write_bytes(buf.getvalue())
        return
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
    emb_dir = location(emb_dir)
    name = spec["name"]
    if len(pids) != len(vectors) or len(pids) != spec["end"] - spec["start"]:
        raise ValueError(f"{name}: {len(pids)} ids, {len(vectors)} vectors, {spec['end'] - spec['start']} planned")
    if pids_digest(pids) != spec["pids_sha256"]:
        raise ValueError(f"{name}: the pids read from {spec['part']} rows {spec['start']}-{spec['end']} are not "
                         "the ones planned (the corpus changed during the run?)")
    bad = first_bad_row(vectors)  # float16 storage can overflow what float32 held
    if bad is not None and bad[1] == NON_FINITE:
        row = bad[0]
        raise NonFiniteError(f"{name}: the vector of passage {pids[row]} (row {row}) is not finite (NaN or inf"
                             + (", beyond float16's range: encode.fp16=false keeps float32" if vectors.dtype == np.float16
                                else "") + "); the shard is not written")
    if bad is not None:
        raise NonFiniteError(f"{name}: the vector of passage {pids[bad[0]]} (row {bad[0]}) holds {bad[1]}; "
                             "the shard is not written")
    _write_file(emb_dir / f"{name}.npy", lambda f: save_npy(f, vectors))
    _write_file(emb_dir / f"{name}.pids.txt", lambda f: f.write("".join(f"{p}\n" for p in pids).encode("utf-8")))
    marker = {**{k: spec[k] for k in LAYOUT_KEYS}, "rows": len(pids), "dim": int(vectors.shape[1]),
              "dtype": str(vectors.dtype), **info}
    write_json(emb_dir / f"{name}.done", marker)
    return marker


def first_bad_row(vectors: np.ndarray, block_bytes: int = 64 * 2**20) -> tuple[int, str] | None:
    """(row, what it holds) of the first vector with a NaN, an inf or a component beyond
    ±MAX_COMPONENT; None when every vector is usable. A block at a time, and per block only its rows'
    largest and smallest values are made, so a memory-mapped shard is scanned without a copy of it."""
    if vectors.ndim == 0 or not vectors.size:
        return None
    vectors = vectors.reshape(len(vectors), -1)  # (rows, dim); a view, also of a memory map
    rows = max(1, block_bytes // (vectors.shape[1] * vectors.dtype.itemsize))
    for s in range(0, len(vectors), rows):
        block = np.asarray(vectors[s:s + rows])
        # NaN fails both comparisons (max and min propagate it); compared in float64, where the bound
        # itself is exact (in float16 it would round to inf and let an inf through)
        ok = (block.max(axis=1).astype(np.float64) <= MAX_COMPONENT) & \
             (block.min(axis=1).astype(np.float64) >= -MAX_COMPONENT)
        if not ok.all():
            row = s + int(np.flatnonzero(~ok)[0])
            values = np.asarray(vectors[row], dtype=np.float64)
            if not np.isfinite(values).all():
                return row, NON_FINITE
            return row, (f"a component of magnitude {np.abs(values).max():.3g}, beyond ±{MAX_COMPONENT:.0e} "
                         "(its scores would overflow float32)")
    return None


def completed_shards(emb_dir: str | Path) -> dict[str, dict]:
    """name -> `.done` marker of every shard that has one (any layout)."""
    out = {}
    for marker in location(emb_dir).glob("shard-*.done"):
        if SHARD_RE.match(marker.name):
            try:
                out[marker.name[:-len(".done")]] = json.loads(marker.read_text())
            except (OSError, ValueError):
                continue  # a marker being replaced or damaged: treated as absent
    return out


def remove_shard(emb_dir: str | Path, name: str) -> None:
    """Marker first, so a kill half-way leaves an ignored shard, never a wrong complete one."""
    emb_dir = location(emb_dir)
    for suffix in (".done", ".npy", ".pids.txt"):
        (emb_dir / f"{name}{suffix}").unlink(missing_ok=True)


def stray_files(emb_dir: str | Path, keep: set[str]) -> list[Location]:
    """Shard files not belonging to a shard in `keep`, and temporaries of killed writers (files, or the
    `.tmp-…` folder `atomic_path` writes a marker in: remove each with `storage_io.remove`)."""
    out = []
    for p in location(emb_dir).iterdir():
        if p.name.startswith(".tmp-shard-"):
            out.append(p)
        elif p.name.startswith("shard-"):
            stem = p.name.split(".", 1)[0]
            if stem not in keep:
                out.append(p)
    return out


def verify_shards(emb_dir: str | Path, specs: list[dict], total_rows: int, done: dict | None = None,
                  checked: frozenset | set = frozenset()) -> list[str]:
    """Problems that keep `specs` from being exactly the corpus: [] when every shard is
    present, made from this layout, its ids file holds exactly the planned pids, its
    vectors file is whole with one row per pid, and the rows add up to the manifest's count.
    `done`: the markers, when the caller has just read them; `checked`: shards whose files the
    caller has already checked with `shard_problem` (their files are not read again)."""
    emb_dir = location(emb_dir)
    done = completed_shards(emb_dir) if done is None else done
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
        problem = None if name in checked else shard_problem(emb_dir, spec)
        if problem:
            problems.append(problem)
        rows += spec["end"] - spec["start"]
    if not problems and rows != total_rows:
        problems.append(f"shards hold {rows} rows, the manifest {total_rows}")
    return problems


def shard_problem(emb_dir: Location, spec: dict) -> str | None:
    """Why a marked shard's files are not the planned shard (None when they are): its ids file
    must hold exactly the planned pids and its `.npy` be whole (header + rows x dim values, no
    byte missing) with one row per pid. Reads the ids and the `.npy` header, never the vectors."""
    name = spec["name"]
    try:
        raw = (emb_dir / f"{name}.pids.txt").read_bytes()
        shape = npy_shape(emb_dir / f"{name}.npy", whole=True)
    except (OSError, ValueError, EOFError) as e:
        return f"{name} is truncated or corrupt ({str(e).splitlines()[0][:200]})"
    if hashlib.sha256(raw).hexdigest() != spec["pids_sha256"]:
        return f"{name}.pids.txt does not hold the planned pids"
    if shape[0] != spec["end"] - spec["start"]:
        return f"{name}.npy has {shape[0]} rows, expected {spec['end'] - spec['start']}"
    return None


def vectors_problem(emb_dir: Location, name: str) -> str | None:
    """Why a marked shard's vectors cannot be reused (a NaN, an inf or a component beyond
    ±MAX_COMPONENT written into it after it was made), else None: `shard_problem` reads no vector,
    this reads each one once (memory-mapped, a block at a time; an object store's shard is one read)."""
    path = emb_dir / f"{name}.npy"
    try:
        bad = first_bad_row(load_vectors(path))
    except InputError as e:
        return f"{name} is truncated or corrupt ({e.reason})"
    if bad is None:
        return None
    pids = (emb_dir / f"{name}.pids.txt").read_text(encoding="utf-8").splitlines()
    pid = pids[bad[0]] if bad[0] < len(pids) else "?"
    return f"{path.name} row {bad[0]} (passage {pid}) holds {bad[1]}"


def npy_shape(path: Location, whole: bool = False) -> tuple[int, ...]:
    """The array shape from a `.npy` header (reads a few hundred bytes, on either kind of location).
    With `whole`, a file shorter or longer than its header promises is a ValueError (truncated)."""
    if isinstance(path, RemotePath):
        with path.fs.open_input_file(path.path) as f:
            shape, dtype, offset = _npy_header(f)
            size = f.size()
    else:
        with open(path, "rb") as f:
            shape, dtype, offset = _npy_header(f)
            size = os.fstat(f.fileno()).st_size
    if whole:
        want = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if size != want:
            raise ValueError(f"{size:,} bytes, but its header promises {want:,} "
                             f"(a {'x'.join(map(str, shape))} {dtype} array)")
    return shape


def _npy_header(f) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of a `.npy` header."""
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(f)
    return tuple(shape), np.dtype(dtype), f.tell()


def load_vectors(path: Location) -> np.ndarray:
    """A shard's vectors: memory-mapped when local, read whole (one shard) from an object store.
    A truncated or corrupt `.npy` is an InputError naming the file (encode re-does such a shard)."""
    try:
        if isinstance(path, RemotePath):
            return np.load(io.BytesIO(path.read_bytes()))
        npy_shape(path, whole=True)  # a short file is named as such, not as numpy's mmap error
        return np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise InputError(path, None, "vectors file missing: run `pipeline encode` again (it re-encodes "
                                         "this shard)") from None
        raise InputError(path, None, f"truncated or corrupt vectors ({str(e).splitlines()[0][:200]}): run "
                                     "`pipeline encode` again (it re-encodes this shard)") from None


def load_meta(emb_dir: str | Path) -> dict:
    path = location(emb_dir) / META_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(path, None, "no embeddings here: run `pipeline encode` first") from None
    return json.loads(text)


def shard_shapes(emb_dir: str | Path) -> Iterator[tuple[str, int, tuple[int, ...]]]:
    """(name, ids, vector array shape) of every shard `iter_shards` would yield, from the ids
    files and the `.npy` headers only (no vectors read, also on object stores)."""
    emb_dir = location(emb_dir)
    meta = load_meta(emb_dir)
    done = completed_shards(emb_dir)
    names = meta.get("shard_names") or sorted(done, key=lambda n: [int(x) for x in n.split("-")[1:]])
    for name in names:
        if name not in done:
            raise InputError(emb_dir / f"{name}.done", None, "shard listed as complete is missing: run `pipeline encode` again")
        pids = (emb_dir / f"{name}.pids.txt").read_text(encoding="utf-8").splitlines()
        yield name, len(pids), npy_shape(emb_dir / f"{name}.npy")


def iter_shards(emb_dir: str | Path, require_complete: bool = True,
                check_finite: bool = True, only: set[str] | None = None) -> Iterator[tuple[list[str], np.ndarray]]:
    """Yield (pids, memory-mapped vectors) shard by shard, in corpus order; a shard holding a NaN, an
    inf or a component beyond ±MAX_COMPONENT is an InputError naming its file, row and passage
    (`check_finite`).

    Only the shards the encoding listed in its metadata are read, so files of
    another layout or of a killed writer are never mixed in.
    """
    emb_dir = location(emb_dir)
    meta = load_meta(emb_dir)
    if require_complete and not meta.get("complete"):
        raise InputError(emb_dir / META_NAME, None, "encoding is not complete: run `pipeline encode` again to finish it")
    done = completed_shards(emb_dir)
    if "shard_names" in meta:
        names = [n for n in meta["shard_names"] if n in done or require_complete]
    else:  # an embedding set written before shards were slices: every marked shard, in order
        names = sorted(done, key=lambda n: [int(x) for x in n.split("-")[1:]])
    if only is not None:  # a part of a several-part index: its shards, in corpus order
        names = [n for n in names if n in only]
    for name in names:
        if name not in done:
            raise InputError(emb_dir / f"{name}.done", None, "shard listed as complete is missing: run `pipeline encode` again")
        vectors = load_vectors(emb_dir / f"{name}.npy")
        pids = (emb_dir / f"{name}.pids.txt").read_text(encoding="utf-8").splitlines()
        if len(pids) != len(vectors):
            raise InputError(emb_dir / f"{name}.pids.txt", None, f"{len(pids)} ids for {len(vectors)} vectors")
        if check_finite:
            bad = first_bad_row(vectors)
            if bad is not None:
                raise InputError(emb_dir / f"{name}.npy", None,
                                 f"row {bad[0]} (passage {pids[bad[0]]}) holds {bad[1]}: a vector that no search "
                                 "can rank; the embedding set is damaged: run `pipeline encode` again into this "
                                 "folder (it re-encodes this shard)")
        yield pids, vectors
