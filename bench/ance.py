"""ANCE's concurrency, measured in one run: trainer with the index refresher running vs without.

Prints:
  - trainer steps/s with the refresher running beside it vs alone (same config, same steps);
  - the fraction of the trainer's wall time spent loading new negatives versions after the
    first one (the trainer never waits for the refresher; this is the cost of switching);
  - refresh latency per version and per 1,000 passages (the refresher's own clock);
  - versions published, versions used, staleness at the end.

    python bench/ance.py                       # tiny random BERT, bundled FAQ (176 passages), CPU
    python bench/ance.py --model minilm --steps 60

On this 2-core machine the trainer and the refresher each get one core, so "with refresher"
includes CPU contention that separate GPUs would not have; read the ratio as a lower bound.
"""

from __future__ import annotations

from machine import print_cpu, scratch  # bench/machine.py (run as python bench/<name>.py)

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="'tiny' (random BERT), 'minilm', or a model directory")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--refresh-every", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    print_cpu()  # the figures below depend on this CPU's ISA (bench/machine.py)

    import ray

    from pipeline.recipes.ance import run_ance
    from pipeline.data.ingest import ingest
    from pipeline.data.bundled import python_faq_dir
    from pipeline.models.tiny import build_tiny_bert
    from pipeline.runtime_env import setup_offline_env
    from pipeline.train.config import load_train_config

    setup_offline_env()
    work = scratch("bench-ance-")
    model = str(build_tiny_bert(work / "tiny")) if args.model == "tiny" else args.model
    corpus = work / "corpus"
    ingest([python_faq_dir()], "beir", corpus, progress=False)
    ray.init(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1", _node_ip_address="127.0.0.1",
             log_to_driver=False)

    def job(name: str, refresher: bool):
        return load_train_config(None, [
            f"model.name_or_path={model}", "model.query_max_length=32", "model.doc_max_length=128",
            f"data.corpus={corpus}", "data.hard_negatives=1", "loss.name=ance", "loss.in_batch_negatives=true",
            "train.num_workers=1", "train.cpus_per_worker=1", f"train.batch_size={args.batch}",
            f"train.max_steps={args.steps}", f"train.report_every={args.refresh_every}",
            "train.negatives_poll_every=5", f"train.storage_path={work / 'runs'}", f"train.name={name}",
            f"ance.refresh_every={args.refresh_every}", "ance.top_k=50", "ance.negatives=10", "ance.cpus=1",
            "ance.poll_seconds=0.2", f"ance.dev_queries={corpus / 'queries.tsv'}",
            f"ance.dev_qrels={corpus / 'qrels' / 'test.trec'}",
            f"ance.start_refresher={'true' if refresher else 'false'}"])

    alone = run_ance(job("alone", False), progress=False)
    both = run_ance(job("with_refresher", True), progress=False)

    def rate(s):
        return s["final_metrics"]["train_steps_run"] / s["final_metrics"]["train_seconds"]

    used = both["negatives_versions"]
    after_first = [u for u in used[1:]]
    wait = sum(u.get("load_seconds") or 0 for u in after_first)
    status = (both.get("refresher") or {}).get("status") or {}
    versions = status.get("versions", [])
    passages = 176
    print(json.dumps({"steps": args.steps, "model": args.model}, indent=None))
    print(f"trainer alone:           {rate(alone):6.2f} steps/s")
    print(f"trainer + refresher:     {rate(both):6.2f} steps/s   ratio {rate(both) / rate(alone):.3f}x "
          "(one core each on this machine; target >= 0.95x with separate devices)")
    print(f"switching cost after the first version: {wait:.3f}s of {both['final_metrics']['train_seconds']:.1f}s "
          f"= {100 * wait / both['final_metrics']['train_seconds']:.2f}% of trainer wall time (target < 1%)")
    if versions:
        lat = [v["seconds"] for v in versions]
        print(f"refresh latency: {sum(lat) / len(lat):.2f}s per version (min {min(lat):.2f}, max {max(lat):.2f}), "
              f"{1000 * sum(lat) / len(lat) / passages:.2f}s per 1,000 passages; {len(versions)} versions published, "
              f"{status.get('skipped_checkpoints', 0)} stale checkpoints skipped")
    print("versions used by the trainer: " + ", ".join(
        f"v{u['version']} (ckpt {u['checkpoint_step']}) from step {u['at_step']}" for u in used))
    print(f"final staleness: {both['final_metrics'].get('negatives_staleness')} steps")
    ray.shutdown()


if __name__ == "__main__":
    main()
