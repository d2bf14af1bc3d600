#!/usr/bin/env python3
"""How often a run's hard negatives are documents judged relevant to a near-identical training query.

A hard negative is a passage the run ranks high for a training query that its judgements do not name. On a
corpus whose judgements are incomplete, some of those are relevant all the same (false negatives). No label
says which; this script measures a proxy: for each training query, the training queries whose judged sets
overlap its own (Jaccard >= --overlap) are its near-duplicates, and a hard negative judged relevant to one of
them is a likely false negative. The same rate for passages drawn at random from the corpus (what
`data.missing_negatives=random` and in-batch negatives draw from) is the reference.

    python scripts/hard_negative_overlap.py --corpus runs/nfcorpus --run runs/nfcorpus/bm25-train.trec

The negatives are the ones the trainer keeps (`data.negatives_run`): the run's top --depth minus every
judged passage, the first --keep of them. Prints one line per overlap threshold.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.data.corpus import corpus_pids  # noqa: E402
from pipeline.data.readers import read_qrels  # noqa: E402
from pipeline.data.run_negatives import run_negatives  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True, help="an ingested corpus folder (pipeline ingest)")
    ap.add_argument("--qrels", help="the training judgements (default <corpus>/qrels/train.trec)")
    ap.add_argument("--run", required=True, help="the hard-negative run of the training queries (pipeline bm25)")
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--keep", type=int, default=30)
    ap.add_argument("--rel-level", type=int, default=1)
    ap.add_argument("--overlap", type=float, nargs="+", default=[0.5, 0.3])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    judged: dict[str, set[str]] = defaultdict(set)
    relevant: dict[str, set[str]] = defaultdict(set)
    for r in read_qrels(args.qrels or Path(args.corpus) / "qrels" / "train.trec"):
        judged[r["qid"]].add(r["docid"])
        if r["rel"] >= args.rel_level:
            relevant[r["qid"]].add(r["docid"])
    # the negatives the trainer keeps (data.negatives_run): the same selection, by the same function
    negatives = {q: ids.split("\t") for q, ids in run_negatives(
        args.run, {q: tuple(v) for q, v in relevant.items()}, {q: tuple(v) for q, v in judged.items()},
        args.depth, args.keep).items() if ids}
    pids = corpus_pids(args.corpus).to_pylist()
    by_doc: dict[str, set[str]] = defaultdict(set)
    for q, docs in relevant.items():
        for d in docs:
            by_doc[d].add(q)
    rng = random.Random(args.seed)
    for threshold in args.overlap:
        hit = n = hit_random = n_random = queries = 0
        for q, docs in relevant.items():
            shared = Counter(o for d in docs for o in by_doc[d] if o != q)
            near = [o for o, c in shared.items() if c / len(docs | relevant[o]) >= threshold]
            if not near:
                continue
            queries += 1
            theirs = set().union(*(relevant[o] for o in near))
            for d in negatives.get(q, []):
                n += 1
                hit += d in theirs
            for d in rng.sample(pids, min(args.keep, len(pids))):
                if d not in judged[q]:
                    n_random += 1
                    hit_random += d in theirs
        print(f"overlap >= {threshold}: {queries:,} of {len(relevant):,} training queries have a near-duplicate; "
              f"of their hard negatives {hit / max(n, 1):.3f} are judged relevant to one ({n:,} negatives), "
              f"of random passages {hit_random / max(n_random, 1):.3f} ({n_random:,})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
