"""Encoding throughput: Ray Data encoder actors vs a plain single-process loop, and memory flatness.

Prints, from one run on the same machine:
  1. passages/s of a plain loop (same model, batch size, max length, torch threads)
     and of `pipeline encode` (Ray Data, encoder actors), end to end and steady state,
     with the ratio ours / plain;
  2. peak memory (driver RSS and USS, the latter without the object-store pages it maps;
     Ray processes' PSS, which counts shared pages once) for a corpus and larger ones,
     with the ratio large / small.

    python bench/encode.py                      # tiny random BERT (fast)
    python bench/encode.py --model minilm --n 2000 --max-length 128
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
WORDS = ("the of and to in is was for on as with by he at from his an were are which this be has or had "
         "python retrieval dense passage query index vector model train encoder ray data shard corpus").split()


def make_corpus(folder: Path, n: int, part_rows: int) -> Path:
    from pipeline.data.ingest import ingest

    rng = random.Random(0)
    src = folder / f"collection-{n}.tsv"
    with open(src, "w") as f:
        for i in range(n):
            f.write(f"{i}\t{' '.join(rng.choice(WORDS) for _ in range(rng.randint(40, 90)))}\n")
    out = folder / f"corpus-{n}"
    ingest([src], "msmarco", out, part_rows=part_rows, progress=False)
    return out


def plain_loop(corpus: Path, model_dir: str, batch: int, max_len: int, threads: int) -> tuple[float, int]:
    import pyarrow.parquet as pq
    import torch

    from pipeline.config import ModelConfig
    from pipeline.models import BiEncoder

    torch.set_num_threads(threads)
    model = BiEncoder.load(ModelConfig(name_or_path=model_dir, doc_max_length=max_len))
    texts = [t for p in sorted((corpus / "corpus").glob("*.parquet")) for t in pq.read_table(p)["text"].to_pylist()]
    t0 = time.perf_counter()
    model.embed(texts, "doc", batch_size=batch)
    return time.perf_counter() - t0, len(texts)


def ray_encode(corpus: Path, out: Path, model_dir: str, batch: int, max_len: int, actors: int, cpus: float,
               threads: int) -> dict:
    from pipeline.config import load_config
    from pipeline.index.encode import encode_corpus

    cfg = load_config(None, [f"model.name_or_path={model_dir}", f"model.doc_max_length={max_len}",
                             f"encode.batch_size={batch}", f"encode.num_actors={actors}",
                             f"encode.cpus_per_actor={cpus}", f"encode.torch_threads={threads}",
                             "encode.show_progress=false"])
    t0 = time.perf_counter()
    summary = encode_corpus(corpus, out, cfg)
    summary["wall"] = time.perf_counter() - t0
    return summary


def _ray_pss() -> int:
    """Proportional set size of every Ray process: shared object-store pages counted once."""
    import psutil

    total = 0
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if "ray::" in cmd or "raylet" in cmd or "gcs_server" in cmd:
                total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, TypeError, AttributeError):
            pass
    return total


def child_rss(args) -> None:
    """Subprocess: encode one corpus, print peak driver RSS and peak Ray-process RSS as JSON."""
    import resource

    import ray

    from pipeline.runtime_env import setup_offline_env

    setup_offline_env()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    import psutil

    peak = {"ray": 0, "driver_uss": 0}
    stop = threading.Event()
    me = psutil.Process()

    def watch():
        while not stop.is_set():
            peak["ray"] = max(peak["ray"], _ray_pss())
            # USS: the driver's private memory, without the object-store pages it maps to read results
            peak["driver_uss"] = max(peak["driver_uss"], me.memory_full_info().uss)
            time.sleep(0.2)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    s = ray_encode(Path(args.corpus), Path(args.out), args.model, args.batch, args.max_length, 1, 1.0, args.threads)
    stop.set()
    th.join()
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RSS " + json.dumps({"driver": driver, "driver_uss": peak["driver_uss"], "ray": peak["ray"],
                               "rows": s["rows"], "wall": s["wall"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="'tiny' (random BERT, hidden 256, 4 layers), 'minilm' or a dir")
    ap.add_argument("--n", type=int, default=6000, help="passages for the throughput run")
    ap.add_argument("--rss-n", type=int, default=2000, help="base corpus size for the memory runs")
    ap.add_argument("--rss-mults", default="1,10", help="corpus sizes for the memory runs, as multiples of --rss-n")
    ap.add_argument("--skip-throughput", action="store_true", help="only the memory runs")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2, help="torch threads, same for both sides")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from pipeline.runtime_env import setup_offline_env

    setup_offline_env()
    if args.child:
        return child_rss(args)

    tmp = Path(tempfile.mkdtemp(prefix="bench-encode-"))
    if args.model == "tiny":
        from pipeline.models.tiny import build_tiny_bert

        args.model = str(build_tiny_bert(tmp / "tiny", hidden=256, layers=4, heads=4, intermediate=1024))
    if not args.skip_throughput:
        throughput(args, tmp)
    memory(args, tmp)


def throughput(args, tmp: Path) -> None:
    import ray

    corpus = make_corpus(tmp, args.n, part_rows=max(1, args.n // 8))
    plain_s, n = plain_loop(corpus, args.model, args.batch, args.max_length, args.threads)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    # warm-up run (Ray worker start, model load) on a separate output, then the measured one
    ray_encode(corpus, tmp / "warm", args.model, args.batch, args.max_length, 1, 1.0, args.threads)
    r1 = ray_encode(corpus, tmp / "emb1", args.model, args.batch, args.max_length, 1, 1.0, args.threads)
    r2 = ray_encode(corpus, tmp / "emb2", args.model, args.batch, args.max_length, 2, 0.5, 1)
    ray.shutdown()
    plain_rate = n / plain_s
    print("\n== encode throughput ==")
    print(f"corpus {n} passages, model {args.model}, batch {args.batch}, max_len {args.max_length}")
    print(f"plain loop ({args.threads} torch threads):          {plain_rate:8.1f} psg/s")
    for label, r in (("Ray Data, 1 actor x 1 CPU", r1), ("Ray Data, 2 actors x 0.5 CPU", r2)):
        rate = n / r["wall"]
        print(f"{label:34s} {rate:8.1f} psg/s   ratio vs plain {rate / plain_rate:.2f}x  (wall {r['wall']:.1f}s incl. actor start)")


def memory(args, tmp: Path) -> None:
    mults = [int(m) for m in args.rss_mults.split(",")]
    print(f"\n== peak memory, corpus sizes {', '.join(f'{m}x' for m in mults)} of {args.rss_n} passages ==")
    rss = {}
    for m in mults:
        size = args.rss_n * m
        c = make_corpus(tmp, size, part_rows=max(1, args.rss_n // 2))
        proc = subprocess.run([sys.executable, __file__, "--child", "--corpus", str(c), "--out", str(tmp / f"rss-{size}"),
                               "--model", args.model, "--batch", str(args.batch), "--max-length", str(args.max_length),
                               "--threads", str(args.threads)], capture_output=True, text=True)
        line = [l for l in proc.stdout.splitlines() if l.startswith("RSS ")]
        if not line:
            print(proc.stdout[-2000:], proc.stderr[-4000:])
            raise SystemExit("RSS child failed")
        rss[m] = json.loads(line[0][4:])
        print(f"{size:7d} passages ({m:>3}x): driver peak RSS {rss[m]['driver'] / 2**20:6.0f} MiB, "
              f"USS {rss[m]['driver_uss'] / 2**20:6.0f} MiB   Ray processes peak PSS {rss[m]['ray'] / 2**20:6.0f} MiB")
    base = rss[mults[0]]
    for m in mults[1:]:
        print(f"ratio {m}x / {mults[0]}x: driver RSS {rss[m]['driver'] / base['driver']:.2f}x, "
              f"USS {rss[m]['driver_uss'] / base['driver_uss']:.2f}x   Ray processes {rss[m]['ray'] / base['ray']:.2f}x")


if __name__ == "__main__":
    main()
