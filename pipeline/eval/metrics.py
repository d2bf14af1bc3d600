"""Qrels-based metrics through ir-measures (pytrec_eval / trec_eval underneath).

Any ir-measures measure string is accepted (`AP nDCG@10 RR@10 R@1000 P@10 Judged@10`,
`nDCG(dcg='exp-log2')@10`, ...), as are trec_eval names (`map`, `ndcg_cut_10`, `P_10`)
and the legacy names MRR@k / MAP@k (ir-measures' own aliases of RR@k / AP@k).
Reported names are ir-measures' canonical names (`str(measure)`: RR@10, AP@100, ...).
Without `eval.measures` the default set is RR@10, nDCG@10, AP@100, RR@100 and R@k for
every `eval.recall_ks`. Binary measures take `eval.rel_level` unless the measure string
sets `rel` itself (with rel_level 2, RR@10 is reported as `RR(rel=2)@10`).

Averages are over the queries that have judgements and appear in the run, as trec_eval
does without `-c`; queries judged but missing from the run are counted and reported so
the gap is visible. A run that shares no query with the qrels is an error, not a table
of zeros.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import ir_measures
from ir_measures import AP, R, RR, nDCG

from ..config import EvalConfig
from ..data.readers import load_qrels
from ..errors import PipelineError
from ..measures import MEASURE_EXAMPLE, measure_name, parse_measures, split_measures  # noqa: F401 (re-exported)
from .runs import RunNotGrouped, iter_run_groups, read_run

def default_measures(cfg: EvalConfig) -> list:
    rel = cfg.rel_level
    return [RR(rel=rel) @ 10, nDCG @ 10, AP(rel=rel) @ 100, RR(rel=rel) @ 100] + [R(rel=rel) @ k for k in cfg.recall_ks]


def measures_for(cfg: EvalConfig, measures: str | Iterable[str] | None = None) -> dict[str, object]:
    """Reported name (ir-measures' canonical string) -> measure.

    `measures` (a string or strings) wins over `cfg.measures`; with neither, the default set.
    """
    spec = measures if measures is not None else getattr(cfg, "measures", ())
    ms = parse_measures(spec, cfg.rel_level) if split_measures(spec or ()) else default_measures(cfg)
    return {str(m): m for m in ms}


def _trec_order(docs: dict[str, float]) -> list[str]:
    return [d for d, _ in sorted(docs.items(), key=lambda x: (x[1], x[0]), reverse=True)]


def _sample(ids: Iterable[str], n: int = 5) -> str:
    ids = sorted(ids)
    return ", ".join(repr(i) for i in ids[:n]) + (f", ... ({len(ids)} in all)" if len(ids) > n else "")


def check_overlap(run: dict[str, dict], qrels: dict[str, dict], run_name: str = "the run",
                  qrels_name: str = "the qrels") -> set[str]:
    """Judged queries that the run ranks documents for; an error when there are none."""
    if not any(run.values()):
        raise PipelineError(f"{run_name}: the run holds no results, nothing to evaluate")
    common = {q for q, docs in run.items() if docs and q in qrels}
    if not common:
        raise PipelineError(
            f"{run_name}: none of the run's {len(run)} query ids is judged in {qrels_name} "
            f"(run: {_sample(run)}; qrels: {_sample(qrels)}); are these the qrels of the queries this run was retrieved for?")
    return common


def _ir_lists(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]], queries: set[str]):
    """ir-measures inputs over `queries`, which are numbered 0..n-1 (the returned list maps back):
    some providers (gdeval's ERR/nDCG) accept only numeric query ids."""
    qids = sorted(queries)
    qrels_list = [ir_measures.Qrel(str(i), d, r) for i, q in enumerate(qids) for d, r in qrels[q].items()]
    # One ranking for every measure, trec_eval's: score descending, ties by docid descending.
    # ir-measures' RR (msmarco provider) breaks ties by docid ascending, so pass ranks as scores.
    run_list = [ir_measures.ScoredDoc(str(i), d, float(-r)) for i, q in enumerate(qids)
                for r, d in enumerate(_trec_order(run[q]))]
    return qids, qrels_list, run_list


def _calc(fn, measures: dict[str, object], *args):
    try:
        return fn(list(measures.values()), *args)
    except PipelineError:
        raise
    except Exception as e:  # a provider's own failure (its message, not a traceback)
        raise PipelineError(f"ir-measures could not compute {', '.join(measures)}: {type(e).__name__}: {e}") from None


def aggregate_values(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]], measures: dict[str, object],
                     queries: set[str]) -> dict[str, float]:
    """{name: value} over `queries`, aggregated as ir-measures (trec_eval) does: a mean, or a sum for NumRet & co."""
    _, qrels_list, run_list = _ir_lists(run, qrels, queries)
    agg = _calc(ir_measures.calc_aggregate, measures, qrels_list, run_list)
    return {name: float(agg[m]) for name, m in measures.items()}


def per_query_values(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]], measures: dict[str, object],
                     queries: set[str]) -> dict[str, dict[str, float]]:
    """{qid: {name: value}} for `queries` (judged queries present in the run)."""
    name_of = {m: name for name, m in measures.items()}
    qids, qrels_list, run_list = _ir_lists(run, qrels, queries)
    per: dict[str, dict[str, float]] = {q: {} for q in qids}
    for m in _calc(lambda ms, *a: list(ir_measures.iter_calc(ms, *a)), measures, qrels_list, run_list):
        per[qids[int(m.query_id)]][name_of[m.measure]] = float(m.value)
    return per


def aggregate_per_query(per: dict[str, dict[str, float]], measures: dict[str, object]) -> dict[str, float]:
    """Per-query values -> aggregates with each measure's own ir-measures aggregator (mean, or sum)."""
    out = {}
    for name, m in measures.items():
        agg = m.aggregator()
        for vals in per.values():
            if name in vals:
                agg.add(vals[name])
        out[name] = float(agg.result())
    return out


def evaluate_run(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]], cfg: EvalConfig,
                 measures: str | Iterable[str] | None = None, run_name: str = "the run",
                 qrels_name: str = "the qrels") -> dict:
    """Aggregate (and optionally per-query) metrics for one run.

    Raises PipelineError when the run is empty or none of its queries is judged.
    """
    if cfg.ignore_identical_ids:
        run = {q: {d: s for d, s in docs.items() if d != q} for q, docs in run.items()}
    ms = measures_for(cfg, measures)
    common = check_overlap(run, qrels, run_name, qrels_name)
    # Average over judged queries that are in the run (trec_eval without -c): ir-measures
    # would otherwise score every judged query missing from the run as 0.
    per = per_query_values(run, qrels, ms, common) if cfg.per_query else None
    result = {
        "metrics": aggregate_per_query(per, ms) if per is not None else aggregate_values(run, qrels, ms, common),
        "run_depth": max((len(d) for d in run.values()), default=0),
        "queries": {
            "judged": len(qrels),
            "in_run": len(run),
            "evaluated": len(common),
            "judged_missing_from_run": len(set(qrels) - common),
        },
    }
    if per is not None:
        result["per_query"] = per
    return result


def cutoffs_deeper_than(names: Iterable[str], depth: int) -> list[str]:
    """Reported measure names whose cut-off exceeds the run depth (their values are cut at it)."""
    out = []
    for name in names:
        try:
            m = ir_measures.parse_measure(name)
        except Exception:
            continue
        c = m.params.get("cutoff")
        if isinstance(c, int) and c > depth:
            out.append(name)
    return out


def evaluate_files(run_path: str | Path, qrels_path: str | Path, cfg: EvalConfig,
                   measures: str | Iterable[str] | None = None, chunk_lines: int = 100_000) -> dict:
    """`evaluate_run` over files. A run grouped by query (as retrieve writes it) is read and scored
    about `chunk_lines` lines (whole queries) at a time, so a 10M-line run costs the memory of one
    chunk; a run whose
    queries are interleaved is read whole. Both give the same numbers."""
    measures_for(cfg, measures)  # a bad measure fails before any file is read
    qrels = load_qrels(qrels_path)
    try:
        result = _evaluate_grouped(run_path, qrels, cfg, measures, chunk_lines, str(qrels_path))
    except RunNotGrouped:
        result = evaluate_run(read_run(run_path), qrels, cfg, measures,
                              run_name=str(run_path), qrels_name=str(qrels_path))
    result.update({"run": str(run_path), "qrels": str(qrels_path)})
    return result


def _evaluate_grouped(run_path, qrels: dict[str, dict[str, int]], cfg: EvalConfig, measures, chunk_lines: int,
                      qrels_name: str) -> dict:
    """evaluate_run's result from a run read query group by query group (see evaluate_files)."""
    ms = measures_for(cfg, measures)
    aggs = {name: m.aggregator() for name, m in ms.items()}
    per_all: dict[str, dict[str, float]] | None = {} if cfg.per_query else None
    in_run: set[str] = set()
    evaluated, depth, any_results = set(), 0, False
    chunk: dict[str, dict[str, float]] = {}
    chunk_size = 0

    def flush() -> None:
        nonlocal chunk_size
        common = {q for q, docs in chunk.items() if docs and q in qrels}
        if common:
            per = per_query_values(chunk, qrels, ms, common)
            for vals in per.values():
                for name, v in vals.items():
                    aggs[name].add(v)
            if per_all is not None:
                per_all.update(per)
            evaluated.update(common)
        chunk.clear()
        chunk_size = 0

    for qid, docs in iter_run_groups(run_path):
        if cfg.ignore_identical_ids:
            docs = {d: s for d, s in docs.items() if d != qid}
        in_run.add(qid)
        depth = max(depth, len(docs))
        any_results = any_results or bool(docs)
        chunk[qid] = docs
        chunk_size += len(docs)
        if chunk_size >= chunk_lines:
            flush()
    flush()
    run_name = str(run_path)
    if not any_results:
        raise PipelineError(f"{run_name}: the run holds no results, nothing to evaluate")
    if not evaluated:
        raise PipelineError(
            f"{run_name}: none of the run's {len(in_run)} query ids is judged in {qrels_name} "
            f"(run: {_sample(in_run)}; qrels: {_sample(qrels)}); are these the qrels of the queries this run was "
            "retrieved for?")
    result = {
        "metrics": {name: float(agg.result()) for name, agg in aggs.items()},
        "run_depth": depth,
        "queries": {"judged": len(qrels), "in_run": len(in_run), "evaluated": len(evaluated),
                    "judged_missing_from_run": len(set(qrels) - evaluated)},
    }
    if per_all is not None:
        result["per_query"] = per_all
    return result
