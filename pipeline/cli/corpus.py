"""`pipeline ingest` and `pipeline subset`: corpus files in, an ingested corpus out."""

from __future__ import annotations

from pathlib import Path

from ..errors import PipelineError

def cmd_ingest(args) -> None:
    from ..data.ingest import ingest

    qrels = {}
    for spec in args.qrels or []:
        split, _, path = spec.rpartition("=")
        if not split:
            from ..data.irds import is_identifier, split_name

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
    if args.format is None:  # an ir_datasets identifier, or a BEIR folder, needs no --format
        from ..data.irds import is_identifier, resolve

        if len(args.inputs) == 1 and Path(args.inputs[0]).is_dir() and (Path(args.inputs[0]) / "corpus.jsonl").exists():
            args.format = "beir"  # the layout BEIR publishes its datasets in
        elif len(args.inputs) == 1 and is_identifier(args.inputs[0]):
            args.format = "irds"
        else:
            if len(args.inputs) == 1:
                resolve(args.inputs[0])  # a missing 'a/b' that is no identifier: names close identifiers
            raise PipelineError("ingest needs --format for files (dpr-wiki, msmarco, msmarco-titled, beir, hf); "
                                "only an ir_datasets identifier (e.g. beir/scifact/test) or a BEIR folder (with "
                                "corpus.jsonl) needs none")
    ingest(args.inputs, args.format, args.out, variant=args.variant, title_join=args.title_join,
           part_rows=args.part_rows, on_empty=args.on_empty, queries=args.queries, qrels=qrels,
           on_unknown_qrels=args.on_unknown_qrels, overwrite=args.overwrite, hf_fields=hf_fields)


def cmd_subset(args) -> None:
    from ..data.subset import make_subset

    make_subset(args.corpus, args.queries, args.qrels, args.out, args.passages, args.train_queries, seed=args.seed,
                overwrite=args.overwrite, dev_queries=args.dev_queries, dev_qrels=args.dev_qrels)


def add_parsers(sub) -> None:
    """The ingest, subset verbs."""
    from ..data.readers import CORPUS_FORMATS

    p = sub.add_parser("ingest", help="raw corpus files -> Parquet parts + manifest")
    p.add_argument("inputs", nargs="+", help="corpus file(s); for --format beir, the BEIR folder; or an ir_datasets "
                                             "identifier (beir/scifact/test, msmarco-passage/dev/small: its docs, "
                                             "queries and qrels, from files already in IR_DATASETS_HOME)")
    p.add_argument("--format", choices=CORPUS_FORMATS, help="required for files; beir is implied for a folder with "
                   "corpus.jsonl, irds (an ir_datasets identifier) "
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

    p = sub.add_parser("subset", help="seeded corpus subset keeping the positives of sampled queries (ANCE's 500k)")
    p.add_argument("--corpus", required=True, help="an ingested corpus folder")
    p.add_argument("--queries", required=True, help="training queries file (or ir_datasets identifier)")
    p.add_argument("--qrels", required=True, help="training qrels file (or ir_datasets identifier)")
    p.add_argument("--passages", type=int, required=True, help="passages in the subset (the sampled queries' "
                                                                 "positives first, then random passages)")
    p.add_argument("--train-queries", type=int, required=True, help="training queries to sample")
    p.add_argument("--dev-queries", help="the dev queries' own file (MS MARCO: queries.dev.small.tsv); with --dev-qrels")
    p.add_argument("--dev-qrels", help="the dev judgements: every dev positive is kept in the subset (qrels/dev.trec), "
                                       "so a dev metric on the subset means something")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--out", required=True, help="subset corpus folder to write (new or empty)")
    p.add_argument("--overwrite", action="store_true", help="replace a subset this command wrote at --out")
    p.set_defaults(func=cmd_subset)
