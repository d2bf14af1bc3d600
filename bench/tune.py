"""Sweep wall time: the same `pipeline tune` sweep with 2 concurrent trials vs 1, in one run.

Each sweep is a fresh `pipeline tune` process (its own local Ray with the dashboard): a DAR grid
over loss.n_perturb on the bundled Python FAQ training split, no early stopping (every trial trains
all its steps, so both sweeps do the same work), each trial 1 worker x 0.9 CPU + a 0.1-CPU trial
driver, validation at the end. Prints both wall times (sweep = Tune's fit, process = with Ray's
start) and the speed-up.

    python bench/tune.py                         # tiny random BERT, 4 trials x 20 steps
    python bench/tune.py --model minilm --trials 4 --steps 30
"""

from __future__ import annotations

from machine import print_cpu, scratch  # bench/machine.py (run as python bench/<name>.py)

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
REPO = Path(__file__).resolve().parents[1]


def sweep_file(args, work: Path, corpus: Path, model: str, concurrent: int) -> Path:
    model_cfg = ({"name_or_path": model, "pooling": "cls"} if model != "minilm" else {"name_or_path": "minilm"})
    doc = {
        "base": {
            "model": {**model_cfg, "query_max_length": 32, "doc_max_length": 64 if model != "minilm" else 128},
            "data": {"corpus": str(corpus), "shuffle_window": 256},
            "loss": {"name": "dar"},
            "optim": {"lr": 1e-4 if model != "minilm" else 3e-5},
            "train": {"name": "bench", "max_steps": args.steps, "batch_size": 8, "num_workers": 1,
                      "cpus_per_worker": 0.9, "report_every": 5, "checkpoint_every": args.steps, "seed": 0},
            "validation": {"corpus": str(corpus), "qrels": str(corpus / "qrels" / "test.trec"), "metric": "RR@10"},
            "ray": {"num_cpus": 2, "temp_dir": str(scratch("ray-"))},
        },
        "space": {"loss.n_perturb": {"grid": list(range(1, args.trials + 1))}},
        "search": {"searcher": "grid", "metric": "val_metric", "scheduler": "none",
                   "max_concurrent_trials": concurrent},
        "output": str(work / f"sweep_c{concurrent}"),
    }
    path = work / f"sweep_c{concurrent}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(path: Path) -> dict:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "tune", "--config", str(path)], cwd=REPO,
                          capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        sys.exit(f"pipeline tune failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out = Path(yaml.safe_load(path.read_text())["output"])
    summary = json.loads((out / "summary.json").read_text())
    return {"process_s": round(wall, 1), "sweep_s": summary["wall_seconds"], "trials": summary["trials"],
            "statuses": summary["statuses"], "best": summary["best"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="tiny (random BERT) or minilm")
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", help="write the measurements here")
    args = ap.parse_args()
    print_cpu()  # the figures below depend on this CPU's ISA (bench/machine.py)

    from pipeline.data.ingest import ingest
    from pipeline.data.bundled import python_faq_dir
    from pipeline.runtime_env import setup_offline_env

    setup_offline_env()
    work = scratch("bench-tune-")
    corpus = work / "faq"
    ingest([python_faq_dir()], "beir", corpus, progress=False)
    model = args.model
    if model == "tiny":
        from pipeline.models.tiny import build_tiny_bert

        model = str(build_tiny_bert(work / "tiny"))
    res = {}
    for conc in (1, 2):
        res[conc] = run(sweep_file(args, work, corpus, model, conc))
        print(f"{conc} concurrent trial(s): sweep {res[conc]['sweep_s']:.1f}s, process {res[conc]['process_s']:.1f}s "
              f"({res[conc]['trials']} trials x {args.steps} steps)", flush=True)
    speedup = res[1]["sweep_s"] / max(res[2]["sweep_s"], 1e-9)
    print(f"| sweep of {args.trials} trials x {args.steps} steps ({args.model}) | 1 at a time | 2 at a time | speed-up |")
    print("|---|---|---|---|")
    print(f"| Tune fit wall time | {res[1]['sweep_s']:.1f} s | {res[2]['sweep_s']:.1f} s | {speedup:.2f}x |")
    print(f"| process (with Ray start) | {res[1]['process_s']:.1f} s | {res[2]['process_s']:.1f} s | "
          f"{res[1]['process_s'] / max(res[2]['process_s'], 1e-9):.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": res, "speedup": speedup}, indent=2))


if __name__ == "__main__":
    main()
