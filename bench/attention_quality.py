"""Does `train.attention=threshold-dropout` train as well as transformers' SDPA? Seeds side by side.

`pipeline train` (DPR, cos/0.05, the settings of `bench/train.py --vs-st`) fine-tunes MiniLM on a BEIR
folder's training pairs once per seed with `train.attention=threshold-dropout` (the CPU default) and once
with `train.attention=sdpa` (torch's per-element dropout draw), everything else equal, in the precision
`train.amp=auto` picks on this CPU. Each model's test nDCG@10 per query (torch fp32, exact search, as every
row of bench/train.py is scored), then the effect of threshold-dropout over SDPA as the effects cells compute
it (pipeline/effects/stats.py: per-seed differences, their mean, sd and 95 % interval, a paired randomization
test over queries, the smallest difference the run could have detected), and each arm's wall time.

A speed lever must not change what is learned: the figure to read is whether the interval holds 0.

    python bench/attention_quality.py --corpus ~/data/nfcorpus --max-pairs 919 --seeds 0,1,2
"""

from __future__ import annotations

from machine import print_cpu, scratch  # bench/machine.py (run as python bench/<name>.py)

import argparse
import json
import statistics
from pathlib import Path

ARMS = ("threshold-dropout", "sdpa")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="a BEIR folder with qrels/train.tsv and qrels/test.tsv")
    ap.add_argument("--seeds", default="0,1,2", help="train.seed values, comma-separated (at least 2)")
    ap.add_argument("--max-pairs", type=int, default=0, help="only the first N judgements of qrels/train.tsv")
    ap.add_argument("--positives-per-query", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if len(seeds) < 2:
        raise SystemExit("error: --seeds needs at least 2 seeds (an interval over one seed is none)")
    print_cpu()
    from pipeline.runtime_env import setup_offline_env

    setup_offline_env()
    from pipeline.effects.stats import effect
    from pipeline.models.loading import resolve_model_path
    from pipeline.models.precision import cpu_has_bf16
    from encode import gemm_peak
    from train import beir_subset, check_vs_st_args, training_gflop, training_set, vs_st_row

    args.sets, args.long_tokens = "long", "200,256"
    check_vs_st_args(args)
    tmp = scratch("bench-attention-quality-")
    model_dir = str(resolve_model_path("minilm"))
    native = cpu_has_bf16()
    peak = gemm_peak(args.threads, ("fp32", "bf16") if native else ("fp32",))
    src = Path(args.corpus)
    if args.max_pairs:
        src = beir_subset(src, tmp / "subset", args.max_pairs, args.positives_per_query)
    corpus, pairs = training_set(src, tmp / "set", args.positives_per_query)
    gflop = training_gflop(model_dir, pairs, args.max_len, args.epochs, args.batch)
    print(f"\nMiniLM, `pipeline train` DPR cos/0.05, {len(json.loads(pairs.read_text()))} training pairs of "
          f"{args.corpus}, {args.epochs} epoch(s), batch {args.batch}, length {args.max_len}, {args.threads} "
          f"threads, train.amp=auto ({'bf16' if native else 'fp32'} here); seeds {seeds}", flush=True)
    per_query: dict[str, dict] = {a: {} for a in ARMS}
    walls: dict[str, list[float]] = {a: [] for a in ARMS}
    for seed in seeds:
        for arm in ARMS:
            r = vs_st_row(args, f"seed {seed}, train.attention={arm}", "ours", "auto", tmp, corpus, pairs,
                          args.positives_per_query, model_dir, gflop, peak, native,
                          (f"train.seed={seed}", f"train.attention={arm}"))
            per_query[arm][seed], walls[arm] = r["per_query"], walls[arm] + [r["wall"]]
    e = effect(per_query["threshold-dropout"], per_query["sdpa"])
    print(f"\nthreshold-dropout against sdpa over {len(seeds)} seeds and {e['queries']} test queries:")
    for arm in ARMS:
        means = [statistics.fmean(per_query[arm][s].values()) for s in seeds]
        print(f"  {arm:18s} nDCG@10 {statistics.fmean(means):.4f} (sd {statistics.stdev(means):.4f}; per seed "
              + ", ".join(f"{m:.4f}" for m in means) + f")  wall {statistics.fmean(walls[arm]):.1f} s a run")
    lo, hi = e["interval"]
    # the effects cells' rule: beyond noise only when the seeds' interval excludes 0 and the queries' test agrees
    beyond = (lo > 0 or hi < 0) and e["p_randomization"] < 0.05
    print(f"  difference {e['difference']:+.4f}, 95% interval over seeds [{lo:+.4f}, {hi:+.4f}] ("
          + ("excludes 0" if lo > 0 or hi < 0 else "holds 0") + f"), paired randomization p over queries "
          f"{e['p_randomization']:.3f}, smallest detectable {e['mde']:.4f}: "
          + ("a difference beyond noise" if beyond else "no difference beyond noise (inconclusive at this many seeds)"))
    print(f"  wall time, sdpa / threshold-dropout: {statistics.fmean(walls['sdpa']) / statistics.fmean(walls['threshold-dropout']):.2f}x")


if __name__ == "__main__":
    main()
