"""An index in parts against one part, side by side, on a synthetic corpus (#61):

    python bench/sharded.py --rows 2m --dim 384 --parts 1,2,4,8 --queries 1000
    python bench/scale.py --parts 1,2,4,8 ...     # the same, from the scale benchmark

Seeded random unit vectors (`--rows` x `--dim`, float32) are written as an embedding set (`--shard-rows` a
shard) under `--work`. For each part count it builds a Flat index (`pipeline index ... index.shards=P`, its own
process), then searches `--queries` seeded random queries for the top 100 in a process of its own with
`retrieve.runner=local`'s loader (one part loaded at a time), and records each process's wall time and peak
resident memory (ru_maxrss). Every several-part run is compared with the one-part run: the same passages in
the same order, the largest score difference. Then an IVF index (IVF1024,Flat, nprobe 32, one quantizer
trained on 100k sampled vectors) in one part and in 4 parts: recall@100 of each against Flat's top 100.

Printed, and written to bench/results/sharded-<date>.txt: the CPU line, the command, then one row per part
count (build s, build peak MB, search s per 1,000 queries, search peak MB, same run as one part, max score
difference) and the IVF recall rows.
"""

from __future__ import annotations

from machine import cpu_line, parse_size  # bench/machine.py (run as python bench/<name>.py)

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def write_embeddings(folder: Path, rows: int, dim: int, shard_rows: int, seed: int = 0, clusters: int = 0) -> Path:
    """Seeded unit vectors as an embedding set (kept: the same arguments reuse it): random ones, or with `clusters`
    around that many random centres (noise 0.5: the structure real embeddings have and random vectors lack, which
    IVF and HNSW rely on)."""
    sys.path.insert(0, str(ROOT))
    from pipeline.index.shards import plan_part, write_shard

    meta_path = folder / "embeddings.json"
    want = {"rows": rows, "dim": dim, "shard_rows": shard_rows, "seed": seed, "clusters": clusters}
    if meta_path.is_file() and all(json.loads(meta_path.read_text()).get(k) == v for k, v in want.items()):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    pids = [f"d{i}" for i in range(rows)]
    specs = plan_part(0, "corpus/part-00000.parquet", pids, shard_rows)
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32) if clusters else None
    for s in specs:
        n = s["end"] - s["start"]
        if centres is not None:  # (the draws in the order the recorded results were made with)
            v = centres[rng.integers(0, clusters, n)] + 0.5 * rng.standard_normal((n, dim)).astype(np.float32)
        else:
            v = rng.standard_normal((n, dim)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        write_shard(folder, s, pids[s["start"]:s["end"]], v)
    meta_path.write_text(json.dumps({**want, "complete": True, "shard_names": [s["name"] for s in specs],
                                     "corpus_fingerprint": f"synthetic-{rows}-{dim}-{seed}-{clusters}",
                                     "model_config": {}, "model": {"path": "synthetic"}}))
    return folder


CHILD_SEARCH = """
import json, resource, sys, time
import numpy as np
sys.path.insert(0, sys.argv[5])
from pipeline.config import IndexConfig
from pipeline.index.faiss_index import load_index
index_dir, out, n, k = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
nprobe, ef = int(sys.argv[6]), int(sys.argv[7])
t0 = time.time()
index = load_index(index_dir, IndexConfig(nprobe=nprobe, ef_search=ef), resident=False)
rng = np.random.default_rng(123)
q = rng.standard_normal((n, index.index.d)).astype(np.float32)
q /= np.linalg.norm(q, axis=1, keepdims=True)
s, i = index.search(q, k)
np.save(out + ".ids.npy", i); np.save(out + ".scores.npy", s)
print(json.dumps({"seconds": time.time() - t0, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


CHILD_BUILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[3])
from pipeline.cli import main
t0 = time.time()
rc = main(["index", "--embeddings", sys.argv[1], "--out", sys.argv[2], *sys.argv[4:]])
print(json.dumps({"rc": rc, "seconds": time.time() - t0,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
sys.exit(rc)
"""


def run_build(emb: Path, out: Path, extra: list[str]) -> dict:
    """`pipeline index` in a process of its own: its wall time and peak resident memory."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    got = subprocess.run([sys.executable, "-c", CHILD_BUILD, str(emb), str(out), str(ROOT), *extra],
                         capture_output=True, text=True, cwd=ROOT)
    if got.returncode != 0:
        raise SystemExit(f"pipeline index {' '.join(extra)} failed: {(got.stderr or got.stdout).strip()[-500:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def run_search(index: Path, out: Path, n: int, k: int, nprobe: int = 0, ef: int = 0) -> dict:
    got = subprocess.run([sys.executable, "-c", CHILD_SEARCH, str(index), str(out), str(n), str(k), str(ROOT),
                          str(nprobe), str(ef)], check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(got.stdout.strip().splitlines()[-1])


def recall(ids: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(ids, truth)]))


def recall_table(args, work: Path) -> list[str]:
    """recall@100 against Flat of IVF, HNSW and IVF-PQ, in one part and in 4, on clustered vectors."""
    emb = write_embeddings(work / "clustered", args.recall_rows, args.dim, max(args.recall_rows // 20, 1000), seed=1,
                           clusters=1000)
    lines = ["", f"recall@100 against Flat's top 100 on {args.recall_rows:,} clustered unit vectors x {args.dim} "
                 f"(1,000 centres, noise 0.5), 20 embedding shards, {args.queries:,} queries:", "",
             "| factory (search setting) | one part | 4 parts |", "|---|---|---|"]
    print("\n".join(lines), flush=True)
    run_build(emb, work / "c-flat", ["index.shards=1"])
    run_search(work / "c-flat", work / "c-flat-run", args.queries, args.top_k)
    truth = np.load(work / "c-flat-run.ids.npy")
    for factory, extra, nprobe in (("IVF256,Flat", [], 16), ("HNSW32", [], 0), ("IVF256,PQ32", [], 16)):
        got = []
        for p in (1, 4):
            idx = work / f"c-{factory.replace(',', '-')}-{p}"
            run_build(emb, idx, ["--factory", factory, "index.train_sample=100000", f"index.shards={p}", *extra])
            run_search(idx, work / f"c-run-{p}", args.queries, args.top_k, nprobe=nprobe, ef=0 if nprobe else 128)
            got.append(recall(np.load(work / f"c-run-{p}.ids.npy"), truth))
        row = f"| {factory} ({f'nprobe {nprobe}' if nprobe else 'efSearch 128'}) | {got[0]:.4f} | {got[1]:.4f} |"
        lines.append(row)
        print(row, flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=parse_size, default=parse_size("2m"))
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--shard-rows", type=parse_size, default=parse_size("100k"))
    ap.add_argument("--parts", default="1,2,4,8")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--top-k", type=int, default=100)
    ap.add_argument("--no-ivf", action="store_true")
    ap.add_argument("--recall-rows", type=parse_size, default=0, help="also recall@100 of IVF, HNSW and IVF-PQ in "
                                                                     "1 and 4 parts on this many clustered vectors")
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench-sharded"))
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    run(args)


def run(args) -> list[str]:
    """The benchmark (also called by bench/scale.py --parts); returns the printed lines."""
    work = Path(args.work)
    emb = write_embeddings(work / "emb", args.rows, args.dim, args.shard_rows)
    lines = [cpu_line(), "command: " + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
             f"corpus: {args.rows:,} synthetic unit vectors x {args.dim} (float32, "
             f"{args.rows * args.dim * 4 / 1e9:.2f} GB), {args.shard_rows:,} a shard; {args.queries:,} queries, "
             f"top {args.top_k}; every figure one run, its own process",
             "", "| parts | build s | build peak MB | search s per 1,000 queries | search peak MB | "
                 "same run as one part | max score difference |", "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    base = None
    for p in [int(x) for x in args.parts.split(",")]:
        idx = work / f"flat-{p}"
        b = run_build(emb, idx, [f"index.shards={p}"])
        s = run_search(idx, work / f"run-{p}", args.queries, args.top_k)
        ids = np.load(work / f"run-{p}.ids.npy")
        scores = np.load(work / f"run-{p}.scores.npy")
        if base is None:
            base = (ids, scores)
        same = bool(np.array_equal(ids, base[0]))
        diff = float(np.abs(scores - base[1]).max())
        row = (f"| {p} | {b['seconds']:.1f} | {b['peak_mb']:,.0f} | {s['seconds'] * 1000 / args.queries:.1f} | "
               f"{s['peak_mb']:,.0f} | {'yes' if same else 'NO'} | {diff:.2e} |")
        lines.append(row)
        print(row, flush=True)
    if not args.no_ivf:
        truth = base[0]
        lines += ["", "IVF1024,Flat (nprobe 32, one quantizer trained on 100,000 sampled vectors) against Flat's "
                      f"top {args.top_k}:", "", "| parts | build s | recall@100 vs Flat | search s per 1,000 queries |",
                  "|---|---|---|---|"]
        print("\n".join(lines[-5:]), flush=True)
        for p in (1, 4):
            idx = work / f"ivf-{p}"
            b = run_build(emb, idx, ["--factory", "IVF1024,Flat", "index.train_sample=100000",
                                     f"index.shards={p}"])
            s = run_search(idx, work / f"ivf-run-{p}", args.queries, args.top_k, nprobe=32)
            row = (f"| {p} | {b['seconds']:.1f} | {recall(np.load(work / f'ivf-run-{p}.ids.npy'), truth):.4f} | "
                   f"{s['seconds'] * 1000 / args.queries:.1f} |")
            lines.append(row)
            print(row, flush=True)
    if args.recall_rows:
        lines += recall_table(args, work)
    out = Path(args.out) / f"sharded-{time.strftime('%Y-%m-%d')}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"-> {out}", flush=True)
    return lines


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
