"""Quality at the same budget: `pipeline train` (Ray Train, 1 worker) vs a plain PyTorch loop.

Both fine-tune the same model on the same training pairs for the same number of steps, with
the same batch size, learning rate, warmup, clipping and score function; the plain loop is
written independently (its own shuffling, torch AdamW, transformers' linear warmup schedule,
the loss functions called directly). Both models are evaluated the same way (encode the
corpus, exact inner-product search, ir-measures on the test qrels). They should agree within
noise for DPR and for DAR.

    python bench/train_quality.py                                  # bundled Python FAQ, MiniLM
    python bench/train_quality.py --beir /data/scifact --epochs 1 --batch 32 --lr 2e-5
"""

from __future__ import annotations

from machine import print_cpu  # bench/machine.py (run as python bench/<name>.py)

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")


def plain_loop(job, examples_dir: Path, steps: int) -> tuple[object, float]:
    import torch
    from transformers import get_linear_schedule_with_warmup

    from pipeline.losses import get_loss
    from pipeline.models import BiEncoder

    torch.manual_seed(job.train.seed)
    torch.set_num_threads(max(1, job.train.torch_threads or 2))
    from pipeline.data.training import read_examples_table

    rows = read_examples_table(examples_dir).to_pylist()
    model = BiEncoder.load(job.model).train()
    decay = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith("bias") and "LayerNorm" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and (n.endswith("bias") or "LayerNorm" in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": job.optim.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=job.optim.lr, eps=job.optim.eps)
    warm = job.optim.warmup_steps or int(job.optim.warmup_ratio * steps + 0.999999)
    sched = get_linear_schedule_with_warmup(opt, warm, steps)
    fn = get_loss(job.loss.name)
    B = job.train.batch_size
    rng = random.Random(job.train.seed)
    t0 = time.time()
    step = 0
    while step < steps:
        order = rows[:]
        rng.shuffle(order)
        for i in range(0, len(order) - B + 1, B):
            batch = order[i:i + B]
            q_tok = model.tokenize([r["query"] for r in batch], "query")
            d_tok = model.tokenize([r["positive"] for r in batch], "doc")
            q, d = model(q_tok, d_tok)
            loss, _ = fn(q, d, torch.arange(B), job.loss, training=True, n_pos=B)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), job.optim.grad_clip)
            opt.step()
            sched.step()
            step += 1
            if step >= steps:
                break
    return model.eval(), time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--beir", help="a BEIR folder with qrels/train.tsv and qrels/test.tsv (default: the bundled FAQ)")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--methods", default="dpr,dar")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--qlen", type=int, default=64)
    ap.add_argument("--dlen", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print_cpu()  # the figures below depend on this CPU's ISA (bench/machine.py)

    import ray

    from pipeline.config import ModelConfig
    from pipeline.data.ingest import ingest
    from pipeline.models import BiEncoder
    from pipeline.data.bundled import python_faq_dir
    from pipeline.index.validate import Validator
    from pipeline.runtime_env import setup_offline_env
    from pipeline.train.config import load_train_config
    from pipeline.train.trainer import resolve_job, train

    setup_offline_env()
    work = Path(tempfile.mkdtemp(prefix="bench-quality-"))
    corpus = work / "corpus"
    ingest([Path(args.beir) if args.beir else python_faq_dir()], "beir", corpus, progress=False)
    ray.init(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1", _node_ip_address="127.0.0.1",
             log_to_driver=False)
    validator = Validator(str(corpus), qrels=str(corpus / "qrels" / "test.trec"), batch_size=64)
    rows = []
    for method in args.methods.split(","):
        job = resolve_job(load_train_config(None, [
            f"model.name_or_path={args.model}", f"model.query_max_length={args.qlen}",
            f"model.doc_max_length={args.dlen}", f"data.corpus={corpus}", f"loss.name={method}",
            "loss.similarity=cos", "loss.temperature=0.05", f"optim.lr={args.lr}", f"train.epochs={args.epochs}",
            f"train.batch_size={args.batch}", "train.num_workers=1", "train.cpus_per_worker=2", "train.torch_threads=2",
            f"train.seed={args.seed}", f"train.storage_path={work / 'runs'}", f"train.name={method}",
            "data.shuffle_window=100000"]), progress=False)
        s = train(job, progress=False)
        ray_model = BiEncoder.load(ModelConfig(name_or_path=s["model"], query_max_length=args.qlen,
                                               doc_max_length=args.dlen)).eval()
        m_ray = validator(ray_model, device="cpu")
        plain_model, plain_s = plain_loop(job, work / "runs" / method / "examples", s["steps"])
        m_plain = validator(plain_model, device="cpu")
        rows.append((method, s["steps"], m_ray, s["final_metrics"]["train_seconds"], m_plain, plain_s))
    zs = validator(BiEncoder.load(ModelConfig(name_or_path=args.model, query_max_length=args.qlen,
                                              doc_max_length=args.dlen)).eval(), device="cpu")
    keys = ["val_RR@10", "val_nDCG@10", "val_R@100"]
    print(f"\ncorpus {args.beir or 'bundled Python FAQ'}, model {args.model}, batch {args.batch}, lr {args.lr}, "
          f"{args.epochs} epoch(s), cos/0.05, seed {args.seed}")
    print(f"{'run':28s} " + " ".join(f"{k[4:]:>9s}" for k in keys) + "   train s")
    print(f"{'zero-shot':28s} " + " ".join(f"{zs[k]:9.4f}" for k in keys))
    for method, steps, m_ray, t_ray, m_plain, t_plain in rows:
        print(f"{method + ' pipeline train':28s} " + " ".join(f"{m_ray[k]:9.4f}" for k in keys) + f"   {t_ray:6.1f}")
        print(f"{method + ' plain loop':28s} " + " ".join(f"{m_plain[k]:9.4f}" for k in keys) + f"   {t_plain:6.1f}")
        print(f"{'  difference':28s} " + " ".join(f"{m_ray[k] - m_plain[k]:+9.4f}" for k in keys) + f"   ({steps} steps)")
    ray.shutdown()


if __name__ == "__main__":
    main()
