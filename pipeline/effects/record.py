"""An experiment's result as tables (per arm and seed the figures, per comparison the effect), and one record
kept across machines and sessions (`pipeline reproduce record --family`).

Each run's per-query values go into the result (rounded to 6 decimals, aligned to the result's query list of
each part), so that every comparison can be computed again from the record alone: by a reader checking a figure,
and when runs made in another work folder, session or machine are added to it. Without them a record could
never grow: a lost work folder would take the paired test of every comparison with it.

`merge(exp, earlier, new)` is what recording does when the matrix already holds a record of the experiment on
that dataset:
- the runs are those of both, the new one's where both hold an arm and seed;
- each comparison is computed from the merged runs, over the seeds whose runs on both sides keep their
  per-query values; where the earlier record's row covers more seeds than that (its runs were recorded before
  per-query values were kept), that row stays as recorded, marked `as_recorded` with its date and commit;
- a run of an arm whose definition (its commands and model path, the experiment's prepare, vars, metric and
  judgements: `definition_digest`) differs from the new result's is not the arm's any more: it is left out,
  and said; an earlier record made with other vars is refused, never mixed.
"""

from __future__ import annotations

import hashlib
import json

from ..errors import PipelineError
from .spec import Arm, Experiment
from .stats import effect

PARTS = ("all", "labeled", "unlabeled")
DIGITS = 6  # per-query values as kept: far below the 4 decimals any figure is read at

UNREFRESHED = ("the trainer used no refreshed negatives version (its refresher ran, but training kept its first "
               "negatives throughout), so the run is not {arm}")


def definition_digest(exp: Experiment, arm: Arm) -> str:
    """What makes a run one of this arm: its commands' templates and model path, and the experiment's prepare,
    vars, metric and judgements (the checkout, work folder and data path are placeholders in them)."""
    what = [exp.arm_commands(arm), arm.model_path, exp.prepare, exp.vars, exp.metric, exp.qrels, exp.train_qrels]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def shared(load: dict | None) -> bool:
    """Whether a run shared its machine: a mean load above the machine's cores by more than one runnable process
    (a run alone keeps about as many busy as it has cores). False when its load was not sampled."""
    try:
        return float(load["mean"]) > int(load["cpus"]) + 1
    except (KeyError, TypeError, ValueError):
        return False


def rounded(per_query: dict | None) -> dict | None:
    return None if per_query is None else {q: round(float(v), DIGITS) for q, v in per_query.items()}


def _kept(run: dict) -> bool:
    """Whether a run keeps its per-query values on every part (runs recorded before they were kept do not)."""
    return all(run["scores"][p].get("per_query") is not None for p in PARTS)


def _seed_key(seed) -> str:
    return "once" if seed is None else str(seed)


def _seed_of(key: str):
    return None if key == "once" else int(key)


# ---------------------------------------------------------------------- why two arms do not compare


def training_differs(method: str, m_runs: dict, baseline: str, b_runs: dict) -> str | None:
    """Why two trained arms' runs are not the same training (examples, steps, global batch or precision of some
    seed against the baseline's: a pair of seeds trained on two machines, one in bf16 and one in fp32, is not
    a paired comparison), or None; an arm without training (zero-shot) is compared with nothing. What a run
    recorded before a key was kept (precision) is compared on the keys both hold."""
    def shown(v):
        return f"{v:,}" if isinstance(v, int) else str(v)

    m = {s: r.get("training") for s, r in m_runs.items()}
    b = {s: r.get("training") for s, r in b_runs.items()}  # zero-shot: {None: None}, no seed in common
    for s in sorted(set(m) & set(b), key=str):
        if m[s] and b[s]:
            keys = [k for k in m[s] if k in b[s] and m[s][k] != b[s][k]]
            if keys:
                diff = ", ".join(f"{k} {shown(m[s][k])} against {shown(b[s][k])}" for k in keys)
                return f"seed {s}: {method} trained on {diff} ({baseline})"
    return None


def unrefreshed(arm: str, runs: dict) -> str | None:
    """Why an arm whose runs had an index refresher beside training did not train as ANCE: a seed whose trainer
    took no refreshed version (it trained on its first negatives throughout), or None."""
    for s in sorted(runs, key=str):
        if runs[s].get("refreshed") == []:
            return f"seed {s}: " + UNREFRESHED.format(arm=arm)
    return None


# ---------------------------------------------------------------------- the tables


def tables(exp: Experiment, dataset: str, runs: dict, earlier: dict | None = None) -> dict:
    """The result's arms, comparisons and per-query values from `runs`:
    {arm: {seed or None: {"scores": {part: {"mean", "per_query" (None: not kept)}}, "wall_seconds", "date",
    "code_digest", "machine", "training", "refreshed"}}}. `earlier`: a recorded result whose comparison rows
    stand where `runs` cannot recompute them over as many seeds (see the module doc)."""
    queries = {p: sorted({q for by_seed in runs.values() for r in by_seed.values()
                          for q in (r["scores"][p].get("per_query") or {})}) for p in PARTS}
    arms = {}
    for a in exp.arms:
        if a not in runs:
            continue
        by_seed = runs[a]
        seeds = {}
        for s in sorted(by_seed, key=lambda x: -1 if x is None else x):
            r = by_seed[s]
            entry = {**{p: r["scores"][p]["mean"] for p in PARTS}, "wall_seconds": r.get("wall_seconds"),
                     "date": r.get("date"), "code_digest": r.get("code_digest")}
            if r.get("machine"):
                entry["machine"] = r["machine"]
            if r.get("load"):
                entry["load"] = r["load"]
            if r.get("training"):
                entry["training"] = r["training"]
            if r.get("refreshed") is not None:
                entry["refreshed_versions"] = r["refreshed"]
            if _kept(r):
                entry["per_query"] = {p: [r["scores"][p]["per_query"].get(q) for q in queries[p]] for p in PARTS}
            seeds[_seed_key(s)] = entry
        walls = [r["wall_seconds"] for r in by_seed.values() if r.get("wall_seconds") is not None]
        arms[a] = {"title": exp.arms[a].title, "definition": definition_digest(exp, exp.arms[a]), "seeds": seeds,
                   "wall_seconds_mean": round(sum(walls) / len(walls), 1) if walls else None}
        n_shared = sum(shared(r.get("load")) for r in by_seed.values())
        if n_shared:  # their wall times are longer than the arm's alone (the page marks them)
            arms[a]["shared_seeds"] = n_shared
    comparisons = {}
    for c in exp.comparisons.values():
        row = {"method": c.method, "baseline": c.baseline, "direction": c.direction, "claim": c.claim,
               "source": c.source, "published_difference": c.published_difference,
               "cell": exp.cell_id(dataset, c.id)}
        if c.method in runs and c.baseline in runs:
            kept = {a: {s: r for s, r in runs[a].items() if _kept(r)} for a in (c.method, c.baseline)}
            parts = {part: effect({s: r["scores"][part]["per_query"] for s, r in kept[c.method].items()},
                                  {s: r["scores"][part]["per_query"] for s, r in kept[c.baseline].items()},
                                  c.direction)
                     for part in PARTS}  # no seed in common (none kept): effect's own "not run", 0 seeds
            row["wall_seconds_per_seed"] = arms[c.method]["wall_seconds_mean"]
            if arms[c.method].get("shared_seeds"):
                row["shared_seeds"] = arms[c.method]["shared_seeds"]
            before = ((earlier or {}).get("comparisons") or {}).get(c.id) or {}
            if (before.get("parts") or {}).get("all", {}).get("n_seeds", 0) > parts["all"]["n_seeds"]:
                row.update({k: v for k, v in before.items() if k in ("parts", "verdict", "not_comparable")})
                then = before.get("as_recorded") or {}  # a row already kept from a record before that one
                row["as_recorded"] = {k: then.get(k) or earlier.get(k) for k in ("date", "commit", "machine")}
                comparisons[c.id] = row
                continue
            row["parts"] = parts
            row["verdict"] = parts["all"]["verdict"]
            differs = (training_differs(c.method, runs[c.method], c.baseline, runs[c.baseline])
                       or unrefreshed(c.method, runs[c.method]) or unrefreshed(c.baseline, runs[c.baseline]))
            if differs:  # not the same pairs, steps or batch, or an ANCE run that never took a refreshed
                # version: the difference is not the method's effect
                row["not_comparable"] = differs
                row["verdict"] = "not comparable"
                for e in row["parts"].values():
                    e["verdict"] = "not comparable"
        else:
            row["verdict"] = "not run"
        comparisons[c.id] = row
    return {"queries": queries, "arms": arms, "comparisons": comparisons}


# ---------------------------------------------------------------------- a record as runs, and merging


def runs_of(record: dict) -> dict:
    """A result's runs in the shape `tables` takes (per-query values None where the record did not keep them;
    a run without its own machine gets the record's)."""
    queries = record.get("queries") or {}
    out = {}
    for a, info in (record.get("arms") or {}).items():
        for key, v in (info.get("seeds") or {}).items():
            kept = v.get("per_query")
            scores = {p: {"mean": v.get(p),
                          "per_query": None if kept is None else
                          {q: x for q, x in zip(queries.get(p) or [], kept.get(p) or []) if x is not None}}
                      for p in PARTS}
            out.setdefault(a, {})[_seed_of(key)] = {
                "scores": scores, "wall_seconds": v.get("wall_seconds"), "load": v.get("load"), "date": v.get("date"),
                "code_digest": v.get("code_digest"), "machine": v.get("machine") or record.get("machine"),
                "training": v.get("training"), "refreshed": v.get("refreshed_versions")}
    return out


def merge(exp: Experiment, earlier: dict, new: dict) -> tuple[dict, list[str]]:
    """The record holding `earlier`'s runs and `new`'s (see the module doc), and what a person should be told
    (runs left out, rows kept as recorded)."""
    if earlier.get("experiment") != new.get("experiment") or earlier.get("dataset") != new.get("dataset"):
        raise PipelineError("the recorded result is of another experiment or dataset")
    if {k: str(v) for k, v in (earlier.get("vars") or {}).items()} != \
            {k: str(v) for k, v in (new.get("vars") or {}).items()}:
        raise PipelineError(f"the recorded result was made with other vars ({earlier.get('vars')}) than this run "
                            f"({new.get('vars')}); runs of two definitions are never mixed in one record")
    said = []
    old_runs, new_runs = runs_of(earlier), runs_of(new)
    runs = {}
    for a in exp.arms:
        digest = definition_digest(exp, exp.arms[a])
        old_def = ((earlier.get("arms") or {}).get(a) or {}).get("definition")
        if a in old_runs and old_def is not None and old_def != digest:
            said.append(f"{a}: the recorded runs ({len(old_runs[a])}) were made with another definition of the "
                        "arm; left out of the record")
        elif a in old_runs:
            runs[a] = dict(old_runs[a])
        if a in new_runs:
            runs.setdefault(a, {}).update(new_runs[a])
    both = sum(1 for a in new_runs for s in new_runs[a] if s in old_runs.get(a, {}))
    carried = sum(len(v) for a, v in runs.items()) - sum(len(v) for a, v in new_runs.items() if a in runs)
    said.append(f"with the record made before: {carried} of its runs kept beside this result's "
                f"{sum(len(v) for v in new_runs.values())}" + (f", {both} replaced by this result's" if both else ""))
    merged = {**new, **tables(exp, new["dataset"], runs, earlier=earlier)}
    for cid, row in merged["comparisons"].items():
        if row.get("as_recorded"):
            n = row["parts"]["all"]["n_seeds"]
            said.append(f"{cid}: kept as recorded on {str(row['as_recorded']['date'])[:10]} "
                        f"({n} seed{'' if n == 1 else 's'}; runs recorded then kept no per-query values)")
    planned = sum(len(exp.seeds) if a.seeded else 1 for a in exp.arms.values())
    finished = sum(len(v) for v in runs.values())
    machines = []
    for by_seed in runs.values():
        for r in by_seed.values():
            if r.get("machine") and r["machine"] not in machines:
                machines.append(r["machine"])
    merged.update({
        "complete": finished >= planned, "runs_finished": finished, "runs_planned": planned,
        "arms_run": [a for a in exp.arms if a in runs],
        "seeds_run": sorted({s for by_seed in runs.values() for s in by_seed if s is not None}),
        "machines": machines,
        "code_digests_of_runs": sorted({str(r.get("code_digest")) for v in runs.values() for r in v.values()}),
    })
    return merged, said
