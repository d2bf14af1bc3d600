"""A cell's status: its newest result (the repository's record or a run's result file), checked to be that cell's
and judged against the figure the cell states now.

A result counts for a cell only when it names the cell and was made by the cell's current definition (the digest
of its commands, metric and data, `cell_digest`): a result file copied from another cell's folder, or left by an
older definition, is shown as such, never as a pass. A figure the project measured itself (`expected_origin`) is
"recorded" on the commit and machine that made it, never "passed": a pass needs a run elsewhere. Every status says
its date, machine and commit, how many commits before HEAD that is, and whether the code the cells run
(`pipeline/`, `jobs/configs/`) changed since.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from .matrix import Cell, matrix_dir

CODE_PATHS = ["pipeline", "jobs/configs"]


def results_dir(folder: str | Path | None = None) -> Path:
    return (Path(folder) if folder is not None else matrix_dir()) / "results"


def cell_digest(cell: Cell) -> str:
    """What makes a result this cell's: its commands, metric and data (not its expected figure or tolerance,
    which may be corrected without running anything again)."""
    text = json.dumps({"commands": cell.commands, "metric": cell.metric, "data": cell.data}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_result(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and ("cell" in data or "experiment" in data) else None


def _checked(r: dict | None, cell: Cell, where: str) -> dict | None:
    """`r` if it is a result of `cell`, marked with where it came from and whether its definition is current."""
    if r is None or r.get("cell") != cell.id:
        return None
    r = dict(r)
    r["_where"] = where
    digest = r.get("cell_digest")
    r["_definition"] = "current" if digest == cell_digest(cell) else ("unknown" if digest is None else "changed")
    return r


def cell_status(cell: Cell, work_root: Path | None = None, folder: str | Path | None = None) -> dict | None:
    """The newest result of `cell`: the repository's record (`repro/results/<id>.json`) or a run's
    `<work_root>/<id>/result.json` naming this cell; None when it was never run. An effect cell's status is its
    comparison in the experiment's result (`<family>-<dataset>.json`, or `<work_root>/<family>-<dataset>/`)."""
    if cell.experiment:
        return effect_status(cell, work_root, folder)
    found = [r for r in (_checked(read_result(results_dir(folder) / f"{cell.id}.json"), cell, "record"),
                         _checked(read_result(work_root / cell.id / "result.json"), cell, "local")
                         if work_root is not None else None) if r]
    return max(found, key=lambda r: r.get("date", "")) if found else None


def effect_status(cell: Cell, work_root: Path | None = None, folder: str | Path | None = None) -> dict | None:
    dataset = cell.data[0]
    name = f"{cell.experiment}-{dataset}"
    found = []
    for r, where in ((read_result(results_dir(folder) / f"{name}.json"), "record"),
                     (read_result(work_root / name / "result.json") if work_root is not None else None, "local")):
        if not r or r.get("experiment") != cell.experiment or r.get("dataset") != dataset:
            continue
        row = (r.get("comparisons") or {}).get(cell.comparison)
        if row and row.get("verdict") != "not run":
            then = row.get("as_recorded") or {}  # a row kept from an earlier record: its own date and commit
            changed = effect_definition_changes(r, row, cell)
            found.append({**row, "date": then.get("date") or r.get("date"),
                          "machine": then.get("machine") or r.get("machine"),
                          "commit": then.get("commit") or r.get("commit"),
                          "changed_vars": r.get("changed_vars"), "_where": where,
                          "_definition": "changed" if changed else "current", "_changes": changed})
    return max(found, key=lambda r: r.get("date", "")) if found else None


def effect_definition_changes(record: dict, row: dict, cell: Cell) -> list[str]:
    """What of an effect cell's definition today differs from what its record's row was made by: an arm of the
    comparison redefined (its definition digest), the experiment's vars or its metric ([] when none)."""
    want = cell.defined_as or {}
    out = []
    for role in ("method", "baseline"):
        arm = row.get(role)
        recorded = ((record.get("arms") or {}).get(arm) or {}).get("definition")
        today = (want.get("arms") or {}).get(arm)
        if recorded is not None and today is not None and recorded != today:
            out.append(f"the {role} arm {arm} is defined otherwise now")
    if want.get("vars") is not None and record.get("vars") is not None and \
            {k: str(v) for k, v in record["vars"].items()} != want["vars"]:
        out.append("the experiment's vars differ")
    if want.get("metric") and record.get("metric") and record["metric"] != want["metric"]:
        out.append(f"its metric was {record['metric']} (now {want['metric']})")
    return out


def judge(got: float, cell: Cell) -> tuple[bool, float | None]:
    """(passed, difference): within `tolerance` of `expected` (a cell without a figure never passes)."""
    if cell.expected is None:
        return False, None
    diff = got - float(cell.expected)
    return abs(diff) <= cell.tolerance + 1e-12, diff


def dig(data, key: str):
    """`metrics.nDCG@10` -> `data["metrics"]["nDCG@10"]` (a key may hold dots when it is a whole key)."""
    if key in data:
        return data[key]
    head, _, rest = key.partition(".")
    while head not in data and rest:
        nxt, _, rest = rest.partition(".")
        head = f"{head}.{nxt}"
    if head not in data:
        raise KeyError(key)
    return dig(data[head], rest) if rest else data[head]


@lru_cache(maxsize=64)
def _age(commit: str | None) -> str:
    from ..provenance import changed_since, commits_since

    if not commit:
        return "commit unknown"
    n = commits_since(commit)
    text = f"{commit[:10]}" + ("" if n is None else f", {n} commit{'s' if n != 1 else ''} before HEAD")
    if n and changed_since(commit, CODE_PATHS):
        text += ", code changed since"
    return text


def circular(status: dict, cell: Cell) -> bool:
    """The result was made where the cell's expected figure came from (the same commit and machine)."""
    origin = cell.expected_origin or {}
    if not origin:
        return False
    same_commit = str(status.get("commit") or "").split("+")[0].startswith(str(origin.get("commit") or "~"))
    same_machine = (status.get("machine") or {}).get("cpu") == origin.get("cpu")
    return same_commit or same_machine


def status_word(status: dict | None, cell: Cell) -> str:
    """passed / missed / recorded / error / stale / never run / not run here, or an effect cell's verdict."""
    if status is None:
        if cell.known_failure:
            return "fails with today's code"
        return "not run here" if not cell.runs_here else "never run"
    if cell.experiment:
        if status.get("_definition") == "changed":
            return "stale"
        return status.get("verdict", "not run")
    got = status.get("got")
    if status.get("error") or not isinstance(got, (int, float)):
        return "error"
    if status.get("_definition") != "current":
        return "stale"
    if cell.paired:  # judged as the difference to its baseline (reproduce/run.run_paired), never alone
        if not status.get("paired"):
            return "recorded"
        return "passed" if status["paired"].get("passed") else "missed"
    if cell.expected is None or circular(status, cell):
        return "recorded"
    return "passed" if judge(float(got), cell)[0] else "missed"


def _status_text(status: dict | None, cell: Cell, relative: bool = True) -> str:
    """The status in words. `relative`: with how many commits before HEAD the result's commit is and whether the
    cells' code changed since (the terminal's `reproduce status`); the committed page leaves that out, as it would
    go stale with every commit."""
    what = status_word(status, cell)
    if status is None:
        if cell.known_failure:
            return f"{what}: {cell.known_failure}"
        return what + (f" ({cell.hardware.get('class', '?')})" if what == "not run here" else "")
    machine = (status.get("machine") or {}).get("cpu", "?")
    commit = status.get("commit")
    where = f" ({str(status.get('date', ''))[:10]}, {machine}, " + (
        _age(commit) if relative else (str(commit)[:10] if commit else "commit unknown")) + ")"
    if cell.experiment:
        d, iv, p = status.get("parts", {}).get("all", {}), None, None
        iv, p = d.get("interval"), d.get("p_randomization")
        fig = (f": {d.get('difference', float('nan')):+.4f}" if d.get("difference") is not None else "")
        fig += f" [{iv[0]:+.4f}, {iv[1]:+.4f}]" if iv else ""
        fig += f", p {p:.3f}" if p is not None else ""
        fig += f" (Holm over the table {d['p_holm']:.3f})" if d.get("p_holm") is not None else ""
        n = d.get("n_seeds", 0)
        fig += f", {n} seed{'' if n == 1 else 's'}"
        changed = f", vars changed {status['changed_vars']}" if status.get("changed_vars") else ""
        if what == "stale":
            changed += (f" (recorded as {status.get('verdict')}; made by an earlier definition: "
                        + "; ".join(status.get("_changes") or []) + ")")
        return what + fig + changed + where
    got = status.get("got")
    note = {"stale": ", made by an earlier definition of the cell", "recorded": ""}.get(what, "")
    if what == "recorded" and cell.expected is not None:
        note = ", where its expected figure came from: a pass needs a run on another commit or machine"
    return what + (f": {got:.4f}" if isinstance(got, (int, float)) else "") + note + where
