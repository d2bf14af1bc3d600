"""An experiment's result as tables (per arm and seed the figures, per comparison the effect), and one record
kept across machines and sessions (`pipeline reproduce record --family`).

Each run's per-query values go into the result (rounded to 6 decimals, aligned to the result's query list of
each part), so that every comparison can be computed again from the record alone: by a reader checking a figure,
and when runs made in another work folder, session or machine are added to it. Without them a record could
never grow: a lost work folder would take the paired test of every comparison with it.

`merge(exp, earlier, new)` is what recording does when the matrix already holds a record of the experiment on
that dataset:
- the runs are those of both; where both hold an arm and seed, the newer run (by its date) is kept, and said;
- each comparison is computed from the merged runs, over the seeds whose runs on both sides keep their
  per-query values; where the earlier record's row covers more seeds than that because its runs were recorded
  before per-query values were kept (and its arms are defined as today), that row stays as recorded, marked
  `as_recorded` with its date and commit;
- a run, of either side, whose definition (its commands and model path, the experiment's prepare, vars, metric
  and judgements: `definition_digest`, kept per run in its identity, effects/identity.py) differs from today's,
  whose config files differ from today's, or that was made on other data than the new result's, is not the
  arm's: it is left out, and said; an earlier record made with other vars, another metric or on other data
  (its `data_fingerprint`) is refused, never mixed.

`recordable(exp, result)` refuses a result that is not of the experiment as the matrix defines it (other vars,
another metric, a run of another definition: a result made from an edited copy of the matrix).
Every comparison row names the code versions its seeds were made by (`code_digests`, the page says so when
there are several): the code is recorded beside a run's identity, not part of it.
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


def definition_digest(exp: Experiment, arm: Arm, vars_: dict | None = None) -> str:
    """What makes a run one of this arm: its commands' templates and model path, and the experiment's prepare,
    vars (`vars_`: those a run used, --set values included; the experiment's by default), metric and judgements
    (the checkout, work folder and data path are placeholders in them)."""
    what = [exp.arm_commands(arm), arm.model_path, exp.prepare, exp.vars if vars_ is None else vars_, exp.metric,
            exp.qrels, exp.train_qrels]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_definition(exp: Experiment, arm: Arm, vars_: dict | None = None) -> str:
    """What makes a run's training and ranking one of this arm's: `definition_digest` less the metric (a run
    is scored again from its run.trec for another metric, never trained again: runner.scores_of). A run's
    identity holds this; the record's arm-level `definition` is `definition_digest`."""
    what = [exp.arm_commands(arm), arm.model_path, exp.prepare, exp.vars if vars_ is None else vars_,
            exp.qrels, exp.train_qrels]
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
            if r.get("identity"):
                entry["identity"] = r["identity"]
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
            codes = sorted({str(r["code_digest"]) for a in (c.method, c.baseline) for r in runs[a].values()
                            if r.get("code_digest")})
            if codes:  # the code versions its seeds were made by (several: the page says so)
                row["code_digests"] = codes
            kept = {a: {s: r for s, r in runs[a].items() if _kept(r)} for a in (c.method, c.baseline)}
            parts = {part: effect({s: r["scores"][part]["per_query"] for s, r in kept[c.method].items()},
                                  {s: r["scores"][part]["per_query"] for s, r in kept[c.baseline].items()},
                                  c.direction)
                     for part in PARTS}  # no seed in common (none kept): effect's own "not run", 0 seeds
            row["wall_seconds_per_seed"] = arms[c.method]["wall_seconds_mean"]
            if arms[c.method].get("shared_seeds"):
                row["shared_seeds"] = arms[c.method]["shared_seeds"]
            before = ((earlier or {}).get("comparisons") or {}).get(c.id) or {}
            if (before.get("parts") or {}).get("all", {}).get("n_seeds", 0) > parts["all"]["n_seeds"] \
                    and _stands_as_recorded(exp, earlier, c):
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
    _holm(comparisons)
    return {"queries": queries, "arms": arms, "comparisons": comparisons}


def _holm(comparisons: dict) -> None:
    """Holm over the dataset's comparisons, part by part (stats.adjust): the family is every row computed here
    with a test (not those kept as recorded, not comparable, or not run); each row's verdict is then the
    adjusted one."""
    from .stats import adjust

    family = {cid: row for cid, row in comparisons.items()
              if row.get("parts") and not row.get("as_recorded") and not row.get("not_comparable")}
    for part in PARTS:
        adjust({cid: row["parts"][part] for cid, row in family.items() if part in row["parts"]})
    for row in family.values():
        row["verdict"] = row["parts"]["all"]["verdict"]
        if row["parts"]["all"].get("verdict_raw") is not None:
            row["verdict_raw"] = row["parts"]["all"]["verdict_raw"]


def _stands_as_recorded(exp: Experiment, earlier: dict, c) -> bool:
    """Whether an earlier record's row may stand for comparison `c`: both arms defined as today in that record,
    and some run of them there kept no per-query values (the reason its row covers more seeds than the runs
    can recompute). A redefined arm's row never comes back over its new runs'."""
    arms = earlier.get("arms") or {}
    for a in (c.method, c.baseline):
        recorded = (arms.get(a) or {}).get("definition")
        if recorded is not None and recorded != definition_digest(exp, exp.arms[a]):
            return False
    return any("per_query" not in v for a in (c.method, c.baseline)
               for v in ((arms.get(a) or {}).get("seeds") or {}).values())


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
                "training": v.get("training"), "refreshed": v.get("refreshed_versions"),
                "identity": v.get("identity"),
                # the arm's definition as recorded (the run's own is its identity's: `run_definition`)
                "arm_definition": info.get("definition")}
    return out


def today_configs(exp: Experiment, arm: Arm) -> dict:
    """The content digests of the checkout's files the arm's commands name, as they are now."""
    from ..provenance import repo_root
    from .identity import config_files
    from .spec import RUN_PLACEHOLDERS, fill

    repo = str(repo_root())
    values = {**{k: f"/{k}" for k in RUN_PLACEHOLDERS}, **exp.vars, "repo": repo, "seed": 0}
    return config_files([fill(c, values) for c in exp.arm_commands(arm)], repo)


def _why_not(exp: Experiment, arm: Arm, run: dict, data: dict | None, configs: dict) -> str | None:
    """Why a run is not one of the arm as defined today (None: it is): another definition, another content of a
    config file its commands name, or other data than `data` (the result it is recorded into)."""
    identity = run.get("identity") or {}
    if identity.get("definition") is not None:
        if identity["definition"] != run_definition(exp, arm):
            return "made with another definition of the arm"
    elif run.get("arm_definition") is not None and run["arm_definition"] != definition_digest(exp, arm):
        return "made with another definition of the arm"
    if identity.get("configs") is not None and identity["configs"] != configs:
        names = sorted(n for n in set(identity["configs"]) | set(configs)
                       if identity["configs"].get(n) != configs.get(n))
        return f"made with another version of {', '.join(names)}"
    if data is not None and identity.get("data") is not None and identity["data"] != data:
        return "made on other data (the corpus or judgements differ from this result's)"
    return None


def recordable(exp: Experiment, result: dict) -> list[str]:
    """Why `result` is not the experiment as the matrix defines it ([] when it is): other vars than the matrix's
    (a result made from an edited copy of the matrix, --set or not), another metric, or a run of another
    definition of its arm."""
    out = []
    if {k: str(v) for k, v in (result.get("vars") or {}).items()} != {k: str(v) for k, v in exp.vars.items()}:
        differ = sorted(k for k in set(result.get("vars") or {}) | set(exp.vars)
                        if str((result.get("vars") or {}).get(k)) != str(exp.vars.get(k)))
        out.append(f"its vars differ from the matrix's ({', '.join(differ)})")
    if result.get("metric") is not None and result["metric"] != exp.metric:
        out.append(f"its metric is {result['metric']}, the matrix's {exp.metric}")
    for a, by_seed in runs_of(result).items():
        if a not in exp.arms:
            out.append(f"it holds runs of {a}, which is not an arm of the experiment")
            continue
        configs = today_configs(exp, exp.arms[a])
        for seed, run in by_seed.items():
            why = _why_not(exp, exp.arms[a], run, result.get("data_fingerprint"), configs)
            if why:
                out.append(f"{a} {'once' if seed is None else f'seed {seed}'} was {why}")
    return out


def merge(exp: Experiment, earlier: dict, new: dict) -> tuple[dict, list[str]]:
    """The record holding `earlier`'s runs and `new`'s (see the module doc), and what a person should be told
    (runs left out, runs replaced by newer ones, rows kept as recorded)."""
    if earlier.get("experiment") != new.get("experiment") or earlier.get("dataset") != new.get("dataset"):
        raise PipelineError("the recorded result is of another experiment or dataset")
    if {k: str(v) for k, v in (earlier.get("vars") or {}).items()} != \
            {k: str(v) for k, v in (new.get("vars") or {}).items()}:
        raise PipelineError(f"the recorded result was made with other vars ({earlier.get('vars')}) than this run "
                            f"({new.get('vars')}); runs of two definitions are never mixed in one record")
    if earlier.get("metric") and new.get("metric") and earlier["metric"] != new["metric"]:
        raise PipelineError(f"the recorded result scores {earlier['metric']}, this run {new['metric']}; runs scored "
                            "on two metrics are never mixed in one record")
    data = new.get("data_fingerprint")
    if earlier.get("data_fingerprint") is not None and data is not None and earlier["data_fingerprint"] != data:
        raise PipelineError("the recorded result was made on other data than this run (their data fingerprints, "
                            "the corpus and judgements, differ); runs on two datasets are never mixed in one record")
    said = []
    old_runs, new_runs = runs_of(earlier), runs_of(new)
    runs: dict = {}
    newer_kept = replaced = 0
    for a in exp.arms:
        arm, configs = exp.arms[a], today_configs(exp, exp.arms[a])
        kept = {}
        for label, source in (("recorded", old_runs.get(a, {})), ("new", new_runs.get(a, {}))):
            left = {}
            for seed, run in source.items():
                why = _why_not(exp, arm, run, data, configs)
                if why:
                    left.setdefault(why, []).append("once" if seed is None else str(seed))
                    continue
                if seed in kept:  # both hold it: the newer run stands
                    if str(kept[seed].get("date") or "") > str(run.get("date") or ""):
                        newer_kept += 1
                        continue
                    replaced += 1
                kept[seed] = run
            for why, seeds in left.items():
                said.append(f"{a}: {len(seeds)} {label} run{'' if len(seeds) == 1 else 's'} (seed "
                            f"{', '.join(seeds)}) {why}; left out of the record")
        if kept:
            runs[a] = kept
    unknown = sum(1 for v in runs.values() for r in v.values() if not r.get("identity"))
    if unknown:
        said.append(f"{unknown} run{'' if unknown == 1 else 's'} kept carry no identity (recorded before runs kept "
                    "one): judged by their arm's definition only, their data and config files unknown")
    carried = sum(1 for a, v in runs.items() for s, r in v.items() if r is old_runs.get(a, {}).get(s))
    said.append(f"with the record made before: {carried} of its runs kept beside this result's "
                f"{sum(len(v) for v in new_runs.values())}" + (f", {replaced} replaced by this result's newer runs"
                                                               if replaced else "")
                + (f", {newer_kept} of this result's runs older than the recorded ones, which stay" if newer_kept
                   else ""))
    merged = {**new, **tables(exp, new["dataset"], runs, earlier=earlier)}
    if data is None and earlier.get("data_fingerprint") is not None:
        merged["data_fingerprint"] = earlier["data_fingerprint"]
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
