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
"""

from __future__ import annotations

import csv
import io
import json
import math
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


def write_table(out: Path, recs: list[TrialRecord], keys: list[str], metric: str, mode: str,
                best: TrialRecord | None) -> None:
    from ..io_utils import write_text_atomic

    header, rows = table_rows(recs, keys, metric, mode)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for row in rows:
        w.writerow(["" if v is None else v for v in row])
    write_text_atomic(out / "results.csv", buf.getvalue())
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
            if best is not None and cells["trial"] == best.trial and h in ("trial", metric):
                text = f"**{text}**"
            shown.append(text)
        lines.append("| " + " | ".join(shown) + " |")
    counts = {s: sum(r.status == s for r in recs) for s in STATUSES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    note = (f"\n{len(recs)} trials ({summary}); {metric} ({mode}) is the last value each trial reported"
            + (f"; best: **{best.trial}** ({metric} {_fmt(best.metric)} at step {best.steps})" if best else "")
            + ".\n")
    write_text_atomic(out / "results.md", "\n".join(lines) + "\n" + note)


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


def write_results(cfg, events_path: Path, metric: str, mode: str) -> dict:
    """All outputs of the sweep folder from its event log; returns a short summary."""
    from ..io_utils import write_json_atomic, write_text_atomic

    out = Path(cfg.output)
    recs = trial_records(read_events(events_path), metric)
    keys = [p.key for p in cfg.space]
    best = best_trial(recs, mode)
    write_table(out, recs, keys, metric, mode, best)
    plots = write_plots(out, recs, list(cfg.space), metric)
    summary = {"trials": len(recs), "statuses": {s: sum(r.status == s for r in recs) for s in STATUSES},
               "metric": metric, "mode": mode, "best": None,
               "files": ["results.csv", "results.md", *[str(p.relative_to(out)) for p in plots]]}
    if best is not None:
        write_text_atomic(out / "best.yaml", best_config_yaml(cfg, best, metric, mode))
        summary["best"] = {"trial": best.trial, "params": best.params, "metric": best.metric, "steps": best.steps}
        summary["files"].append("best.yaml")
    write_json_atomic(out / "summary.json", {**summary, "trials_detail": [
        {"trial": r.trial, "status": r.status, "params": r.params, "metric": r.metric, "steps": r.steps,
         "total_steps": r.total_steps, "wall_s": round(r.wall_s, 1), "error": r.error} for r in recs]})
    return summary
