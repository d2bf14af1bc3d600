"""A sweep's outputs, built from its event log (`events.jsonl`, one JSON object a line).

    events.jsonl     start / result / complete / early-stopped / error records, appended by the
                     progress callback (an interrupted sweep keeps what it wrote; a resumed one appends)
    results.csv      one row per trial: id, status, the swept values, the metric (last reported),
                     steps / total, wall seconds, the other validation measures, the error if any
    results.md       the same table in Markdown, best first
    best.yaml        the best trial's full training config: `pipeline train --config best.yaml`
    plots/metric_vs_<key>.png   the metric against each swept value (marker = status)
    plots/learning_curves.png   the metric and the training loss against steps, one line per trial

The best trial is chosen among trials that ran to their last step when there are any (an
early-stopped trial's metric is from fewer steps), by its last reported metric.

With replicates (`search.replicate_key: train.seed`), trials whose swept values differ only in
the replicate key form one configuration, and the sweep selects configurations, not trials:

    best         the configuration with the best mean over its replicates, among those whose every
                 replicate ran to its last step (when there are any; else among those with any
                 result), ties to the one with more replicates
    results.md   first a table by configuration -- mean ± sd over the replicates (sample sd, n - 1),
                 n, and each replicate's value -- then the trials; the best configuration's trials
                 are bold
    results_by_config.csv   that table as CSV
    best.yaml    the best configuration, its replicate key left at the base config's value (the
                 header lists the mean ± sd and each replicate's value)

Size: ~520 lines on purpose: the event log's reading, the per-trial and per-configuration
tables, the plots and best.yaml are one concern (a sweep's outputs) and share their records.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

STATUSES = ("terminated", "early-stopped", "error", "unfinished")


@dataclass
class TrialRecord:
    trial: str
    params: dict
    status: str = "unfinished"
    steps: int = 0
    total_steps: int | None = None
    metric: float | None = None
    wall_s: float = 0.0
    last: dict = field(default_factory=dict)
    history: list = field(default_factory=list)  # [{step, metric?, loss?, ...}] by step
    error: str = ""


def read_events(path: Path) -> list[dict]:
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill: the rest is still good
            continue
    return out


def trial_records(events: list[dict], metric: str) -> list[TrialRecord]:
    """Fold the event log into one record per trial (latest terminal event wins; results by step)."""
    recs: dict[str, TrialRecord] = {}
    started: dict[str, float] = {}
    seen: dict[str, float] = {}  # each trial's latest event time
    for ev in events:
        tid = ev.get("trial")
        if tid is None:
            continue
        if "time" in ev and ev.get("event") != "start":
            seen[tid] = ev["time"]
        rec = recs.get(tid)
        if rec is None:
            rec = recs[tid] = TrialRecord(trial=tid, params=dict(ev.get("params") or {}))
        kind = ev.get("event")
        if kind == "start":
            rec.params = dict(ev.get("params") or rec.params)
            if rec.status != "terminated":
                rec.status = "unfinished"
            if tid in started:  # started again after an interruption: count the time it ran before
                rec.wall_s += max(0.0, seen.get(tid, started[tid]) - started[tid])
            started[tid] = ev.get("time", 0.0)
        elif kind == "result":
            m = ev.get("metrics") or {}
            step = int(m.get("step", 0))
            rec.history = [h for h in rec.history if h["step"] != step] + [dict(m, step=step)]
            rec.history.sort(key=lambda h: h["step"])
            if m.get("total_steps") is not None:
                rec.total_steps = int(m["total_steps"])
        elif kind in ("complete", "early-stopped", "error"):
            rec.status = {"complete": "terminated"}.get(kind, kind)
            if kind == "error":
                rec.error = str(ev.get("error") or "")
            if tid in started:
                rec.wall_s += max(0.0, ev.get("time", 0.0) - started.pop(tid))
    for rec in recs.values():
        if rec.history:
            rec.steps = int(rec.history[-1]["step"])
            merged: dict = {}
            for h in rec.history:
                merged.update(h)
            rec.last = merged
            vals = [h[metric] for h in rec.history if metric in h and _finite(h[metric])]
            rec.metric = float(vals[-1]) if vals else None
        if rec.status == "unfinished" and rec.trial in started:  # interrupted: the time it ran so far
            rec.wall_s += max(0.0, seen.get(rec.trial, started[rec.trial]) - started[rec.trial])
    return list(recs.values())


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def best_trial(recs: list[TrialRecord], mode: str) -> TrialRecord | None:
    scored = [r for r in recs if r.metric is not None and r.status != "error"]
    done = [r for r in scored if r.status == "terminated"]
    pool = done or scored
    if not pool:
        return None
    sign = 1 if mode == "max" else -1
    return max(pool, key=lambda r: (sign * r.metric, r.steps))


@dataclass
class ConfigGroup:
    """One configuration of a sweep with replicates: its trials under each replicate value."""

    params: dict                                   # the swept values, the replicate key left out
    key: str                                       # the replicate key, e.g. train.seed
    trials: dict = field(default_factory=dict)     # replicate value (repr) -> TrialRecord
    values: dict = field(default_factory=dict)     # replicate value (repr) -> the value itself
    expected: tuple = ()                           # the replicate values the sweep runs (repr)

    def scored(self) -> dict:
        """replicate (repr) -> metric, for the replicates with a metric (errors left out)."""
        return {v: r.metric for v, r in self.trials.items() if r.metric is not None and r.status != "error"}

    @property
    def n(self) -> int:
        return len(self.scored())

    @property
    def mean(self) -> float | None:
        vals = list(self.scored().values())
        return statistics.fmean(vals) if vals else None

    @property
    def sd(self) -> float | None:
        """The sample standard deviation over the replicates (None below 2)."""
        vals = list(self.scored().values())
        return statistics.stdev(vals) if len(vals) >= 2 else None

    @property
    def complete(self) -> bool:
        """Every expected replicate ran to its last step and reported the metric."""
        return bool(self.expected) and all(
            v in self.trials and self.trials[v].status == "terminated" and self.trials[v].metric is not None
            for v in self.expected)

    @property
    def steps(self) -> int:
        return min((r.steps for r in self.trials.values()), default=0)

    def label(self) -> str:
        return f"mean over {self.key} ({self.n} of {len(self.expected)} trials)"

    def describe(self) -> str:
        return ", ".join(f"{k}={_fmt(v)}" for k, v in self.params.items()) or "(no other swept key)"


def group_replicates(recs: list[TrialRecord], keys: list[str], replicate_key: str,
                     replicate_values: list | None = None) -> list[ConfigGroup]:
    """Trials whose values of `keys` differ only in `replicate_key` -> one group each, in the
    order their first trial appears. `replicate_values` are the values the sweep runs (space order;
    default: every value seen). A replicate run twice keeps its finished run (else its latest)."""
    others = [k for k in keys if k != replicate_key]
    values = list(replicate_values) if replicate_values is not None else \
        list({repr(r.params.get(replicate_key)): r.params.get(replicate_key) for r in recs}.values())
    expected = tuple(dict.fromkeys(repr(v) for v in values))
    groups: dict[tuple, ConfigGroup] = {}
    for r in recs:
        gk = tuple(repr(r.params.get(k)) for k in others)
        g = groups.get(gk)
        if g is None:
            g = groups[gk] = ConfigGroup(params={k: r.params.get(k) for k in others}, key=replicate_key,
                                         expected=expected)
        v = r.params.get(replicate_key)
        old = g.trials.get(repr(v))
        if old is None or (r.status == "terminated", r.metric is not None, r.steps) >= \
                (old.status == "terminated", old.metric is not None, old.steps):
            g.trials[repr(v)] = r
            g.values[repr(v)] = v
    for g in groups.values():  # replicates in the sweep's order, unexpected ones after
        order = list(expected) + sorted(set(g.trials) - set(expected))
        g.trials = {v: g.trials[v] for v in order if v in g.trials}
    return list(groups.values())


def best_group(groups: list[ConfigGroup], mode: str) -> ConfigGroup | None:
    """The best mean over replicates, among complete configurations when there are any."""
    scored = [g for g in groups if g.n]
    pool = [g for g in scored if g.complete] or scored
    if not pool:
        return None
    sign = 1 if mode == "max" else -1
    return max(pool, key=lambda g: (sign * g.mean, g.n))


def _order_groups(groups: list[ConfigGroup], mode: str) -> list[ConfigGroup]:
    sign = -1 if mode == "max" else 1
    return sorted(groups, key=lambda g: (not g.complete, g.mean is None, sign * g.mean if g.mean is not None else 0.0))


def _mean_sd(g: ConfigGroup) -> str:
    if g.mean is None:
        return ""
    return f"{_fmt(g.mean)} ± {_fmt(g.sd)}" if g.sd is not None else f"{_fmt(g.mean)} (n={g.n})"


def group_rows(groups: list[ConfigGroup], keys: list[str], metric: str, mode: str) -> tuple[list[str], list[list]]:
    """The by-configuration table: swept values, mean, sd, n, complete, each replicate's metric."""
    if not groups:
        return [], []
    key = groups[0].key
    others = [k for k in keys if k != key]
    reps = list(dict.fromkeys([*groups[0].expected, *[v for g in groups for v in g.trials]]))
    shown = {v: next((g.values[v] for g in groups if v in g.values), v) for v in reps}
    header = [*others, f"{metric}_mean", f"{metric}_sd", "n", "complete",
              *[f"{key}={_fmt(shown[v])}" for v in reps], "trials"]
    rows = []
    for g in _order_groups(groups, mode):
        cells = []
        for v in reps:
            r = g.trials.get(v)
            cells.append(None if r is None else (r.metric if r.metric is not None and r.status != "error" else None))
        rows.append([*[g.params.get(k) for k in others], g.mean, g.sd, g.n, g.complete, *cells,
                     " ".join(r.trial for r in g.trials.values())])
    return header, rows


def _replicate_cell(r: TrialRecord | None) -> str:
    if r is None:
        return "not run"
    if r.status == "error" or r.metric is None:
        return r.status
    return _fmt(r.metric) + ("" if r.status == "terminated" else f" ({r.status})")


def group_markdown(groups: list[ConfigGroup], keys: list[str], metric: str, mode: str,
                   best: ConfigGroup | None) -> list[str]:
    key = groups[0].key
    others = [k for k in keys if k != key]
    reps = list(dict.fromkeys([*groups[0].expected, *[v for g in groups for v in g.trials]]))
    shown = {v: next((g.values[v] for g in groups if v in g.values), v) for v in reps}
    header = [*others, f"{metric} mean ± sd", "n", *[f"{key}={_fmt(shown[v])}" for v in reps]]
    lines = [f"## By configuration: mean ± sd over {key}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for g in _order_groups(groups, mode):
        cells = [_fmt(g.params.get(k)) for k in others] + [_mean_sd(g), f"{g.n}/{len(g.expected)}"]
        cells += [_replicate_cell(g.trials.get(v)) for v in reps]
        if g is best:
            cells = [f"**{c}**" if c else c for c in cells]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    n_complete = sum(g.complete for g in groups)
    lines += ["", f"{len(groups)} configurations x {len(groups[0].expected)} values of {key} "
              f"({n_complete} with every replicate finished); sd is the sample sd over the replicates (n - 1)"
              + (f"; best by the mean over {key}"
                 + (" among complete configurations" if best.complete else
                    " (no configuration has every replicate finished: among those with results)")
                 + f": **{best.describe()}**, {metric} {_mean_sd(best)} (n={best.n})" if best else "")
              + ".", ""]
    return lines


def _order(recs: list[TrialRecord], mode: str) -> list[TrialRecord]:
    sign = -1 if mode == "max" else 1

    def key(r):
        return (r.metric is None, sign * r.metric if r.metric is not None else 0.0, r.trial)
    return sorted(recs, key=key)


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e-3 or abs(v) >= 1e4 else f"{v:.4f}".rstrip("0").rstrip(".")
    return str(v)


def table_rows(recs: list[TrialRecord], keys: list[str], metric: str, mode: str) -> tuple[list[str], list[list]]:
    extra = sorted({k for r in recs for k in r.last if k.startswith("val_") and k not in (metric, "val_metric",
                                                                                         "val_seconds")})
    header = ["trial", "status", *keys, metric, "steps", "total_steps", "wall_s", *extra, "error"]
    rows = []
    for r in _order(recs, mode):
        rows.append([r.trial, r.status, *[r.params.get(k) for k in keys], r.metric, r.steps, r.total_steps,
                     round(r.wall_s, 1), *[r.last.get(k) for k in extra], r.error])
    return header, rows


def _csv(header: list[str], rows: list[list]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for row in rows:
        w.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


def write_table(out: Path, recs: list[TrialRecord], keys: list[str], metric: str, mode: str,
                best: TrialRecord | None, groups: list[ConfigGroup] | None = None,
                best_config: ConfigGroup | None = None, warning: str = "") -> None:
    """results.csv / results.md; with replicate groups, results_by_config.csv and the
    by-configuration table first (`best` is then None and the best configuration's trials are bold)."""
    from ..io_utils import write_text_atomic

    header, rows = table_rows(recs, keys, metric, mode)
    write_text_atomic(out / "results.csv", _csv(header, rows))
    top: list[str] = []
    bold = {best.trial} if best is not None else set()
    if groups:
        write_text_atomic(out / "results_by_config.csv", _csv(*group_rows(groups, keys, metric, mode)))
        top = group_markdown(groups, keys, metric, mode, best_config) + ["## Trials", ""]
        bold = {r.trial for r in best_config.trials.values()} if best_config is not None else set()
    md_header = [h for h in header if h != "error"] + (["error"] if any(r.error for r in recs) else [])
    lines = ["| " + " | ".join(md_header) + " |", "|" + "---|" * len(md_header)]
    for row in rows:
        cells = dict(zip(header, row))
        shown = []
        for h in md_header:
            v = cells[h]
            text = _fmt(v).replace("|", "\\|").replace("\n", " ")
            if h == "error" and len(text) > 80:
                text = text[:77] + "..."
            if cells["trial"] in bold and h in ("trial", metric):
                text = f"**{text}**"
            shown.append(text)
        lines.append("| " + " | ".join(shown) + " |")
    counts = {s: sum(r.status == s for r in recs) for s in STATUSES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    note = (f"\n{len(recs)} trials ({summary}); {metric} ({mode}) is the last value each trial reported"
            + (f"; best: **{best.trial}** ({metric} {_fmt(best.metric)} at step {best.steps})" if best else "")
            + (f"; bold: the trials of the best configuration ({best_config.describe()})" if best_config else "")
            + ".\n")
    head = [f"> **WARNING**: {warning}", ""] if warning else []
    write_text_atomic(out / "results.md", "\n".join(head + top + lines) + "\n" + note)


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def write_plots(out: Path, recs: list[TrialRecord], params: list, metric: str) -> list[Path]:
    """metric vs each swept key, and the learning curves of all trials (PNG, matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    written = []
    markers = {"terminated": ("o", "tab:blue"), "early-stopped": ("x", "tab:orange"),
               "error": ("s", "tab:red"), "unfinished": ("^", "tab:gray")}
    for p in params:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        vals = [r.params.get(p.key) for r in recs]
        numeric = _numeric([v for v in vals if v is not None])
        cats = [] if numeric else sorted({repr(v) for v in vals})
        for status, (marker, color) in markers.items():
            pts = [(r.params.get(p.key), r.metric) for r in recs if r.status == status and r.metric is not None]
            if not pts:
                continue
            xs = [x if numeric else cats.index(repr(x)) for x, _ in pts]
            ax.scatter(xs, [y for _, y in pts], marker=marker, color=color, label=status, s=40)
        if not numeric:
            ax.set_xticks(range(len(cats)), cats)
        elif p.kind == "loguniform":
            ax.set_xscale("log")
        ax.set_xlabel(p.key)
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} vs {p.key} (last reported)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # no trial reported yet (an interrupted sweep): no legend
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = plots / f"metric_vs_{p.key.replace('/', '_')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    # right panel: the training loss, or the validation metric when the sweep ranks by the loss
    other = "loss" if metric != "loss" else "val_metric"
    for r in recs:
        style = "--" if r.status == "early-stopped" else "-"
        label = r.trial + " " + " ".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in r.params.items())
        pts = [(h["step"], h[metric]) for h in r.history if metric in h]
        if pts:
            axes[0].plot(*zip(*pts), style, marker=".", label=label)
        loss = [(h["step"], h[other]) for h in r.history if other in h]
        if loss:
            axes[1].plot(*zip(*loss), style, label=label)
    axes[0].set_title(f"{metric} (dashed: early-stopped)")
    axes[1].set_title("training loss" if other == "loss" else "validation metric (val_metric)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(metric)
    axes[1].set_ylabel(other)
    handles, labels = axes[1].get_legend_handles_labels() if axes[1].lines else axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=min(3, len(labels)))
        fig.tight_layout(rect=(0, 0.08 + 0.04 * math.ceil(len(labels) / 3), 1, 1))
    else:
        fig.tight_layout()
    path = plots / "learning_curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def best_config_yaml(cfg, best: TrialRecord, metric: str, mode: str) -> str:
    """The best trial's full training config, as `pipeline train --config` reads it."""
    from ..train.config import dump_job
    from .space import load_job, set_key, trial_data

    data = trial_data(cfg, best.params)
    base_job = load_job(cfg.base_data(), "base")
    data = set_key(data, "train.name", f"{base_job.train.name}-best")
    job = load_job(data, f"best trial {best.trial}")
    head = (f"# Best trial {best.trial} of the sweep {cfg.output} ({cfg.config_path or 'inline'}): "
            f"{metric} {_fmt(best.metric)} ({mode}) at step {best.steps}"
            + (f"/{best.total_steps}" if best.total_steps else "") + "\n"
            + "# " + ", ".join(f"{k}={v!r}" for k, v in best.params.items()) + "\n"
            + "#   pipeline train --config <this file>\n")
    return head + dump_job(job)


def best_group_yaml(cfg, group: ConfigGroup, metric: str, mode: str) -> str:
    """The best configuration's full training config; its replicate key stays the base config's."""
    from ..train.config import dump_job
    from .space import load_job, set_key, trial_data

    data = trial_data(cfg, group.params)
    base_job = load_job(cfg.base_data(), "base")
    data = set_key(data, "train.name", f"{base_job.train.name}-best")
    job = load_job(data, f"best configuration {group.describe()}")
    per = ", ".join(f"{group.key}={_fmt(group.values[v])}: {_fmt(m)} ({group.trials[v].trial})"
                    for v, m in group.scored().items())
    head = (f"# Best configuration of the sweep {cfg.output} ({cfg.config_path or 'inline'}) by the mean over "
            f"{group.key}: {metric} {_mean_sd(group)} ({mode}, n={group.n}"
            + ("" if group.complete else f" of {len(group.expected)}, not every replicate finished") + ")\n"
            + f"# {group.describe()}\n# per replicate: {per}\n"
            + f"# {group.key} is left at the base config's value; the replicates ran "
            + ", ".join(_fmt(group.values.get(v, v)) for v in group.expected) + "\n"
            + "#   pipeline train --config <this file>\n")
    return head + dump_job(job)


def write_results(cfg, events_path: Path, metric: str, mode: str, out: Path | None = None) -> dict:
    """All outputs of the sweep folder from its event log; returns a short summary. `out` is the
    local folder they are written in: the output itself, or the staging folder of an output on a
    URI (tune/output.py uploads it); default `cfg.output`."""
    from ..io_utils import write_json_atomic, write_text_atomic

    out = Path(cfg.output) if out is None else out
    recs = trial_records(read_events(events_path), metric)
    keys = [p.key for p in cfg.space]
    rkey = getattr(cfg.search, "replicate_key", None)
    groups = chosen = None
    if rkey:
        param = next((p for p in cfg.space if p.key == rkey), None)
        groups = group_replicates(recs, keys, rkey, list(param.values) if param is not None else None)
        chosen = best_group(groups, mode)
        best = None
    else:
        best = best_trial(recs, mode)
    warning = ""
    if getattr(cfg.search, "allow_test_selection", False):
        from .space import load_job, selects_on_test

        why = selects_on_test(load_job(cfg.base_data(), "base"))
        if why:
            warning = (f"this sweep selected on a test split ({why}; search.allow_test_selection: true): "
                       "the best trial's numbers on that split are not a held-out estimate")
    write_table(out, recs, keys, metric, mode, best, groups, chosen, warning)
    plots = write_plots(out, recs, list(cfg.space), metric)
    summary = {"trials": len(recs), "statuses": {s: sum(r.status == s for r in recs) for s in STATUSES},
               "metric": metric, "mode": mode, "best": None,
               "files": ["results.csv", "results.md", *(["results_by_config.csv"] if groups else []),
                         *[str(p.relative_to(out)) for p in plots]]}
    if best is not None:
        write_text_atomic(out / "best.yaml", best_config_yaml(cfg, best, metric, mode))
        summary["best"] = {"trial": best.trial, "params": best.params, "metric": best.metric, "steps": best.steps}
        summary["files"].append("best.yaml")
    if chosen is not None:
        write_text_atomic(out / "best.yaml", best_group_yaml(cfg, chosen, metric, mode))
        summary["best"] = {"trial": chosen.label(), "params": chosen.params, "metric": chosen.mean, "sd": chosen.sd,
                           "n": chosen.n, "complete": chosen.complete, "steps": chosen.steps,
                           "replicate_key": rkey,
                           "replicates": [{rkey: chosen.values[v], "trial": chosen.trials[v].trial, "metric": m}
                                          for v, m in chosen.scored().items()]}
        summary["files"].append("best.yaml")
    if groups is not None:
        summary["replicate_key"] = rkey
        summary["configurations"] = [
            {"params": g.params, "mean": g.mean, "sd": g.sd, "n": g.n, "complete": g.complete,
             "replicates": [{rkey: g.values[v], "trial": r.trial, "status": r.status, "metric": r.metric}
                            for v, r in g.trials.items()]}
            for g in _order_groups(groups, mode)]
    write_json_atomic(out / "summary.json", {**summary, "trials_detail": [
        {"trial": r.trial, "status": r.status, "params": r.params, "metric": r.metric, "steps": r.steps,
         "total_steps": r.total_steps, "wall_s": round(r.wall_s, 1), "error": r.error} for r in recs]})
    return summary
