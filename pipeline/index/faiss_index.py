"""FAISS indexes built from embedding shards: exact inner product by default, any factory string.

The build streams shard by shard (memory-mapped; a vector with a NaN, an inf or a component
beyond ±MAX_COMPONENT is refused naming its file, row and passage), trains IVF/PQ on a sample,
estimates the final size from a probe and checks it against available RAM
before adding anything, uses GPU FAISS when present, and saves atomically:

    index_dir/index.faiss   the index (always a CPU index on disk)
    index_dir/pids.txt      row i of the index is pid on line i+1
    index_dir/index.json    factory, metric, size, corpus + model identity (written with the rest)
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from pathlib import Path

import numpy as np

from ..config import IndexConfig
from ..errors import ConfigError, InputError, PipelineError, ResourceError
from ..io_utils import (OutputError, atomic_path, differing_keys, is_rerun, recover_stale, refuse_different,
                        request_differs, same_output, scratch_beside)
from ..models.precision import query_precision
from ..storage import RemotePath
from .pid_table import PidTable
from .search_params import said, search_settings, set_search_params
from .shards import META_NAME, first_bad_row, iter_shards, load_meta, location, shard_shapes

INDEX_FILE, PIDS_FILE, META_FILE = "index.faiss", "pids.txt", "index.json"


def _faiss():
    import faiss

    return faiss


def _metric(metric: str):
    faiss = _faiss()
    return faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2


def new_index(dim: int, factory: str, metric):
    """faiss.index_factory(dim, factory, metric) without polysemous training: the factory turns it on for
    every 8-bit PQ (IndexPQ, IndexIVFPQ, inside any transform, refine or HNSW), an annealing that reorders each
    sub-quantizer's centroids so Hamming distances between codes track real ones. Only polysemous search
    (polysemous_ht, which nothing here sets) reads that order; the centroids and every search result are the
    same without it (tests/unit/test_index_training.py), and it cost ~1.3-1.4 s per sub-quantizer whatever the
    sample size on a 2-core AVX2 EPYC: 10.4 s of PQ8's 10.5 s training, 91 s of a 768-d PQ64's 94 s
    (bench/results/index-train-2026-12-03.txt)."""
    faiss = _faiss()
    index = faiss.index_factory(dim, factory, metric)
    for part in _nested(index):
        if hasattr(part, "do_polysemous_training"):
            part.do_polysemous_training = False
    return index


def _nested(index) -> list:
    """The index and every index it wraps (a transform's, a refine's, an HNSW's storage, an IVF's quantizer),
    each as its own class."""
    faiss = _faiss()
    index = faiss.downcast_index(index)
    found = [index]
    for attr in ("index", "base_index", "refine_index", "storage", "quantizer"):
        sub = getattr(index, attr, None)
        if isinstance(sub, faiss.Index):
            found += _nested(sub)
    return found


def gpu_count() -> int:
    faiss = _faiss()
    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def _want_gpu(cfg: IndexConfig) -> bool:
    n = gpu_count()
    if cfg.use_gpu == "yes" and n == 0:
        raise ResourceError("index.use_gpu=yes but FAISS sees no GPU (install the `gpu` extra: make setup FAISS=gpu)")
    return cfg.use_gpu != "no" and n > 0


def _sample(emb_dir, n_total: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    take = min(k, n_total)
    chosen = np.sort(rng.choice(n_total, size=take, replace=False))
    out, offset = [], 0
    for _, vecs in iter_shards(emb_dir, check_finite=False):  # the sampled rows are checked below
        lo, hi = np.searchsorted(chosen, [offset, offset + len(vecs)])
        if hi > lo:
            out.append(np.asarray(vecs[chosen[lo:hi] - offset], dtype=np.float32))
        offset += len(vecs)
    sample = np.concatenate(out)
    if first_bad_row(sample) is not None:  # a NaN, an inf or a component beyond ±MAX_COMPONENT
        for _ in iter_shards(emb_dir):  # raises, naming the shard, the row and the passage
            pass
    return sample


def compressed_factory(n: int, dim: int) -> tuple[str, float]:
    """An IVF-PQ factory that fits where Flat does not, and its size: ~4·sqrt(N) lists (a power of
    two, FAISS's guideline), PQ with one byte per 4-8 dimensions (a sub-quantizer count that divides
    `dim`); codes + 8-byte ids + the centroids."""
    nlist = 1 << max(4, round(math.log2(4 * math.sqrt(max(n, 1)))))
    nlist = max(16, min(nlist, 1 << 16, n // 39 or 16))
    nlist = 1 << int(math.log2(nlist))
    m = next((m for m in (64, 48, 32, 24, 16, 12, 8, 4, 2, 1) if dim % m == 0 and dim // m >= 4), 1)
    return f"IVF{nlist},PQ{m}", n * (m + 8) + nlist * dim * 4.0


def estimate_bytes(index, probe: np.ndarray) -> tuple[float, int]:
    """(bytes per added vector, bytes of the empty index), measured by adding `probe` to a clone."""
    faiss = _faiss()
    empty = faiss.serialize_index(index).nbytes
    clone = faiss.clone_index(index)
    clone.add(probe)
    return (faiss.serialize_index(clone).nbytes - empty) / max(len(probe), 1), empty


def _load_embeddings_meta(emb_dir) -> dict:
    """embeddings.json, checked complete and consistent with the shards on disk (headers only)."""
    try:
        is_dir = emb_dir.is_dir()
    except OSError as e:  # a storage URI that cannot be reached or read
        from ..remote_path import error_reason

        raise InputError(emb_dir, None, f"cannot read the embeddings there: {error_reason(e)}") from None
    if not is_dir:
        raise InputError(emb_dir, None, "not a folder of embeddings (run `pipeline encode` first)")
    try:
        meta = load_meta(emb_dir)
    except ValueError as e:
        raise InputError(emb_dir / META_NAME, None, f"not valid JSON ({e}); the embedding set is damaged") from None
    if not isinstance(meta, dict):
        raise InputError(emb_dir / META_NAME, None, "not a JSON object: not written by `pipeline encode`")
    missing = [k for k in ("rows", "dim", "corpus_fingerprint", "model_config") if k not in meta]
    if missing:
        raise InputError(emb_dir / META_NAME, None, f"missing {', '.join(missing)}: not written by `pipeline encode`")
    if not meta.get("complete"):
        raise InputError(emb_dir / META_NAME, None,
                         "encoding is not complete: run `pipeline encode` again to finish it")
    rows, dim = int(meta["rows"]), int(meta["dim"])
    total = 0
    try:  # headers and ids only (no vectors read, also on object stores)
        shards = []
        for name, n_ids, shape in shard_shapes(emb_dir):
            shards.append((name, shape[0] if len(shape) else 0))
            if len(shape) != 2 or shape[1] != dim:
                raise InputError(emb_dir, None, f"a shard holds vectors of shape {shape}, embeddings.json "
                                 f"says dim {dim}; run `pipeline encode` again")
            if n_ids != shape[0]:
                raise InputError(emb_dir / f"{name}.pids.txt", None, f"{n_ids} ids for {shape[0]} vectors")
            total += shape[0]
    except FileNotFoundError as e:
        raise InputError(e.filename or emb_dir, None, "missing although its shard is marked done; "
                         "run `pipeline encode` again") from None
    except (ValueError, OSError, EOFError) as e:
        raise InputError(emb_dir, None, f"a shard is unreadable or truncated ({e}); run `pipeline encode` "
                         "again") from None
    if total != rows:
        raise InputError(emb_dir, None, f"the shards hold {total} of the {rows} vectors embeddings.json lists: "
                         "the embedding set is incomplete; run `pipeline encode` again")
    if rows == 0:
        raise InputError(emb_dir, None, "the embedding set is empty: nothing to index")
    _check_corpus_unchanged(emb_dir, meta)
    return {**meta, "_shard_rows": shards}  # (name, rows) in order: what a plan of parts is made from, read once


def _check_corpus_unchanged(emb_dir, meta: dict) -> None:
    """The corpus the vectors were encoded from must still be the corpus at that path: one
    re-ingested there with other content since would pair these vectors with ids and texts
    they do not encode (a run that looks fine and is wrong). A corpus that is no longer there
    (moved, or on another machine) cannot be checked; the index records the fingerprint anyway."""
    from ..data.manifest import MANIFEST_NAME, load_manifest

    corpus = meta.get("corpus")
    if not corpus or not (Path(corpus) / MANIFEST_NAME).is_file():
        return
    try:
        now = load_manifest(corpus).get("fingerprint")
    except PipelineError:
        return  # a damaged manifest is ingest's to report; the vectors' own checks passed
    if now and now != meta["corpus_fingerprint"]:
        raise InputError(emb_dir / META_NAME, None,
                         f"these vectors were encoded from the corpus at {corpus} (fingerprint "
                         f"{meta['corpus_fingerprint']}), which has been re-ingested with other content since "
                         f"(fingerprint {now}); encode it again (pipeline encode --corpus {corpus} --out <a new "
                         "folder>) and index those vectors")


def _ivf_lists(index) -> int:
    faiss = _faiss()
    try:
        return int(faiss.extract_index_ivf(index).nlist)
    except (RuntimeError, AttributeError):
        return 0


def build_index(emb_dir: str | Path, out_dir: str | Path, cfg: IndexConfig, progress: bool = True,
                overwrite: bool = True, say_done: bool = True) -> dict:
    """Build a FAISS index over all complete shards of `emb_dir`; returns index.json's content.

    `out_dir` must be new, empty, or an index this tool wrote (replaced only with
    `overwrite`; the CLI asks for `--overwrite`). Anything else there is refused before
    any work starts, and an existing index stays readable until the new one is complete.
    Run again as it was run, it builds beside the index there and keeps that one when the two
    are the same (`_unchanged`). `say_done` off: no done line (a build staged for upload says its own).
    """
    import psutil

    faiss = _faiss()
    out_loc = location(out_dir)
    if isinstance(out_loc, RemotePath):
        return _build_index_remote(emb_dir, out_loc, cfg, progress, overwrite)
    emb_dir, out_dir = location(emb_dir), Path(out_dir)  # embeddings: a local path or a storage URI
    from .sharded import PLAN_FILE

    # a killed build of several parts (its plan, no index.json): this command's own, resumed
    resuming = (out_dir / PLAN_FILE).is_file() and not (out_dir / META_FILE).exists()
    rerun = False if resuming else is_rerun(out_dir, "index", overwrite)
    if rerun:
        _same_request(out_dir, emb_dir, cfg)  # another request: refused before any work
    meta = _load_embeddings_meta(emb_dir)
    n_total, dim = int(meta["rows"]), int(meta["dim"])
    t0 = time.time()
    try:
        index = new_index(dim, cfg.factory, _metric(cfg.metric))
    except RuntimeError as e:
        raise ConfigError(f"index.factory={cfg.factory!r} is not a valid FAISS factory string: "
                          f"{_faiss_reason(e)}") from None
    # the search settings given here are kept in the index file (FAISS writes nprobe and efSearch with it), so
    # retrieve and Searcher search as built unless they are given their own; refused now when
    # the factory has no such setting. (Parts are clones of this index: each keeps them.)
    set_search_params(index, cfg, cfg.factory)
    nlist = _ivf_lists(index)
    if nlist > n_total:
        raise ConfigError(f"index.factory={cfg.factory!r} asks for {nlist:,} inverted lists but the corpus has only "
                          f"{n_total:,} vectors (IVF needs at least one training vector per list, FAISS advises 39): "
                          f"use at most IVF{max(1, n_total // 39)}, or Flat")
    sample = None
    if not index.is_trained:
        # FAISS wants 39 training vectors a list (and warns on stderr otherwise): the sample grows to
        # that when index.train_sample is smaller, still bounded by the list count, never by N
        want = max(cfg.train_sample, min(n_total, 39 * nlist)) if nlist else cfg.train_sample
        sample = _sample(emb_dir, n_total, want)
        if nlist and len(sample) < nlist:
            raise ConfigError(f"index.factory={cfg.factory!r}: {nlist:,} lists but index.train_sample="
                              f"{cfg.train_sample:,} training vectors; raise index.train_sample to at least {nlist:,}")
        if progress:
            raised = f" (index.train_sample={cfg.train_sample:,} raised to 39 a list)" if want > cfg.train_sample else ""
            print(f"[index] training {cfg.factory} on {len(sample):,} sampled vectors{raised}", flush=True)
        try:
            with _faiss_warnings() as warned:
                index.train(sample)
        except RuntimeError as e:
            raise ConfigError(f"index.factory={cfg.factory!r} cannot be trained on {len(sample):,} vectors: "
                              f"{_faiss_reason(e)}") from None
        if progress:
            for points, centroids, advised, times in warned:
                fix = (f"raise index.train_sample to {advised:,}, or compare its recall with Flat" if points < n_total
                       else "compare its recall with Flat; on a corpus this small Flat is exact and fast")
                print(f"[index] note: FAISS trained {f'{times} clusterings' if times > 1 else 'one clustering'} of "
                      f"{centroids:,} centroids on {points:,} vectors, fewer than the {advised:,} it advises: the "
                      f"codes are coarser ({fix})", flush=True)
    probe = sample[:2000] if sample is not None else _sample(emb_dir, n_total, 2000)
    per_vec, base = estimate_bytes(index, probe)
    need = per_vec * n_total + base
    avail = psutil.virtual_memory().available
    if progress:
        print(f"[index] {cfg.factory} over {n_total:,} x {dim}: ~{per_vec:,.0f} B/vector, "
              f"estimated {need / 2**30:.2f} GiB (available {avail / 2**30:.1f} GiB)", flush=True)
    fits = cfg.max_ram_fraction * avail
    # by itself, parts only where parts of one embedding shard each would fit; else the refusal below says what would
    one_shard = per_vec * max((rows for _, rows in meta["_shard_rows"]), default=0) + base
    auto = cfg.shards == 0 and not cfg.shard_max_gb and need > fits and one_shard <= fits
    if resuming or cfg.shards > 1 or cfg.shard_max_gb > 0 or auto:
        return _build_in_parts(emb_dir, out_dir, cfg, meta, index, per_vec, base, fits, rerun, overwrite, progress,
                               say_done, t0, None if sample is None else len(sample))
    if need > cfg.max_ram_fraction * avail:
        alt, alt_bytes = compressed_factory(n_total, dim)
        raise ResourceError(f"index {cfg.factory} over {n_total:,} x {dim} needs ~{need / 2**30:.2f} GiB, more than "
                            f"{cfg.max_ram_fraction:.0%} of the {avail / 2**30:.1f} GiB available; "
                            f"--factory '{alt}' would take ~{alt_bytes / 2**30:.2f} GiB (approximate search: check "
                            "its recall against Flat on a dev set), or raise index.max_ram_fraction")
    on_gpu = _want_gpu(cfg)
    work = index
    if on_gpu:
        try:
            work = faiss.index_cpu_to_all_gpus(index)
        except RuntimeError as e:  # e.g. HNSW has no GPU version
            print(f"[index] {cfg.factory} cannot run on GPU ({str(e).splitlines()[0]}); building on CPU", flush=True)
            on_gpu, work = False, index
    del sample, probe
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(scratch_beside(out_dir)) if rerun else out_dir
        try:
            info = _write_index(faiss, emb_dir, target, cfg, work, on_gpu, n_total, dim, per_vec, meta, t0, progress)
        except OSError as e:  # the disk filled (or vanished) while the pids or metadata were written
            raise OutputError(f"{out_dir}: cannot write the index ({e.strerror or e}); nothing was written"
                              + (", the existing index is kept" if Path(out_dir).exists() else "")) from None
        if rerun:
            old = _unchanged(target, out_dir)
            if progress:
                print(f"[index] unchanged: {out_dir} already holds this index ({info['ntotal']:,} vectors, "
                      f"{cfg.factory}, the same files); nothing was written", flush=True)
            return old
    if progress and say_done:
        print(f"[index] done: {info['ntotal']:,} vectors, {cfg.factory} ({cfg.metric}), "
              f"{'GPU' if on_gpu else 'CPU'} build in {info['seconds']:.1f}s{said(cfg)} -> {out_dir}", flush=True)
    return info


def _build_in_parts(emb_dir, out_dir: Path, cfg: IndexConfig, meta: dict, trained, per_vec: float, base: int,
                    fits: float, rerun: bool, overwrite: bool, progress: bool, say_done: bool, t0: float,
                    sample_rows: int | None) -> dict:
    """An index of several parts (index/sharded.py): planned, each part checked against the memory it may take,
    then built (resumed when a killed build of the same plan is there)."""
    from .sharded import _part_fits, build_sharded, part_problem, plan_parts

    shards = meta["_shard_rows"]
    parts, why = plan_parts(shards, per_vec, base, cfg.shards, cfg.shard_max_gb, fits)
    for part in parts:
        _part_fits(part, fits, f"index {cfg.factory} over {int(meta['rows']):,} vectors")
    if rerun:  # a complete index of the same request is there (checked by _same_request): kept when it is this one
        old = json.loads((out_dir / META_FILE).read_text(encoding="utf-8"))
        same = [{k: p[k] for k in ("name", "offset", "rows", "shards")} for p in old.get("parts") or []] == \
            [{k: p[k] for k in ("name", "offset", "rows", "shards")} for p in parts]
        if same and all(part_problem(out_dir / p["name"], p, old) is None for p in parts):
            if progress:
                print(f"[index] unchanged: {out_dir} already holds this index ({old['ntotal']:,} vectors in "
                      f"{len(parts)} parts, {cfg.factory}); nothing was written", flush=True)
            return old
        refuse_different(out_dir, "index", "other parts: the embeddings or the plan changed since")
    if (out_dir / META_FILE).exists():  # --overwrite of a complete index: the new one is built beside it
        with atomic_path(out_dir) as tmp:
            info = build_sharded(emb_dir, tmp, cfg, meta, trained, per_vec, base, parts, why, progress, t0,
                                 sample_rows)
    else:
        info = build_sharded(emb_dir, out_dir, cfg, meta, trained, per_vec, base, parts, why, progress, t0,
                             sample_rows)
    if progress and say_done:
        print(f"[index] done: {info['ntotal']:,} vectors in {len(parts)} parts, {cfg.factory} ({cfg.metric}), "
              f"CPU build in {info['seconds']:.1f}s{said(cfg)} -> {out_dir}", flush=True)
    return info


_VOLATILE = ("seconds", "gpu_build")  # index.json fields that say how a build went, not what it holds


def _same_request(out_dir, emb_dir, cfg: IndexConfig) -> None:
    """A re-run into an index this tool wrote (a folder or a storage URI): the same embeddings, factory, metric and
    search settings, or refused now."""
    old = json.loads((out_dir / META_FILE).read_text(encoding="utf-8"))
    recorded = {**old, "search": old.get("search") or {}}  # (an index.json from before search settings: none)
    differs = request_differs(recorded, {"embeddings": str(emb_dir), "factory": cfg.factory, "metric": cfg.metric,
                                         "search": search_settings(cfg)})
    if differs:
        refuse_different(out_dir, "index", differs)


def _unchanged(built: Path, out_dir: Path, name=None) -> dict:
    """The index.json of `out_dir`, kept, when `built` holds the same index and ids; otherwise refused (the
    error names `name`, where `out_dir` is a local copy of it)."""
    old = json.loads((out_dir / META_FILE).read_text(encoding="utf-8"))
    new = json.loads((built / META_FILE).read_text(encoding="utf-8"))
    if differing_keys(old, new, ignore=_VOLATILE) or not same_output(built, out_dir, ignore=(META_FILE,)):
        refuse_different(name or out_dir, "index", "other vectors or ids: the embeddings changed since")
    return old


def _write_index(faiss, emb_dir, out_dir, cfg, work, on_gpu: bool, n_total: int, dim: int, per_vec: float,
                 meta: dict, t0: float, progress: bool) -> dict:
    """Add every shard to `work` (batch by batch) and write the index folder atomically."""
    from tqdm import tqdm

    _reserve_codes(work, n_total)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        bar = tqdm(total=n_total, unit="vec", desc="index", disable=not progress, mininterval=2.0)
        with open(tmp / PIDS_FILE, "w", encoding="utf-8") as pid_file:
            for pids, vecs in iter_shards(emb_dir):
                for s in range(0, len(vecs), cfg.add_batch_size):
                    chunk = np.ascontiguousarray(vecs[s:s + cfg.add_batch_size], dtype=np.float32)
                    work.add(chunk)
                    bar.update(len(chunk))
                pid_file.write("".join(p + "\n" for p in pids))
        bar.close()
        if work.ntotal != n_total:
            raise InputError(emb_dir, None, f"shards hold {work.ntotal} vectors, the manifest says {n_total}")
        final = faiss.index_gpu_to_cpu(work) if on_gpu else work
        try:
            faiss.write_index(final, str(tmp / INDEX_FILE))
        except RuntimeError as e:  # e.g. the disk is full: a message, not FAISS's C++ trace
            raise OutputError(f"{out_dir}: cannot write the index ({_faiss_reason(e)}); nothing was written"
                              + (", the existing index is kept" if Path(out_dir).exists() else "")) from None
        info = {
            "factory": cfg.factory, "metric": cfg.metric, "ntotal": int(final.ntotal), "dim": dim,
            "gpu_build": on_gpu, "bytes_per_vector_est": round(per_vec, 1),
            "seconds": round(time.time() - t0, 2), "embeddings": str(emb_dir),
            **{k: meta.get(k) for k in ("corpus_fingerprint", "variant", "title_join", "model", "model_config", "corpus",
                                        "precision", "precision_resolved", "backend_resolved")},
            "query_precision": query_precision(),  # how retrieve, Searcher and QueryEncoder encode queries
            "search": search_settings(cfg),  # kept in the index file: searched with these unless given others
        }
        (tmp / META_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info


def _reserve_codes(index, n_total: int) -> None:
    """An index that keeps its codes in one array (Flat, SQ, PQ) grows it as vectors are added, and
    each growth copies the array: `pipeline index` of 3M x 32 Flat peaked at 611 MB for a 388 MB
    index. Sized once to the final count and emptied (the capacity stays), adding never copies: 462 MB."""
    codes = getattr(index, "codes", None)
    if codes is None or index.ntotal != 0:
        return
    codes.resize(n_total * index.code_size)
    codes.resize(0)


def _check_remote_output(out: RemotePath, overwrite: bool) -> bool:
    """check_output's rules on an object store: new, empty, or an index this tool wrote; True when it is a
    re-run (an index there and no `overwrite`)."""
    import fnmatch

    from ..io_utils import OUTPUT_KINDS

    spec = OUTPUT_KINDS["index"]
    names = sorted(p.name for p in out.iterdir())
    if not names:
        return False
    if spec.marker not in names:
        raise OutputError(f"{out} already exists and is not {spec.what} (it holds {', '.join(names[:5])}); refusing "
                          "to replace it. Choose another output path; nothing was written or deleted.")
    others = [n for n in names if n != spec.marker and not any(fnmatch.fnmatch(n, a) for a in spec.allowed)]
    if others:
        raise OutputError(f"{out} holds {spec.what} but also {', '.join(others[:5])}; move those away or choose "
                          "another output path. Nothing was written or deleted.")
    return not overwrite  # an index this tool wrote, asked again without --overwrite: a re-run


def _build_index_remote(emb_dir, out: RemotePath, cfg: IndexConfig, progress: bool, overwrite: bool) -> dict:
    """Build in a local staging folder, then upload with index.json last: a reader sees the whole
    index or none (index.json is the completion marker; a replaced index loses its marker first).
    Run again as it was run, the build is compared with (a cached local copy of) the index there and
    that one kept when the two are the same, as for a local folder."""
    import shutil

    from ..storage_checks import check_writable
    from ..storage_io import staging_dir, upload_dir

    rerun = _check_remote_output(out, overwrite)
    if rerun:
        _same_request(out, location(emb_dir), cfg)  # another request: refused before any work
    else:  # a re-run writes nothing there
        check_writable(out, who="pipeline index")
    local = staging_dir(out, "index") / "build"
    shutil.rmtree(local, ignore_errors=True)
    # the build's own lines (the training sample, FAISS's notes, the size estimate), not its done line: the
    # index is done once uploaded
    info = build_index(emb_dir, local, cfg, progress=progress, overwrite=False, say_done=False)
    if rerun:
        try:
            old = _unchanged(local, local_index_dir(out), name=out)
        finally:
            shutil.rmtree(local, ignore_errors=True)
        if progress:
            print(f"[index] unchanged: {out} already holds this index ({info['ntotal']:,} vectors, {cfg.factory}, "
                  "the same files); nothing was written", flush=True)
        return old
    (out / META_FILE).unlink(missing_ok=True)
    upload_dir(local, out, marker=META_FILE)
    shutil.rmtree(local, ignore_errors=True)
    if progress:
        print(f"[index] done: {info['ntotal']:,} vectors, {cfg.factory} ({cfg.metric}) in {info['seconds']:.1f}s, "
              f"uploaded{said(cfg)} -> {out}", flush=True)
    return info


def local_index_dir(index_dir) -> Path:
    """A local folder holding the index at `index_dir`: the folder itself, or for a storage URI a
    local copy (cached under the staging folder, keyed by the index's index.json, so a replaced
    index is fetched again and an unchanged one once)."""
    import hashlib
    import shutil

    loc = location(index_dir)
    if not isinstance(loc, RemotePath):
        return Path(index_dir)
    from ..storage import download_dir, staging_dir

    try:
        meta = (loc / META_FILE).read_bytes()
    except (FileNotFoundError, OSError):
        raise InputError(loc, None, "no complete index here (no index.json): run `pipeline index --out` "
                         "to this location first") from None
    local = staging_dir(loc, "index") / f"copy-{hashlib.sha256(meta).hexdigest()[:16]}"
    if (local / META_FILE).is_file():
        return local
    part = local.with_name(local.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    download_dir(loc, part)
    if (part / META_FILE).read_bytes() != meta:
        shutil.rmtree(part, ignore_errors=True)
        raise InputError(loc, None, "the index was replaced while it was being fetched; run again")
    part.rename(local)
    return local


_SHORT_TRAINING = re.compile(r"WARNING clustering (\d+) points to (\d+) centroids: "
                             r"please provide at least (\d+) training points")


@contextlib.contextmanager
def _faiss_warnings():
    """FAISS's C++ code warns on the process's stderr, once per clustering: a PQ64 trained on a small corpus
    printed the same line 64 times. Its stderr is held in a file while the block runs; each kind of "too
    few training points" warning comes back once, as (points, centroids, advised, times) in the yielded
    list for the caller to say in its own words; anything else is passed on to stderr as it was."""
    import os
    import sys
    import tempfile

    notes: list[tuple[int, int, int, int]] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield notes
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode("utf-8", "replace")
            counts: dict[tuple[int, int, int], int] = {}
            other = []
            for line in text.splitlines():
                m = _SHORT_TRAINING.search(line)
                if m:
                    key = tuple(int(g) for g in m.groups())
                    counts[key] = counts.get(key, 0) + 1
                elif line.strip():
                    other.append(line)
            notes.extend((*key, times) for key, times in counts.items())
            if other:
                print("\n".join(other), file=sys.stderr, flush=True)


def _faiss_reason(e: Exception) -> str:
    """FAISS errors carry a C++ signature and source location; keep what went wrong."""

    text = " ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())
    text = re.sub(r"^Error in .*? at \S+:\d+: ", "", text)
    text = re.sub(r"^Error: ", "", text)
    # an I/O failure: "'ret == (size * 4)' failed: write error in <tmp file>: 106451 != 1280000 (No space left
    # on device)" says no more to a user than the OS's reason
    io = re.search(r"\b(write|read) error in .*\(([^()]+)\)\s*$", text)
    if io:
        return f"{io.group(1)} error: {io.group(2)}"
    return text or type(e).__name__


def load_index(index_dir, cfg: IndexConfig | None = None, resident: bool = True):
    """The index at `index_dir`, one part (LoadedIndex) or several (sharded.ShardedIndex: `resident` keeps its
    parts loaded once used; without it one part is loaded at a time). Both search alike."""
    from .sharded import ShardedIndex, is_sharded

    folder = local_index_dir(index_dir)
    if is_sharded(folder):
        return ShardedIndex(folder, cfg, resident=resident)
    return LoadedIndex(folder, cfg)


class LoadedIndex:
    """A FAISS index with its pid list and metadata, ready to search."""

    def __init__(self, index_dir: str | Path, cfg: IndexConfig | None = None):
        faiss = _faiss()
        index_dir = local_index_dir(index_dir)  # a storage URI is fetched to a local copy
        meta_path = index_dir / META_FILE
        if not index_dir.exists():
            recover_stale(index_dir)  # a writer killed mid-replacement left the old index aside
        if not index_dir.is_dir():
            raise InputError(index_dir, None, "no index here: run `pipeline index` first")
        if not meta_path.exists():
            raise InputError(meta_path, None, "no index here: run `pipeline index` first")
        try:
            self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if not isinstance(self.meta, dict):
                raise ValueError("not a JSON object")
        except (ValueError, OSError) as e:
            raise InputError(meta_path, None, f"unreadable index metadata ({e}); rebuild with `pipeline index`") from None
        index_path = index_dir / INDEX_FILE
        if not index_path.is_file():
            raise InputError(index_path, None, "missing; rebuild with `pipeline index`")
        try:
            self.index = faiss.read_index(str(index_path))
        except RuntimeError as e:
            raise InputError(index_path, None, f"not a readable FAISS index (corrupt or truncated: "
                             f"{_faiss_reason(e)}); rebuild with `pipeline index`") from None
        want_n, want_dim = self.meta.get("ntotal"), self.meta.get("dim")
        if (want_n is not None and self.index.ntotal != want_n) or (want_dim is not None and self.index.d != want_dim):
            raise InputError(index_path, None, f"holds {self.index.ntotal} x {self.index.d} vectors, index.json says "
                             f"{want_n} x {want_dim}: corrupt or from another build; rebuild with `pipeline index`")
        try:
            self.pids = PidTable(index_dir / PIDS_FILE)  # 8 bytes a passage, ids decoded when looked up
        except FileNotFoundError:
            raise InputError(index_dir / PIDS_FILE, None, "missing; rebuild with `pipeline index`") from None
        except OSError as e:
            raise InputError(index_dir / PIDS_FILE, None, f"unreadable ({e}); rebuild with `pipeline index`") from None
        except InputError as e:
            raise InputError(index_dir / PIDS_FILE, None, f"unreadable ({e.reason}); rebuild with `pipeline index`") from None
        if len(self.pids) != self.index.ntotal:
            raise InputError(index_dir / PIDS_FILE, None, f"{len(self.pids)} ids for {self.index.ntotal} vectors")
        cfg = cfg or IndexConfig()
        set_search_params(self.index, cfg, self.meta.get("factory"))
        if _want_gpu(cfg):
            try:
                self.index = faiss.index_cpu_to_all_gpus(self.index)
            except RuntimeError:
                pass  # index type without a GPU version: search on CPU

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(Q, D) float32 -> scores (Q, k), row ids (Q, k); -1 where fewer than k exist. Equal scores in corpus
        order (the lower row first), the rule a several-part index's merge follows (index/sharded.order)."""
        from .sharded import search_ordered

        return search_ordered(self.index, queries, k, self.meta.get("metric", "ip"))
