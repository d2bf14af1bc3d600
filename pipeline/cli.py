"""`pipeline` console script: verbs over the library (ingest, encode, index, retrieve, evaluate, train, demo).

Every verb takes `--config FILE` and trailing `section.key=value` overrides,
e.g. `pipeline encode --corpus runs/c --out runs/e encode.num_actors=2 encode.cpus_per_actor=0.5`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import PipelineError


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (see jobs/configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. encode.batch_size=128")


def _cfg(args, extra: list[str] | None = None):
    from .config import load_config

    return load_config(args.config, list(extra or []) + list(args.overrides))


def cmd_ingest(args) -> None:
    from .data.ingest import ingest

    qrels = {}
    for spec in args.qrels or []:
        split, _, path = spec.rpartition("=")
        qrels[split or Path(path).stem] = path
    hf_fields = None
    if args.format == "hf":
        hf_fields = {"id_field": args.id_field, "title_field": args.title_field or None, "text_field": args.text_field}
    ingest(args.inputs, args.format, args.out, variant=args.variant, title_join=args.title_join,
           part_rows=args.part_rows, on_empty=args.on_empty, queries=args.queries, qrels=qrels,
           on_unknown_qrels=args.on_unknown_qrels, overwrite=args.overwrite, hf_fields=hf_fields)


def cmd_encode(args) -> None:
    from .index.encode import encode_corpus

    extra = [f"model.name_or_path={args.model}"] if args.model else []
    encode_corpus(args.corpus, args.out, _cfg(args, extra))


def cmd_index(args) -> None:
    from .index.faiss_index import build_index

    extra = [f"index.factory={args.factory}"] if args.factory else []
    build_index(args.embeddings, args.out, _cfg(args, extra).index)


def cmd_retrieve(args) -> None:
    from .index.retrieve import retrieve

    extra = [f"retrieve.top_k={args.top_k}"] if args.top_k else []
    cfg = _cfg(args, extra)
    model_cfg = None
    if args.model:
        from dataclasses import replace

        model_cfg = replace(cfg.model, name_or_path=args.model)
    retrieve(args.index, args.queries, args.out, cfg, queries_format=args.queries_format, model_cfg=model_cfg)


def cmd_evaluate(args) -> None:
    from .eval.metrics import evaluate_files, read_run
    from .eval.qa import qa_accuracy
    from .eval.report import format_table
    from .io_utils import write_json_atomic

    extra = ["eval.per_query=true"] if args.per_query else []
    cfg = _cfg(args, extra).eval
    if bool(args.qrels) == bool(args.qa):
        raise PipelineError("evaluate needs exactly one of --qrels (TREC/BEIR qrels) or --qa (DPR QA file, with --corpus)")
    if args.qrels:
        result = evaluate_files(args.run, args.qrels, cfg)
    else:
        if not args.corpus:
            raise PipelineError("--qa needs --corpus (the ingested corpus the run retrieved from)")
        result = qa_accuracy(read_run(args.run), args.qa, args.corpus, cfg.qa_ks)
    meta_path = Path(str(args.run) + ".meta.json")
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        result["corpus"] = {"fingerprint": meta.get("corpus_fingerprint"), "variant": meta.get("variant"),
                            "title_join": meta.get("title_join")}
    print(format_table({Path(args.run).name: result["metrics"]}))
    deep = [k for k in cfg.recall_ks if k > result.get("run_depth", k)]
    if deep:
        print(f"WARNING: the run holds at most {result['run_depth']} documents per query; "
              f"R@{', R@'.join(map(str, deep))} are cut at that depth (retrieve with --top-k {max(deep)})")
    q = result["queries"]
    print("queries: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in q.items()))
    if args.per_query and "per_query" in result:
        for qid, vals in sorted(result["per_query"].items()):
            print(qid + "\t" + "\t".join(f"{k}={v:.4f}" for k, v in vals.items()))
    if args.json:
        write_json_atomic(args.json, result)
        print(f"[evaluate] wrote {args.json}")


def cmd_train(args) -> None:
    from .train.config import load_train_config
    from .train.trainer import train

    job = load_train_config(args.config, list(args.overrides))
    train(job, validate_fn=make_validator(job))


def make_validator(job):
    """The validation function handed to the trainer (None without a validation corpus)."""
    if not job.validation.corpus:
        return None
    from .index.validate import Validator

    v = job.validation
    return Validator(v.corpus, v.queries, v.qrels, v.metric, v.top_k, v.batch_size, job.eval)


def cmd_demo(args) -> None:
    from .demo import run_demo

    run_demo(Path(args.out), _cfg(args), fresh=args.fresh, train=not args.no_train)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .data.readers import CORPUS_FORMATS

    parser = argparse.ArgumentParser(prog="pipeline", description="Dense retrieval on Ray: ingest, encode, index, retrieve, evaluate.")
    parser.add_argument("--version", action="version", version=f"pipeline {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("ingest", help="raw corpus files -> Parquet parts + manifest")
    p.add_argument("inputs", nargs="+", help="corpus file(s); for --format beir, the BEIR folder")
    p.add_argument("--format", required=True, choices=CORPUS_FORMATS)
    p.add_argument("--out", required=True)
    p.add_argument("--variant", help="wiki-dpr | msmarco-official | msmarco-titled | beir-<name> | custom")
    p.add_argument("--title-join", help="'none' | '{title} [SEP] {text}' | '{title} {text}'")
    p.add_argument("--part-rows", type=int, default=100_000, help="passages per Parquet part (= encode shard)")
    p.add_argument("--on-empty", choices=("skip", "error"), default="skip")
    p.add_argument("--queries", help="queries TSV (qid\\ttext) or jsonl to copy beside the corpus")
    p.add_argument("--qrels", action="append", metavar="[SPLIT=]PATH", help="qrels to check against the corpus")
    p.add_argument("--on-unknown-qrels", choices=("skip", "error"), default="error")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--id-field", default="id", help="hf format: id column")
    p.add_argument("--title-field", default="title", help="hf format: title column ('' for none)")
    p.add_argument("--text-field", default="text", help="hf format: text column")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("encode", help="Parquet corpus -> embedding shards (Ray Data, resumable)")
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", help="model dir or 'minilm' (= model.name_or_path)")
    _add_config_args(p)
    p.set_defaults(func=cmd_encode)

    p = sub.add_parser("index", help="embedding shards -> FAISS index")
    p.add_argument("--embeddings", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--factory", help="FAISS factory string (= index.factory), default Flat")
    _add_config_args(p)
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("retrieve", help="queries -> TREC run")
    p.add_argument("--index", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--queries-format", default="auto", choices=("auto", "tsv", "beir", "dpr-qa"))
    p.add_argument("--out", required=True, help="TREC run file to write")
    p.add_argument("--top-k", type=int)
    p.add_argument("--model", help="query model (default: the model that encoded the corpus)")
    _add_config_args(p)
    p.set_defaults(func=cmd_retrieve)

    p = sub.add_parser("evaluate", help="TREC run + qrels (or DPR QA answers) -> metrics")
    p.add_argument("--run", required=True)
    p.add_argument("--qrels")
    p.add_argument("--qa", help="DPR QA file (question\\t[answers]) for top-k accuracy")
    p.add_argument("--corpus", help="ingested corpus folder (for --qa)")
    p.add_argument("--per-query", action="store_true")
    p.add_argument("--json", help="write the metrics as JSON here")
    _add_config_args(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("train", help="train a bi-encoder with Ray Train (DPR, DAR)")
    _add_config_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("demo", help="the whole flow on the bundled Python FAQ corpus")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--fresh", action="store_true", help="recompute every step")
    p.add_argument("--no-train", action="store_true", help="zero-shot only (skip the DPR/DAR fine-tuning)")
    _add_config_args(p)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .runtime_env import setup_offline_env

    setup_offline_env()
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
