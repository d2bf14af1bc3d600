"""Training a PQ index as `pipeline index` does against FAISS's own factory index, side by side:

    python bench/index_train.py --dim 768 --factories "PQ64;IVF1024,PQ64" --train 50k --add 100k --queries 500

FAISS's index_factory turns on polysemous training for every 8-bit PQ: an annealing that reorders each
sub-quantizer's centroids so that Hamming distances between codes follow real distances, read only by
polysemous search (polysemous_ht), which the pipeline never sets. `pipeline index` builds through
faiss_index.new_index, which turns it off. For each factory, on the same seeded vectors (a sample of
`--train` clustered-Gaussian vectors of `--dim` dimensions, unit norm, inner product), both indexes are trained
and filled in this process one after the other and timed; then `--queries` queries are searched in both for
the top 100: the same passages in the same order (the share of identical rows) and the largest score
difference, and each one's recall@100 against exact search.

Printed, and written to bench/results/index-train-<date>.txt: the CPU line, the command, one row per factory.
"""

from __future__ import annotations

from machine import cpu_line, parse_size  # bench/machine.py (run as python bench/<name>.py)

import argparse
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(ROOT))


def vectors(n: int, dim: int, seed: int) -> np.ndarray:
    """Unit vectors around 256 seeded centres: clustered as embeddings are, so PQ and IVF have structure."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((256, dim)).astype(np.float32)
    x = centres[rng.integers(0, 256, n)] + 0.6 * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--factories", default="PQ64;IVF1024,PQ64", help="FAISS factory strings, ';'-separated")
    ap.add_argument("--train", default="50k", help="training sample (vectors)")
    ap.add_argument("--add", default="100k", help="vectors added and searched")
    ap.add_argument("--queries", type=int, default=500)
    args = ap.parse_args()

    import faiss

    from pipeline.index.faiss_index import new_index

    factories = [f.strip() for f in args.factories.split(";") if f.strip()]
    n_train, n_add = parse_size(args.train), parse_size(args.add)
    base = vectors(n_add, args.dim, 0)
    train = base[np.random.default_rng(1).choice(n_add, min(n_train, n_add), replace=False)]
    queries = vectors(args.queries, args.dim, 2)
    exact = faiss.IndexFlatIP(args.dim)
    exact.add(base)
    _, truth = exact.search(queries, 100)

    lines = [cpu_line(), f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} threads",
             "command: python bench/index_train.py " + " ".join(sys.argv[1:]),
             f"{n_add:,} x {args.dim} vectors, {len(train):,} trained on, {args.queries} queries, top 100",
             f"{'factory':<22} {'FAISS train s':>13} {'ours train s':>12} {'speed-up':>8} "
             f"{'same rows':>9} {'max |ds|':>9} {'R@100 FAISS':>11} {'R@100 ours':>10}"]
    print("\n".join(lines), flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"index-train-{date.today().isoformat()}.txt"
    for factory in factories:
        got = []
        for make in (lambda: faiss.index_factory(args.dim, factory, faiss.METRIC_INNER_PRODUCT),
                     lambda: new_index(args.dim, factory, faiss.METRIC_INNER_PRODUCT)):
            index = make()
            t0 = time.perf_counter()
            index.train(train)
            t_train = time.perf_counter() - t0
            index.add(base)
            if hasattr(faiss.downcast_index(index), "nprobe"):
                faiss.downcast_index(index).nprobe = 32
            scores, ids = index.search(queries, 100)
            recall = np.mean([len(set(a) & set(b)) / 100 for a, b in zip(ids, truth)])
            got.append((t_train, scores, ids, recall))
        (t_f, s_f, i_f, r_f), (t_o, s_o, i_o, r_o) = got
        same = float(np.mean((i_f == i_o).all(axis=1)))
        line = (f"{factory:<22} {t_f:>13.1f} {t_o:>12.1f} {t_f / t_o:>7.1f}x {same:>9.0%} "
                f"{float(np.abs(s_f - s_o).max()):>9.2g} {r_f:>11.3f} {r_o:>10.3f}")
        print(line, flush=True)
        lines.append(line)
        out.write_text("\n".join(lines) + "\n")  # row by row: a long factory cut short keeps the rows before it
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
