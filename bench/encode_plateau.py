"""Is driver memory bounded? Encode the same corpus several times in ONE process and print
the driver's USS (private memory) after each run. A leak grows every run; a bounded
working set (Ray's in-process object store, malloc arenas) plateaus after the first.

    python bench/encode_plateau.py --n 20000 --runs 4
"""

from __future__ import annotations

from machine import print_cpu, scratch  # bench/machine.py (run as python bench/<name>.py)

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--part-rows", type=int, default=500)
    args = ap.parse_args()
    print_cpu()  # the figures below depend on this CPU's ISA (bench/machine.py)
    from pipeline.runtime_env import setup_offline_env

    setup_offline_env()
    import psutil
    import ray

    from encode import make_corpus
    from pipeline.config import load_config
    from pipeline.index.encode import encode_corpus
    from pipeline.models.tiny import build_tiny_bert

    tmp = scratch("bench-plateau-")
    model = build_tiny_bert(tmp / "tiny")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    corpus = make_corpus(tmp, args.n, part_rows=args.part_rows)
    cfg = load_config(None, [f"model.name_or_path={model}", "model.pooling=mean", "encode.show_progress=false"])
    me = psutil.Process()
    for i in range(args.runs):
        encode_corpus(corpus, tmp / f"emb{i}", cfg)
        print(f"after run {i + 1} ({(i + 1) * args.n:,} passages encoded): driver USS "
              f"{me.memory_full_info().uss / 2**20:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
