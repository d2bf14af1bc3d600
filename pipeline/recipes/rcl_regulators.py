"""RCL's stage 2 (docs/METHODS.md §3): the regulator tables, one per frozen entropy model.

    regulators/sentences/{query,doc}/   the training sentences written as two small corpora keyed by
                                        sentence id (`write_sentence_corpus`; one corpus when a
                                        model's two sides are alike)
    regulators/<digest>/{query,doc}/    each entropy model's vectors of them, encoded by the spine's
                                        Ray Data encoder actors (`encode_corpus`: length-sorted
                                        batches, `rcl.encode.precision`, resumable shards)
    regulators/<digest>/meta.json       written last: the table is complete (reused on re-run)

Config keys: `rcl.encode.*` (the encoder's shape and precision), `ray.*`, the model's own
`model.*`. Called by recipes/rcl.run_rcl between stage 1 and stage 3.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import PipelineError
from ..io_utils import atomic_path, save_npy, sha256_files, write_json_atomic


def model_digest(path: str | Path) -> str:
    files = sorted(p for p in Path(path).rglob("*") if p.is_file())
    return sha256_files(files)[:16]


def regulator_texts(examples_dir: Path) -> tuple[list[str], list[str]]:
    """Every training query and every document text (positives and hard negatives), deduplicated."""
    from ..data.examples_store import iter_example_tables

    queries: dict[str, None] = {}
    docs: dict[str, None] = {}
    for t in iter_example_tables(Path(examples_dir), batch_size=65_536):
        queries.update(dict.fromkeys(t["query"].to_pylist()))
        docs.update(dict.fromkeys(t["positive"].to_pylist()))
        if "negatives" in t.column_names:
            for negs in t["negatives"].to_pylist():
                docs.update(dict.fromkeys(negs or []))
    return list(queries), list(docs)


def write_regulator_table(model_cfg, queries: list[str], docs: list[str], out: Path, batch_size: int = 64,
                          digest: str | None = None, threads: int = 1) -> dict:
    """Encode every text with one frozen model; keys are `text_key(text, side)` (train/methods/rcl.py)."""
    import torch

    from ..models import BiEncoder
    from ..train.methods.base import freeze
    from ..train.methods.rcl import text_key

    torch.set_num_threads(max(1, threads))
    model = freeze(BiEncoder.load(model_cfg))
    with torch.no_grad():
        qv = model.embed(queries, "query", batch_size=batch_size) if queries else np.zeros((0, model.dim), np.float32)
        dv = model.embed(docs, "doc", batch_size=batch_size) if docs else np.zeros((0, model.dim), np.float32)
    keys = [text_key(t, "query") for t in queries] + [text_key(t, "doc") for t in docs]
    meta = {"model": str(model_cfg.name_or_path), "digest": digest, "rows": len(keys), "dim": int(model.dim),
            "queries": len(queries), "docs": len(docs)}
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "keys.txt").write_text("\n".join(keys) + "\n")
        save_npy(tmp / "vectors.npy", np.concatenate([qv, dv]).astype(np.float32))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))  # last: marks the table complete
    return meta


def write_sentence_corpus(texts: list[str], side: str, out: Path, source: str,
                          docs: list[str] | None = None) -> dict:
    """The training sentences of one side as a corpus `pipeline encode` reads (a Parquet part and
    a manifest, data/manifest.py): pid = `text_key(text, side)`, no title. Rewritten only when
    its sentences changed (the fingerprint covers their keys). `side="both"`: `texts` are the
    queries and `docs` the documents, in one corpus (for a model whose two sides are the same)."""
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..data.ingest import CORPUS_SCHEMA
    from ..data.manifest import MANIFEST_NAME, fingerprint
    from ..train.methods.rcl import text_key

    counts = {side: len(texts)}
    if side == "both":
        counts = {"query": len(texts), "doc": len(docs or [])}
        keys = [text_key(t, "query") for t in texts] + [text_key(t, "doc") for t in docs or []]
        texts = list(texts) + list(docs or [])
    else:
        keys = [text_key(t, side) for t in texts]
    manifest = {"variant": "custom", "format": "rcl-sentences", "side": side, "counts": counts, "title_join": "none",
                "sources": [{"path": source, "sha256": hashlib.sha256("\n".join(keys).encode()).hexdigest()}],
                "rows": len(keys), "parts": [{"file": "corpus/part-00000.parquet", "rows": len(keys)}]}
    manifest["fingerprint"] = fingerprint(manifest)
    old = out / MANIFEST_NAME
    if old.exists() and json.loads(old.read_text()).get("fingerprint") == manifest["fingerprint"]:
        return manifest
    with atomic_path(out) as tmp:
        (tmp / "corpus").mkdir(parents=True)
        pq.write_table(pa.table({"pid": keys, "title": [""] * len(keys), "text": list(texts)}, schema=CORPUS_SCHEMA),
                       tmp / "corpus" / "part-00000.parquet", row_group_size=max(1, min(len(keys), 16_384)))
        write_json_atomic(tmp / MANIFEST_NAME, manifest)
    return manifest


def side_model_cfg(model_cfg, side: str):
    """The model config under which the spine's encoder (it encodes the document side) gives the
    `side` vectors of `model_cfg`: for queries, the query prefix and length put on the document
    side. None when that cannot be said so (separate towers or heads, or a model whose document
    prompt would replace an empty query prefix): such a model is encoded by `write_regulator_table`."""
    from ..models import BiEncoder

    if side in ("doc", "both"):
        return model_cfg
    probe = BiEncoder.load(model_cfg)
    c = probe.cfg
    if not probe.shared or probe.query_head is not probe.doc_head or (not c.query_prefix and c.doc_prefix):
        return None
    return replace(model_cfg, query_name_or_path=None, pooling=c.pooling, normalize=c.normalize,
                   doc_prefix=c.query_prefix, doc_max_length=c.query_max_length)


def sides_identical(model_cfg) -> bool:
    """True when the model embeds a text the same as query and as document (one tower and head,
    the same prefix and length): stage 2 then encodes both sides in one pass."""
    from ..models import BiEncoder

    probe = BiEncoder.load(model_cfg)
    c = probe.cfg
    return (probe.shared and probe.query_head is probe.doc_head and c.query_prefix == c.doc_prefix
            and c.query_max_length == c.doc_max_length)


def _shard_files(emb_dir: Path, rel: str) -> list[dict]:
    """The complete embedding set's shards (vectors file, ids file, rows), in corpus order."""
    from ..index.shards import iter_shards, load_meta

    names = load_meta(emb_dir)["shard_names"]
    out = []
    for name, (pids, _vectors) in zip(names, iter_shards(emb_dir)):
        out.append({"vectors": f"{rel}/{name}.npy", "keys": f"{rel}/{name}.pids.txt", "rows": len(pids)})
    return out


def encode_regulator_table(model_cfg, corpora: dict[str, Path], out: Path, encode_cfg, ray_cfg,
                           digest: str | None = None, progress: bool = True, label: str | None = None) -> dict:
    """One frozen entropy model's table with the spine's Ray Data encoder actors
    (`index/encode.encode_corpus`: sorted batches, precision, resumable shards): `out/query/` and
    `out/doc/` (or `out/both/`, when `corpora` has a "both" corpus) are its embedding sets of the
    sentence corpora; `meta.json`, written last, lists their shards (train/methods/rcl.RegulatorTable
    reads it). A killed encoding resumes shard by shard; a complete table is reused."""
    import shutil

    from ..config import PipelineConfig
    from ..index.encode import encode_corpus
    from ..index.shards import META_NAME

    if (out / "meta.json").exists():
        return json.loads((out / "meta.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    files, rows, dim = [], {"query": 0, "doc": 0}, None
    for side in (("both",) if "both" in corpora else ("query", "doc")):
        mcfg = side_model_cfg(model_cfg, side)
        if mcfg is None:
            raise PipelineError(f"{model_cfg.name_or_path}: the {side} side cannot be encoded by the spine's encoder")
        emb = out / side
        manifest = json.loads((corpora[side] / "manifest.json").read_text())
        corpus_fp = manifest["fingerprint"]
        if (emb / META_NAME).exists() and json.loads((emb / META_NAME).read_text()).get("corpus_fingerprint") != corpus_fp:
            shutil.rmtree(emb)  # vectors of other sentences (the examples changed): ours to redo
        if progress:
            what = "query and document sentences (one pass: its two sides are alike)" if side == "both" else f"{side} sentences"
            print(f"[rcl] stage 2: {label or model_cfg.name_or_path} encodes the {what} "
                  f"-> {emb}", flush=True)
        summary = encode_corpus(corpora[side], emb, PipelineConfig(model=mcfg, ray=ray_cfg, encode=encode_cfg))
        files += _shard_files(emb, side)
        dim = summary["dim"]
        for k, n in manifest.get("counts", {side: summary["rows"]}).items():
            rows[k] += n
    meta = {"layout": "shards", "model": str(model_cfg.name_or_path), "digest": digest, "rows": rows["query"] + rows["doc"],
            "queries": rows["query"], "docs": rows["doc"], "dim": dim, "precision": encode_cfg.precision,
            "files": files}
    write_json_atomic(out / "meta.json", meta)  # last: marks the table complete
    return meta


def build_regulators(models: dict[str, Path], job, examples_dir: Path, out_dir: Path, progress: bool = True) -> list[str]:
    """Stage 2: every frozen entropy model encodes every training query and document with the
    spine's Ray Data encoder actors (one model after the other, each using the cluster); the
    vectors are stored beside the training data under `regulators/<model digest>/`, keyed by
    sentence id (`text_key`). A model whose query side the spine's encoder cannot express
    (separate towers or heads) is encoded by a Ray task instead (`write_regulator_table`)."""
    import ray

    s = job.section("rcl")
    queries, docs = regulator_texts(examples_dir)
    corpora = {side: out_dir / "sentences" / side for side in ("query", "doc")}
    both = {"both": out_dir / "sentences" / "both"}
    written: set[str] = set()

    def corpora_for(mcfg) -> dict[str, Path]:
        """One corpus of both sides when the model embeds them alike (one encoding pass), else two."""
        chosen = both if sides_identical(mcfg) else corpora
        for side, folder in chosen.items():
            if side not in written:
                write_sentence_corpus(queries if side != "doc" else docs, side, folder, str(examples_dir),
                                      docs=docs if side == "both" else None)
                written.add(side)
        return chosen

    encode_cfg = replace(s.encode, show_progress=s.encode.show_progress and progress)
    tables, fallback = [], []
    for name, path in models.items():
        digest = model_digest(path)
        dest = out_dir / digest
        tables.append(str(dest))
        if (dest / "meta.json").exists():
            continue
        mcfg = replace(job.model, name_or_path=str(path), query_name_or_path=None)
        if side_model_cfg(mcfg, "query") is None:
            fallback.append((name, mcfg, dest, digest))
            continue
        encode_regulator_table(mcfg, corpora_for(mcfg), dest, encode_cfg, job.ray, digest=digest, progress=progress,
                               label=name)
    if fallback:
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        per_task = max(0.25, min(1.0, cpus / len(fallback)))
        task = ray.remote(num_cpus=per_task)(write_regulator_table)
        if progress:
            print(f"[rcl] stage 2: {len(fallback)} model(s) with separate query/document towers or heads encode "
                  "in Ray tasks (the spine's encoder runs the document side only)", flush=True)
        ray.get([task.remote(mcfg, queries, docs, dest, encode_cfg.batch_size, digest, max(1, int(per_task)))
                 for _name, mcfg, dest, digest in fallback])
    return tables


# --------------------------------------------------------------------------- the pipeline
