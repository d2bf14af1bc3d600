"""`pipeline` console script: verbs over the library (ingest, encode, index, retrieve, evaluate, compare, train,
tune, info, config show, demo). `pipeline <verb> --help` lists the config keys the verb reads (pipeline/confdoc.py).

Every verb takes `--config FILE` and trailing `section.key=value` overrides,
e.g. `pipeline encode --corpus runs/c --out runs/e encode.num_actors=2 encode.cpus_per_actor=0.5`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .errors import ConfigError, PipelineError


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (see jobs/configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. encode.batch_size=128")


def _cfg(args, extra: list[str] | None = None):
    from .config import load_config

    return load_config(args.config, list(extra or []) + list(args.overrides))


# --------------------------------------------------------------------------- common flags
# --batch-size, --fp16 and --device are shorthands for config keys (trailing key=value overrides still win):
#   encode   --batch-size -> encode.batch_size   --fp16 -> encode.precision=fp16   --device -> encode.gpus_per_actor
#   retrieve --batch-size -> retrieve.batch_size                                    --device -> the query model's device
#   train    --batch-size -> train.batch_size    --fp16 -> train.amp=fp16          --device -> train.use_gpu
#   index                                                                           --device -> index.use_gpu
#   sts      --batch-size                                                           --device -> the model's device
# --fp16 means fp16 *compute* (autocast) and needs a GPU; it is refused on CPU. Stored float16 vectors are
# encode.fp16=true, a separate choice.

_DEVICE_HELP = "cpu, cuda or auto (a GPU when one is visible here); cuda without a GPU is an error"


def _add_common_flags(p: argparse.ArgumentParser, batch: str | None = None, fp16: str | None = None,
                      device: str | None = None) -> None:
    if batch:
        p.add_argument("--batch-size", type=int, help=batch)
    if fp16:
        p.add_argument("--fp16", action="store_true", help=fp16)
    if device:
        p.add_argument("--device", choices=("cpu", "cuda", "auto"), help=f"{device}: {_DEVICE_HELP}")


def _remote_cluster(args) -> bool:
    """True when the work runs on a Ray cluster we connect to (its GPUs are checked by Ray's resources)."""
    import os

    if os.environ.get("RAY_ADDRESS", "local") != "local":
        return True
    return any(o.startswith("ray.address=") and o.split("=", 1)[1] not in ("", "null", "local")
               for o in args.overrides)


def _gpu_here() -> bool:
    import torch

    return torch.cuda.is_available()


def _resolve_device(args, what: str, cluster_ok: bool = False) -> str | None:
    """'cpu' | 'cuda' | None (not given). cuda without a visible GPU is a PipelineError (unless the work runs
    on a cluster we connect to, whose GPUs Ray's resource check verifies)."""
    device = getattr(args, "device", None)
    if device is None:
        return None
    remote = cluster_ok and _remote_cluster(args)
    if device == "auto":
        return "cuda" if _gpu_here() else ("auto" if remote else "cpu")
    if device == "cuda" and not remote and not _gpu_here():
        raise PipelineError(f"--device cuda: no CUDA GPU is visible here (torch.cuda.is_available() is false), so "
                            f"{what} cannot run on one; use --device cpu (or auto)")
    return device


def _batch_override(args, key: str) -> list[str]:
    b = getattr(args, "batch_size", None)
    if b is None:
        return []
    if b < 1:
        raise PipelineError(f"--batch-size must be a positive integer, got {b}")
    return [f"{key}={b}"]


def _fp16_refused(what: str, alt: str) -> PipelineError:
    return PipelineError(f"--fp16 is fp16 compute, which needs a GPU; {what} runs on CPU here ({alt})")


def cmd_ingest(args) -> None:
    from .data.ingest import ingest

    qrels = {}
    for spec in args.qrels or []:
        split, _, path = spec.rpartition("=")
        if not split:
            from .data.irds import is_identifier, split_name

            split = split_name(path) if is_identifier(path) else Path(path).stem
        if split in qrels:
            raise PipelineError(f"--qrels split {split!r} is given twice ({qrels[split]} and {path})")
        qrels[split] = path
    # --id-field/--title-field/--text-field default to None so that giving them with a
    # format whose columns are fixed is refused (by ingest) instead of silently ignored.
    given = {k: v for k, v in (("id_field", args.id_field), ("title_field", args.title_field),
                               ("text_field", args.text_field)) if v is not None}
    hf_fields = given or None
    if args.format == "hf":
        hf_fields = {"id_field": "id", "title_field": "title", "text_field": "text", **given}
        hf_fields["title_field"] = hf_fields["title_field"] or None
    if args.format is None:  # only an ir_datasets identifier needs no --format
        from .data.irds import is_identifier, resolve

        if len(args.inputs) == 1 and is_identifier(args.inputs[0]):
            args.format = "irds"
        else:
            if len(args.inputs) == 1:
                resolve(args.inputs[0])  # a missing 'a/b' that is no identifier: names close identifiers
            raise PipelineError("ingest needs --format for files (dpr-wiki, msmarco, msmarco-titled, beir, hf); "
                                "only an ir_datasets identifier (e.g. beir/scifact/test) needs none")
    ingest(args.inputs, args.format, args.out, variant=args.variant, title_join=args.title_join,
           part_rows=args.part_rows, on_empty=args.on_empty, queries=args.queries, qrels=qrels,
           on_unknown_qrels=args.on_unknown_qrels, overwrite=args.overwrite, hf_fields=hf_fields)


def cmd_encode(args) -> None:
    from .index.encode import encode_corpus

    extra = [f"model.name_or_path={args.model}"] if args.model else []
    extra += _batch_override(args, "encode.batch_size")
    device = _resolve_device(args, "encoding", cluster_ok=True)
    if device == "cpu":
        extra.append("encode.gpus_per_actor=0")
    cfg = _cfg(args, extra)
    if device == "cuda" and cfg.encode.gpus_per_actor == 0:
        cfg = _cfg(args, extra + ["encode.gpus_per_actor=1"])
    if args.fp16:
        if cfg.encode.gpus_per_actor == 0:
            raise _fp16_refused("the encoder actors have no GPU", "--device cuda or encode.gpus_per_actor=1 gives them "
                                "one; on CPU, encode.precision=bf16 or auto; float16 storage is encode.fp16=true")
        cfg = _cfg(args, extra + [f"encode.gpus_per_actor={cfg.encode.gpus_per_actor}", "encode.precision=fp16"])
    encode_corpus(args.corpus, args.out, cfg)


def cmd_index(args) -> None:
    from .index.faiss_index import build_index

    extra = [f"index.factory={args.factory}"] if args.factory else []
    if args.device:  # FAISS's own GPU check (index.use_gpu=yes without a FAISS GPU is an error naming the fix)
        extra.append("index.use_gpu=" + {"cpu": "no", "cuda": "yes", "auto": "auto"}[args.device])
    if args.pyserini and "://" in str(args.out):
        raise ConfigError(f"--pyserini writes pyserini's layout into a local folder; --out {args.out} is a storage URI "
                          "(build the index there without --pyserini, or to a local folder with it)")
    build_index(args.embeddings, args.out, _cfg(args, extra).index, overwrite=args.overwrite)
    if args.pyserini:
        from .search import export_pyserini

        export_pyserini(args.out)
        print(f"[index] pyserini layout (index, docid) written beside index.faiss in {args.out}")


def cmd_retrieve(args) -> None:
    from .index.retrieve import retrieve

    extra = [f"retrieve.top_k={args.top_k}"] if args.top_k is not None else []
    extra += _batch_override(args, "retrieve.batch_size")
    device = _resolve_device(args, "query encoding")
    cfg = _cfg(args, extra)
    model_cfg = None
    if args.model:
        from dataclasses import replace

        model_cfg = replace(cfg.model, name_or_path=args.model)
    from .data.irds import queries_file, resolve

    queries = resolve(args.queries)  # an existing path wins over an ir_datasets identifier
    irds_id = getattr(queries, "id", None)
    model = _query_model_on(device, args.index, model_cfg) if device == "cuda" else None
    meta = retrieve(args.index, queries_file(irds_id) if irds_id else args.queries, args.out, cfg,
                    queries_format="tsv" if irds_id else args.queries_format, model_cfg=model_cfg,
                    overwrite=args.overwrite, model=model)
    if irds_id:  # the run's meta names the identifier, not the temporary file it was read through
        from .io_utils import write_json_atomic

        write_json_atomic(str(args.out) + ".meta.json", {**meta, "queries": irds_id, "queries_ir_datasets": irds_id})


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
    from .index.retrieve import query_model_config
    from .models import BiEncoder

    try:
        meta = json.loads((Path(index_dir) / "index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # retrieve reports the unreadable index itself
    return _OnDevice(BiEncoder.load(query_model_config(meta, model_cfg)), device)


def cmd_evaluate(args) -> None:
    from .eval.metrics import cutoffs_deeper_than, evaluate_files, read_run
    from .eval.qa import qa_accuracy
    from .eval.report import format_table
    from .io_utils import check_output, write_json_atomic

    extra = ["eval.per_query=true"] if args.per_query else []
    extra += [f"eval.qa_match={args.match}"] if args.match else []
    cfg = _eval_cfg(args, extra)
    if args.json:
        check_output(args.json, "metrics", args.overwrite)  # refused before any work, nothing written
    if bool(args.qrels) == bool(args.qa):
        raise PipelineError("evaluate needs exactly one of --qrels (TREC/BEIR qrels) or --qa (DPR QA file, with --corpus)")
    if args.qa and args.measures:
        raise PipelineError("--measures applies to --qrels; --qa reports DPR top-k accuracy at eval.qa_ks")
    if args.qrels and args.match:
        raise PipelineError("--match applies to --qa (DPR answer matching), not to --qrels")
    if args.qrels:
        result = evaluate_files(args.run, args.qrels, cfg)
    else:
        if not args.corpus:
            raise PipelineError("--qa needs --corpus (the ingested corpus the run retrieved from)")
        from .data.irds import queries_file, resolve

        qa = resolve(args.qa)  # dpr-w100/natural-questions/dev: questions + answers, qids 0..N-1 as DPR's files
        qa_path = queries_file(qa.id, "dpr-qa") if getattr(qa, "id", None) else args.qa
        result = qa_accuracy(read_run(args.run), qa_path, args.corpus, cfg.qa_ks, cfg.qa_match)
        if getattr(qa, "id", None):
            result["qa"] = qa.id
    meta_path = Path(str(args.run) + ".meta.json")
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        result["corpus"] = {"fingerprint": meta.get("corpus_fingerprint"), "variant": meta.get("variant"),
                            "title_join": meta.get("title_join")}
    print(format_table({Path(args.run).name: result["metrics"]}))
    deep = cutoffs_deeper_than(result["metrics"], result["run_depth"]) if "run_depth" in result else []
    if deep:
        need = max(int(d.rsplit("@", 1)[1]) for d in deep)
        print(f"WARNING: the run holds at most {result['run_depth']} documents per query; "
              f"{', '.join(deep)} {'is' if len(deep) == 1 else 'are'} cut at that depth (retrieve with --top-k {need})")
    q = result["queries"]
    print("queries: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in q.items()))
    if args.per_query and "per_query" in result:
        for qid, vals in sorted(result["per_query"].items()):
            print(qid + "\t" + "\t".join(f"{k}={v:.4f}" for k, v in vals.items()))
    if args.json:
        write_json_atomic(args.json, result)
        print(f"[evaluate] wrote {args.json}")


def _eval_cfg(args, extra: list[str] | None = None):
    """The eval section, with --measures (ir-measures strings) over eval.measures."""
    from dataclasses import replace

    cfg = _cfg(args, extra).eval
    if getattr(args, "measures", None):
        cfg = replace(cfg, measures=(args.measures,))  # validated here: a bad measure is a ConfigError
    return cfg


def cmd_compare(args) -> None:
    from .eval.compare import compare_runs, format_comparison
    from .io_utils import check_output, write_json_atomic

    # `key.path=value` overrides among the positional runs (argparse cannot tell them apart)
    is_override = re.compile(r"^[A-Za-z_]\w*(\.\w+)+=")
    args.overrides = list(args.overrides) + [r for r in args.runs if is_override.match(r)]
    args.runs = [r for r in args.runs if not is_override.match(r)]
    if not args.runs:
        raise PipelineError("compare needs at least one run file")
    cfg = _eval_cfg(args)
    if args.json:
        check_output(args.json, "metrics", args.overwrite)  # refused before any work, nothing written
    names = [Path(r).name for r in args.runs]
    labels = names if len(set(names)) == len(names) else [str(r) for r in args.runs]
    if len(set(labels)) != len(labels):
        raise PipelineError("compare: the same run file is given twice")
    result = compare_runs(dict(zip(labels, args.runs)), args.qrels, test=args.test, cfg=cfg,
                          allow_mixed=args.allow_mixed, resamples=args.resamples, seed=args.seed)
    print(format_comparison(result))
    if args.json:
        write_json_atomic(args.json, result)
        print(f"[compare] wrote {args.json}")


def cmd_sts(args) -> None:
    """STS: Spearman and Pearson of cosine vs gold (pipeline/eval/sts.py)."""
    from dataclasses import replace as _replace

    from .eval.sts import evaluate_sts, parse_scale, read_sts
    from .io_utils import check_output, write_json_atomic
    from .models import BiEncoder

    if args.json:
        check_output(args.json, "sts", args.overwrite)  # refused before any work, nothing written
    scale = parse_scale(args.scale)
    cfg = _cfg(args)
    device = _resolve_device(args, "STS encoding") or "cpu"
    read_sts(args.pairs, args.format, scale)  # a broken pairs file is refused before the model loads
    model = BiEncoder.load(_replace(cfg.model, name_or_path=args.model) if args.model else cfg.model)
    if device != "cpu":
        model = model.to(device).eval()
    res = evaluate_sts(args.pairs, model, fmt=args.format, side=args.side, batch_size=args.batch_size, device=device,
                       scale=scale)
    print(f"{Path(args.pairs).name} ({res['format']}, {res['pairs']} pairs): "
          f"Spearman {100 * res['spearman']:.2f}  Pearson {100 * res['pearson']:.2f}")
    if args.json:
        write_json_atomic(args.json, {**res, "model": args.model or cfg.model.name_or_path})


def cmd_train(args) -> None:
    from .train.config import load_train_config
    from .train.trainer import train

    extra = _batch_override(args, "train.batch_size")
    device = _resolve_device(args, "training", cluster_ok=True)
    if device in ("cpu", "cuda"):
        extra.append(f"train.use_gpu={'true' if device == 'cuda' else 'false'}")
    job = load_train_config(args.config, extra + list(args.overrides))
    if args.fp16:
        if not job.train.use_gpu:
            raise _fp16_refused("training", "--device cuda or train.use_gpu=true trains on GPUs; on CPU, train.amp=bf16 "
                                "or auto")
        job = load_train_config(args.config, extra + ["train.amp=fp16"] + list(args.overrides))
    if job.loss.name in ("ance", "ance_dar"):
        from .ance import run_ance

        run_ance(job, validate_fn=make_validator(job))
        return
    if job.loss.name == "rcl":  # RCL's stages (initial, entropy models, regulators, final): pipeline/rcl.py
        from .rcl import run_rcl

        run_rcl(job)
        return
    train(job, validate_fn=make_validator(job))


def cmd_subset(args) -> None:
    from .data.subset import make_subset

    make_subset(args.corpus, args.queries, args.qrels, args.out, args.passages, args.train_queries, seed=args.seed,
                overwrite=args.overwrite)


def cmd_refresh(args) -> None:
    from .ance import refresh_command
    from .train.config import load_train_config

    job = load_train_config(args.config, list(args.overrides))
    refresh_command(args.run_dir, job, once=args.once, idle_exit_s=args.idle_exit)


def make_validator(job):
    """The validation function handed to the trainer (None without a validation corpus)."""
    from .authorship import AUTHORSHIP_METHODS, validator_for

    if job.loss.name in AUTHORSHIP_METHODS:  # R@8 on the authorship split's val (METHODS.md §4)
        return validator_for(job)
    if not job.validation.corpus:
        return None
    from .index.validate import Validator

    v = job.validation
    return Validator(v.corpus, v.queries, v.qrels, v.metric, v.top_k, v.batch_size, job.eval)


def cmd_tune(args) -> None:
    from .tune.runner import run_sweep
    from .tune.space import load_sweep_config

    if not args.config:
        raise PipelineError("tune needs --config SWEEP.yaml (see jobs/configs/tune_dar.yaml)")
    run_sweep(load_sweep_config(args.config, list(args.overrides)), resume=args.resume)


def cmd_config_show(args) -> None:
    """The resolved config as YAML: a pipeline config, a training job config or a Tune sweep file."""
    import yaml

    from .config import dump_config, load_config, merge_overrides, read_yaml, to_dict
    from .confdoc import config_kind

    data = merge_overrides(read_yaml(args.config), list(args.overrides))
    kind = args.kind or config_kind(data)
    if kind == "train":
        from .train.config import dump_job, load_train_config

        text = dump_job(load_train_config(args.config, list(args.overrides)))
    elif kind == "sweep":
        from .train.config import job_to_dict
        from .tune.space import load_job, load_sweep_config

        sweep = load_sweep_config(args.config, list(args.overrides))
        text = yaml.safe_dump({"base": job_to_dict(load_job(sweep.base_data(), "base")),
                               "base_source": sweep.base_source, "overrides": list(sweep.overrides),
                               "space": sweep.raw.get("space"), "search": to_dict(sweep.search),
                               "output": sweep.output}, sort_keys=False)
    else:
        text = dump_config(load_config(args.config, list(args.overrides)))
    print(f"# {kind} config" + (f" from {args.config}" if args.config else " (defaults)")
          + (f" with {' '.join(args.overrides)}" if args.overrides else ""))
    print(text, end="")


def cmd_info(args) -> None:
    from .info import describe, info

    if args.json:
        print(json.dumps(describe(args.path), indent=2))
        return
    print(info(args.path))


def cmd_demo(args) -> None:
    from .demo import run_demo

    run_demo(Path(args.out), _cfg(args), fresh=args.fresh, train=not args.no_train)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .data.readers import CORPUS_FORMATS

    parser = argparse.ArgumentParser(prog="pipeline", description="Dense retrieval on Ray: ingest, encode, index, retrieve, evaluate, train, tune.")
    parser.add_argument("--version", action="version", version=f"pipeline {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("ingest", help="raw corpus files -> Parquet parts + manifest")
    p.add_argument("inputs", nargs="+", help="corpus file(s); for --format beir, the BEIR folder; or an ir_datasets "
                                             "identifier (beir/scifact/test, msmarco-passage/dev/small: its docs, "
                                             "queries and qrels, from files already in IR_DATASETS_HOME)")
    p.add_argument("--format", choices=CORPUS_FORMATS, help="required for files; irds (an ir_datasets identifier) "
                                                            "is implied for an identifier")
    p.add_argument("--out", required=True, help="corpus folder to write (Parquet parts, manifest.json, queries, qrels)")
    p.add_argument("--variant", help="wiki-dpr | msmarco-official | msmarco-titled | beir-<name> | custom")
    p.add_argument("--title-join", help="'none' | '{title} [SEP] {text}' | '{title} {text}'")
    p.add_argument("--part-rows", type=int, default=100_000, help="passages per Parquet part (= encode shard)")
    p.add_argument("--on-empty", choices=("skip", "error"), default="skip",
                   help="a passage with no text: skip it (counted in the summary and manifest) or stop at it")
    p.add_argument("--queries", help="queries TSV (qid\\ttext) or jsonl, or an ir_datasets identifier, to copy beside the corpus")
    p.add_argument("--qrels", action="append", metavar="[SPLIT=]PATH", help="qrels (file or ir_datasets identifier) "
                                                                          "to check against the corpus")
    p.add_argument("--on-unknown-qrels", choices=("skip", "error"), default="error",
                   help="a judged passage id the corpus lacks: stop at it (default) or skip it (counted)")
    p.add_argument("--overwrite", action="store_true", help="replace a corpus this tool wrote at --out")
    p.add_argument("--id-field", help="hf format only: id column (default id)")
    p.add_argument("--title-field", help="hf format only: title column, '' for none (default title)")
    p.add_argument("--text-field", help="hf format only: text column (default text)")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("encode", help="Parquet corpus -> embedding shards (Ray Data, resumable)")
    p.add_argument("--corpus", required=True, help="an ingested corpus folder (pipeline ingest)")
    p.add_argument("--out", required=True, help="embeddings folder (local path, shared filesystem or s3://, gs:// "
                                                "URI); a killed run re-run with the same --out redoes only missing shards")
    p.add_argument("--model", help="model dir or 'minilm' (= model.name_or_path)")
    _add_common_flags(p, batch="texts per forward pass (= encode.batch_size)",
                      fp16="fp16 compute (autocast) on the encoder actors' GPUs (= encode.precision=fp16); needs "
                           "GPU actors, refused on CPU; vectors stay float32 (encode.fp16=true stores float16)",
                      device="where the encoder actors run (= encode.gpus_per_actor: cpu 0, cuda 1)")
    _add_config_args(p)
    p.set_defaults(func=cmd_encode)

    p = sub.add_parser("index", help="embedding shards -> FAISS index")
    p.add_argument("--embeddings", required=True, help="an embeddings folder or URI (pipeline encode --out)")
    p.add_argument("--out", required=True, help="index folder or URI to write")
    p.add_argument("--factory", help="FAISS factory string (= index.factory), default Flat")
    p.add_argument("--overwrite", action="store_true", help="replace an index this tool wrote at --out")
    p.add_argument("--pyserini", action="store_true",
                   help="also write pyserini's FaissSearcher layout (index + docid) into --out")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"),
                   help="build the FAISS index on CPU or GPU (= index.use_gpu no|yes|auto; yes needs faiss-gpu)")
    _add_config_args(p)
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("retrieve", help="queries -> TREC run")
    p.add_argument("--index", required=True, help="an index folder or URI (pipeline index --out)")
    p.add_argument("--queries", required=True, help="queries file, or an ir_datasets identifier "
                                                    "(e.g. msmarco-passage/dev/small; local files only)")
    p.add_argument("--queries-format", default="auto", choices=("auto", "tsv", "beir", "dpr-qa"),
                   help="qid<TAB>text TSV, BEIR queries.jsonl, or DPR's question<TAB>[answers] (auto: .jsonl is "
                        "BEIR, anything else TSV)")
    p.add_argument("--out", required=True, help="TREC run file to write")
    p.add_argument("--top-k", type=int, help="passages per query in the run (= retrieve.top_k, default 100)")
    p.add_argument("--model", help="query model (default: the model that encoded the corpus)")
    p.add_argument("--overwrite", action="store_true", help="replace a run this tool wrote at --out")
    _add_common_flags(p, batch="queries per batch (= retrieve.batch_size)",
                      device="where the query model runs (queries are encoded in the documents' precision, as "
                             "recorded in the index)")
    _add_config_args(p)
    p.set_defaults(func=cmd_retrieve)

    p = sub.add_parser("evaluate", help="TREC run + qrels (or DPR QA answers) -> metrics")
    p.add_argument("--run", required=True, help="a TREC run file")
    p.add_argument("--qrels", help="TREC/BEIR qrels file, or an ir_datasets identifier (e.g. beir/scifact/test)")
    p.add_argument("--qa", help="DPR QA file (question\\t[answers]) for top-k accuracy, or an ir_datasets identifier "
                                "with answers (dpr-w100/natural-questions/dev)")
    p.add_argument("--corpus", help="ingested corpus folder (for --qa)")
    p.add_argument("--per-query", action="store_true", help="also print (and write to --json) every query's values")
    p.add_argument("--json", help="write the metrics as JSON here")
    p.add_argument("--overwrite", action="store_true", help="replace a metrics JSON this tool wrote at --json")
    p.add_argument("--measures", help="ir-measures measures, e.g. \"AP nDCG@10 RR@10 R@1000 P@10 Judged@10\" "
                                      "(= eval.measures; default RR@10 nDCG@10 AP@100 RR@100 R@k for eval.recall_ks)")
    p.add_argument("--match", choices=("string", "regex"),
                   help="--qa answer matching as DPR: string (token sequence) or regex (CuratedTREC) (= eval.qa_match)")
    _add_config_args(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("sts", help="STS pairs -> Spearman / Pearson of cosine similarity vs the gold score")
    p.add_argument("--pairs", required=True, help="STS-benchmark CSV or TSV, SICK, or s1<TAB>s2<TAB>score")
    p.add_argument("--model", help="model directory or minilm (default model.name_or_path)")
    p.add_argument("--format", choices=("auto", "stsb-csv", "stsb-tsv", "sick", "tsv"), default="auto",
                   help="the --pairs layout (auto: from its first line)")
    p.add_argument("--scale", default="0:5", metavar="LO:HI",
                   help="the gold scores' scale; a score outside it is an error naming its line (default 0:5, "
                        "STS-benchmark; SICK's 1-5 fits)")
    p.add_argument("--side", choices=("doc", "query"), default="doc", help="encode sentences as documents (default, "
                                                                           "no query prompt) or as queries")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per forward pass")
    _add_common_flags(p, device="where the model runs")
    p.add_argument("--json", help="write spearman, pearson, pairs as JSON here")
    p.add_argument("--overwrite", action="store_true", help="replace an STS JSON this tool wrote at --json")
    _add_config_args(p)
    p.set_defaults(func=cmd_sts)

    p = sub.add_parser("compare", help="several TREC runs + qrels -> one table, paired significance tests vs the first")
    p.add_argument("runs", nargs="+", metavar="RUN", help="TREC run files; the first is the baseline")
    p.add_argument("--qrels", required=True, help="qrels file or ir_datasets identifier")
    p.add_argument("--measures", help="ir-measures measures (= eval.measures; default as evaluate)")
    p.add_argument("--test", choices=("ttest", "randomization", "both"), default="ttest",
                   help="paired t-test (scipy ttest_rel), paired randomization test (scipy permutation_test), or both")
    p.add_argument("--resamples", type=int, default=10_000, help="randomization test resamples (exact when 2^queries <= this)")
    p.add_argument("--seed", type=int, default=0, help="randomization test seed")
    p.add_argument("--allow-mixed", "--allow-mixed-corpora", dest="allow_mixed", action="store_true",
                   help="compare runs over different corpora anyway (a warning is printed above the table)")
    p.add_argument("--json", help="write the comparison as JSON here")
    p.add_argument("--overwrite", action="store_true", help="replace a metrics JSON this tool wrote at --json")
    p.add_argument("--config", help="YAML config (its eval section applies)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. --set eval.rel_level=2 (also accepted among the run files)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("train", help="train with Ray Train: any registered method (loss.name: dpr, dar, ance, ance_dar, ...)")
    _add_common_flags(p, batch="examples per worker per step (= train.batch_size)",
                      fp16="fp16 mixed precision with a gradient scaler (= train.amp=fp16); needs GPU workers, "
                           "refused on CPU (bf16 is train.amp=bf16)",
                      device="train on CPUs or GPUs (= train.use_gpu)")
    _add_config_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("subset", help="seeded corpus subset keeping the positives of sampled queries (ANCE's 500k)")
    p.add_argument("--corpus", required=True, help="an ingested corpus folder")
    p.add_argument("--queries", required=True, help="training queries file (or ir_datasets identifier)")
    p.add_argument("--qrels", required=True, help="training qrels file (or ir_datasets identifier)")
    p.add_argument("--passages", type=int, required=True, help="passages in the subset (the sampled queries' "
                                                                 "positives first, then random passages)")
    p.add_argument("--train-queries", type=int, required=True, help="training queries to sample")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--out", required=True, help="subset corpus folder to write (new or empty)")
    p.add_argument("--overwrite", action="store_true", help="replace a subset this command wrote at --out")
    p.set_defaults(func=cmd_subset)

    p = sub.add_parser("refresh", help="ANCE index refresher alone, against a training run's checkpoints")
    p.add_argument("--run-dir", required=True, help="<train.storage_path>/<train.name> of the run to follow")
    p.add_argument("--once", action="store_true", help="refresh from the newest checkpoint once and exit")
    p.add_argument("--idle-exit", type=float, default=600.0, help="exit after this many seconds without a new checkpoint")
    _add_config_args(p)
    p.set_defaults(func=cmd_refresh)

    p = sub.add_parser("tune", help="Ray Tune sweep over a trainer's config (ASHA, grid/random/optuna)")
    _add_config_args(p)
    p.add_argument("--resume", action="store_true", help="continue the interrupted sweep in the config's output")
    p.set_defaults(func=cmd_tune)

    from .authorship import add_parser as add_authorship_parser

    add_authorship_parser(sub)  # pipeline authorship split|evaluate|table (ARR)

    p = sub.add_parser("config", help="config tools: `pipeline config show --config X.yaml [key=value ...]`")
    csub = p.add_subparsers(dest="config_command", required=True)
    p = csub.add_parser("show", help="print the resolved config (file + overrides + defaults) as YAML; a training "
                                     "job config (train/data/optim/loss sections) or a sweep file is detected")
    p.add_argument("--kind", choices=("pipeline", "train", "sweep"), help="force the config kind (default: detected)")
    _add_config_args(p)
    p.set_defaults(func=cmd_config_show)

    p = sub.add_parser("info", help="summarise a project folder or file: corpus, embeddings, index, run, qrels, "
                                    "training run, checkpoint, sweep, model, metrics JSON")
    p.add_argument("path", metavar="PATH", help="a folder or file this tool wrote (or a project folder)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("demo", help="the whole flow on the bundled Python FAQ corpus")
    p.add_argument("--out", default="runs/demo", help="demo folder (default runs/demo); a re-run reuses finished steps")
    p.add_argument("--fresh", action="store_true", help="recompute every step")
    p.add_argument("--no-train", action="store_true", help="zero-shot only (skip the DPR/DAR fine-tuning)")
    _add_config_args(p)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .runtime_env import setup_offline_env

    setup_offline_env()
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        _attach_config_help(parser)  # generated from the config dataclasses, only when help is asked for
    args = parser.parse_args(argv)
    from .ray_runtime import shutdown_local_ray

    _exit_on_hangup()
    try:
        args.func(args)
    except PipelineError as e:
        from .storage import redact

        print(f"error: {redact(str(e))}", file=sys.stderr)  # no credential of a URI reaches the terminal
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        shutdown_local_ray()  # a local Ray this command started stops with it, however it ends
    return 0


def _attach_config_help(parser: argparse.ArgumentParser) -> None:
    """Each verb's --help ends with the config keys it reads and their defaults (pipeline/confdoc.py)."""
    from .confdoc import example_override, verb_epilog

    for action in parser._subparsers._group_actions if parser._subparsers else []:
        for verb, sub in getattr(action, "choices", {}).items():
            text = verb_epilog(verb)
            if text:
                sub.epilog = text
                sub.formatter_class = argparse.RawDescriptionHelpFormatter
            for a in sub._actions:  # the override example names one of this verb's own keys
                if a.dest == "overrides" and example_override(verb):
                    a.help = f"config overrides, e.g. {example_override(verb)} (keys below)"


def _exit_on_hangup() -> None:
    """SIGHUP (terminal closed) exits through Python, so atexit hooks stop a local Ray."""
    import signal

    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
        try:
            signal.signal(signal.SIGHUP, lambda signum, frame: sys.exit(128 + signum))
        except ValueError:  # not the main thread (e.g. main() called from a worker thread)
            pass


if __name__ == "__main__":
    sys.exit(main())
