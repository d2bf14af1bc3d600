"""Qrels-based metrics through ir-measures (pytrec_eval / trec_eval underneath).

Reported names follow the field: MRR@10, MRR@100, nDCG@10, MAP@100, R@k.
Averages are over the queries that have judgements and appear in the run, as
trec_eval does without `-c`; queries judged but missing from the run are
counted and reported so the gap is visible.
"""

from __future__ import annotations

from pathlib import Path

import ir_measures
from ir_measures import AP, R, RR, nDCG

from ..config import EvalConfig
from ..errors import InputError
from ..data.readers import load_qrels, read_run_file


def measures_for(cfg: EvalConfig) -> dict[str, object]:
    """Display name -> ir-measures measure. Binary measures honour `rel_level`."""
    rel = cfg.rel_level
    out = {
        "MRR@10": RR(rel=rel) @ 10,
        "nDCG@10": nDCG @ 10,
        "MAP@100": AP(rel=rel) @ 100,
        "MRR@100": RR(rel=rel) @ 100,
    }
    for k in cfg.recall_ks:
        out[f"R@{k}"] = R(rel=rel) @ k
    return out


def read_run(path: str | Path) -> dict[str, dict[str, float]]:
    """TREC run -> {qid: {docid: score}}; malformed lines fail with file:line."""
    run: dict[str, dict[str, float]] = {}
    for r in read_run_file(path):
        docs = run.setdefault(r["qid"], {})
        if r["docid"] in docs:
            raise InputError(path, r["line"], f"document {r['docid']!r} appears twice for query {r['qid']!r}")
        docs[r["docid"]] = r["score"]
    return run


def _trec_order(docs: dict[str, float]) -> list[str]:
    return [d for d, _ in sorted(docs.items(), key=lambda x: (x[1], x[0]), reverse=True)]


def evaluate_run(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]], cfg: EvalConfig) -> dict:
    """Aggregate (and optionally per-query) metrics for one run."""
    if cfg.ignore_identical_ids:
        run = {q: {d: s for d, s in docs.items() if d != q} for q, docs in run.items()}
    measures = measures_for(cfg)
    name_of = {m: name for name, m in measures.items()}
    # Average over judged queries that are in the run (trec_eval without -c): ir-measures
    # would otherwise score every judged query missing from the run as 0.
    qrels_list = [ir_measures.Qrel(q, d, r) for q, docs in qrels.items() if q in run for d, r in docs.items()]
    # One ranking for every measure, trec_eval's: score descending, ties by docid descending.
    # ir-measures' RR (msmarco provider) breaks ties by docid ascending, so pass ranks as scores.
    run_list = [ir_measures.ScoredDoc(q, d, float(-i)) for q, docs in run.items()
                for i, d in enumerate(_trec_order(docs))]
    agg = ir_measures.calc_aggregate(list(measures.values()), qrels_list, run_list)
    result = {
        "metrics": {name: float(agg[m]) for name, m in measures.items()},
        "run_depth": max((len(d) for d in run.values()), default=0),
        "queries": {
            "judged": len(qrels),
            "in_run": len(run),
            "evaluated": len(set(qrels) & set(run)),
            "judged_missing_from_run": len(set(qrels) - set(run)),
        },
    }
    if cfg.per_query:
        per: dict[str, dict[str, float]] = {}
        for m in ir_measures.iter_calc(list(measures.values()), qrels_list, run_list):
            per.setdefault(m.query_id, {})[name_of[m.measure]] = float(m.value)
        result["per_query"] = per
    return result


def evaluate_files(run_path: str | Path, qrels_path: str | Path, cfg: EvalConfig) -> dict:
    result = evaluate_run(read_run(run_path), load_qrels(qrels_path), cfg)
    result.update({"run": str(run_path), "qrels": str(qrels_path)})
    return result
