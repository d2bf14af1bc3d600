#!/usr/bin/env python3
"""How spread out an encoder's passage vectors are: the mean cosine between random pairs of passages.

A dual encoder whose passages all point the same way (mean cosine near 1) can still rank, but barely: the
differences that order a query's hits shrink toward the noise. Fine-tuning moves this figure; a loss that
never pushes a query away from most of the corpus (ANCE's pairwise loss, one hard negative per query) can
drive it toward 1, a collapse. Give it embedding folders (`pipeline encode --out`), or an effects
experiment's work folder to measure every arm and seed it holds:

    python scripts/embedding_spread.py runs/zero-shot/emb runs/dpr/emb
    python scripts/embedding_spread.py --effects W/effects-nfcorpus

Prints one line per embedding set: passages, mean and standard deviation of the cosine over --pairs random
pairs (seeded), and the length of the mean unit vector (0 when the vectors spread evenly, 1 when they coincide).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.errors import InputError  # noqa: E402
from pipeline.index.shards import iter_shards  # noqa: E402


def spread(emb_dir: Path, pairs: int, seed: int) -> dict:
    x = np.concatenate([np.asarray(v, dtype=np.float32) for _, v in iter_shards(emb_dir)])
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, len(x), pairs), rng.integers(0, len(x), pairs)
    keep = i != j
    cos = (x[i[keep]] * x[j[keep]]).sum(1)
    return {"passages": len(x), "mean": float(cos.mean()), "sd": float(cos.std()),
            "mean_vector": float(np.linalg.norm(x.mean(0)))}


def effects_folders(work: Path) -> list[tuple[str, Path]]:
    """(arm/seed, its emb folder) for every finished run of an effects work folder, arms in name order; runs
    set aside when an arm changed (`seed-<s>.replaced-<time>`) are not the experiment's and are left out."""
    found = []
    for run in sorted((work / "arms").glob("*/*")):
        if ".replaced-" not in run.name and (run / "done.json").is_file() and (run / "emb").is_dir():
            found.append((f"{run.parent.name}/{run.name}", run / "emb"))
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("emb", nargs="*", type=Path, help="embedding folders (pipeline encode --out)")
    ap.add_argument("--effects", type=Path, help="an effects experiment's work folder (<work>/effects-<dataset>)")
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    todo = [(str(p), p) for p in args.emb]
    if args.effects:
        todo += effects_folders(args.effects)
    if not todo:
        ap.error("name embedding folders or --effects")
    for name, folder in todo:
        try:
            s = spread(folder, args.pairs, args.seed)
        except InputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{name}: {s['passages']:,} passages, mean cosine {s['mean']:.3f} (sd {s['sd']:.3f}), "
              f"mean unit vector {s['mean_vector']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
