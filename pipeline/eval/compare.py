"""Several runs side by side, with paired significance tests against the first (the baseline).

Every run is scored per query with the same ir-measures measures as `pipeline evaluate`,
on the queries that are judged and answered by every run (a paired test needs the same
queries on both sides; how many each run loses to that is reported). For each measure
and each run after the first: the mean, the difference to the baseline, and the p-value
of a two-sided paired test over the per-query values:

* `ttest`: Student's paired t-test, `scipy.stats.ttest_rel`;
* `randomization`: Fisher's paired randomization (permutation) test of the mean
  difference, `scipy.stats.permutation_test(permutation_type="samples")` - exact when
  2^queries <= resamples, else `resamples` random sign flips from a fixed seed.

p < alpha (0.05) is marked `*`. There is no correction for multiple comparisons.
Runs over different corpora (the `corpus_fingerprint` of `<run>.meta.json`) are refused
unless `allow_mixed`, which puts a warning above the table.

Library use (the demo's comparison):

    res = compare_runs({"zero-shot": "a/run.trec", "DPR": "b/run.trec"}, "qrels/test.trec",
                       measures="RR@10 nDCG@10 R@10", test="both", cfg=cfg.eval)
    print(format_comparison(res, markdown=True))
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..config import EvalConfig
from ..data.manifest import check_comparable
from ..data.readers import load_qrels
from ..errors import PipelineError
from .metrics import aggregate_per_query, check_overlap, measures_for, per_query_values
from .runs import read_run
from .report import render_table

TESTS = {
    "ttest": ("t", "paired t-test (scipy.stats.ttest_rel)"),
    "randomization": ("rand", "paired randomization test (scipy.stats.permutation_test)"),
}
TEST_CHOICES = ("ttest", "randomization", "both")


def _tests(test: str) -> list[str]:
    if test == "both":
        return ["ttest", "randomization"]
    if test not in TESTS:
        raise PipelineError(f"significance test {test!r} is not one of {list(TEST_CHOICES)}")
    return [test]


def run_corpus(run_path: str | Path) -> dict | None:
    """The corpus identity recorded beside a run by `pipeline retrieve` (`<run>.meta.json`), or None."""
    meta_path = Path(str(run_path) + ".meta.json")
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PipelineError(f"{meta_path}: unreadable run metadata ({e})") from None
    if not isinstance(meta, dict):
        raise PipelineError(f"{meta_path}: run metadata is not a JSON object")
    return {"fingerprint": meta.get("corpus_fingerprint"), "variant": meta.get("variant"),
            "title_join": meta.get("title_join")}


def paired_pvalue(test: str, b: np.ndarray, a: np.ndarray, resamples: int = 10_000, seed: int = 0) -> float | None:
    """Two-sided p-value of a paired test of b against a (None when it is undefined: < 2 queries)."""
    diff = b - a
    if len(diff) < 2:
        return None
    if not np.any(diff):  # identical per-query values: no evidence of a difference
        return 1.0
    import scipy.stats as st

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # constant differences: t is infinite, p = 0
        if test == "ttest":
            p = st.ttest_rel(b, a).pvalue
        elif test == "randomization":
            batch = max(1, int(2e7 // len(diff)))  # bound the resampled matrix to ~160 MB
            p = st.permutation_test((b, a), lambda x, y, axis: np.mean(x - y, axis=axis), vectorized=True,
                                    permutation_type="samples", n_resamples=resamples, batch=batch,
                                    alternative="two-sided", random_state=seed).pvalue
        else:
            raise PipelineError(f"significance test {test!r} is not one of {list(TESTS)}")
    p = float(p)
    return None if math.isnan(p) else min(1.0, p)


def compare_runs(runs: dict[str, str | Path | dict], qrels: str | Path | dict, measures: str | Iterable[str] | None = None,
                 test: str = "ttest", *, cfg: EvalConfig | None = None, corpora: dict[str, dict | None] | None = None,
                 allow_mixed: bool = False, resamples: int = 10_000, seed: int = 0, alpha: float = 0.05) -> dict:
    """Score `runs` (label -> TREC run path, or {qid: {docid: score}}) and test each against the first.

    `measures` (ir-measures strings) default to `cfg.measures`, then to evaluate's default set.
    `corpora` (label -> {"fingerprint", "variant", ...}) overrides what `<run>.meta.json` says.
    Returns a dict (JSON-ready) for `format_comparison`.
    """
    cfg = cfg or EvalConfig()
    if not runs:
        raise PipelineError("compare needs at least one run")
    if resamples < 1:
        raise PipelineError(f"resamples must be >= 1, got {resamples}")
    tests = _tests(test)
    ms = measures_for(cfg, measures)
    qrels_name = str(qrels) if not isinstance(qrels, dict) else "the qrels"
    qrels_d = qrels if isinstance(qrels, dict) else load_qrels(qrels)

    # corpus identity: refuse runs over different corpora before reading them
    metas = {label: (corpora or {}).get(label) or (run_corpus(r) if not isinstance(r, dict) else None)
             for label, r in runs.items()}
    known = {label: m for label, m in metas.items() if m and m.get("fingerprint")}
    warning = check_comparable(known, allow_mixed)
    unknown = [label for label in runs if label not in known]
    notes = []
    if unknown and len(runs) > 1:
        notes.append(f"corpus unknown for {', '.join(unknown)} (no <run>.meta.json): "
                     "cannot check that every run retrieved from the same corpus")

    loaded: dict[str, dict] = {}
    judged_in: dict[str, set[str]] = {}
    for label, r in runs.items():
        run = r if isinstance(r, dict) else read_run(r)
        if cfg.ignore_identical_ids:
            run = {q: {d: s for d, s in docs.items() if d != q} for q, docs in run.items()}
        judged_in[label] = check_overlap(run, qrels_d, label if isinstance(r, dict) else str(r), qrels_name)
        loaded[label] = run
    common = set.intersection(*judged_in.values())
    if not common:
        raise PipelineError("the runs share no judged query: " + "; ".join(
            f"{label}: {len(q)} judged queries" for label, q in judged_in.items()))
    dropped = {label: len(q - common) for label, q in judged_in.items() if len(q) > len(common)}
    if dropped:
        notes.append("paired over the " + str(len(common)) + " judged queries every run answers; left out: "
                     + ", ".join(f"{n} of {label}" for label, n in dropped.items()))

    qids = sorted(common)
    values: dict[str, dict[str, np.ndarray]] = {}
    aggregates: dict[str, dict[str, float]] = {}
    for label, run in loaded.items():
        per = per_query_values(run, qrels_d, ms, common)
        aggregates[label] = aggregate_per_query(per, ms)
        for m in ms:
            missing = [q for q in qids if m not in per[q]]
            if missing:
                raise PipelineError(f"{label}: ir-measures gives no per-query value of {m} for {len(missing)} queries "
                                    f"(e.g. {missing[0]!r}), so it cannot be tested pairwise; leave {m} out")
        values[label] = {m: np.array([per[q][m] for q in qids], dtype=np.float64) for m in ms}
    labels = list(runs)
    base = labels[0]
    out_runs: dict[str, dict] = {}
    for label in labels:
        row: dict = {"run": str(runs[label]) if not isinstance(runs[label], dict) else None,
                     "corpus": metas[label],
                     "metrics": aggregates[label]}
        if label != base:
            vs = {}
            for m in ms:
                entry = {"delta": row["metrics"][m] - out_runs[base]["metrics"][m]}
                for t in tests:
                    p = paired_pvalue(t, values[label][m], values[base][m], resamples, seed)
                    entry[f"p_{t}"] = p
                    entry[f"significant_{t}"] = p is not None and p < alpha
                vs[m] = entry
            row["vs_baseline"] = vs
        out_runs[label] = row
    return {
        "baseline": base,
        "measures": list(ms),
        "tests": tests,
        "test_names": {t: TESTS[t][1] for t in tests},
        "alpha": alpha,
        "resamples": resamples if "randomization" in tests else None,
        "seed": seed if "randomization" in tests else None,
        "queries": len(common),
        "qrels": qrels_name,
        "metrics": {label: row["metrics"] for label, row in out_runs.items()},
        "runs": out_runs,
        "warning": warning,
        "notes": notes,
    }


def _p(p: float | None, alpha: float) -> str:
    if p is None:
        return "n/a"
    s = f"{p:.4f}" if p >= 1e-4 else f"{p:.0e}"
    return s + ("*" if p < alpha else "")


def format_comparison(result: dict, markdown: bool = False, digits: int = 4) -> str:
    """The table of `compare_runs`: per measure the value, Δ to the baseline and the p-value(s)."""
    tests, alpha = result["tests"], result["alpha"]
    short = {t: TESTS[t][0] for t in tests}
    header = ["run"]
    for m in result["measures"]:
        header += [m, f"Δ {m}"] + [f"p({short[t]}) {m}" for t in tests]
    rows = []
    for label, row in result["runs"].items():
        cells = [label]
        for m in result["measures"]:
            cells.append(f"{row['metrics'][m]:.{digits}f}")
            vs = row.get("vs_baseline")
            if vs is None:
                cells += ["-"] + ["-" for _ in tests]
            else:
                cells.append(f"{vs[m]['delta']:+.{digits}f}")
                cells += [_p(vs[m][f"p_{t}"], alpha) for t in tests]
        rows.append(cells)
    named = "; ".join(f"p({short[t]}) = two-sided {result['test_names'][t]}"
                      + (f", {result['resamples']} resamples, seed {result['seed']}" if t == "randomization" else "")
                      for t in tests)
    head = (f"Paired tests against the baseline {result['baseline']!r} over {result['queries']} queries: {named}; "
            f"* = p < {alpha:g} (no multiple-comparison correction)")
    lines = []
    if result.get("warning"):
        lines += [result["warning"], ""]
    lines.append(head)
    lines += [f"note: {n}" for n in result.get("notes", [])]
    lines += ["", render_table(header, rows, markdown)]
    return "\n".join(lines)
