"""RCL benchmarks (one local Ray for the whole script).

1. Concurrency (`--part concurrency`, tiny random BERT): stage 1 with N entropy models run side by
   side (one Ray Train run each, CPUs shared) vs the same N runs one after another, in one run of
   this script: wall time of each, same steps, no early stop.
2. Quality (`--part faq`, MiniLM on the bundled Python FAQ, k folds): per fold, RCL (entropy
   models + regulators, final model from the base) vs the plain contrastive fine-tune (eq. 1)
   with the same final-model budget (same steps, batch, lr, seed), both scored on the held-out
   fold (top-1/3/5, MAP), the entropy models alone too (paper Table 5: below the base), and the
   anisotropy of every model.

    flock /tmp/ray-tests.lock .venv/bin/python bench/rcl.py --part concurrency --n 4 --steps 30
    flock /tmp/ray-tests.lock .venv/bin/python bench/rcl.py --part faq --folds 5 --lambdas 0.01,0.02 --epochs 2
"""

from __future__ import annotations

from machine import print_cpu  # bench/machine.py (run as python bench/<name>.py)

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")

from pipeline.runtime_env import setup_offline_env  # noqa: E402

setup_offline_env()


def _ingest(work: Path) -> Path:
    from pipeline.data.ingest import ingest
    from pipeline.data.manifest import MANIFEST_NAME
    from pipeline.data.bundled import python_faq_dir

    corpus = work / "corpus"
    if not (corpus / MANIFEST_NAME).exists():
        ingest([python_faq_dir()], "beir", corpus, overwrite=True, progress=False)
    return corpus


def concurrency(args, work: Path) -> dict:
    from pipeline.models.tiny import build_tiny_bert
    from pipeline.recipes.rcl import run_rcl
    from pipeline.train.config import load_train_config

    corpus = _ingest(work)
    tiny = work / "tiny_bert"
    if not (tiny / "config.json").exists():
        build_tiny_bert(tiny)
    lams = ",".join(f"{0.01 * (i + 1):g}" for i in range(args.n))
    out = {}
    for mode in ("concurrent", "sequential"):
        job = load_train_config(None, [
            "loss.name=rcl", "loss.similarity=cos", f"model.name_or_path={tiny}", "model.pooling=mean",
            "model.query_max_length=32", "model.doc_max_length=64", f"data.corpus={corpus}",
            "train.num_workers=1", f"train.cpus_per_worker={args.cpus}", "train.batch_size=8", "train.max_steps=2",
            f"train.storage_path={work / 'runs'}", f"train.name={mode}-{time.time_ns()}", "train.report_every=10",
            "optim.lr=1e-4", f"validation.corpus={corpus}", "rcl.dev_split=0.15",
            f"rcl.entropy_lambdas=[{lams}]", f"rcl.entropy_max_steps={args.steps}", f"rcl.eval_every={args.steps}",
            "rcl.patience=100", f"rcl.concurrent={'true' if mode == 'concurrent' else 'false'}",
            "rcl.anisotropy_sentences=0"])
        rec = run_rcl(job, progress=False)
        out[mode] = rec["stage1_wall_seconds"]
        print(f"[bench] stage 1, {args.n} entropy models x {args.steps} steps, {mode}: {out[mode]:.1f}s", flush=True)
    out["speedup"] = round(out["sequential"] / out["concurrent"], 2)
    out.update(n=args.n, steps=args.steps, cpus_per_run_sequential=args.cpus)
    print(f"[bench] concurrent vs sequential: {out['speedup']:.2f}x", flush=True)
    return out


def faq(args, work: Path) -> dict:
    import numpy as np

    from pipeline.eval.faq import anisotropy, faq_metrics, kfold, load_faq
    from pipeline.models import BiEncoder
    from pipeline.recipes.rcl import run_rcl
    from pipeline.train.config import load_train_config

    corpus = _ingest(work)
    queries, answers, qrels = load_faq()
    folds = kfold(qrels, args.folds, args.seed)
    sentences = list(queries.values()) + list(answers.values())
    base_cfg = load_train_config(REPO / "jobs" / "configs" / "rcl.yaml", []).model
    cache: dict[str, dict] = {}

    def score(path, test) -> dict:
        m = BiEncoder.load(replace(base_cfg, name_or_path=str(path)))
        r = faq_metrics(m, queries, answers, qrels, test)
        r["anisotropy"] = anisotropy(m, sentences, n=200, seed=0)
        return r

    rows = []
    for i, test in enumerate(folds[: args.max_folds or None]):
        train_q = sorted(q for j, f in enumerate(folds) if j != i for q in f)
        qrels_file = work / f"fold{i}_train.trec"
        qrels_file.write_text("".join(f"{q} 0 {d} {r}\n" for q in train_q for d, r in sorted(qrels[q].items())))
        common = [f"data.corpus={corpus}", f"data.qrels={qrels_file}", f"validation.corpus={corpus}",
                  f"train.storage_path={work / 'runs'}", f"train.epochs={args.epochs}", f"train.seed={args.seed}",
                  f"rcl.entropy_lambdas=[{args.lambdas}]", f"rcl.entropy_init={args.init}",
                  f"rcl.entropy_max_steps={args.entropy_steps}", "rcl.anisotropy_sentences=0",
                  "train.num_workers=1", "train.cpus_per_worker=1.0"]
        t0 = time.time()
        rcl = run_rcl(load_train_config(REPO / "jobs" / "configs" / "rcl.yaml",
                                        common + [f"train.name=fold{i}-rcl"]), progress=args.verbose)
        t_rcl = time.time() - t0
        t0 = time.time()
        plain = run_rcl(load_train_config(REPO / "jobs" / "configs" / "rcl.yaml",
                                          common + [f"train.name=fold{i}-plain", "rcl.regulators=false",
                                                    "rcl.entropy_init=base"]), progress=args.verbose)
        t_plain = time.time() - t0
        row = {"fold": i, "test_queries": len(test), "base": cache.setdefault(f"base{i}", score("minilm", test)),
               "plain": score(plain["final_model"], test), "rcl": score(rcl["final_model"], test),
               "entropy": {k: score(p, test) for k, p in rcl["entropy_models"].items()},
               "wall_seconds": {"rcl": round(t_rcl, 1), "plain": round(t_plain, 1)},
               "steps_final": rcl["stages"]["final"]["steps"], "steps_plain": plain["stages"]["final"]["steps"]}
        if "initial" in rcl["stages"]:
            row["initial"] = score(rcl["stages"]["initial"]["model"], test)
        rows.append(row)
        print(f"[bench] fold {i}: MAP base {row['base']['MAP']:.4f} plain {row['plain']['MAP']:.4f} "
              f"rcl {row['rcl']['MAP']:.4f}; entropy "
              + ", ".join(f"{k} {v['MAP']:.4f}" for k, v in row["entropy"].items()), flush=True)

    def mean(key, metric):
        return float(np.mean([r[key][metric] for r in rows]))

    summary = {m: {k: round(mean(k, m), 4) for k in ("base", "plain", "rcl")}
               for m in ("top1", "top3", "top5", "MAP", "anisotropy")}
    for m in ("MAP", "anisotropy"):
        for name in rows[0]["entropy"]:
            summary[m][name] = round(float(np.mean([r["entropy"][name][m] for r in rows])), 4)
    print("\n| model | top-1 | top-3 | top-5 | MAP | anisotropy |\n|---|---|---|---|---|---|")
    for k in ("base", "plain", "rcl"):
        print(f"| {k} | " + " | ".join(f"{summary[m][k]:.4f}" for m in ("top1", "top3", "top5", "MAP", "anisotropy")) + " |")
    for name in rows[0]["entropy"]:
        print(f"| {name} (alone) | | | | {summary['MAP'][name]:.4f} | {summary['anisotropy'][name]:.4f} |")
    return {"folds": rows, "summary": summary, "settings": vars(args)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("concurrency", "faq", "both"), default="concurrency")
    ap.add_argument("--n", type=int, default=4, help="concurrency: entropy models")
    ap.add_argument("--steps", type=int, default=30, help="concurrency: steps per entropy model")
    ap.add_argument("--cpus", type=float, default=2.0, help="concurrency: CPUs (and torch threads) of a run when "
                                                            "sequential; concurrent runs share them")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--max-folds", type=int, default=0, help="faq: run only the first folds (0 = all)")
    ap.add_argument("--lambdas", default="0.01,0.02,0.03,0.04")
    ap.add_argument("--init", choices=("base", "initial"), default="initial")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--entropy-steps", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", help="work folder (default: a temporary one)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    print_cpu()  # the figures below depend on this CPU's ISA (bench/machine.py)
    from pipeline.ray_runtime import init_ray
    from pipeline.config import RayConfig

    init_ray(RayConfig(dashboard=True))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        res = {}
        if args.part in ("concurrency", "both"):
            res["concurrency"] = concurrency(args, work)
        if args.part in ("faq", "both"):
            res["faq"] = faq(args, work)
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
