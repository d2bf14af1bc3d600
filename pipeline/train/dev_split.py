"""`validation.dev_split`: a seeded share of the training queries held out as the dev split.

The pair methods (DPR, DAR, ANCE) select and early-stop on what `validation.*` names; with
`validation.dev_split: 0.1` that is a seeded 10 % of the training queries (`data.qrels`, default
`<corpus>/qrels/train.trec`), held out of training, instead of a split the numbers are reported
on. The split is written to `<storage_path>/<name>/split/{train,dev}.trec` (rewritten only when
it changes). Its seed is `validation.dev_seed` (0), not `train.seed`: every trial of a sweep and
every method sees the same held-out queries, and a resumed run trains on the same examples
and the job then trains on `split/train.trec` and validates on `split/dev.trec` against the
training corpus and queries. RCL's `rcl.dev_split` uses the same split (recipes/rcl.py).
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from ..errors import ConfigError


def write_dev_split(src: Path, fraction: float, seed: int, out: Path, what: str) -> tuple[Path, Path]:
    """Split the judged queries of `src` (TREC or BEIR qrels) into train / dev TREC qrels in `out`."""
    from ..data.readers import load_qrels
    from ..io_utils import write_text_atomic

    qrels = load_qrels(src)
    qids = sorted(qrels)
    random.Random(seed).shuffle(qids)
    n_dev = max(1, round(fraction * len(qids)))
    if n_dev >= len(qids):
        raise ConfigError(f"{what}={fraction} leaves no training query ({len(qids)} judged queries in {src})")
    dev, train = set(qids[:n_dev]), set(qids[n_dev:])
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, keep in (("train.trec", train), ("dev.trec", dev)):
        text = "".join(f"{q} 0 {d} {r}\n" for q in sorted(keep) for d, r in sorted(qrels[q].items()))
        if not (out / name).exists() or (out / name).read_text() != text:
            write_text_atomic(out / name, text)
        paths.append(out / name)
    return paths[0], paths[1]


def check_dev_split(job) -> None:
    """Refuse a `validation.dev_split` that cannot apply, before anything is written (a sweep checks
    its base config with this before its folder is made)."""
    v = job.validation
    if not v.dev_split:
        return
    if job.data.source != "qrels" or not job.data.corpus:
        raise ConfigError("validation.dev_split needs data.source=qrels with data.corpus (the training queries "
                          "are split)")
    if v.qrels:
        raise ConfigError(f"validation.dev_split={v.dev_split} and validation.qrels={v.qrels} both name the dev "
                          "judgements; give one")


def apply_dev_split(job):
    """The job with its dev split applied (unchanged without `validation.dev_split`): it trains on
    the rest of the training queries and validates on the held-out ones. Call it before choosing
    the validator (index/validate.make_validator reads `validation.*`)."""
    v = job.validation
    if not v.dev_split:
        return job
    check_dev_split(job)
    from .. import storage as st

    corpus = Path(job.data.corpus)
    run_dir = st.resolve(job.train.storage_path) / job.train.name
    out = (st.staging_dir(run_dir) if isinstance(run_dir, st.RemotePath) else run_dir) / "split"
    train, dev = write_dev_split(Path(job.data.qrels or corpus / "qrels" / "train.trec"), v.dev_split,
                                 v.dev_seed, out, "validation.dev_split")
    return replace(job, data=replace(job.data, qrels=str(train)),
                   validation=replace(v, corpus=str(v.corpus or corpus), queries=v.queries or job.data.queries,
                                      qrels=str(dev)))
