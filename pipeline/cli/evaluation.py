"""`pipeline evaluate`, `compare`, `sts` and `authorship`: runs and models scored."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError, PipelineError
from .common import FilesAndOverrides, add_common_flags, add_config_args, device_flag, load_cfg


def _positional_qrels_run(args) -> None:
    """`evaluate QRELS RUN` (trec_eval's and ir_measures' order) sets --qrels and --run."""
    files = list(getattr(args, "files", None) or [])
    if not files:
        return
    if len(files) != 2:
        raise PipelineError(f"evaluate takes QRELS RUN positionally (trec_eval's order), got {len(files)} file(s): "
                            f"{' '.join(files)}; or give --qrels QRELS --run RUN")
    if args.qrels or args.run or args.qa:
        raise PipelineError("give the qrels and the run either positionally (evaluate QRELS RUN, trec_eval's order) "
                            "or as --qrels/--run (--qa), not both")
    qrels, run = files
    if _trec_columns(qrels) == 6 and _trec_columns(run) == 4:
        raise PipelineError(f"evaluate {qrels} {run}: the first looks like a run and the second like qrels; the "
                            f"order is QRELS RUN, as trec_eval's: evaluate {run} {qrels}")
    args.qrels, args.run = qrels, run


def _trec_columns(path: str) -> int | None:
    """Fields on the first line of a local text file (a run has 6, TREC qrels 4), else None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return len(f.readline().split())
    except OSError:
        return None


def cmd_evaluate(args) -> None:
    _positional_qrels_run(args)
    if not args.run:
        raise PipelineError("evaluate needs a run: evaluate QRELS RUN (trec_eval's order), or --run RUN with "
                            "--qrels QRELS (or --qa)")
    extra = ["eval.per_query=true"] if args.per_query else []
    extra += [f"eval.qa_match={args.match}"] if args.match else []
    cfg = _eval_cfg(args, extra)
    # the library after the config: a config error never loads more than the config system
    from ..eval.metrics import cutoffs_deeper_than, evaluate_files
    from ..eval.qa import qa_accuracy
    from ..eval.report import format_table
    from ..eval.runs import read_run
    from ..io_utils import is_rerun, write_json_rerun

    if args.json:
        rerun = is_rerun(args.json, "metrics", args.overwrite)  # another file there: refused before any work
    if bool(args.qrels) == bool(args.qa):
        raise PipelineError("evaluate needs exactly one of --qrels (TREC/BEIR qrels) or --qa (DPR QA file, with --corpus)")
    if args.qa and args.measures:
        raise PipelineError("--measures applies to --qrels; --qa reports DPR top-k accuracy at eval.qa_ks and answer-based "
                            "MRR and MAP over eval.qa_rank_depth")
    if args.qrels and args.match:
        raise PipelineError("--match applies to --qa (DPR answer matching), not to --qrels")
    if args.split_by and not args.qrels:
        raise PipelineError("--split-by needs --qrels (the test judgements it splits)")
    if args.qrels:
        result = evaluate_files(args.run, args.qrels, cfg)
        if args.split_by:
            result["parts"], result["split_by"] = _parts(args, cfg)
    else:
        if not args.corpus:
            raise PipelineError("--qa needs --corpus (the ingested corpus the run retrieved from)")
        from ..data.irds import queries_file, resolve

        qa = resolve(args.qa)  # dpr-w100/natural-questions/dev: questions + answers, qids 0..N-1 as DPR's files
        qa_path = queries_file(qa.id, "dpr-qa") if getattr(qa, "id", None) else args.qa
        result = qa_accuracy(read_run(args.run), qa_path, args.corpus, cfg.qa_ks, cfg.qa_match, cfg.qa_rank_depth,
                             per_query=cfg.per_query)
        if getattr(qa, "id", None):
            result["qa"] = qa.id
    meta_path = Path(str(args.run) + ".meta.json")
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        result["corpus"] = {"fingerprint": meta.get("corpus_fingerprint"), "variant": meta.get("variant"),
                            "title_join": meta.get("title_join")}
    rows = {Path(args.run).name: result["metrics"]}
    for part, res in (result.get("parts") or {}).items():
        rows[f"{Path(args.run).name} [{part}]"] = res["metrics"]
    print(format_table(rows))
    if result.get("parts"):
        p = result["parts"]
        print(f"split by {result['split_by']['source']}: {result['split_by']['documents']:,} labeled documents; "
              + "; ".join(f"{part}: {p[part]['judgements']:,} relevant judgements, {p[part]['queries']['evaluated']} "
                          "queries scored" for part in p)
              + " (each part's ranking leaves out the other part's relevant documents)")
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
        _say_json("evaluate", args.json, write_json_rerun(args.json, result, "metrics", rerun))


def _say_json(verb: str, path, written: bool) -> None:
    print(f"[{verb}] wrote {path}" if written else f"[{verb}] unchanged: {path} already holds these values; "
                                                     "nothing was written")


def _parts(args, cfg) -> tuple[dict, dict]:
    """`--split-by`: the run scored on the labeled and the unlabeled test judgements (eval/label_split.py)."""
    from ..data.readers import load_qrels
    from ..eval.label_split import evaluate_parts, labeled_documents
    from ..eval.runs import read_run

    labeled, where = labeled_documents(args.split_by, cfg.rel_level)
    parts = evaluate_parts(read_run(args.run), load_qrels(args.qrels), labeled, cfg)
    return parts, {"source": where, "path": str(args.split_by), "documents": len(labeled)}


def _eval_cfg(args, extra: list[str] | None = None):
    """The eval section, with --measures (ir-measures strings) over eval.measures."""
    from dataclasses import replace

    cfg = load_cfg(args, extra).eval
    if getattr(args, "measures", None):
        cfg = replace(cfg, measures=(args.measures,))  # validated here: a bad measure is a ConfigError
    return cfg


def cmd_compare(args) -> None:
    # trailing `section.key=value` overrides come among the runs (common.FilesAndOverrides), --set ones too
    if not args.runs:
        raise PipelineError("compare needs at least one run file")
    cfg = _eval_cfg(args)
    from ..eval.compare import compare_runs, format_comparison
    from ..io_utils import is_rerun, write_json_rerun

    if args.json:
        rerun = is_rerun(args.json, "metrics", args.overwrite)  # another file there: refused before any work
    names = [Path(r).name for r in args.runs]
    labels = names if len(set(names)) == len(names) else [str(r) for r in args.runs]
    if len(set(labels)) != len(labels):
        raise PipelineError("compare: the same run file is given twice")
    result = compare_runs(dict(zip(labels, args.runs)), args.qrels, test=args.test, cfg=cfg,
                          allow_mixed=args.allow_mixed, resamples=args.resamples, seed=args.seed)
    print(format_comparison(result))
    if args.json:
        _say_json("compare", args.json, write_json_rerun(args.json, result, "metrics", rerun))


def cmd_sts(args) -> None:
    """STS: Spearman and Pearson of cosine vs gold (pipeline/eval/sts.py)."""
    from dataclasses import replace as _replace

    cfg = load_cfg(args)  # before the library: a config error never loads torch
    from ..eval.sts import evaluate_sts, parse_scale, read_sts
    from ..io_utils import is_rerun, write_json_rerun
    from ..models import BiEncoder

    if args.json:
        rerun = is_rerun(args.json, "sts", args.overwrite)  # another file there: refused before any work
    scale = parse_scale(args.scale)
    device = device_flag(args, "STS encoding") or "cpu"
    pairs = read_sts(args.pairs, args.format, scale)  # a broken pairs file is refused before the model loads
    model = BiEncoder.load(_replace(cfg.model, name_or_path=args.model) if args.model else cfg.model)
    if device != "cpu":
        model = model.to(device).eval()
    res = evaluate_sts(args.pairs, model, fmt=args.format, side=args.side, batch_size=args.batch_size, device=device,
                       scale=scale, pairs=pairs)
    print(f"{Path(args.pairs).name} ({res['format']}, {res['pairs']} pairs): "
          f"Spearman {100 * res['spearman']:.2f}  Pearson {100 * res['pearson']:.2f}")
    if args.json:
        _say_json("sts", args.json, write_json_rerun(args.json, {**res, "model": args.model or cfg.model.name_or_path},
                                                     "sts", rerun))


def cmd_authorship(args) -> None:
    """`pipeline authorship split|evaluate|table`: ARR's steps other than training (recipes/arr.py)."""
    from ..recipes import arr

    if args.action == "split":
        arr.split(args.input, args.out, args.config, args.overrides)
    elif args.action == "evaluate":
        splits = tuple(s.strip() for s in args.splits.split(",")) if args.splits else None
        from .. import progress

        with progress.sink(lambda r: print(f"[authorship] {progress.line(r)}", flush=True)):
            json_out = args.json or str(arr.default_result_path(args.split, args.model, args.baseline, args.label))
            arr.evaluate(args.split, model=args.model, baseline=args.baseline, json_out=json_out,
                         overwrite=args.overwrite, splits=splits, batch_size=args.batch_size,
                         device=device_flag(args, "authorship evaluate") or "cpu", label=args.label)
    else:
        print(arr.table(args.results))


def cmd_fuse(args) -> None:
    from ..eval.fuse import fuse, inputs_meta, read_ranked, write_fused

    if len(args.runs) < 2:
        raise ConfigError("fuse needs at least two runs")
    if args.weights and args.method != "interpolate":
        raise ConfigError("--weights are the interpolation's (--method interpolate)")
    meta = inputs_meta(args.runs)
    runs = [read_ranked(r, args.depth or None, args.resort) for r in args.runs]
    fused = fuse(runs, args.method, rrf_k=args.rrf_k, weights=args.weights, normalize=not args.no_normalize,
                 k=args.k or None)
    tag = args.run_tag or {"rrf": f"rrf_k{args.rrf_k}", "interpolate": "interpolate", "average": "average"}[args.method]
    lines = write_fused(fused, args.out, tag, args.overwrite,
                        {**meta, "fused_from": [str(Path(r).resolve()) for r in args.runs], "method": args.method,
                         "rrf_k": args.rrf_k if args.method == "rrf" else None, "weights": args.weights,
                         "normalize": args.method == "interpolate" and not args.no_normalize,
                         "depth": args.depth, "k": args.k})
    print(f"[fuse] {args.method} of {len(runs)} runs: {len(fused):,} queries, {lines:,} lines -> {args.out}")


def cmd_rerank(args) -> None:
    from ..eval.rerank import rerank

    device = "cuda" if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no GPU is visible to torch here")
    rerank(args.run, args.corpus, args.queries, args.model, args.out, batch_size=args.batch_size,
           max_length=args.max_length, top_k=args.top_k, device=device, overwrite=args.overwrite,
           tag=args.run_tag)


def add_parsers(sub) -> None:
    """The evaluate, sts, compare, fuse, rerank, authorship verbs."""
    p = sub.add_parser("rerank", help="a run's (query, passage) pairs scored by a cross-encoder -> a reranked TREC "
                                      "run (also a teacher's scores for distillation)")
    p.add_argument("--run", required=True, help="the TREC run whose pairs are scored")
    p.add_argument("--corpus", required=True, help="the ingested corpus the run ranks (pipeline ingest --out)")
    p.add_argument("--queries", required=True, help="the queries file (qid<TAB>text, or BEIR queries.jsonl)")
    p.add_argument("--model", required=True, help="a local cross-encoder folder (a Hugging Face sequence-"
                                                  "classification model, as sentence-transformers' CrossEncoder saves it)")
    p.add_argument("--out", required=True, help="the reranked TREC run to write")
    p.add_argument("--batch-size", type=int, default=32, help="pairs per forward pass (default 32)")
    p.add_argument("--max-length", type=int, default=512, help="tokens of a (query, passage) pair (default 512)")
    p.add_argument("--top-k", type=int, default=0, help="passages kept per query (default 0: all the run ranked)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the cross-encoder runs")
    p.add_argument("--run-tag", default="rerank", help="the run's tag column")
    p.add_argument("--overwrite", action="store_true", help="replace a run this tool wrote at --out")
    p.set_defaults(func=cmd_rerank)

    p = sub.add_parser("fuse", help="several TREC runs (a BM25 and a dense run, say) -> one fused run (pyserini's "
                                    "fusion: reciprocal rank fusion, interpolation, average)",
                       usage="%(prog)s RUN RUN [RUN ...] --out RUN [--method rrf|interpolate|average] [options]")
    p.add_argument("runs", nargs="+", metavar="RUN", help="TREC run files (two or more)")
    p.add_argument("--out", required=True, help="the fused TREC run to write")
    p.add_argument("--method", choices=("rrf", "interpolate", "average"), default="rrf",
                   help="rrf: sum of 1/(k + rank); interpolate: weighted sum of scores normalised per query "
                        "(min-max); average: mean of the raw scores")
    p.add_argument("--rrf-k", "--rrf.k", dest="rrf_k", type=int, default=60, help="RRF's k (default 60)")
    p.add_argument("--weights", type=float, nargs="+", help="interpolate: one weight a run, in their order "
                                                            "(default equal)")
    p.add_argument("--no-normalize", action="store_true", help="interpolate the raw scores (pyserini's "
                                                               "`interpolation`: two runs, --weights A 1-A)")
    p.add_argument("--depth", type=int, default=1000, help="lines of each query read from each run (default 1000; "
                                                           "0: all)")
    p.add_argument("--k", type=int, default=1000, help="documents kept per query (default 1000; 0: all)")
    p.add_argument("--resort", action="store_true", help="rank each run again by its scores first (pyserini's "
                                                         "--resort)")
    p.add_argument("--run-tag", "--runtag", dest="run_tag", help="the fused run's tag column")
    p.add_argument("--overwrite", action="store_true", help="replace a run this tool wrote at --out")
    p.set_defaults(func=cmd_fuse)

    p = sub.add_parser("evaluate", help="TREC run + qrels (or DPR QA answers) -> metrics",
                       usage="%(prog)s [QRELS RUN | --qrels QRELS --run RUN | --qa QA --corpus C --run RUN] "
                             "[options] [key=value ...]")
    p.add_argument("files", nargs="*", action=FilesAndOverrides, metavar="QRELS RUN",
                   help="the qrels and the run, in trec_eval's order (= --qrels QRELS --run RUN); trailing "
                        "section.key=value config overrides may follow, e.g. eval.rel_level=2 (keys below)")
    p.add_argument("--run", help="a TREC run file (or the second positional)")
    p.add_argument("--qrels", help="TREC/BEIR qrels file, or an ir_datasets identifier (e.g. beir/scifact/test); or "
                                   "the first positional")
    p.add_argument("--qa", help="DPR QA file (question\\t[answers]) for top-k accuracy and answer-based MRR@100 and "
                                "MAP@100 (DAR's), or an ir_datasets identifier "
                                "with answers (dpr-w100/natural-questions/dev)")
    p.add_argument("--corpus", help="ingested corpus folder (for --qa)")
    p.add_argument("--per-query", action="store_true", help="also print (and write to --json) every query's values")
    p.add_argument("--json", help="write the metrics as JSON here")
    p.add_argument("--overwrite", action="store_true", help="replace a metrics JSON this tool wrote at --json")
    p.add_argument("--measures", help="ir-measures measures, e.g. \"AP nDCG@10 RR@10 R@1000 P@10 Judged@10\" "
                                      "(= eval.measures; default RR@10 nDCG@10 AP@100 RR@100 R@k for eval.recall_ks)")
    p.add_argument("--split-by", metavar="TRAINING",
                   help="also score the run on the test judgements of documents some training pair names "
                        "(labeled) and of the others (unlabeled), as DAR's paper does: TRAINING is the examples "
                        "folder a training run wrote (<run>/examples) or the training qrels")
    p.add_argument("--match", choices=("string", "regex"),
                   help="--qa answer matching as DPR: string (token sequence) or regex (CuratedTREC) (= eval.qa_match)")
    p.add_argument("--config", help="YAML config (its eval section applies)")
    p.set_defaults(func=cmd_evaluate, overrides=[])

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
    add_common_flags(p, device="where the model runs")
    p.add_argument("--json", help="write spearman, pearson, pairs as JSON here")
    p.add_argument("--overwrite", action="store_true", help="replace an STS JSON this tool wrote at --json")
    add_config_args(p)
    p.set_defaults(func=cmd_sts)

    p = sub.add_parser("compare", help="several TREC runs + qrels -> one table, paired significance tests vs the first",
                       usage="%(prog)s RUN [RUN ...] --qrels QRELS [options] [key=value ...]")
    p.add_argument("runs", nargs="+", metavar="RUN", action=FilesAndOverrides,
                   help="TREC run files; the first is the baseline. Trailing section.key=value config overrides may "
                        "follow, as for every verb, e.g. eval.rel_level=2 (keys below)")
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
                   help="the same as a trailing key=value override (kept for older scripts): --set eval.rel_level=2 "
                        "= eval.rel_level=2")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("authorship", help="ARR authorship data: cross-topic-open-set split, R@8/MRR evaluation, table")
    acts = p.add_subparsers(dest="action", required=True)
    s = acts.add_parser("split", help="records (CSV/JSONL/Parquet) -> train/val/cross_topic_test/same_topic_test")
    s.add_argument("--input", required=True, help="records file, or `fortunes` for the bundled corpus")
    s.add_argument("--out", required=True, help="split folder to write (train, val and the two test splits)")
    s.add_argument("--config", help="YAML with an authorship: section")
    s.add_argument("overrides", nargs="*", metavar="key=value",
                   help="e.g. authorship.author_fraction=0.1 authorship.text_column=body")
    s.set_defaults(func=cmd_authorship)
    e = acts.add_parser("evaluate", help="R@8 and MRR on the test splits (a model or a BOW/TF-IDF baseline)")
    e.add_argument("--split", required=True, help="folder written by `authorship split`")
    g = e.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", help="model folder (or `minilm` for zero-shot)")
    g.add_argument("--baseline", choices=("bow", "tfidf"), help="a bag-of-words or TF-IDF baseline instead of a model")
    e.add_argument("--json", help="write the result here (default: results/<name>.json beside the split folder, "
                                  "e.g. runs/arr/split -> runs/arr/results/arr_cl.json, what `authorship table "
                                  "runs/arr/results/*.json` reads; <name>: --label, the baseline, zero-shot or the "
                                  "training run's name)")
    e.add_argument("--overwrite", action="store_true", help="replace a result JSON this tool wrote at --json")
    e.add_argument("--label", help="the table row (default: from the run's summary.json)")
    e.add_argument("--splits", help="comma-separated (default cross_topic_test,same_topic_test; val allowed)")
    e.add_argument("--batch-size", type=int, default=64, help="texts per forward pass")
    e.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="where the model runs: cpu (default), cuda or auto (a GPU when one is visible here)")
    e.set_defaults(func=cmd_authorship)
    t = acts.add_parser("table", help="the paper-style table from result JSONs (mean over seeds, n per cell)")
    t.add_argument("results", nargs="*", help="result JSONs of `authorship evaluate` (by default in results/ beside "
                                              "the split folder: runs/arr/results/*.json)")
    t.set_defaults(func=cmd_authorship)
