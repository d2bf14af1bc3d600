"""Training speed: our loop vs a plain PyTorch loop, DAR vs DPR step cost, and `pipeline train` vs
sentence-transformers' own trainer.

Prints, from one run on the same machine (each measurement in a fresh subprocess):
  (a) steps/s of `pipeline.train` (Ray Train, 1 worker) vs a plain single-process loop
      doing the same steps (same model, batch, lengths, threads, loss), and the ratio;
  (b) DAR step time / DPR step time in the plain loop (paper: 1.11x), and the peak memory
      of each (CUDA max allocated on GPU, peak RSS on CPU) with their ratio.

    python bench/train.py                 # tiny random BERT (hidden 256, 4 layers), CPU
    python bench/train.py --model minilm --steps 20

With --vs-st: fine-tuning MiniLM on the bundled FAQ's training pairs as whole processes, as users run
them, side by side: sentence-transformers' SentenceTransformerTrainer with MultipleNegativesRankingLoss
(fp32, and bf16=True where the CPU has native bf16) against `pipeline train` (DPR, cos/0.05 = MNRL's scale
20; fp32, its default train.amp=auto, and bf16 where native) at the same pairs, batch, lengths, learning
rate, warmup, gradient clipping, epochs and threads. Each row: whole-process wall, training seconds,
steps/s, examples/s, GFLOP/s of the training against this CPU's measured matmul peak, and the fine-tuned
model's FAQ test nDCG@10 (every model encoded and searched the same way).

    python bench/train.py --vs-st --epochs 10
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


# ------------------------------------------------------------------ vs sentence-transformers' trainer

ST_SCRIPT = """
import json, sys, time
t0 = time.time()
import torch
from datasets import Dataset
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
pairs = json.load(open(cfg["pairs"]))
model = SentenceTransformer(cfg["model"], device="cpu")
model.max_seq_length = cfg["max_len"]
data = Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})
args = SentenceTransformerTrainingArguments(output_dir=cfg["out"] + "/ckpt", num_train_epochs=cfg["epochs"],
    per_device_train_batch_size=cfg["batch"], learning_rate=cfg["lr"], warmup_steps=cfg["warmup"], max_grad_norm=cfg["clip"],
    bf16=cfg["bf16"], use_cpu=True, seed=0, dataloader_drop_last=True, save_strategy="no", report_to="none",
    logging_steps=10**6, disable_tqdm=True)
trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data,
                                     loss=MultipleNegativesRankingLoss(model, scale=1 / cfg["tau"]))
t1 = time.time()
out = trainer.train()
t2 = time.time()
model.save(cfg["out"] + "/model")
print("RESULT " + json.dumps({"train_seconds": t2 - t1, "steps": out.global_step, "startup_seconds": t1 - t0}))
"""


def faq_pairs(folder: Path) -> tuple[Path, Path]:
    """The bundled FAQ ingested, and its training pairs (query, title-joined answer) as JSON."""
    from pipeline.data.bundled import python_faq_dir
    from pipeline.data.ingest import ingest
    from pipeline.data.training import build_examples, read_examples_table
    from pipeline.train.config import TrainDataConfig

    corpus = folder / "faq"
    ingest([python_faq_dir()], "beir", corpus, progress=False)
    build_examples(TrainDataConfig(source="qrels", corpus=str(corpus)), folder / "examples", progress=False)
    rows = read_examples_table(folder / "examples").to_pylist()
    (folder / "pairs.json").write_text(json.dumps([[r["query"], r["positive"]] for r in rows]))
    return corpus, folder / "pairs.json"


def faq_ndcg(model_dir: str, corpus: Path) -> float:
    """FAQ test nDCG@10 of a fine-tuned model, encoded and searched the same way for every row (torch fp32)."""
    import numpy as np

    import pyarrow.parquet as pq

    from pipeline.config import EvalConfig, ModelConfig
    from pipeline.data.manifest import join_title, load_manifest
    from pipeline.data.readers import load_qrels, load_queries
    from pipeline.eval.metrics import evaluate_run
    from pipeline.models import BiEncoder

    model = BiEncoder.load(ModelConfig(name_or_path=model_dir))
    manifest = load_manifest(corpus)
    pids, texts = [], []
    for part in manifest["parts"]:
        t = pq.read_table(corpus / part["file"])
        pids += t["pid"].to_pylist()
        texts += [join_title(a, b, manifest["title_join"]) for a, b in zip(t["title"].to_pylist(), t["text"].to_pylist())]
    docs = model.embed(texts, "doc", precision="fp32")
    qrels = load_qrels(corpus / "qrels" / "test.trec")
    queries = load_queries(corpus / "queries.tsv")
    qids = sorted(q for q in queries if q in qrels)
    qv = model.embed([queries[q] for q in qids], "query", precision="fp32")
    scores = qv @ docs.T
    run = {q: {pids[j]: float(scores[i, j]) for j in np.argsort(-scores[i])[:100]} for i, q in enumerate(qids)}
    return evaluate_run(run, qrels, EvalConfig(), measures=["nDCG@10"])["metrics"]["nDCG@10"]


def training_gflop(model_dir: str, pairs_path: Path, max_len: int, epochs: int, batch: int) -> float:
    """GFLOP of the training: 3 x one forward pass (forward + backward) over every query and answer
    token of every step's batch (unpadded: the useful work; bench/encode.py's encoder_gflop)."""
    from encode import encoder_gflop
    from transformers import AutoConfig, AutoTokenizer

    pairs = json.loads(pairs_path.read_text())
    tok = AutoTokenizer.from_pretrained(model_dir)
    n = len(pairs) // batch * batch  # the steps' examples (the last partial batch is dropped)
    lengths = [len(x) for x in tok([t for p in pairs[:n] for t in p], truncation=True, max_length=max_len)["input_ids"]]
    return 3 * epochs * encoder_gflop(AutoConfig.from_pretrained(model_dir), lengths)


def vs_st(args) -> None:
    """The whole-process comparison with sentence-transformers' trainer (see the module doc)."""
    from encode import gemm_peak

    from pipeline.models.loading import resolve_model_path
    from pipeline.models.precision import cpu_has_bf16

    tmp = Path(tempfile.mkdtemp(prefix="bench-train-st-"))
    model_dir = str(resolve_model_path("minilm"))
    corpus, pairs = faq_pairs(tmp)
    n_pairs = len(json.loads(pairs.read_text()))
    native = cpu_has_bf16()
    peak = gemm_peak(args.threads, ("fp32", "bf16") if native else ("fp32",))
    gflop = training_gflop(model_dir, pairs, args.max_len, args.epochs, args.batch)
    print(f"\nMiniLM fine-tuned on the FAQ's {n_pairs} training pairs, {args.epochs} epochs, batch {args.batch}, "
          f"max length {args.max_len}, lr {args.lr:g}, warmup 10%, gradient clip 1.0, cos/0.05, {args.threads} threads; "
          f"{gflop:,.0f} GFLOP of training; matmul peak fp32 {peak['fp32']:.0f} / bf16 {peak['bf16']:.0f} GFLOP/s; "
          f"native bf16: {'yes' if native else 'no'}", flush=True)
    rows = [("sentence-transformers trainer, fp32", "st", False)]
    if native:
        rows.append(("sentence-transformers trainer, bf16=True", "st", True))
    rows += [("pipeline train, train.amp=no (fp32)", "ours", "no"), ("pipeline train, default (train.amp=auto)", "ours", "auto")]
    if native:
        rows.append(("pipeline train, train.amp=bf16", "ours", "bf16"))
    results = []
    for label, kind, prec in rows:
        out = tmp / f"{kind}-{prec}"
        t0 = time.time()
        if kind == "st":
            cfg = {"threads": args.threads, "pairs": str(pairs), "model": model_dir, "max_len": args.max_len,
                   "epochs": args.epochs, "batch": args.batch, "lr": args.lr, "warmup": 0.1, "clip": 1.0, "bf16": prec,
                   "tau": 0.05, "out": str(out)}
            p = subprocess.run([sys.executable, "-c", ST_SCRIPT, json.dumps(cfg)], capture_output=True, text=True)
            wall = time.time() - t0
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            if not line:
                print(p.stdout[-2000:], p.stderr[-3000:])
                raise SystemExit(f"{label} failed")
            r = json.loads(line[0][7:])
            model, train_s, steps = str(out / "model"), r["train_seconds"], r["steps"]
        else:
            cmd = [sys.executable, "-m", "pipeline.cli", "train", "--config", "jobs/configs/dpr.yaml",
                   f"data.corpus={corpus}", "validation.dev_split=0", "loss.similarity=cos", "loss.temperature=0.05",
                   f"model.query_max_length={args.max_len}", f"model.doc_max_length={args.max_len}",
                   f"train.epochs={args.epochs}", f"train.batch_size={args.batch}", "train.num_workers=1",
                   f"train.torch_threads={args.threads}", f"optim.lr={args.lr}", "optim.warmup_ratio=0.1",
                   "optim.grad_clip=1.0", "train.checkpoint_every=0", "train.report_every=10", f"train.amp={prec}",
                   f"train.storage_path={out}", "train.name=run", "data.shuffle_window=1024"]
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
            wall = time.time() - t0
            if p.returncode != 0:
                print(p.stdout[-2000:], p.stderr[-3000:])
                raise SystemExit(f"{label} failed")
            summary = json.loads((out / "run" / "summary.json").read_text())
            model, train_s, steps = str(out / "run" / "model"), summary["time_split"]["training"], summary["steps"]
        ndcg = faq_ndcg(model, corpus)
        kind_peak = peak["bf16"] if prec in (True, "bf16") or (prec == "auto" and native) else peak["fp32"]
        results.append((label, wall, train_s, steps, ndcg, gflop / train_s, kind_peak))
        print(f"  {label:44s} wall {wall:6.1f} s  training {train_s:6.1f} s  {steps / train_s:5.2f} steps/s  "
              f"{steps * args.batch / train_s:6.1f} examples/s  {gflop / train_s:6.1f} GFLOP/s "
              f"({100 * gflop / train_s / kind_peak:3.0f}% of peak)  FAQ test nDCG@10 {ndcg:.4f}", flush=True)
    base = results[0][1]
    print("\nwhole-process wall time against sentence-transformers' fp32 trainer (higher is faster):")
    for label, wall, *_ in results:
        print(f"  {label:44s} {base / wall:5.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--qlen", type=int, default=32)
    ap.add_argument("--dlen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vs-st", action="store_true", help="whole-process comparison with sentence-transformers' trainer")
    ap.add_argument("--epochs", type=int, default=10, help="--vs-st: epochs over the FAQ's training pairs")
    ap.add_argument("--max-len", type=int, default=256, help="--vs-st: max tokens of queries and answers")
    ap.add_argument("--lr", type=float, default=2e-5, help="--vs-st: learning rate")
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--storage", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    print_cpu()  # the figures below depend on this CPU's ISA (bench/machine.py)
    from pipeline.runtime_env import setup_offline_env

    setup_offline_env()
    if args.vs_st:
        if args.batch == 16 and "--batch" not in " ".join(sys.argv):
            args.batch = 32
        if args.threads == 1 and "--threads" not in " ".join(sys.argv):
            args.threads = os.cpu_count() or 2
        vs_st(args)
        return
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
