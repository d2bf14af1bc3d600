"""Training speed: our Ray Train loop vs a plain PyTorch loop, and DAR vs DPR step cost.

Prints, from one run on the same machine (each measurement in a fresh subprocess):
  (a) steps/s of `pipeline.train` (Ray Train, 1 worker) vs a plain single-process loop
      doing the same steps (same model, batch, lengths, threads, loss), and the ratio;
  (b) DAR step time / DPR step time in the plain loop (paper: 1.11x), and the peak memory
      of each (CUDA max allocated on GPU, peak RSS on CPU) with their ratio.

    python bench/train.py                 # tiny random BERT (hidden 256, 4 layers), CPU
    python bench/train.py --model minilm --steps 20
"""

from __future__ import annotations

from machine import print_cpu  # bench/machine.py (run as python bench/<name>.py)

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
WORDS = ("the of and to in is was for on as with by he at from his an were are which this be has or had "
         "python retrieval dense passage query index vector model train encoder ray data shard corpus").split()


def make_corpus(folder: Path, n: int) -> Path:
    from pipeline.data.ingest import ingest

    rng = random.Random(0)
    (folder / "collection.tsv").write_text("".join(
        f"{i}\t{' '.join(rng.choice(WORDS) for _ in range(rng.randint(40, 90)))}\n" for i in range(n)))
    (folder / "queries.tsv").write_text("".join(
        f"q{i}\t{' '.join(rng.choice(WORDS) for _ in range(8))}\n" for i in range(n)))
    (folder / "qrels.trec").write_text("".join(f"q{i} 0 {i} 1\n" for i in range(n)))
    out = folder / "corpus"
    ingest([folder / "collection.tsv"], "msmarco", out, queries=folder / "queries.tsv",
           qrels={"train": folder / "qrels.trec"}, progress=False)
    return out


def job_overrides(args, corpus: Path, storage: Path, loss: str, name: str) -> list[str]:
    return [f"model.name_or_path={args.model_dir}", "model.pooling=mean", f"model.query_max_length={args.qlen}",
            f"model.doc_max_length={args.dlen}", f"data.corpus={corpus}", f"loss.name={loss}",
            f"train.batch_size={args.batch}", f"train.max_steps={args.steps}", "train.num_workers=1",
            "train.cpus_per_worker=1", f"train.torch_threads={args.threads}", f"train.storage_path={storage}",
            f"train.name={name}", f"train.report_every={args.steps}", "data.shuffle_window=1", "optim.lr=1e-4"]


def plain(args, loss_name: str) -> dict:
    """The same steps as the Ray loop, in one process: tokenise, forward, loss, backward, step."""
    import torch

    from pipeline.losses import get_loss
    from pipeline.losses.dist import gather_docs
    from pipeline.models import BiEncoder
    from pipeline.train.config import load_train_config
    from pipeline.train.optim import build_optimizer, warmup_linear
    from pipeline.train.trainer import resolve_job

    job = resolve_job(load_train_config(None, job_overrides(args, Path(args.corpus), Path(args.storage), loss_name,
                                                            "plain")), progress=False)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from pipeline.data.training import build_examples

    build_examples(job.data, Path(args.storage) / "plain_examples", progress=False)
    from pipeline.data.training import read_examples_table

    rows = read_examples_table(Path(args.storage) / "plain_examples").to_pylist()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = BiEncoder.load(job.model).to(device).train()
    opt = build_optimizer(model.parameters(), job.optim)
    sched = warmup_linear(opt, 0, args.steps)
    fn = get_loss(loss_name)
    B = args.batch
    times = []
    for step in range(args.steps + args.warmup):
        batch = rows[(step * B) % (len(rows) - B):][:B]
        t0 = time.perf_counter()
        q_tok = {k: v.to(device) for k, v in model.tokenize([r["query"] for r in batch], "query").items()}
        d_tok = {k: v.to(device) for k, v in model.tokenize([r["positive"] for r in batch], "doc").items()}
        q, d = model(q_tok, d_tok)
        docs, pos_idx, G = gather_docs(d, None)
        loss, _ = fn(q, docs, pos_idx, job.loss, training=True, n_pos=G)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), job.optim.grad_clip)
        opt.step()
        sched.step()
        if device == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"steps_per_s": len(times) / sum(times), "step_s": sum(times) / len(times), "peak_bytes": peak,
            "memory": "cuda max allocated" if device == "cuda" else "peak RSS"}


def ray_loop(args) -> dict:
    import ray

    from pipeline.train.config import load_train_config
    from pipeline.train.trainer import train

    ray.init(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1", log_to_driver=False,
             _node_ip_address="127.0.0.1")
    job = load_train_config(None, job_overrides(args, Path(args.corpus), Path(args.storage), "dpr", "ray")
                            + [f"train.max_steps={args.steps + args.warmup}"])
    s = train(job, progress=False)
    hist = [h for h in s["history"] if "loss" in h]
    # steady state: the loop's own clock for the last report window (excludes start-up and warm-up)
    return {"steps_per_s": hist[-1]["steps_per_s"], "loop_seconds": s["final_metrics"]["train_seconds"],
            "wall_seconds": s["wall_seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--qlen", type=int, default=32)
    ap.add_argument("--dlen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--storage", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    print_cpu()  # the figures below depend on this CPU's ISA (bench/machine.py)
    from pipeline.runtime_env import setup_offline_env

    setup_offline_env()
    if args.mode:
        out = ray_loop(args) if args.mode == "ray" else plain(args, args.mode)
        print("RESULT " + json.dumps(out))
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    if args.model == "tiny":
        from pipeline.models.tiny import build_tiny_bert

        args.model_dir = str(build_tiny_bert(tmp / "tiny", hidden=256, layers=4, heads=4, intermediate=1024))
    else:
        from pipeline.models.loading import resolve_model_path

        args.model_dir = str(resolve_model_path(args.model))
    corpus = make_corpus(tmp, max(400, args.batch * (args.steps + args.warmup) * 2))
    res = {}
    for mode in ("dpr", "dar", "ray"):
        cmd = [sys.executable, __file__, "--mode", mode, "--corpus", str(corpus), "--storage", str(tmp / mode),
               "--model-dir", args.model_dir] + [f"--{k}={getattr(args, k)}" for k in
                                                 ("steps", "warmup", "batch", "qlen", "dlen", "threads")]
        p = subprocess.run(cmd, capture_output=True, text=True)
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        if not line:
            print(p.stdout[-3000:], p.stderr[-3000:])
            raise SystemExit(f"{mode} failed")
        res[mode] = json.loads(line[0][7:])
    dpr, dar, ray_r = res["dpr"], res["dar"], res["ray"]
    print(f"\nmodel {args.model}, batch {args.batch}, q/d max length {args.qlen}/{args.dlen}, {args.threads} torch thread(s), "
          f"{args.steps} measured steps after {args.warmup} warm-up")
    print("(a) Ray Train loop vs plain loop (DPR loss)")
    print(f"    plain loop           {dpr['steps_per_s']:7.2f} steps/s")
    print(f"    Ray Train, 1 worker  {ray_r['steps_per_s']:7.2f} steps/s (steady state; whole fit {ray_r['wall_seconds']:.1f}s)"
          f"   ratio {ray_r['steps_per_s'] / dpr['steps_per_s']:.2f}x")
    print("(b) DAR (n=7, w=0.1) vs DPR in the plain loop")
    print(f"    step time  DPR {dpr['step_s'] * 1000:7.1f} ms   DAR {dar['step_s'] * 1000:7.1f} ms   ratio {dar['step_s'] / dpr['step_s']:.3f}x")
    print(f"    {dpr['memory']}  DPR {dpr['peak_bytes'] / 2**20:7.0f} MiB   DAR {dar['peak_bytes'] / 2**20:7.0f} MiB   "
          f"ratio {dar['peak_bytes'] / dpr['peak_bytes']:.3f}x")


if __name__ == "__main__":
    main()
