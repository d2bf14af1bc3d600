"""`pipeline encode`, `index`, `retrieve` and `bm25`: the spine from a corpus to a TREC run."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from .common import add_common_flags, add_config_args, batch_override, device_flag, fp16_refused, load_cfg

def cmd_encode(args) -> None:
    extra = [f"model.name_or_path={args.model}"] if args.model else []
    extra += batch_override(args, "encode.batch_size")
    device = device_flag(args, "encoding", cluster_ok=True)
    if device == "cpu":
        extra.append("encode.gpus_per_actor=0")
    cfg = load_cfg(args, extra)
    if device == "cuda" and cfg.encode.gpus_per_actor == 0:
        cfg = load_cfg(args, extra + ["encode.gpus_per_actor=1"])
    if args.fp16:
        if cfg.encode.gpus_per_actor == 0:
            raise fp16_refused("the encoder actors have no GPU", "--device cuda or encode.gpus_per_actor=1 gives them "
                               "one; on CPU, encode.precision=bf16 or auto; float16 storage is encode.fp16=true")
        cfg = load_cfg(args, extra + [f"encode.gpus_per_actor={cfg.encode.gpus_per_actor}", "encode.precision=fp16"])
    from ..index.encode import encode_corpus  # after the config: a config error never loads torch

    encode_corpus(args.corpus, args.out, cfg)


def cmd_index(args) -> None:
    if args.merge:  # a several-part index into one part
        if args.embeddings or args.factory or args.pyserini:
            raise ConfigError("--merge takes an index of several parts and --out; --embeddings, --factory and "
                              "--pyserini are for building one")
        from ..index.sharded import merge_index

        merge_index(args.merge, args.out)
        return
    if not args.embeddings:
        raise ConfigError("pipeline index needs --embeddings (or --merge INDEX, to merge an index of several parts)")
    extra = [f"index.factory={args.factory}"] if args.factory else []
    if args.device:  # FAISS's own GPU check (index.use_gpu=yes without a FAISS GPU is an error naming the fix)
        extra.append("index.use_gpu=" + {"cpu": "no", "cuda": "yes", "auto": "auto"}[args.device])
    if args.pyserini and "://" in str(args.out):
        raise ConfigError(f"--pyserini writes pyserini's layout into a local folder; --out {args.out} is a storage URI "
                          "(build the index there without --pyserini, or to a local folder with it)")
    cfg = load_cfg(args, extra).index
    if args.pyserini and (cfg.shards > 1 or cfg.shard_max_gb):
        raise ConfigError("--pyserini writes pyserini's one-index layout; an index of several parts has none: build it, "
                          "then `pipeline index --merge` it into one and export that")
    from ..index.faiss_index import build_index  # after the config: a config error never loads FAISS or torch

    build_index(args.embeddings, args.out, cfg, overwrite=args.overwrite)
    if args.pyserini:
        from ..search import export_pyserini

        export_pyserini(args.out)
        print(f"[index] pyserini layout (index, docid) written beside index.faiss in {args.out}")


def cmd_retrieve(args) -> None:
    extra = [f"retrieve.top_k={args.top_k}"] if args.top_k is not None else []
    extra += batch_override(args, "retrieve.batch_size")
    device = device_flag(args, "query encoding")
    cfg = load_cfg(args, extra)
    from ..index.retrieve import retrieve  # after the config: a config error never loads torch

    model_cfg = None
    if args.model:
        from dataclasses import replace

        model_cfg = replace(cfg.model, name_or_path=args.model)
    from ..data.irds import queries_file, resolve

    queries = resolve(args.queries)  # an existing path wins over an ir_datasets identifier
    irds_id = getattr(queries, "id", None)
    model = _query_model_on(device, args.index, model_cfg) if device == "cuda" else None
    meta = retrieve(args.index, queries_file(irds_id) if irds_id else args.queries, args.out, cfg,
                    queries_format="tsv" if irds_id else args.queries_format, model_cfg=model_cfg,
                    overwrite=args.overwrite, model=model, only_judged=args.qrels, queries_label=irds_id)
    if irds_id and meta.get("queries_ir_datasets") != irds_id:  # named as read, not by the temporary file
        from ..io_utils import write_json_atomic

        write_json_atomic(str(args.out) + ".meta.json", {**meta, "queries_ir_datasets": irds_id})


def cmd_bm25(args) -> None:
    from ..index.bm25 import B, K1, bm25_run

    bm25_run(args.corpus, args.queries or str(Path(args.corpus) / "queries.tsv"), args.out, top_k=args.top_k,
             qrels=args.qrels, k1=K1 if args.k1 is None else args.k1, b=B if args.b is None else args.b,
             overwrite=args.overwrite)


class _OnDevice:
    """A BiEncoder whose `embed` runs on `device` (retrieve calls embed without one, i.e. on CPU)."""

    def __init__(self, model, device: str):
        self._model, self._device = model.to(device).eval(), device

    def embed(self, texts, side, **kw):
        return self._model.embed(texts, side, **{**kw, "device": self._device})

    def __getattr__(self, name):
        return getattr(self._model, name)


def _query_model_on(device: str, index_dir, model_cfg):
    """The query model retrieve would load (the index's, unless --model), placed on `device`."""
    from ..index.retrieve import query_model_config
    from ..models import BiEncoder

    try:
        meta = json.loads((Path(index_dir) / "index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # retrieve reports the unreadable index itself
    return _OnDevice(BiEncoder.load(query_model_config(meta, model_cfg)), device)


def add_parsers(sub) -> None:
    """The encode, index, retrieve verbs."""
    p = sub.add_parser("encode", help="Parquet corpus -> embedding shards (Ray Data, resumable)")
    p.add_argument("--corpus", required=True, help="an ingested corpus folder (pipeline ingest)")
    p.add_argument("--out", required=True, help="embeddings folder (local path, shared filesystem or s3://, gs:// "
                                                "URI); a killed run re-run with the same --out redoes only missing shards")
    p.add_argument("--model", help="model dir or 'minilm' (= model.name_or_path)")
    add_common_flags(p, batch="texts per forward pass (= encode.batch_size)",
                     fp16="compute precision: fp16 autocast on the encoder actors' GPUs (= encode.precision=fp16); "
                          "needs GPU actors, refused on CPU. Not storage: the vectors are still written float32 "
                          "(storage precision is encode.fp16=true, float16 files)",
                     device="where the encoder actors run (= encode.gpus_per_actor: cpu 0, cuda 1)")
    add_config_args(p)
    p.set_defaults(func=cmd_encode)

    p = sub.add_parser("index", help="embedding shards -> FAISS index (of one part, or several: index.shards)")
    p.add_argument("--embeddings", help="an embeddings folder or URI (pipeline encode --out)")
    p.add_argument("--merge", metavar="INDEX", help="merge an index of several parts into one at --out (where this "
                                                    "machine has the memory for the whole)")
    p.add_argument("--out", required=True, help="index folder or URI to write")
    p.add_argument("--factory", help="FAISS factory string (= index.factory), default Flat")
    p.add_argument("--overwrite", action="store_true", help="replace an index this tool wrote at --out")
    p.add_argument("--pyserini", action="store_true",
                   help="also write pyserini's FaissSearcher layout (index + docid) into --out")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"),
                   help="build the FAISS index on CPU or GPU (= index.use_gpu no|yes|auto; yes needs faiss-gpu)")
    add_config_args(p)
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("retrieve", help="queries -> TREC run (pyserini's --topics/--output/--hits accepted)")
    p.add_argument("--index", required=True, help="an index folder or URI (pipeline index --out)")
    p.add_argument("--queries", "--topics", dest="queries", required=True,
                   help="queries file, or an ir_datasets identifier (e.g. msmarco-passage/dev/small; local files "
                        "only); --topics is pyserini's name for it")
    p.add_argument("--queries-format", default="auto", choices=("auto", "tsv", "beir", "dpr-qa"),
                   help="qid<TAB>text TSV, BEIR queries.jsonl, or DPR's question<TAB>[answers] (auto: .jsonl is "
                        "BEIR, anything else TSV)")
    p.add_argument("--qrels", help="search only the queries this qrels file judges (e.g. the test split's, when the "
                                   "queries file holds every split's queries)")
    p.add_argument("--out", "--output", dest="out", required=True,
                   help="TREC run file to write (--output: pyserini's name)")
    p.add_argument("--top-k", "--hits", dest="top_k", type=int,
                   help="passages per query in the run (= retrieve.top_k; default 100, where pyserini's --hits "
                        "defaults to 1000: give --hits 1000 for its depth, e.g. for R@1000)")
    p.add_argument("--model", help="query model (default: the model that encoded the corpus)")
    p.add_argument("--overwrite", action="store_true", help="replace a run this tool wrote at --out")
    add_common_flags(p, batch="queries per batch (= retrieve.batch_size)",
                     device="where the query model runs (queries are computed in fp32 whatever precision the "
                            "documents were encoded or stored in: models/precision.query_precision)")
    add_config_args(p)
    p.set_defaults(func=cmd_retrieve)

    p = sub.add_parser("bm25", help="an ingested corpus + queries -> a BM25 TREC run (bm25s; hard negatives, a "
                                    "lexical baseline)")
    p.add_argument("--corpus", required=True, help="an ingested corpus folder (pipeline ingest)")
    p.add_argument("--queries", help="queries file (default: <corpus>/queries.tsv)")
    p.add_argument("--qrels", help="search only the queries this qrels file judges (e.g. <corpus>/qrels/train.trec "
                                   "for training negatives)")
    p.add_argument("--out", required=True, help="TREC run file to write (+ <run>.meta.json)")
    p.add_argument("--top-k", type=int, default=100, help="passages per query (default 100)")
    p.add_argument("--k1", type=float, help="BM25 k1 (default 0.9, Anserini's)")
    p.add_argument("--b", type=float, help="BM25 b (default 0.4, Anserini's)")
    p.add_argument("--overwrite", action="store_true", help="replace a run this tool wrote at --out")
    p.set_defaults(func=cmd_bm25)
