"""The statistics of an effect cell: a method against its baseline over seeds and queries (pure functions).

Input: per-query values of one measure, `{seed: {qid: value}}` for the method and for the baseline (a
baseline without seeds, e.g. the zero-shot model, is one run: `{None: {qid: value}}`, paired with every seed).
Only queries every run scored are used.

- per seed: the difference of the means over queries, d_s = mean_q(method_s,q - baseline_s,q);
- over seeds: mean and standard deviation of d_s, and the 95 % interval mean ± t(0.975, n-1) sd/√n
  (training randomness on this test set; n seeds);
- over queries: each query's difference averaged over seeds, D_q, tested by Fisher's paired randomization
  test (sign flips, the project's `compare` test) and Student's paired t-test (test-set sampling);
- the smallest effect the run could have detected (two-sided 5 %, power 80 %): over seeds
  (t(0.975, n-1) + t(0.80, n-1)) sd/√n, over queries (z(0.975) + z(0.80)) sd(D_q)/√Q; the larger is the one
  the verdict needs;
- the verdict, given the direction the method's paper claims (+1 or -1): "holds beyond noise" when the
  interval excludes 0 on that side and the randomization test gives p < 0.05; "opposite beyond noise" when both
  say the other side; "no difference" when the method scored every query exactly as its baseline did in every
  seed (a method that changes nothing, e.g. an arm that trains as its baseline does); else "inconclusive" (fewer
  than 2 seeds always are);
- over a dataset's comparisons (the family of claims one table makes, each part apart): Holm's step-down
  adjustment of the randomization test's p-values (`holm`), and the verdict again with the adjusted p
  (`adjust`): a row's `verdict` is the adjusted one, `verdict_raw` the row's alone. Holm controls the chance
  that any comparison of the table reads "beyond noise" when no method does anything (the family-wise error) at
  α, without assuming the tests independent; about 2 % of rows of a no-op method would otherwise read "holds
  beyond noise" by chance, and a matrix holds dozens of verdicts;
- the randomization test's Monte Carlo error: its p is estimated from `resamples` sign flips, with standard
  error √(p(1 - p)/resamples); a p within three of them of α is marked `p_near_alpha` (its verdict could
  change with another draw of the flips).
"""

from __future__ import annotations

import math

import numpy as np

ALPHA = 0.05
POWER = 0.80


def common_queries(*runs: dict) -> list[str]:
    """The queries scored in every run of every `{seed: {qid: value}}` given."""
    sets = [set(per) for seeds in runs for per in seeds.values()]
    return sorted(set.intersection(*sets)) if sets else []


def _matrix(seeds: dict, order: list, queries: list[str]) -> np.ndarray:
    return np.array([[seeds[s][q] for q in queries] for s in order], dtype=np.float64)


def effect(method: dict, baseline: dict, direction: int = 1, resamples: int = 10_000, seed: int = 0) -> dict:
    """The effect of `method` over `baseline` (see the module doc). Seeds are paired by value; a baseline
    with the single key None pairs with every seed of the method."""
    from scipy import stats

    from ..eval.compare import paired_pvalue

    if set(baseline) == {None}:
        seeds = sorted(method)
        base_of = {s: None for s in seeds}
    else:
        seeds = sorted(set(method) & set(baseline))
        base_of = {s: s for s in seeds}
    if not seeds:
        return {"seeds": [], "n_seeds": 0, "queries": 0, "verdict": "not run"}
    queries = common_queries({s: method[s] for s in seeds}, {s: baseline[base_of[s]] for s in seeds})
    if not queries:
        return {"seeds": seeds, "n_seeds": len(seeds), "queries": 0, "verdict": "no common queries"}
    m = _matrix(method, seeds, queries)
    b = np.array([[baseline[base_of[s]][q] for q in queries] for s in seeds], dtype=np.float64)
    per_seed = (m - b).mean(axis=1)
    n = len(seeds)
    mean = float(per_seed.mean())
    sd = float(per_seed.std(ddof=1)) if n > 1 else None
    out = {"seeds": seeds, "n_seeds": n, "queries": len(queries),
           "method_mean": float(m.mean()), "baseline_mean": float(b.mean()),
           "method_per_seed": [float(x) for x in m.mean(axis=1)],
           "baseline_per_seed": [float(x) for x in b.mean(axis=1)],
           "per_seed": [float(x) for x in per_seed], "difference": mean, "sd": sd}
    if n > 1:
        half = float(stats.t.ppf(1 - ALPHA / 2, n - 1)) * sd / math.sqrt(n)
        out["interval"] = [mean - half, mean + half]
        out["mde_seeds"] = float(stats.t.ppf(1 - ALPHA / 2, n - 1) + stats.t.ppf(POWER, n - 1)) * sd / math.sqrt(n)
    else:
        out["interval"] = None
        out["mde_seeds"] = None
    dq = (m - b).mean(axis=0)  # each query's difference, averaged over seeds
    out["p_randomization"] = paired_pvalue("randomization", m.mean(axis=0), b.mean(axis=0), resamples, seed)
    out["p_ttest"] = paired_pvalue("ttest", m.mean(axis=0), b.mean(axis=0))
    sd_q = float(dq.std(ddof=1)) if len(dq) > 1 else 0.0
    out["mde_queries"] = float(stats.norm.ppf(1 - ALPHA / 2) + stats.norm.ppf(POWER)) * sd_q / math.sqrt(len(dq))
    mdes = [x for x in (out["mde_seeds"], out["mde_queries"]) if x is not None]
    out["mde"] = max(mdes) if mdes else None
    out["identical"] = bool(np.array_equal(m, b))
    out["direction"] = direction
    out["resamples"] = resamples
    p = out["p_randomization"]
    if p is not None:
        out["p_mc_se"] = math.sqrt(p * (1 - p) / resamples)
        out["p_near_alpha"] = bool(abs(p - ALPHA) < 3 * out["p_mc_se"])
    out["verdict"] = verdict(out, direction)
    return out


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjusted p-values of a family {name: p}: sorted ascending, the i-th of m (from 1) is
    multiplied by m - i + 1, made non-decreasing and capped at 1 (Holm 1979)."""
    order = sorted(pvalues, key=lambda k: (pvalues[k], str(k)))
    m, out, running = len(order), {}, 0.0
    for i, k in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[k]))
        out[k] = running
    return out


def adjust(effects: dict) -> None:
    """Holm over a family of effects {name: effect()} (one dataset's comparisons on one part): each gets
    `p_holm`, `family_size`, `verdict_raw` (its verdict alone) and `verdict` judged with `p_holm`. Effects
    without a p-value (no seeds, no common queries) are not part of the family."""
    tested = {k: e["p_randomization"] for k, e in effects.items() if e.get("p_randomization") is not None}
    adjusted = holm(tested)
    for k, e in effects.items():
        if k not in adjusted:
            continue
        e["p_holm"] = adjusted[k]
        e["family_size"] = len(adjusted)
        e["verdict_raw"] = verdict(e, e.get("direction", 1))
        e["verdict"] = verdict(e, e.get("direction", 1), "p_holm")


def verdict(e: dict, direction: int, p_key: str = "p_randomization") -> str:
    """'holds beyond noise', 'opposite beyond noise', 'no difference' or 'inconclusive' (see the module doc),
    judged with the p-value under `p_key` (the raw one, or Holm's `p_holm`)."""
    if e.get("n_seeds", 0) < 2 or e.get("interval") is None:
        return "inconclusive"
    if e.get("identical"):
        return "no difference"
    lo, hi = e["interval"]
    p = e.get(p_key)
    significant = p is not None and p < ALPHA
    if significant and ((direction > 0 and lo > 0) or (direction < 0 and hi < 0)):
        return "holds beyond noise"
    if significant and ((direction > 0 and hi < 0) or (direction < 0 and lo > 0)):
        return "opposite beyond noise"
    return "inconclusive"
