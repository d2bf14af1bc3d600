"""`pipeline encode`: encoder actors turn corpus slices into embedding shards, each writing its own.

The driver plans the shards: consecutive slices of `encode.shard_rows` rows of
each corpus part, each named by its part and first row and tied to the part
layout (part file, its row count, the row range, the sha256 of the slice's pids).
Shards already on disk with the same layout are reused, once their files are checked
(ids, size, and every vector finite and within bounds: a shard damaged since is named
and encoded again); any other shard file is removed. The remaining slices become a Ray Data dataset of small work items
(`from_items`, one block each), mapped by a pool of `ShardEncoder` actors: each
actor reads its slice from the Parquet part (only the row groups it needs, through
`pyarrow.fs`), tokenises it once, encodes it in length-sorted batches with the
configured precision, and writes the shard itself (vectors, ids, then `.done`).
Only a few bytes per shard travel back to the driver, so the driver's memory and
traffic do not grow with the corpus, and each shard is on disk the moment its
slice is encoded: a kill loses at most the shard each actor was working on.

`complete: true` is written only after every planned shard has been checked
against the layout (ids file digest, vector rows) and the rows add up to the
manifest's count.

Resources: every actor must fit on one node, and all of them at once (Ray Data
starts the whole pool before any work). Those shapes run; any other is refused
up front with a message naming the settings to change (Ray would wait forever).
The work items need no read task, so actors may take every CPU.

The output folder's checks and lock live in `encode_output.py` (re-exported here).
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import asdict, replace
from pathlib import Path

from ..config import EncodeConfig, ModelConfig, PipelineConfig
from ..data.manifest import load_manifest
from ..errors import ConfigError, PipelineError, ResourceError, worker_error, worker_os_error
from ..io_utils import missing_dirs, remove_empty_dirs
from ..storage import RemotePath, remove
from .encode_output import LOCK_NAME, check_embeddings_output, output_lock  # noqa: F401 (LOCK_NAME: re-exported)
from .export_cost import (OPENVINO_MIN_PASSAGES, OPENVINO_MIN_PASSAGES_CACHED, OPENVINO_MIN_PASSAGES_FP32,
                          OPENVINO_MIN_PASSAGES_FP32_CACHED)
from .encode_workers import SPEC_KEYS, TOKENIZE_MAX_CALLS, ShardEncoder, TokenizeSpec, tokenize_shards
from .shards import (META_NAME, completed_shards, first_bad_row, layout_matches, location, plan_part,
                     remove_shard, shard_problem, stray_files, vectors_problem, verify_shards, write_json)

def model_identity(model_cfg: ModelConfig) -> dict:
    """What makes two embedding sets comparable, and finds the model again on another machine: its
    name as given (an alias such as "minilm", or the path), its folder here, the digest of its files
    (models/loading.model_record), and the encoding settings."""
    from ..models.loading import model_record

    return {**model_record(model_cfg.name_or_path), "pooling": model_cfg.pooling, "normalize": model_cfg.normalize,
            "doc_prefix": model_cfg.doc_prefix, "doc_max_length": model_cfg.doc_max_length}


def same_model(old: dict, new: dict) -> bool:
    """Two model identities name the same model with the same settings: by the files' digest (or, for
    a set written before digests were recorded, the weights' digest and the settings)."""
    settings = ("pooling", "normalize", "doc_prefix", "doc_max_length")
    if any(old.get(k) != new.get(k) for k in settings if k in old):
        return False
    if old.get("digest"):
        return old["digest"] == new.get("digest")
    from ..io_utils import sha256_files
    from ..models.loading import resolve_model_path

    path = resolve_model_path(new["path"])
    weights = sorted(path.rglob("*.safetensors")) or sorted(path.rglob("*.bin"))
    return old.get("weights_sha256") == (sha256_files(weights) if weights else None)


def _resolved_model_cfg(model_cfg: ModelConfig, title_join: str = " "):
    """(config, dim, tokenize spec, the loaded model): pooling/normalize/lengths filled from the
    model directory so every actor agrees; the document tokenizer as the tokenising stage gets it;
    the model itself for a local encoder (encode.runner=local), which then does not load it again."""
    from ..models import BiEncoder

    probe = BiEncoder.load(model_cfg, defer=True)  # the weights at their first use: none in a warm OpenVINO encode
    tok, prefix, max_len = probe.token_spec("doc")
    return (replace(probe.cfg, pooling=probe.pooling, normalize=probe.normalize), probe.dim,
            TokenizeSpec(tok, prefix, max_len, title_join), probe)


def plan_shards(corpus_dir: Path, manifest: dict, shard_rows: int) -> list[dict]:
    """Every shard of the corpus as it is on disk now (reads only the pid column, one part at a time)."""
    import pyarrow.parquet as pq

    specs = []
    for i, part in enumerate(manifest["parts"]):
        path = corpus_dir / part["file"]
        try:
            pids = [str(p) for p in pq.read_table(path, columns=["pid"]).column("pid").to_pylist()]
        except (OSError, ValueError) as e:
            raise PipelineError(f"{path}: cannot read the corpus part ({e}); ingest the corpus again") from None
        if len(pids) != part["rows"]:
            raise PipelineError(f"{path} holds {len(pids)} rows, its manifest says {part['rows']}: "
                                "the corpus changed after ingest; ingest it again")
        for spec in plan_part(i, part["file"], pids, shard_rows):
            spec["path"] = str(path.resolve())
            specs.append(spec)
    return specs


def _node_cpus() -> list[float]:
    import ray

    return [float(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive")]


def resolve_tokenize(enc: EncodeConfig) -> str:
    """`stage` or `actor`: auto = a tokenising stage when the actors run on GPUs, else in the actor
    (on a CPU-only node the stage's task takes cores from the model; bench/encode.py measures both)."""
    if enc.tokenize != "auto":
        return enc.tokenize
    return "stage" if enc.gpus_per_actor > 0 else "actor"


def resolve_shape(enc: EncodeConfig, node_cpus: list[float], total_gpus: float) -> tuple[int, float, int]:
    """(actors, CPUs per actor, torch threads) for this cluster; ResourceError if it cannot run.

    Ray places each actor on one node and Ray Data waits for the whole pool, so the
    shape runs iff `num_actors` actors of `cpus_per_actor` pack onto the nodes (and
    the GPUs suffice). With a tokenising stage, the actors must also leave
    `encode.tokenize_cpus` free on every node (then, wherever Ray puts them, some node
    has room for a tokenising task). Unset values take the largest shape that fits.
    """
    node_cpus = [c for c in node_cpus if c > 0]
    if not node_cpus:
        raise ResourceError("encode: the Ray cluster has no CPUs")
    stage = resolve_tokenize(enc) == "stage"
    reserve = enc.tokenize_cpus if stage else 0.0
    room = [c - reserve for c in node_cpus]
    gpus = enc.gpus_per_actor
    cpus = enc.cpus_per_actor
    if cpus is None:
        cpus = 1.0 if gpus > 0 else min(node_cpus) - reserve
        if cpus <= 0:
            raise ResourceError(f"encode: encode.tokenize_cpus={reserve:g} leaves no CPU for the encoder actors on "
                                f"a {min(node_cpus):g}-CPU node; lower it or set encode.tokenize=actor")
    fits = sum(max(0, math.floor(c / cpus + 1e-9)) for c in room)
    actors = enc.num_actors
    if actors is None:
        actors = max(1, fits if gpus == 0 else min(fits, math.floor(total_gpus / gpus + 1e-9)))
    problems = []
    also = f" while leaving {reserve:g} CPU per node to the tokenising stage" if stage else ""
    if cpus > max(room) + 1e-9:
        problems.append(f"an actor of {cpus:g} CPUs fits on no node{also} (the largest has {max(node_cpus):g})")
    elif actors > fits:
        problems.append(f"{actors} actors x {cpus:g} CPUs do not fit on the nodes' CPUs "
                        f"({' + '.join(f'{c:g}' for c in node_cpus)}){also}: at most {fits} such actors fit")
    if gpus * actors > total_gpus + 1e-9:
        problems.append(f"{actors} actors x {gpus:g} GPUs asked, the cluster has {total_gpus:g}")
    if problems:
        best = max(room)
        raise ResourceError(
            f"encode: {'; '.join(problems)}. Set encode.num_actors and encode.cpus_per_actor so that they "
            f"fit (e.g. encode.num_actors=1 encode.cpus_per_actor={best:g}, or "
            f"encode.num_actors={max(1, math.floor(best / 0.5 + 1e-9)) * len(node_cpus)} encode.cpus_per_actor=0.5)"
            + (", or encode.tokenize=actor" if stage else "")
            + ", or leave both unset to use the whole cluster; Ray would otherwise wait forever.")
    threads = enc.torch_threads or max(1, int(cpus + 0.5))
    return actors, cpus, threads


def encode_corpus(corpus_dir: str | Path, out_dir: str | Path, cfg: PipelineConfig) -> dict:
    """Encode every passage of an ingested corpus into `out_dir`; resumes if interrupted.

    `out_dir` is a local path, a `file://` URI (shared filesystem) or an object-store URI
    (`s3://bucket/prefix`, `gs://…`; see `pipeline.storage`): the workers write their shards
    there themselves. Returns a summary dict (rows, new rows, shards reused, seconds, rows/s).
    """
    t_entry = time.time()  # start-up (model check, Ray, actors, model loads) is measured from here
    corpus_dir, out_dir = Path(corpus_dir), location(out_dir)
    if isinstance(out_dir, RemotePath):  # unreachable store, missing bucket, no credentials: one clear error first
        from ..storage_checks import check_writable

        check_writable(out_dir, who="the driver")
    check_embeddings_output(out_dir)  # a folder holding anything but embeddings is refused before any work
    created = missing_dirs(out_dir) if isinstance(out_dir, Path) else []
    with output_lock(out_dir, created):  # one encode at a time into a local folder
        return _encode_locked(corpus_dir, out_dir, cfg, t_entry, created)


def _encode_locked(corpus_dir: Path, out_dir, cfg: PipelineConfig, t_entry: float, created: list[Path]) -> dict:
    """`encode_corpus` once the output is checked and locked (`created`: the folders this run made)."""
    enc: EncodeConfig = cfg.encode
    manifest = load_manifest(corpus_dir)
    model_cfg, dim, tokenize_spec, probe = _resolved_model_cfg(cfg.model, manifest["title_join"])
    dtype = "float16" if enc.fp16 else "float32"
    specs = plan_shards(corpus_dir, manifest, enc.shard_rows)
    meta = {
        "corpus": str(corpus_dir.resolve()),
        "corpus_fingerprint": manifest["fingerprint"],
        "variant": manifest["variant"],
        "title_join": manifest["title_join"],
        "rows": manifest["rows"],
        "parts": len(manifest["parts"]),
        "model": model_identity(model_cfg),
        "model_config": asdict(model_cfg),
        "dim": dim,
        "dtype": dtype,
        "precision": enc.precision,
        "shard_rows": enc.shard_rows,
        "shards": len(specs),
        "shard_names": [s["name"] for s in specs],
    }
    meta_path = out_dir / META_NAME
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        diff = [k for k in ("corpus_fingerprint", "dim", "dtype", "precision") if k in old and old.get(k) != meta[k]]
        if "model" in old and not same_model(old["model"], meta["model"]):
            diff.insert(1, "model")
        if diff:
            raise PipelineError(f"{out_dir} holds embeddings from a different {', '.join(diff)}; "
                                "use a new output folder (or delete this one)")
    # reuse shards of exactly this layout; every other shard file is removed below
    done = completed_shards(out_dir) if out_dir.is_dir() else {}
    reused = {s["name"] for s in specs if s["name"] in done and layout_matches(done[s["name"]], s)}
    for spec in specs:  # a marked shard whose files were damaged since (a truncated .npy, a NaN or an inf
        # or a huge value written into its vectors) is encoded again, never counted as complete
        problem = ((shard_problem(out_dir, spec) or vectors_problem(out_dir, spec["name"]))
                   if spec["name"] in reused else None)
        if problem:
            reused.discard(spec["name"])
            print(f"[encode] {problem}: encoding this shard again", flush=True)
    todo = [s for s in specs if s["name"] not in reused]
    total_rows = manifest["rows"]
    todo_rows = sum(s["end"] - s["start"] for s in todo)
    shape = None
    runner = resolve_runner(enc, cfg.ray)
    if enc.precision == "int8":  # refused up front (torch backend, GPU actors, no NNCF), before anything is written
        from ..models.backends import resolve_backend

        resolve_backend(enc.backend, "cuda" if enc.gpus_per_actor > 0 else "cpu", "int8")
    # the corpus's first passages, the same for every encoder and a resumed run: int8 is calibrated on
    # them, and bf16 / int8 towers are checked on them (models/backends.py)
    calibration = calibration_texts(specs, manifest["title_join"]) if todo else None
    # encode.backend=auto on a CPU: OpenVINO where its export is cached or the corpus pays for making it, else torch
    backend, backend_why = backend_by_cost(enc, probe, todo_rows, runner) if todo else (enc.backend, None)
    if todo:  # a model whose vectors are NaN/inf (or overflow float32's scores) is refused before anything is written
        checked_model_vectors(probe, calibration[:8], meta["model"]["digest"], export_ok=backend != "torch")
        if runner != "local":  # the actors check their own towers: the driver's compiled fp32 export is let go
            from ..models.tower_check import release_references

            release_references()
    try:
        if todo and runner == "local":
            shape = local_shape(enc)
            from ..storage_checks import check_writable

            check_writable(out_dir)
        elif todo:  # refuse a shape that cannot run before anything is written
            from ..ray_runtime import cluster_resources, init_ray

            init_ray(cfg.ray)
            shape = resolve_shape(enc, _node_cpus(), cluster_resources()["GPU"])
            _check_output_writable(out_dir)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PipelineError(f"{out_dir}: cannot create the output folder ({e.strerror or e})") from None
        write_json(meta_path, {**meta, "complete": False})
        for name in set(done) - reused:
            remove_shard(out_dir, name)
        for stray in stray_files(out_dir, keep=reused):
            remove(stray)  # a file, or a killed actor's temporary folder
        if todo and runner == "local":
            _run_local(todo, out_dir, model_cfg, manifest["title_join"], dtype, enc, shape[2], todo_rows, probe,
                       calibration, backend, backend_why)
        elif todo:
            del probe  # the actors load their own
            _run(todo, out_dir, model_cfg, manifest["title_join"], dtype, enc, shape, todo_rows, tokenize_spec,
                 calibration, backend, backend_why)
    except BaseException:
        if created and not completed_shards(out_dir):  # a folder this run made, holding nothing of use
            (out_dir / META_NAME).unlink(missing_ok=True)
            remove_empty_dirs(created)
        raise
    markers = completed_shards(out_dir)  # read once: verified, and the precision the actors used
    problems = verify_shards(out_dir, specs, total_rows, done=markers, checked=reused)  # reused: checked above
    if problems:
        raise PipelineError(f"encode finished, but {len(problems)} shard problem(s) remain: "
                            f"{'; '.join(problems[:5])}; run `pipeline encode` again")
    # what the actors computed in: encode.precision resolved on each actor (`auto` -> bf16 or fp32 per
    # CPU ISA / GPU), as every shard's marker records it
    used = sorted({str(markers[s["name"]]["precision"]) for s in specs
                   if markers.get(s["name"], {}).get("precision")})
    resolved = used[0] if len(used) == 1 else ("mixed: " + ", ".join(used) if used else enc.precision)
    # and with what (encode.backend resolved on each encoder; shards of an older run say nothing)
    backends = sorted({str(markers[s["name"]].get("backend") or "torch") for s in specs if s["name"] in markers})
    backend = backends[0] if len(backends) == 1 else "mixed: " + ", ".join(backends)
    notes = sorted({markers[s["name"]]["backend_note"] for s in specs if markers.get(s["name"], {}).get("backend_note")})
    # the measured figures of every encoder's check against torch (one entry per distinct result)
    checks = sorted({json.dumps(markers[s["name"]]["backend_check"], sort_keys=True) for s in specs
                     if markers.get(s["name"], {}).get("backend_check")})
    write_json(meta_path, {**meta, "precision_resolved": resolved, "backend": enc.backend, "backend_resolved": backend,
                           **({"backend_notes": notes} if notes else {}),
                           **({"backend_checks": [json.loads(c) for c in checks]} if checks else {}), "complete": True})
    secs = time.time() - t_entry  # the whole command: start-up + encoding (+ checks) add up to it
    summary = {"rows": total_rows, "encoded": todo_rows, "reused_shards": len(reused), "shards": len(specs),
               "parts": len(manifest["parts"]), "seconds": round(secs, 2),
               "rows_per_s": round(todo_rows / secs, 1) if todo_rows and secs else None,
               "dim": dim, "dtype": dtype, "precision": resolved, "backend": backend, "out": str(out_dir)}
    if shape:
        summary.update(actors=shape[0], cpus_per_actor=shape[1], torch_threads=shape[2],
                       tokenize=resolve_tokenize(enc), runner=runner)
    split = ""
    if todo and _first_shard.get("started"):
        now = time.time()
        summary["startup_seconds"] = round(max(_first_shard["started"] - t_entry, 0.0), 2)
        summary["encoding_seconds"] = round(now - _first_shard["started"], 2)
        summary["encoding_rows_per_s"] = round(todo_rows / max(summary["encoding_seconds"], 1e-9), 1)
        split = (f" (start-up {summary['startup_seconds']:.1f}s, encoding {summary['encoding_seconds']:.1f}s at "
                 f"{summary['encoding_rows_per_s']:,.0f} rows/s)")
    rate = f", {summary['rows_per_s']:,.0f} rows/s" if summary["rows_per_s"] else ""
    where = " in this process, no Ray (encode.runner=local)" if todo and runner == "local" else ""
    print(f"[encode] done: {total_rows:,} passages in {len(specs)} shards "
          f"({todo_rows:,} encoded now{where}, {len(reused)} shards already complete) in {secs:.1f}s{rate}{split}; "
          f"dim {dim} {dtype}, computed in {resolved} by {backend} (encode.precision={enc.precision}, "
          f"encode.backend={enc.backend}) -> {out_dir}"
          + "".join(f"\n[encode] note: {n}" for n in notes), flush=True)
    return summary


# encode.backend=auto makes a model's OpenVINO export (converted, checked against torch, compiled: a one-time
# cost, 3.4 s for MiniLM on a 2-core AMX Xeon, 7.5-7.7 s on a 2-core AVX2 EPYC) only for a corpus that pays it
# back in this run; below these counts of passages to encode it runs torch, and where the export is cached it
# always runs OpenVINO (nothing to pay). An export from the architecture's cached graph (an earlier training
# run's validation kept it) converts nothing: its thresholds are lower. The counts are validation's
# (index/export_cost.py); measured for encode (bench/results/first-encode-avx2-2026-12-02.txt, AVX2 EPYC): the
# FAQ's 176 passages in fp32, a first run 21.3 s with torch chosen, 29.9 s making the export, sentence-transformers
# 27.2 s.
EXPORT_FROM_PASSAGES = {"bf16": OPENVINO_MIN_PASSAGES, "fp32": OPENVINO_MIN_PASSAGES_FP32}
EXPORT_FROM_PASSAGES_GRAPH_CACHED = {"bf16": OPENVINO_MIN_PASSAGES_CACHED, "fp32": OPENVINO_MIN_PASSAGES_FP32_CACHED}


def backend_by_cost(enc: EncodeConfig, model, todo_rows: int, runner: str) -> tuple[str, str | None]:
    """(the backend the encoders are given, why torch was chosen or None) for `todo_rows` passages to encode.
    Only encode.backend=auto on CPU encoders with OpenVINO installed is decided here (an explicit backend, int8,
    GPU encoders are the encoders' own: tower_runner): torch when this model's export is not in the export
    cache and the corpus has fewer passages than pay for making it (EXPORT_FROM_PASSAGES), else auto."""
    if enc.backend != "auto" or enc.precision == "int8" or enc.gpus_per_actor > 0:
        return enc.backend, None
    from ..models.backends import export_cached, graph_cached, openvino_available
    from ..models.precision import resolve_precision

    if not openvino_available():
        return enc.backend, None
    if runner == "local":
        import torch

        if torch.cuda.is_available():
            return enc.backend, None
    if export_cached(model, "doc"):
        return enc.backend, None
    precision = "bf16" if resolve_precision(enc.precision, "cpu") == "bf16" else "fp32"
    cached = graph_cached(model, "doc")
    least = (EXPORT_FROM_PASSAGES_GRAPH_CACHED if cached else EXPORT_FROM_PASSAGES)[precision]
    if todo_rows >= least:
        return enc.backend, None
    made = "from the architecture's cached graph" if cached else "converted, checked against torch, compiled"
    return "torch", (f"torch used: {todo_rows:,} passages to encode in {precision} are fewer than the {least:,} "
                     f"from which the model's OpenVINO export ({made}; made once, then kept in the export cache) "
                     "pays back its cost; once a larger corpus has made it, every encode of this model runs "
                     "OpenVINO (encode.backend=openvino makes it now)")


def checked_model_vectors(model, texts: list[str], digest: str, export_ok: bool = False) -> None:
    """`_check_model_vectors` on the model's fp32 vectors of `texts` (the corpus's first passages), once per
    model files (`digest`), model settings, texts, model code, torch version and CPU: a pass is remembered in
    the export cache (models/export_cache.py), so an encode run again on the same corpus does not pay a torch
    pass for it (its first forward was ~0.7 s of a warm run's start-up on NFCorpus abstracts). Any of these
    changed (another checkpoint, another corpus) is a new key and the check runs; a failure is never kept.
    `export_ok` (an encode that may run OpenVINO) and the model's weights not loaded yet: the vectors come from its
    export compiled in fp32 where that has passed the fp32 gate on this CPU (tower_check.verified_export), so a
    first encode of a corpus loads no torch weights for this check."""
    import hashlib

    import torch

    from ..io_utils import write_text_atomic
    from ..models.export_cache import export_cache_dir, model_code_digest
    from ..models.tower_check import cpu_key

    key = hashlib.sha256(json.dumps([digest, asdict(model.cfg), list(texts), model_code_digest(),
                                     torch.__version__, cpu_key()], sort_keys=True, default=str).encode()).hexdigest()
    try:
        memo = export_cache_dir() / "model-checks" / f"{key[:32]}.json"
        if json.loads(memo.read_text()).get("key") == key:
            return
    except ConfigError:  # $PIPELINE_EXPORT_CACHE names a file: checked every time (an OpenVINO tower says why)
        memo = None
    except (OSError, ValueError, AttributeError):
        pass
    reference = None
    if export_ok and getattr(model, "deferred", False):
        from ..models.tower_check import verified_export

        reference = verified_export(model, "doc", threads=torch.get_num_threads())
    _check_model_vectors(model, model.embed(texts, "doc", runner=reference))
    if memo is None:
        return
    try:  # a read-only (or full) cache: the check is simply made again next time
        memo.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(memo, json.dumps({"key": key, "passed": True, "texts": len(texts)}) + "\n")
    except OSError:
        pass


def _check_model_vectors(model, vectors) -> None:
    """The model's vectors of the corpus's first passages: finite (BiEncoder.check_finite) and every
    component within ±MAX_COMPONENT (shards.py says why), else NonFiniteError naming the model."""
    from ..errors import NonFiniteError

    model.check_finite(vectors, "doc")
    bad = first_bad_row(vectors)
    if bad is not None:
        raise NonFiniteError(f"the model {model.cfg.name_or_path} gives vectors no index can score: the vector "
                             f"of the corpus's passage {bad[0] + 1} (of its first {len(vectors)}) holds {bad[1]}; "
                             "nothing was written")


def resolve_runner(enc: EncodeConfig, ray_cfg) -> str:
    """`ray` or `local` (see EncodeConfig.runner): auto = local unless something asks for Ray."""
    import os
    import sys

    if enc.runner != "auto":
        return enc.runner
    ray = sys.modules.get("ray")
    if (ray is not None and ray.is_initialized()) or ray_cfg.address or os.environ.get("RAY_ADDRESS"):
        return "ray"  # a cluster, a job on one, or a Ray this process already runs (Tune, a recipe)
    if _ray_only(enc):
        return "ray"
    import torch

    return "ray" if torch.cuda.is_available() else "local"


def _ray_only(enc: EncodeConfig) -> list[str]:
    """The settings asking for what only the Ray runner does (several actors, GPU actors, a stage)."""
    return [k for k, asked in (("encode.num_actors", (enc.num_actors or 1) > 1),
                               ("encode.gpus_per_actor", enc.gpus_per_actor > 0),
                               ("encode.tokenize=stage", enc.tokenize == "stage")) if asked]


def local_shape(enc: EncodeConfig) -> tuple[int, float, int]:
    """(1 encoder, its CPUs, torch threads) for encode.runner=local; ConfigError for what only the
    Ray runner does (several actors, GPU actors, a tokenising stage)."""
    import os

    from ..errors import ConfigError

    asked = _ray_only(enc)
    if asked:
        raise ConfigError(f"encode.runner=local runs one encoder in this process; {', '.join(asked)} "
                          "need encode.runner=ray")
    cpus = enc.cpus_per_actor or float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                       else os.cpu_count() or 1)
    return 1, cpus, enc.torch_threads or max(1, int(cpus + 0.5))


def calibration_texts(specs: list[dict], title_join: str, n: int = 300) -> list[str]:
    """encode.precision=int8's calibration set: the corpus's first `n` passages, in corpus order."""
    from .encode_workers import read_texts

    texts: list[str] = []
    for spec in specs:
        texts += read_texts(spec, title_join)[1][: n - len(texts)]
        if len(texts) >= n:
            break
    return texts


def _disk_error(out_dir, os_error: str) -> PipelineError:
    """A shard write that failed (e.g. the disk filled): every shard written before is complete and
    kept (markers last), and a re-run encodes the rest."""
    kept = len(completed_shards(out_dir)) if out_dir is not None else 0
    return PipelineError(f"{out_dir}: writing embedding shards failed: {os_error}; the {kept} shard(s) "
                         "finished before are kept: make room (or fix the folder) and run encode again "
                         "to encode the rest")


def _run_local(todo: list[dict], out_dir, model_cfg: ModelConfig, title_join: str, dtype: str,
               enc: EncodeConfig, threads: int, todo_rows: int, model=None,
               calibration: list[str] | None = None, backend: str | None = None,
               backend_why: str | None = None) -> None:
    """encode.runner=local: the actors' own ShardEncoder in this process, shard after shard (no Ray
    start, no actor start, the receipts as the Ray runner's); `model` is the driver's loaded one."""
    import numpy as np

    encoder = ShardEncoder(asdict(model_cfg), title_join, threads, enc.precision, enc.batch_size, dtype,
                           str(out_dir), model=model, backend=backend or enc.backend,
                           calibration=calibration, backend_why=backend_why)
    bar = _progress_bar(todo_rows, enc.show_progress)
    _first_shard.clear()
    try:
        for spec in todo:
            batch = {k: np.array([spec[k]], dtype=object) for k in SPEC_KEYS}
            try:
                receipt = encoder._encode(batch)  # not __call__: that one ends a failed actor's process
            except OSError as e:
                raise _disk_error(out_dir, f"[Errno {e.errno}] {e.strerror or e}") from None
            if not _first_shard:
                _first_shard["started"] = time.time() - float(receipt["seconds"][0])
            _report_shard(str(receipt["name"][0]), int(receipt["rows"][0]))
            bar.update(int(receipt["rows"][0]))
    finally:
        bar.close()


def _check_output_writable(out_dir) -> None:
    """The workers write the shards: on a URI or a cluster of several nodes every node must be
    able to write there (and see the same storage); on one machine the driver's check suffices."""
    import ray

    from ..storage_checks import check_writable, check_writable_on_nodes

    if isinstance(out_dir, RemotePath) or sum(1 for n in ray.nodes() if n.get("Alive")) > 1:
        check_writable_on_nodes(out_dir)
    else:
        check_writable(out_dir)


def _run(todo: list[dict], out_dir, model_cfg: ModelConfig, title_join: str, dtype: str,
         enc: EncodeConfig, shape: tuple[int, float, int], todo_rows: int,
         tokenize_spec: "TokenizeSpec | None" = None, calibration: list[str] | None = None,
         backend: str | None = None, backend_why: str | None = None) -> None:
    import ray
    from ray.data import DataContext

    actors, cpus, threads = shape
    if len(todo) < actors:
        print(f"[encode] note: {len(todo)} shard(s) to encode for {actors} actors; lower encode.shard_rows "
              "to give every actor work", flush=True)
    ctx = DataContext.get_current()
    ctx.execution_options.preserve_order = False
    ctx.enable_progress_bars = False
    ctx.execution_options.resource_limits = ctx.execution_options.resource_limits.copy(
        object_store_memory=enc.object_store_budget_mb * 2**20)
    items = [{k: s[k] for k in SPEC_KEYS} for s in todo]
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    if resolve_tokenize(enc) == "stage":  # CPU tasks tokenise ahead; the actors only run the model
        ds = ds.map_batches(tokenize_shards, fn_kwargs={"spec": tokenize_spec}, batch_size=1, batch_format="numpy",
                            num_cpus=enc.tokenize_cpus, max_calls=TOKENIZE_MAX_CALLS)
    with warnings.catch_warnings():  # Ray 2.60 deprecates the remote-args hook, with no named max_restarts yet
        warnings.filterwarnings("ignore", message=".*ray_remote_args.* is deprecated")
        ds = _encoder_stage(ds, model_cfg, title_join, threads, enc, dtype, out_dir, cpus, actors, calibration,
                            backend or enc.backend, backend_why)
    failure = _collect(ds, todo_rows, enc.show_progress, out_dir)
    if failure is not None:
        raise failure  # (the actor that raised has left: ShardEncoder.__call__)


def _encoder_stage(ds, model_cfg, title_join, threads, enc, dtype, out_dir, cpus, actors, calibration=None,
                   backend: str | None = None, backend_why: str | None = None):
    from ray.data import ActorPoolStrategy

    return ds.map_batches(
        ShardEncoder,
        fn_constructor_kwargs={"model_cfg": asdict(model_cfg), "title_join": title_join, "torch_threads": threads,
                               "precision": enc.precision, "batch_size": enc.batch_size, "dtype": dtype,
                               "out_dir": str(out_dir), "backend": backend or enc.backend,
                               "calibration": calibration, "backend_why": backend_why},
        batch_size=1,
        batch_format="numpy",
        num_cpus=cpus,
        num_gpus=enc.gpus_per_actor or None,
        compute=ActorPoolStrategy(size=actors),
        ray_remote_args_fn=_no_restarts,
    )


def _no_restarts() -> dict:
    """Encoder actors are not restarted: a failed shard fails the run and a re-run encodes only the
    missing shards (see ShardEncoder.__call__)."""
    return {"max_restarts": 0}


_first_shard: dict = {}  # when the run's first shard began encoding (set by _collect)


def _progress_bar(todo_rows: int, show: bool):
    from ..progress import bar  # tqdm, its last line printed once (progress.bar)

    return bar(todo_rows, "encode", unit="psg", show=show, smoothing=0.1, mininterval=2.0)


def _report_shard(name: str, rows: int) -> None:
    """Called on the driver as each shard's receipt arrives (the shard is already on disk)."""


def _collect(ds, todo_rows: int, show_progress: bool, out_dir=None) -> PipelineError | None:
    """Drain the receipts: a name and a row count per shard, never vectors. A worker's
    PipelineError is returned, made outside the exception handler (no context chaining Ray's error)."""
    bar = _progress_bar(todo_rows, show_progress)
    batches = iter(ds.iter_batches(batch_size=None, batch_format="numpy"))
    failure: PipelineError | None = None
    _first_shard.clear()
    try:
        for batch in batches:
            if not _first_shard and "seconds" in batch and len(batch["seconds"]):
                # the first shard began encoding this long before its receipt: start-up ends there
                _first_shard["started"] = time.time() - float(batch["seconds"][0])
            for name, rows in zip(batch["name"], batch["rows"]):
                _report_shard(str(name), int(rows))
                bar.update(int(rows))
    except Exception as e:  # a worker's PipelineError arrives wrapped by Ray: surface its message
        failure = worker_error(e)
        if failure is None and (os_error := worker_os_error(e)) is not None:
            failure = _disk_error(out_dir, os_error)
        if failure is None:
            raise
    finally:
        # Close the iterator now: its executor then shuts the actor pool down. Left to garbage
        # collection, a traceback that keeps this frame alive (an error being handled or kept by a
        # caller) keeps the actors and their CPUs, and the next encode waits for them forever.
        if hasattr(batches, "close"):
            batches.close()
        bar.close()
    return failure
