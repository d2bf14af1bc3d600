"""docs/reproductions.md: the matrix as a page (`pipeline reproduce report`)."""

from __future__ import annotations

from pathlib import Path

from .matrix import Matrix
from .status import _status_text, cell_status


def render_report(matrix: Matrix, work_root: Path | None = None, folder: str | Path | None = None) -> str:
    """docs/reproductions.md: every family, every cell with its figure, source, status and commands. An experiment's
    family shows its commands once and, per dataset with a result, its table and figure (`write_figures` draws the
    figures beside the page)."""
    out = ["# Reproductions",
           "",
           "Every published figure this pipeline can reach, one cell per figure, as data in `repro/*.yaml`: the",
           "data it needs, the exact commands, the figure with its source and tolerance, the hardware it needs.",
           "`pipeline reproduce run CELL --data NAME=PATH` runs a cell and compares; this page is made by",
           "`pipeline reproduce report` from the matrix and the recorded results (`repro/results/`).",
           "Project cells (marked *project*) are this project's own figures, not published ones.", "",
           "Each cell shows the one command that runs it and the commands that runs, with example paths filled in: "
           "`{work}` is the cell's work folder (`--work`, default `runs/reproduce/<cell>`), and each dataset's "
           "placeholder (`{scifact}`, ...) the folder or file given with `--data NAME=PATH` (here `datasets/<name>`; "
           "the bundled FAQ is `pipeline/resources/python_faq`). A status names its date, machine and commit "
           "(`pipeline reproduce status` adds how many commits before HEAD that is, and whether the code the cells "
           "run changed since); \"recorded\" means the run is where the cell's expected figure came from (or the cell "
           "has none): only a run on another commit or machine can pass it.", "",
           "| cell | figure | expected | tolerance | hardware | status |", "|---|---|---|---|---|---|"]
    for cell in matrix.cells.values():
        st = cell_status(cell, work_root, folder)
        exp = "—" if cell.expected is None else f"{cell.expected:g}"
        # a cell's own section; an effect cell's row is in its experiment's table for its dataset
        anchor = cell.data[0] if cell.experiment else cell.id.replace(".", "")
        out.append(f"| [`{cell.id}`](#{anchor}) | {cell.metric['name']}"
                   + (" *(project)*" if cell.project else "")
                   + f" | {exp} | ±{cell.tolerance:g} | {cell.hardware.get('class')}, {cell.hardware.get('wall')} | "
                   f"{_status_text(st, cell, relative=False)} |")
    for fam, info in matrix.families.items():
        out += ["", f"## {info['title']}", ""]
        if info.get("notes"):
            out += [str(info["notes"]).strip(), ""]
        if fam in matrix.experiments:
            out += _experiment_section(matrix, fam, work_root, folder)
            continue
        if info.get("uncovered"):
            n = sum(int(u.get("count") or 1) for u in info["uncovered"])
            out += [f"Figures of this family's papers that no cell reproduces ({n}), each with its reason:", ""]
            out += [f"- {u['figures']}" + (f" ({u['count']})" if u.get("count") else "") + f": {u['reason']}"
                    for u in info["uncovered"]] + [""]
        for cell in [c for c in matrix.cells.values() if c.family == fam]:
            st = cell_status(cell, work_root, folder)
            out += [f"### {cell.id}", "", f"**{cell.title}**" + (" (the project's own figure)" if cell.project else ""),
                    "", f"- figure: {cell.metric['name']} = {'—' if cell.expected is None else cell.expected} "
                    f"± {cell.tolerance:g} ({cell.tolerance_why})",
                    f"- source: {cell.source}",
                    "- data: " + ", ".join(f"`{d}` ({matrix.datasets[d]['layout']})" for d in cell.data),
                    f"- hardware: {cell.hardware.get('class')}, {cell.hardware.get('wall')}"
                    + (" (measured)" if cell.hardware.get("wall_measured") else " (estimated)"),
                    f"- status: {_status_text(st, cell, relative=False)}"]
            if cell.deviations:
                out.append("- deviations from the paper: " + "; ".join(cell.deviations))
            if cell.notes:
                out.append(f"- notes: {cell.notes.strip()}")
            out += ["", "```bash", *_pasteable(matrix, cell), "```"]
    out += ["", "## Datasets", "", "| name | layout | ir_datasets | identified by | where to get it |", "|---|---|---|---|---|"]
    for name, spec in sorted(matrix.datasets.items()):
        ident = ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in (spec.get("identify") or {}).items())
        out.append(f"| `{name}` | {spec['layout']} | {spec.get('irds') or '—'} | {ident or '—'} | "
                   f"{'bundled with the project' if spec.get('bundled') else spec.get('get')} |")
    return "\n".join(out) + "\n"


def example_values(matrix: Matrix, cell) -> dict[str, str]:
    """The page's example paths: `datasets/<name>` for each dataset (a bundled one where it lies in the repository)
    and the default work folder."""
    values = {d: ("pipeline/resources/python_faq" if matrix.datasets[d].get("bundled") else f"datasets/{d}")
              for d in cell.data}
    values["work"] = f"runs/reproduce/{cell.id}"
    return values


def _pasteable(matrix: Matrix, cell) -> list[str]:
    """The cell's run as one command, then the commands it runs with the example paths filled in: each line can be
    pasted as it is (the placeholders are explained once, at the top of the page)."""
    from ..effects.spec import Experiment, fill, split_command

    values = example_values(matrix, cell)
    data = " ".join(f"--data {d}={values[d]}" for d in cell.data if not matrix.datasets[d].get("bundled"))
    head = [f"pipeline reproduce run {cell.id}" + (f" {data}" if data else ""),
            "# which runs (" + ", ".join(f"{{{k}}} = {v}" for k, v in values.items()) + "):"]
    show = Experiment.display
    return head + [show(None, fill(split_command(c, cell.id), values)) for c in cell.commands]


def experiment_results(matrix: Matrix, fam: str, work_root, folder) -> dict[str, dict]:
    """{dataset: the newest result of the experiment on it} (the repository's record or a local run)."""
    from .status import read_result, results_dir

    exp = matrix.experiments[fam]
    out = {}
    for d in exp.datasets:
        name = f"{fam}-{d}"
        found = [r for r in (read_result(results_dir(folder) / f"{name}.json"),
                             read_result(work_root / name / "result.json") if work_root is not None else None)
                 if r and r.get("experiment") == fam and r.get("dataset") == d]
        if found:
            out[d] = max(found, key=lambda r: r.get("date", ""))
    return out


def write_figures(matrix: Matrix, out_dir: Path, work_root=None, folder=None) -> list[Path]:
    """Each experiment's figure per dataset with a result, `<family>-<dataset>.png` in `out_dir`."""
    from ..effects import report

    made = []
    for fam in matrix.experiments:
        for d, result in experiment_results(matrix, fam, work_root, folder).items():
            png = Path(out_dir) / f"{fam}-{d}.png"
            if report.figure(result, png):
                made.append(png)
    return made


def _experiment_section(matrix: Matrix, fam: str, work_root, folder) -> list[str]:
    from ..effects import report

    exp = matrix.experiments[fam]
    out = ["```bash", f"pipeline reproduce run --family {fam} --data {exp.datasets[0]}=PATH    # every arm and seed; "
           "re-run to resume", "# once per dataset ({data} = its folder, {prep} = <work>/" + fam + "-<dataset>/prepare):"]
    out += [exp.display(c) for c in exp.prepare]
    out += ["# each trained arm and seed ({run} = <work>/" + fam + "-<dataset>/arms/<arm>/seed-<s>), then its "
            "evaluation (every arm):", exp.display(exp.train) + " <the arm's overrides>"]
    out += [exp.display(c) for c in exp.evaluate] + ["```", "", "Arms (each the training command plus these "
                                                      "overrides):", ""]
    for a in exp.arms.values():
        out.append(f"- `{a.id}`: {a.title}" + (f" — `{' '.join(a.train)}`" if a.train else " — no training")
                   + (f" ({a.notes.strip()})" if a.notes else ""))
    out += ["", "Vars (`--set NAME=VALUE` changes one; such a run is never recorded): "
            + ", ".join(f"`{k}={v}`" for k, v in exp.vars.items()), "",
            f"`pipeline reproduce record --family {fam} --work W` merges a run's result into the record below: "
            "seeds run in another work folder, session or machine are added (the newer run where both hold a "
            "seed), and every comparison is computed again over all of them from each run's per-query values, "
            "which the record keeps.", ""]
    results = experiment_results(matrix, fam, work_root, folder)
    for d in exp.datasets:
        if d not in results:
            out += [f"#### {d}", "", f"Not run yet: `pipeline reproduce run --family {fam} --data {d}=PATH`.", ""]
            continue
        result = results[d]
        has_rows = any((r.get("parts") or {}).get("all", {}).get("n_seeds") for r in result["comparisons"].values())
        out += report.markdown(result, f"{fam}-{d}.png" if has_rows else None)
    out += ["Cells (one per comparison and dataset; the figure is the difference to the baseline):", ""]
    for c in exp.comparisons.values():
        out.append(f"- `{c.id}`: {exp.arms[c.method].title} against {exp.arms[c.baseline].title}; the paper's "
                   f"direction: {'a gain' if c.direction > 0 else 'a loss'} ({c.claim}; {c.source})")
    return out + [""]
