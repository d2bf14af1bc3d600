"""`pipeline encode`: stream the Parquet corpus through encoder actors into embedding shards.

Ray Data reads only the corpus parts whose shard is not complete, feeds them to
a pool of `EncoderActor`s (`map_batches` with a callable class; CPUs/GPUs per
actor from config), and the driver writes each shard as soon as all rows of its
part have arrived. Order is preserved, so at most one partial shard is held in
memory whatever the corpus size. A killed run, started again, encodes only the
missing shards; a shard is never half-written (vectors, ids, then a `.done`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from ..config import EncodeConfig, ModelConfig, PipelineConfig
from ..data.manifest import join_title, load_manifest
from ..errors import PipelineError
from ..io_utils import write_json_atomic
from .shards import META_NAME, completed_shards, shard_name, write_shard


class EncoderActor:
    """Ray Data callable class: a batch of passages -> their document vectors."""

    def __init__(self, model_cfg: dict, title_join: str, torch_threads: int, fp16: bool):
        import torch

        from ..models import BiEncoder

        torch.set_num_threads(max(1, torch_threads))
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = BiEncoder.load(ModelConfig(**model_cfg)).to(self.device).eval()
        self.title_join = title_join
        self.fp16 = fp16

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [join_title(t, x, self.title_join) for t, x in zip(batch["title"], batch["text"])]
        vectors = self.model.embed(texts, "doc", batch_size=len(texts), device=self.device,
                                   fp16=self.fp16 and self.device == "cuda")
        return {"pid": batch["pid"], "path": batch["path"], "embedding": vectors}


def model_identity(model_cfg: ModelConfig) -> dict:
    """What makes two embedding sets comparable: weights digest + encoding settings."""
    from ..io_utils import sha256_files
    from ..models.encoder import resolve_model_path

    path = resolve_model_path(model_cfg.name_or_path)
    weights = sorted(path.rglob("*.safetensors")) or sorted(path.rglob("*.bin"))
    return {"path": str(path), "weights_sha256": sha256_files(weights) if weights else None,
            "pooling": model_cfg.pooling, "normalize": model_cfg.normalize,
            "doc_prefix": model_cfg.doc_prefix, "doc_max_length": model_cfg.doc_max_length}


def _resolved_model_cfg(model_cfg: ModelConfig) -> tuple[ModelConfig, int]:
    """Fill pooling/normalize from the model directory so every actor agrees."""
    from ..models import BiEncoder

    probe = BiEncoder.load(model_cfg)
    return replace(probe.cfg, pooling=probe.pooling, normalize=probe.normalize), probe.dim


def encode_corpus(corpus_dir: str | Path, out_dir: str | Path, cfg: PipelineConfig) -> dict:
    """Encode every passage of an ingested corpus into `out_dir`; resumes if interrupted.

    Returns a summary dict (rows, new rows, shards reused, seconds, rows/s).
    """
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    from ..ray_runtime import check_resources, init_ray

    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    manifest = load_manifest(corpus_dir)
    enc: EncodeConfig = cfg.encode
    model_cfg, dim = _resolved_model_cfg(cfg.model)
    dtype = "float16" if enc.fp16 else "float32"
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
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path = out_dir / META_NAME
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        diff = [k for k in ("corpus_fingerprint", "model", "dim", "dtype") if old.get(k) != meta[k]]
        if diff:
            raise PipelineError(f"{out_dir} holds embeddings from a different {', '.join(diff)}; "
                                "use a new output folder (or delete this one)")
    write_json_atomic(meta_path, {**meta, "complete": False})

    done = completed_shards(out_dir)
    todo = [(i, p) for i, p in enumerate(manifest["parts"]) if i not in done]
    total_rows = sum(p["rows"] for p in manifest["parts"])
    todo_rows = sum(p["rows"] for _, p in todo)
    t0 = time.time()
    if todo:
        init_ray(cfg.ray)
        check_resources("encode", enc.num_actors * enc.cpus_per_actor, enc.num_actors * enc.gpus_per_actor,
                        keep_free_cpus=0.5)
        ctx = DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        # Bound read-ahead: without a budget Ray Data fills up to its share of the object
        # store (30 % of RAM), so memory would grow with the corpus until that cap.
        ctx.execution_options.resource_limits = ctx.execution_options.resource_limits.copy(
            object_store_memory=enc.object_store_budget_mb * 2**20)
        paths = [str((corpus_dir / p["file"]).resolve()) for _, p in todo]
        index_of = {path: i for path, (i, _) in zip(paths, todo)}
        rows_of = {path: p["rows"] for path, (_, p) in zip(paths, todo)}
        ds = ray.data.read_parquet(paths, include_paths=True).select_columns(["pid", "title", "text", "path"])
        # A Parquet file is read as one block, so fewer parts than actors would starve
        # all but a few actors (STACK.md §6): then split them; large corpora never need it.
        blocks = enc.blocks_per_part * len(paths) if enc.blocks_per_part else (
            enc.num_actors * 4 if len(paths) < enc.num_actors * 2 else 0)
        if blocks:
            ds = ds.repartition(blocks)
        threads = enc.torch_threads or max(1, int(enc.cpus_per_actor))
        ds = ds.map_batches(
            EncoderActor,
            fn_constructor_kwargs={"model_cfg": asdict(model_cfg), "title_join": manifest["title_join"],
                                   "torch_threads": threads, "fp16": enc.fp16},
            batch_size=enc.batch_size,
            batch_format="numpy",
            num_cpus=enc.cpus_per_actor,
            num_gpus=enc.gpus_per_actor or None,
            compute=ActorPoolStrategy(size=enc.num_actors),
        )
        _collect(ds, out_dir, index_of, rows_of, dtype, todo_rows, enc.show_progress)
    complete = completed_shards(out_dir)
    missing = [i for i in range(len(manifest["parts"])) if i not in complete]
    if missing:
        raise PipelineError(f"encode finished with {len(missing)} shard(s) missing: {missing[:10]}")
    write_json_atomic(meta_path, {**meta, "complete": True})
    secs = time.time() - t0
    summary = {"rows": total_rows, "encoded": todo_rows, "reused_shards": len(done), "shards": len(manifest["parts"]),
               "seconds": round(secs, 2), "rows_per_s": round(todo_rows / secs, 1) if todo_rows and secs else None,
               "dim": dim, "dtype": dtype, "out": str(out_dir)}
    rate = f", {summary['rows_per_s']:,.0f} rows/s" if summary["rows_per_s"] else ""
    print(f"[encode] done: {total_rows:,} passages in {len(manifest['parts'])} shards "
          f"({todo_rows:,} encoded now, {len(done)} shards already complete) in {secs:.1f}s{rate}; "
          f"dim {dim} {dtype} -> {out_dir}", flush=True)
    return summary


def _collect(ds, out_dir: Path, index_of: dict, rows_of: dict, dtype: str, todo_rows: int, show_progress: bool):
    """Drain the dataset, writing each shard the moment its last row arrives."""
    from tqdm import tqdm

    buffers: dict[str, tuple[list, list]] = {}
    bar = tqdm(total=todo_rows, unit="psg", desc="encode", disable=not show_progress, smoothing=0.1,
               mininterval=2.0)
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        paths = batch["path"]
        emb = batch["embedding"]
        pids = batch["pid"]
        start = 0
        while start < len(paths):  # batches are path-contiguous (order preserved); split at path changes
            path = paths[start]
            end = start + 1
            while end < len(paths) and paths[end] == path:
                end += 1
            ids, vecs = buffers.setdefault(path, ([], []))
            ids.extend(str(p) for p in pids[start:end])
            vecs.append(np.asarray(emb[start:end], dtype=dtype))
            if len(ids) == rows_of[path]:
                write_shard(out_dir, index_of[path], ids, np.concatenate(vecs), Path(path).name)
                del buffers[path]
            elif len(ids) > rows_of[path]:
                raise PipelineError(f"{shard_name(index_of[path])}: more rows than its part holds")
            start = end
        bar.update(len(paths))
    bar.close()
    if buffers:
        raise PipelineError(f"rows missing for {len(buffers)} part(s): {sorted(buffers)[:3]}")
