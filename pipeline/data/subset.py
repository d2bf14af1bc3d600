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
from .manifest import load_manifest
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
                overwrite: bool = False) -> dict:
    from .ingest import ingest

    corpus_dir, out = Path(corpus_dir), Path(out)
    check_subset_output(out, corpus_dir, overwrite)
    manifest = load_manifest(corpus_dir)
    judged = load_qrels(qrels)
    texts = load_queries(queries)
    positives = {q: sorted(d for d, r in docs.items() if r >= rel_level) for q, docs in judged.items()}
    candidates = sorted(q for q, ds in positives.items() if ds and q in texts)
    if train_queries < 1 or passages < 1:
        raise PipelineError("--passages and --train-queries must be >= 1")
    if train_queries > len(candidates):
        raise PipelineError(f"--train-queries {train_queries}: only {len(candidates)} judged queries with text exist")
    rng = random.Random(seed)
    chosen = sorted(rng.sample(candidates, train_queries))
    keep_pos = sorted({d for q in chosen for d in positives[q]})
    total = manifest["passages"] if "passages" in manifest else sum(p["rows"] for p in manifest["parts"])
    if len(keep_pos) > passages:
        raise PipelineError(f"the {train_queries} queries have {len(keep_pos)} positives, more than --passages {passages}")
    if passages > total:
        raise PipelineError(f"--passages {passages} is more than the corpus's {total}")
    # seeded reservoir over the other passages (one pass, memory O(passages))
    pos_set, fill, seen = set(keep_pos), [], 0
    need = passages - len(keep_pos)
    for part in manifest["parts"]:
        for pid in pq.read_table(corpus_dir / part["file"], columns=["pid"])["pid"].to_pylist():
            if pid in pos_set:
                continue
            seen += 1
            if len(fill) < need:
                fill.append(pid)
            else:
                j = rng.randrange(seen)
                if j < need:
                    fill[j] = pid
    keep = pos_set | set(fill)
    missing = pos_set - {p for part in manifest["parts"]
                         for p in pq.read_table(corpus_dir / part["file"], columns=["pid"])["pid"].to_pylist()
                         if p in pos_set}
    if missing:
        raise PipelineError(f"{qrels}: {len(missing)} positives of the sampled queries are not in {corpus_dir}, "
                            f"e.g. {sorted(missing)[:3]}")
    with tempfile.TemporaryDirectory(prefix=".subset-", dir=out.parent if out.parent.exists() else None) as tmp:
        beir = Path(tmp) / "subset"
        (beir / "qrels").mkdir(parents=True)
        with open(beir / "corpus.jsonl", "w", encoding="utf-8") as f:
            for part in manifest["parts"]:
                t = pq.read_table(corpus_dir / part["file"], columns=["pid", "title", "text"])
                for pid, title, text in zip(t["pid"].to_pylist(), t["title"].to_pylist(), t["text"].to_pylist()):
                    if pid in keep:
                        f.write(json.dumps({"_id": pid, "title": title or "", "text": text}) + "\n")
        with open(beir / "queries.jsonl", "w", encoding="utf-8") as f:
            for q in chosen:
                f.write(json.dumps({"_id": q, "text": texts[q]}) + "\n")
        with open(beir / "qrels" / "train.tsv", "w", encoding="utf-8") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for q in chosen:
                for d, r in sorted(judged[q].items()):
                    if d in keep:
                        f.write(f"{q}\t{d}\t{r}\n")
        variant = manifest["variant"] if manifest["variant"] in ("msmarco-official",) else "custom"
        ingest([beir], "beir", out, variant=variant, title_join=manifest["title_join"], progress=progress,
               overwrite=overwrite)
    record = {"source_corpus": str(corpus_dir.resolve()), "source_fingerprint": manifest["fingerprint"],
              "source_variant": manifest["variant"], "seed": seed, "passages": len(keep),
              "positives_kept": len(keep_pos), "filled": len(fill), "train_queries": len(chosen),
              "queries": chosen, "positives": keep_pos, "rel_level": rel_level,
              "fingerprint": load_manifest(out)["fingerprint"]}
    write_json_atomic(out / "subset.json", record)
    if progress:
        print(f"[subset] {len(keep):,} passages ({len(keep_pos):,} positives of {len(chosen):,} queries + "
              f"{len(fill):,} sampled, seed {seed}) -> {out}", flush=True)
    return record
