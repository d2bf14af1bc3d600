"""An experiment's result as a page section and a figure (`pipeline reproduce report`).

The table: one row per comparison (method, baseline, difference, 95 % interval, p, verdict, seeds, the smallest
detectable effect, wall time per seed, marked where seeds shared the machine: `record.shared`) and the same on
DAR's labeled and unlabeled parts. The figure: per
comparison, each seed's difference as a dot, the mean and its interval as a bar, a line at 0.
"""

from __future__ import annotations

from pathlib import Path

PART_NAMES = {"all": "all test judgements", "labeled": "labeled documents", "unlabeled": "unlabeled documents"}


def _f(x, fmt="+.4f") -> str:
    return "—" if x is None else format(x, fmt)


def _p(e: dict) -> str:
    """The randomization test's p, then Holm's over the table (≈ marks a p within three Monte Carlo errors of
    α: another draw of the flips could cross it)."""
    p, adjusted = e.get("p_randomization"), e.get("p_holm")
    near = "≈" if e.get("p_near_alpha") else ""
    return f"{near}{_f(p, '.3f')}" + ("" if adjusted is None else f" / {_f(adjusted, '.3f')}")


def _verdict(e: dict) -> str:
    raw = e.get("verdict_raw")
    return e["verdict"] + (f" (alone: {raw})" if raw is not None and raw != e["verdict"] else "")


def _row(cid: str, row: dict, part: str) -> str | None:
    e = (row.get("parts") or {}).get(part)
    if not e or not e.get("n_seeds"):
        return None
    wall = row.get("wall_seconds_per_seed")
    wall_text = ("—" if wall is None else f"{wall / 60:.1f} min") \
        + (f" ({row['shared_seeds']} shared)" if row.get("shared_seeds") else "")
    if "difference" not in e:  # no query of this part can be scored (the judgements name none of its documents)
        return (f"| {cid} | {row['method']} | {row['baseline']} | — | — | — | — | — | no query can be scored on "
                f"this part | {e['n_seeds']} | — | {wall_text} |")
    iv = e.get("interval")
    return (f"| {cid} | {row['method']} | {row['baseline']} | {_f(e.get('method_mean'), '.4f')} | "
            f"{_f(e.get('baseline_mean'), '.4f')} | {_f(e.get('difference'))} ± {_f(e.get('sd'), '.4f')} | "
            + (f"[{iv[0]:+.4f}, {iv[1]:+.4f}]" if iv else "—") + f" | {_p(e)} | {_verdict(e)} | "
            f"{e['n_seeds']} | {_f(e.get('mde'), '.4f')} | {wall_text} |")


def _wall(v: dict) -> str:
    """A run's wall time, with the load it ran under when it shared the machine."""
    from .record import shared

    if v.get("wall_seconds") is None:
        return "—"
    load = v.get("load")
    return f"{v['wall_seconds'] / 60:.1f} min" + (f" (shared: load {load['mean']:.1f} on {load['cpus']} cores)"
                                                   if shared(load) else "")


def markdown(result: dict, figure: str | None = None) -> list[str]:
    """The section's lines for one dataset's result."""
    machines = result.get("machines") or [result.get("machine") or {}]
    where = "; ".join(f"{m.get('cpu', '?')} ({m.get('cores', '?')} cores, "
                      f"{', '.join(m.get('isa') or []) or 'no listed ISA flags'})" for m in machines)
    dates = sorted(str(v.get("date") or "")[:10] for a in (result.get("arms") or {}).values()
                   for v in a["seeds"].values() if v.get("date"))
    when = dates[0] if dates and dates[0] == dates[-1] else (f"{dates[0]} to {dates[-1]}" if dates else
                                                             str(result.get("date", ""))[:10])
    out = [f"#### {result['dataset']}", "",
           f"{result['metric']} on the test judgements; {len(result.get('seeds') or [])} seeds planned, "
           f"{result.get('runs_finished', 0)} of {result.get('runs_planned', 0)} runs finished"
           + ("" if result.get("complete") else " (incomplete: rows show the seeds run so far)")
           + f"; {result.get('labeled_documents', 0):,} labeled documents. Measured {when} on {where}, recorded "
           f"at commit {str(result.get('commit') or '?')[:10]}"
           + (f"; vars changed: {result['changed_vars']}" if result.get("changed_vars") else "") + ".", ""]
    head = ("| comparison | method | baseline | method mean | baseline mean | difference ± sd (seeds) | 95 % interval "
            "| p (queries) / Holm | verdict | seeds | smallest detectable | wall per seed |")
    sep = "|---|---|---|---|---|---|---|---|---|---|---|---|"
    for part in ("all", "labeled", "unlabeled"):
        rows = [r for r in (_row(cid, row, part) for cid, row in result["comparisons"].items()) if r]
        if not rows:
            continue
        out += [f"On {PART_NAMES[part]}:", "", head, sep, *rows, ""]
    tested = [e for row in result["comparisons"].values() for e in [(row.get("parts") or {}).get("all") or {}]
              if e.get("family_size")]
    odd = []
    if tested:
        resamples = tested[0].get("resamples", 10_000)
        odd.append(f"* p is the paired randomization test over queries ({resamples:,} sign flips; its Monte Carlo "
                   f"error √(p(1-p)/{resamples:,}) is at most {0.5 / resamples ** 0.5:.4f}; ≈ marks a p within three "
                   "such errors of 0.05), then Holm's adjustment over the table's "
                   f"{tested[0]['family_size']} tested comparisons (each part apart): the verdict is judged with "
                   "Holm's p, so a table of methods that do nothing reads \"beyond noise\" anywhere at most 5 % of "
                   "the time; where the row alone reads otherwise, its verdict says so (alone: ...).")
    odd += [f"* **{cid} is not comparable**: {row['not_comparable']}; the difference is not the method's effect."
            for cid, row in result["comparisons"].items() if row.get("not_comparable")]
    odd += [f"* **{cid}**'s seeds were made by {len(row['code_digests'])} versions of the code "
            f"({', '.join(row['code_digests'])}): a change to a loss between them would be in its difference."
            for cid, row in result["comparisons"].items() if len(row.get("code_digests") or []) > 1]
    if result.get("runs_left_out"):
        odd.append(f"* {len(result['runs_left_out'])} finished run(s) left out (another identity): "
                   + "; ".join(result["runs_left_out"][:5]) + ".")
    odd += [f"* **{cid}** is as recorded on {str(row['as_recorded'].get('date'))[:10]} (commit "
            f"{str(row['as_recorded'].get('commit') or '?')[:10]}): its runs were recorded before the record kept "
            "each query's value, so it cannot be computed again with the runs added since; its figures are "
            "those runs' (the table of arms and seeds below shows the newest run of each seed)."
            for cid, row in result["comparisons"].items() if row.get("as_recorded")]
    if any(row.get("shared_seeds") for row in result["comparisons"].values()):
        odd.append("* A wall time marked *shared* is a mean over seeds some of which shared the machine with other "
                   "work (a mean load above its cores by more than one process, sampled while they ran): alone they "
                   "take less; the table of arms and seeds below names them.")
    if odd:
        out += odd + [""]
    if figure:
        out += [f"![each seed's difference (dots), the mean and its 95 % interval]({figure})", ""]
    arms = result.get("arms") or {}
    if arms:
        several = len(machines) > 1  # runs merged from more than one machine: each run names its own
        out += ["Per arm and seed (" + result["metric"] + ", all / labeled / unlabeled):", "",
                "| arm | seed | all | labeled | unlabeled | wall |" + (" machine | date |" if several else ""),
                "|---|---|---|---|---|---|" + ("---|---|" if several else "")]
        for a, info in arms.items():
            for s, v in info["seeds"].items():
                m = v.get("machine") or result.get("machine") or {}
                out.append(f"| {a} | {s} | {_f(v.get('all'), '.4f')} | {_f(v.get('labeled'), '.4f')} | "
                           f"{_f(v.get('unlabeled'), '.4f')} | " + _wall(v) + " |"
                           + (f" {m.get('cpu', '?')} ({m.get('cores', '?')} cores) | {str(v.get('date'))[:10]} |"
                              if several else ""))
        out.append("")
    return out


def plotted(result: dict) -> list[tuple[str, dict]]:
    """The comparisons the figure shows: those with a seed run, less those not comparable (their difference is
    not the method's effect, and the table says why)."""
    return [(cid, row["parts"]["all"]) for cid, row in result["comparisons"].items()
            if (row.get("parts") or {}).get("all", {}).get("n_seeds") and "per_seed" in row["parts"]["all"]
            and not row.get("not_comparable")]


OFF_SCALE = 8.0  # a row reaching this many times further from 0 than the median row is drawn at the edge


def scale(rows: list[tuple[str, dict]]) -> tuple[float | None, list[str]]:
    """The figure's half-width and the rows too far out for it: a row whose seeds or interval reach more than
    OFF_SCALE times as far from 0 as the median row's would squash every other row into a point (a collapsed
    method against effects of a few thousandths), so it is drawn at the edge with its figures written out.
    (None, []) when every row fits: matplotlib's own limits then."""
    import statistics

    reach = {cid: max([abs(x) for x in e["per_seed"]] + [abs(x) for x in (e.get("interval") or [])]
                      + [abs(e["difference"])]) for cid, e in rows}
    if len(reach) < 3:
        return None, []
    typical = statistics.median(reach.values())
    off = [cid for cid, r in reach.items() if typical > 0 and r > OFF_SCALE * typical]
    if not off or len(off) == len(reach):
        return None, []
    return 1.15 * max(r for cid, r in reach.items() if cid not in off), off


def figure(result: dict, path: Path) -> bool:
    """Each comparison's per-seed differences as dots, mean and 95 % interval as a bar; a row far off the others'
    scale at the edge, its figures written beside it (`scale`); False when nothing ran."""
    rows = plotted(result)
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    limit, off = scale(rows)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.4))
    for y, (cid, e) in enumerate(reversed(rows)):
        iv = e.get("interval")
        color = {"holds beyond noise": "tab:green", "opposite beyond noise": "tab:red",
                 "no difference": "tab:gray"}.get(e["verdict"], "tab:blue")
        if cid in off:
            side = -1 if e["difference"] < 0 else 1
            ax.scatter([side * limit * 0.97], [y], marker="<" if side < 0 else ">", s=60, color=color, zorder=4)
            ax.annotate(f"{e['difference']:+.4f}" + (f" [{iv[0]:+.4f}, {iv[1]:+.4f}]" if iv else "")
                        + ", off this scale", (side * limit * 0.92, y), va="center", ha="left" if side < 0 else "right",
                        fontsize=8, color=color)
            continue
        ax.scatter(e["per_seed"], [y] * len(e["per_seed"]), s=14, color="0.45", zorder=3)
        if iv:
            ax.plot(iv, [y, y], color=color, linewidth=3, alpha=0.6, zorder=2)
        ax.scatter([e["difference"]], [y], marker="D", s=36, color=color, zorder=4)
    if limit is not None:
        ax.set_xlim(-limit, limit)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [cid for cid, _ in reversed(rows)])
    ax.set_xlabel(f"{result['metric']} difference to the baseline (dots: seeds; bar: 95 % interval)")
    ax.set_title(f"{result['dataset']}: each method against its baseline")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return True
