"""The matrix's own rules, checked by `pipeline reproduce check` (and its unit tests):

- every cell (but an experiment's) says where its tolerance comes from (`tolerance_evidence: {kind, width,
  note}`), and its tolerance is no wider than that evidence allows:

  - `seeds`: the width is a measured spread over seeds (a standard deviation); tolerance <= 2 x width, since
    one run lands within two standard deviations of the mean about 95 % of the time;
  - `resolution`: the width is one query's worth of the metric (1/N on N queries for a per-query metric in
    [0, 1]: a binary one at a cut-off, RR, nDCG, AP; 1 for a count); tolerance <= 3 x width. A figure the same
    model computes (a released checkpoint, a zero-shot model, a deterministic baseline, a fixed-seed re-run)
    moves between machines only where near-ties flip; three queries' worth lets a few flips through, no more;
  - `reproduction_gap`: the width is the gap between two published runs of the same recipe (a paper's own
    reproduction, a re-run of the released files) plus half a unit of their printed digit; tolerance <= width,
    the gap being already the spread two runs showed;
  - `published_rounding`: the width is half a unit of the figure's last printed digit; tolerance <= width. The
    floor: what the printed figure itself can say, where nothing wider has been measured.

  A trained figure with no measured spread and no reproduction gap has only `published_rounding`: a single run
  will usually miss it by its seed noise, which is what the evidence says until a spread is measured;
- a method cell (one that names its `baseline` cell, the baseline row of the same table and column) must be
  able to fail a method that does nothing: the baseline's figure may not lie inside the method cell's
  tolerance, unless the cell is `paired` (its claim is the difference method - baseline, both cells run, checked
  against the paper's `published_difference`, which must agree with the two published figures within their
  tolerances). Where the published gain is smaller than a run's noise, the cell is paired, or an effect cell
  (the difference over seeds with a paired test: repro/effects.yaml). The shipped matrix also pairs every
  trained method cell whose tolerance has only `published_rounding` behind it: no single run can be expected
  inside that width, so only the difference to its baseline can carry the paper's claim;
- a baseline measures what its method cell measures (the same metric name);
- a tolerance may not let 0 pass when 0 is not the claim (a figure within its tolerance of 0); for a paired
  cell the claim is the difference, so neither may `published_difference` ± its tolerance (a method that
  does nothing would pass);
- every figure and tolerance is a finite number (the loader refuses the others);
- an experiment's record (`results/<family>-<dataset>.json`) says what its runs say: every comparison row
  computed from runs that keep their per-query values is computed again from the record alone and must be
  the same row (`check_records`); a row kept as recorded (its runs kept none) is left as it is. And it is of
  the experiment as defined now: every arm's recorded definition is today's, its vars and metric the
  experiment's (an arm redefined without running it again makes its rows stale, and the check fails).
"""

from __future__ import annotations

from .matrix import Matrix

FACTORS = {"seeds": 2.0, "resolution": 3.0, "reproduction_gap": 1.0, "published_rounding": 1.0}
EPS = 1e-9  # 3 x (1/300) is 0.009999999999999998 in floating point
REL = 1e-5  # a width is written to six significant digits (1/300 as 0.00333333)


def allowed_tolerance(evidence: dict) -> float:
    """The widest tolerance `evidence` ({kind, width, note}) supports (see the module doc)."""
    return FACTORS[evidence["kind"]] * float(evidence["width"])


def check_rules(matrix: Matrix) -> list[str]:
    problems = []
    for cell in matrix.cells.values():
        if cell.experiment:
            continue
        ev = cell.tolerance_evidence
        if not ev:
            problems.append(f"{cell.id}: no tolerance_evidence: say where its tolerance ±{cell.tolerance:g} comes "
                            "from (kind seeds, resolution, reproduction_gap or published_rounding, its width, a note)")
        elif cell.tolerance > allowed_tolerance(ev) * (1 + REL) + EPS:
            problems.append(f"{cell.id}: tolerance ±{cell.tolerance:g} is wider than its evidence allows "
                            f"({ev['kind']} {ev['width']:g} -> at most {allowed_tolerance(ev):g}); narrow it, or "
                            "measure wider evidence")
        base = None
        if cell.baseline:
            base = matrix.cells.get(cell.baseline)
            if base is None:
                problems.append(f"{cell.id}: baseline {cell.baseline} is not a cell of the matrix")
            elif base.metric["name"] != cell.metric["name"]:
                problems.append(f"{cell.id}: its baseline {base.id} measures {base.metric['name']}, the cell "
                                f"{cell.metric['name']}")
        if cell.paired and base is not None and cell.expected is not None and base.expected is not None:
            gap = cell.expected - base.expected
            if abs(cell.published_difference - gap) > cell.tolerance + base.tolerance + EPS:
                problems.append(f"{cell.id}: published_difference {cell.published_difference:g} disagrees with its "
                                f"figure minus {base.id}'s ({gap:+.6g})")
        if cell.expected is None:
            continue
        lo, hi = cell.expected - cell.tolerance, cell.expected + cell.tolerance
        if base is not None and not cell.paired and base.expected is not None and lo <= base.expected <= hi:
            problems.append(f"{cell.id}: its baseline {base.id}'s figure {base.expected:g} lies inside its "
                            f"tolerance ({cell.expected:g} ± {cell.tolerance:g}): a method that does nothing "
                            "would pass; narrow the tolerance with evidence, or make it paired (the difference to "
                            "the baseline, published_difference) or an effect cell")
        if cell.expected != 0 and lo <= 0 <= hi:
            problems.append(f"{cell.id}: {cell.expected:g} ± {cell.tolerance:g} lets a figure of 0 pass")
        if cell.paired and cell.published_difference:
            d = float(cell.published_difference)
            if d - cell.tolerance <= 0 <= d + cell.tolerance:
                problems.append(f"{cell.id}: its claim is the difference {d:+g}, and {d:+g} ± {cell.tolerance:g} "
                                "lets a difference of 0 (a method that does nothing) pass; narrow the tolerance "
                                "below the published difference, or make it an effect cell (seeds)")
    return problems


def same_figures(a, b, rel: float = 1e-9) -> bool:
    """`a` equals `b` with every float compared to `rel` of its size: the statistics computed again from a
    record's per-query values differ in their last digits between numpy and scipy releases (an interval's end
    by 6e-18 on Python 3.10's numpy 2.2), which is not a figure edited by hand or computed otherwise."""
    import math

    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_figures(a[k], b[k], rel) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_figures(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
        return numbers and (a == b or math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)
                            or (math.isnan(a) and math.isnan(b)))
    return a == b


def check_records(matrix: Matrix, folder=None) -> list[str]:
    """Each experiment record whose comparison rows are not what its own runs' per-query values give (a
    figure edited by hand, or a record written by code that computed otherwise)."""
    import json

    from ..effects.record import definition_digest, runs_of, tables
    from .status import read_result, results_dir

    problems = []
    for fam, exp in matrix.experiments.items():
        for d in exp.datasets:
            path = results_dir(folder) / f"{fam}-{d}.json"
            r = read_result(path) if path.exists() else None
            if r is None:
                continue
            for a, info in (r.get("arms") or {}).items():
                recorded = (info or {}).get("definition")
                if a not in exp.arms:
                    problems.append(f"{path.name}: holds runs of {a}, which is no longer an arm of the experiment; "
                                    "record the experiment again (or remove the arm's runs)")
                elif recorded is not None and recorded != definition_digest(exp, exp.arms[a]):
                    problems.append(f"{path.name}: {a} is defined otherwise than when its runs were recorded (its "
                                    "commands, model path, the prepare, vars, metric or judgements changed): its "
                                    "rows are stale; run the arm again and record it")
            if {k: str(v) for k, v in (r.get("vars") or {}).items()} != {k: str(v) for k, v in exp.vars.items()}:
                problems.append(f"{path.name}: recorded with other vars ({r.get('vars')}) than the experiment "
                                f"defines ({exp.vars}); run it again and record it")
            if r.get("metric") and r["metric"] != exp.metric:
                problems.append(f"{path.name}: scores {r['metric']}, the experiment {exp.metric}; run it again "
                                "and record it")
            again = json.loads(json.dumps(tables(exp, d, runs_of(r), earlier=r)["comparisons"]))
            for cid, row in (r.get("comparisons") or {}).items():
                if row.get("as_recorded") or cid not in again:
                    continue
                if (not same_figures(again[cid].get("parts"), row.get("parts"))
                        or again[cid].get("verdict") != row.get("verdict")):
                    problems.append(f"{path.name}: {cid}: the row is not what the record's runs give (computed "
                                    f"again: {again[cid].get('verdict')}, "
                                    f"{(again[cid].get('parts') or {}).get('all', {}).get('difference')}); "
                                    "record the run again with `pipeline reproduce record`")
    return problems
