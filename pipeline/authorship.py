"""`pipeline authorship split|evaluate|table` (ARR, METHODS.md §4).

    pipeline authorship split --input quotes.parquet --out runs/arr/split [authorship.author_fraction=0.1 ...]
    pipeline authorship evaluate --split runs/arr/split --model runs/train/arr_cl/model --json cl.json
    pipeline authorship evaluate --split runs/arr/split --baseline tfidf --json tfidf.json
    pipeline authorship table runs/arr/results/*.json

Training is `pipeline train --config jobs/configs/arr_cl.yaml|arr_mll.yaml|arr.yaml`; its
validation (R@8 on the split's `val`, `val_metric`) comes from `AuthorshipValidator`.
"""

from __future__ import annotations

from pathlib import Path

from .errors import PipelineError

AUTHORSHIP_METHODS = ("arr_cl", "arr_mll", "arr")


def split_config(config: str | None, overrides: list[str]):
    """The `authorship:` section of a YAML file + `authorship.key=value` overrides."""
    from .config import from_dict, merge_overrides, read_yaml
    from .data.authorship import SplitConfig

    data = merge_overrides(read_yaml(config), list(overrides))
    other = sorted(k for k in data if k != "authorship")
    if other:
        raise PipelineError(f"authorship split reads only the authorship: section; unexpected: {', '.join(other)}")
    return from_dict(SplitConfig, data.get("authorship") or {}, prefix="authorship.")


def validator_for(job):
    """validate_fn for an authorship training job (R@8 on the split's validation file), or None."""
    if job.loss.name not in AUTHORSHIP_METHODS or job.validation.corpus:
        return None
    sec = job.section("authorship")
    if not sec.split:
        return None
    from .eval.authorship import AuthorshipValidator

    return AuthorshipValidator(sec.split, "val", job.validation.batch_size)


def cmd_authorship(args) -> None:
    from .io_utils import write_json_atomic

    if args.action == "split":
        from .data.authorship import bundled_fortunes, write_split

        src = bundled_fortunes() if args.input == "fortunes" else args.input
        write_split(src, args.out, split_config(args.config, args.overrides))
    elif args.action == "evaluate":
        from .eval.authorship import evaluate_split

        if args.json and Path(args.json).exists() and not args.overwrite:
            raise PipelineError(f"{args.json} exists; use --overwrite to replace it")
        splits = tuple(s.strip() for s in args.splits.split(",")) if args.splits else None
        kw = {"splits": splits} if splits else {}
        from .cli import _resolve_device

        device = _resolve_device(args, "authorship evaluate") or "cpu"
        result = evaluate_split(args.split, model=args.model, baseline=args.baseline, batch_size=args.batch_size,
                                device=device, label=args.label, **kw)
        if args.json:
            write_json_atomic(args.json, result)
            print(f"[authorship] wrote {args.json}")
    else:
        from .eval.authorship import collect, format_table

        if not args.results:
            raise PipelineError("give one or more result JSONs of `pipeline authorship evaluate`")
        print(format_table(collect(args.results)))


def add_parser(sub) -> None:
    """The `authorship` verb and its three actions (called from cli.build_parser)."""
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
    e.add_argument("--json", help="write the result here")
    e.add_argument("--overwrite", action="store_true", help="replace a result JSON this tool wrote at --json")
    e.add_argument("--label", help="the table row (default: from the run's summary.json)")
    e.add_argument("--splits", help="comma-separated (default cross_topic_test,same_topic_test; val allowed)")
    e.add_argument("--batch-size", type=int, default=64, help="texts per forward pass")
    e.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="where the model runs: cpu (default), cuda or auto (a GPU when one is visible here)")
    e.set_defaults(func=cmd_authorship)
    t = acts.add_parser("table", help="the paper-style table from result JSONs (mean over seeds, n per cell)")
    t.add_argument("results", nargs="*", help="result JSONs of `authorship evaluate --json`")
    t.set_defaults(func=cmd_authorship)

