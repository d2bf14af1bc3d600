"""`pipeline subset`: a seeded corpus subset for paper protocols (ANCE's MS MARCO 500k x 10k/50k).

Samples `train_queries` judged queries, keeps every passage judged relevant for them, fills the
corpus up to `passages` with a seeded uniform sample of the other passages, and ingests the
result (BEIR layout, so titles survive) with its queries and qrels. `subset.json` records the
seed, the source corpus fingerprint, the counts and which positives were kept.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

from ..errors import PipelineError
from ..io_utils import write_json_atomic
from .manifest import VARIANTS_FIXED, load_manifest
from .readers import load_qrels, load_queries


def check_subset_output(out: Path, corpus_dir: Path, overwrite: bool) -> None:
    """`--out` must be new, an empty folder, or a subset this command wrote (replaced with
    `--overwrite`); anything else is refused before any work, naming subset's own options."""
    if out.exists() and corpus_dir.exists() and out.resolve() == corpus_dir.resolve():
        raise PipelineError(f"--out {out} is the source corpus (--corpus); write the subset to another folder")
    if not out.exists():
        return
    if not out.is_dir():
        raise PipelineError(f"--out {out} is a file; pipeline subset writes a corpus folder. Choose another --out; "
                            "nothing was written")
    names = sorted(p.name for p in out.iterdir())
    if not names:
        return
    if "subset.json" in names and "manifest.json" in names:
        if not overwrite:
            raise PipelineError(f"--out {out} already holds a subset; pass --overwrite to `pipeline subset` to replace "
                                "it (its corpus parts, manifest, queries, qrels and subset.json; other files there "
                                "are kept), or choose another --out. Nothing was written")
        return
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    what = "an ingested corpus that `pipeline subset` did not write" if "manifest.json" in names else f"{shown}"
    raise PipelineError(f"--out {out} holds {what}; pipeline subset writes into a new or empty folder, or replaces "
                        "a subset it wrote (--overwrite). Choose another --out; nothing was written or deleted")


def make_subset(corpus_dir: str | Path, queries: str | Path, qrels: str | Path, out: str | Path, passages: int,
                train_queries: int, seed: int = 0, rel_level: int = 1, progress: bool = True,
                overwrite: bool = False, dev_queries: str | Path | None = None,
                dev_qrels: str | Path | None = None) -> dict:
    from .ingest import ingest

    corpus_dir, out = Path(corpus_dir), Path(out)
    check_subset_output(out, corpus_dir, overwrite)
    if bool(dev_queries) != bool(dev_qrels):
        raise PipelineError("--dev-queries and --dev-qrels go together (the dev queries' own file and their judgements)")
    if train_queries < 1 or passages < 1:
        raise PipelineError("--passages and --train-queries must be >= 1")
    manifest = load_manifest(corpus_dir)
    total = manifest["passages"] if "passages" in manifest else sum(p["rows"] for p in manifest["parts"])
    if passages > total:
        raise PipelineError(f"--passages {passages} is more than the corpus's {total}")
    judged = load_qrels(qrels)
    texts = load_queries(queries)
    positives = {q: sorted(d for d, r in docs.items() if r >= rel_level) for q, docs in judged.items()}
    candidates = sorted(q for q, ds in positives.items() if ds and q in texts)
    if train_queries > len(candidates):
        raise PipelineError(f"--train-queries {train_queries}: only {len(candidates)} judged queries with text exist")
    dev_judged, dev_texts, dev_pos = {}, {}, []
    if dev_qrels:
        dev_judged = load_qrels(dev_qrels)
        dev_texts_all = load_queries(dev_queries)
        lost = sorted(q for q in dev_judged if q not in dev_texts_all)
        if len(lost) == len(dev_judged):
            raise PipelineError(f"--dev-qrels {dev_qrels}: none of its {len(dev_judged)} queries is in --dev-queries "
                                f"{dev_queries} (e.g. {lost[:3]}): the wrong file?")
        if lost:
            raise PipelineError(f"--dev-qrels {dev_qrels}: {len(lost)} of its {len(dev_judged)} queries are not in "
                                f"--dev-queries {dev_queries}, e.g. {lost[:3]}")
        dev_texts = {q: dev_texts_all[q] for q in dev_judged}
        clash = sorted(q for q in dev_texts if q in texts and texts[q] != dev_texts[q])
        if clash:
            raise PipelineError(f"{len(clash)} query ids name different texts in --queries and --dev-queries, e.g. "
                                f"{clash[:3]}; the subset's queries table cannot hold both")
        dev_pos = sorted({d for docs in dev_judged.values() for d, r in docs.items() if r >= rel_level})
    rng = random.Random(seed)
    chosen = sorted(rng.sample(candidates, train_queries))
    keep_pos = sorted({d for q in chosen for d in positives[q]} | set(dev_pos))
    if len(keep_pos) > passages:
        raise PipelineError(f"the {train_queries} training queries{' and the dev queries' if dev_pos else ''} have "
                            f"{len(keep_pos)} positives, more than --passages {passages}")
    # seeded reservoir over the other passages (one pass, memory O(passages))
    pos_set, fill, seen = set(keep_pos), [], 0
    need = passages - len(keep_pos)
    found: set[str] = set()
    for part in manifest["parts"]:
        for pid in pq.read_table(corpus_dir / part["file"], columns=["pid"])["pid"].to_pylist():
            if pid in pos_set:
                found.add(pid)
                continue
            seen += 1
            if len(fill) < need:
                fill.append(pid)
            else:
                j = rng.randrange(seen)
                if j < need:
                    fill[j] = pid
    keep = pos_set | set(fill)
    missing = pos_set - found
    if missing:
        raise PipelineError(f"{len(missing)} positives of the sampled training{' and dev' if dev_pos else ''} queries "
                            f"are not in {corpus_dir}, e.g. {sorted(missing)[:3]}")
    pairs = sum(len(positives[q]) for q in chosen)
    dev_dropped = 0
    with tempfile.TemporaryDirectory(prefix=".subset-", dir=out.parent if out.parent.exists() else None) as tmp:
        beir = Path(tmp) / "subset"
        (beir / "qrels").mkdir(parents=True)
        with open(beir / "corpus.jsonl", "w", encoding="utf-8") as f:
            for part in manifest["parts"]:
                t = pq.read_table(corpus_dir / part["file"], columns=["pid", "title", "text"])
                for pid, title, text in zip(t["pid"].to_pylist(), t["title"].to_pylist(), t["text"].to_pylist()):
                    if pid in keep:
                        f.write(json.dumps({"_id": pid, "title": title or "", "text": text}) + "\n")
        with open(beir / "queries.jsonl", "w", encoding="utf-8") as f:  # the corpus's query table: train + dev
            table = {**{q: texts[q] for q in chosen}, **dev_texts}
            for q in sorted(table):
                f.write(json.dumps({"_id": q, "text": table[q]}) + "\n")
        with open(beir / "qrels" / "train.tsv", "w", encoding="utf-8") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for q in chosen:
                for d, r in sorted(judged[q].items()):
                    if d in keep:
                        f.write(f"{q}\t{d}\t{r}\n")
        if dev_judged:
            with open(beir / "qrels" / "dev.tsv", "w", encoding="utf-8") as f:
                f.write("query-id\tcorpus-id\tscore\n")
                for q in sorted(dev_judged):
                    for d, r in sorted(dev_judged[q].items()):
                        if d in keep:
                            f.write(f"{q}\t{d}\t{r}\n")
                        else:
                            dev_dropped += 1  # a non-relevant judgement of a passage not sampled
        src = manifest["variant"]  # the source's variant survives in the name (the titled flag of MS MARCO too)
        variant = src if src.endswith("-subset") else f"{src}-subset" if (src in VARIANTS_FIXED or
                                                                          src.startswith("beir-")) else "custom"
        ingest([beir], "beir", out, variant=variant, title_join=manifest["title_join"], progress=progress,
               overwrite=overwrite)
    record = {"source_corpus": str(corpus_dir.resolve()), "source_fingerprint": manifest["fingerprint"],
              "source_variant": manifest["variant"], "variant": variant, "seed": seed, "passages": len(keep),
              "positives_kept": len(keep_pos), "filled": len(fill), "train_queries": len(chosen),
              "training_pairs": pairs, "queries": chosen, "positives": keep_pos, "rel_level": rel_level,
              "dev_queries": len(dev_judged), "dev_positives_kept": len(dev_pos),
              "dev_judgements_dropped": dev_dropped,
              "fingerprint": load_manifest(out)["fingerprint"]}
    write_json_atomic(out / "subset.json", record)
    if progress:
        dev = f", {len(dev_judged):,} dev queries with all {len(dev_pos):,} dev positives" if dev_judged else ""
        paper = " (ANCE's Table 5: 6,591 for 10k queries)" if train_queries == 10_000 else ""
        print(f"[subset] {len(keep):,} passages ({len(keep_pos):,} positives of {len(chosen):,} training queries"
              f"{dev} + {len(fill):,} sampled, seed {seed}), {pairs:,} training pairs{paper}; variant {variant} "
              f"-> {out}", flush=True)
    return record
