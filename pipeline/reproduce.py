"""The reproduction matrix, as data: `repro/*.yaml` (one file per family), each cell a published figure
(or one of the project's own) with the exact `pipeline` commands that reach it.

    family: beir-zero-shot                  # the file's family, its title and notes
    title: ...
    datasets:                               # what the cells need, in the layout the dataset is published in
      scifact:
        layout: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv)
        irds: beir/scifact/test             # an ir_datasets identifier, where one exists
        identify: {passages: 5183, queries: 300}   # counts (or file sizes / digests) that identify the right files
        get: where the files come from, and what --data scifact=PATH points at
    cells:
      - id: beir-scifact-minilm
        title: all-MiniLM-L6-v2, zero-shot, BEIR SciFact test
        data: [scifact]
        model: minilm
        commands:                           # run in order; {work} is the cell's work folder, {scifact} the data
          - pipeline ingest {scifact} --format beir --out {work}/corpus
          - ...
        metric: {name: nDCG@10, file: metrics.json, key: metrics.nDCG@10}
        expected: 0.6451                    # the published figure, in the metric file's scale
        tolerance: 0.005
        tolerance_why: why that tolerance
        source: paper, table, row, column (or the MTEB result)
        hardware: {class: 2-core CPU, wall: "6 min", wall_measured: true}
        runs_here: true                     # false: a GPU-scale cell, shown as "not run here", never dropped
        deviations: [...]                   # where the setup knowingly departs from the paper's
        project: false                      # true: the project's own figure, not a published one

`load_matrix` reads and checks every file (every key, every dataset a cell names, placeholders,
tolerance); `cell_status` reads the newest result of a cell (the repository's record in
`repro/results/`, or a run's `<work>/result.json`); `render_report` writes the matrix as Markdown.
Running a cell is `pipeline reproduce run` (cli/reproduce.py).
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

CELL_KEYS = {"id", "title", "data", "model", "commands", "metric", "expected", "tolerance", "tolerance_why", "source",
             "hardware", "runs_here", "deviations", "project", "notes"}
REQUIRED = ("id", "title", "data", "commands", "metric", "expected", "tolerance", "tolerance_why", "source",
            "hardware")
DATASET_KEYS = {"layout", "irds", "identify", "get", "bundled"}
HARDWARE_CLASSES = ("2-core CPU", "one GPU", "eight GPUs", "two GPUs")
ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def matrix_dir() -> Path:
    """The repository's `repro/` folder (beside the `pipeline` package)."""
    return Path(__file__).resolve().parents[1] / "repro"


@dataclass
class Cell:
    """One row of the matrix."""

    id: str
    family: str
    title: str
    data: list[str]
    commands: list[str]
    metric: dict
    expected: float | None
    tolerance: float
    tolerance_why: str
    source: str
    hardware: dict
    model: str = ""
    runs_here: bool = True
    deviations: list[str] = field(default_factory=list)
    project: bool = False
    notes: str = ""
    file: str = ""

    def as_json(self) -> dict:
        return {"id": self.id, "title": self.title, "family": self.family, "data": list(self.data),
                "metric": self.metric["name"], "expected": self.expected, "tolerance": self.tolerance,
                "hardware": self.hardware.get("class"), "wall": self.hardware.get("wall"), "source": self.source,
                "runs_here": self.runs_here, "project": self.project, "model": self.model,
                "deviations": list(self.deviations)}


@dataclass
class Matrix:
    families: dict[str, dict]           # family -> {"title", "notes", "file"}
    datasets: dict[str, dict]           # dataset name -> its spec (+ "family")
    cells: dict[str, Cell]

    def cell(self, cell_id: str) -> Cell:
        if cell_id not in self.cells:
            import difflib

            close = difflib.get_close_matches(cell_id, sorted(self.cells), n=3)
            raise ConfigError(f"no reproduction cell {cell_id!r}" + (f" (did you mean {', '.join(close)}?)" if close
                              else "") + "; `pipeline reproduce list` shows them all")
        return self.cells[cell_id]


def placeholders(command: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(command) if f}


def _check_cell(raw: dict, where: str, datasets: dict) -> None:
    unknown = set(raw) - CELL_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(CELL_KEYS))}")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    if not ID_RE.match(str(raw["id"])):
        raise ConfigError(f"{where}: id {raw['id']!r} must be lower-case letters, digits, '.', '_' or '-'")
    if not isinstance(raw["commands"], list) or not raw["commands"]:
        raise ConfigError(f"{where}: commands must be a non-empty list")
    for c in raw["commands"]:
        if not isinstance(c, str) or not c.startswith("pipeline "):
            raise ConfigError(f"{where}: every command is a `pipeline ...` command line, got {c!r}")
        extra = placeholders(c) - {"work"} - set(raw["data"])
        if extra:
            raise ConfigError(f"{where}: command {c!r} names {', '.join(sorted(extra))}, which are neither "
                              "{work} nor data the cell lists")
    for name in raw["data"]:
        if name not in datasets:
            raise ConfigError(f"{where}: data {name!r} is not a dataset its file describes")
    m = raw["metric"]
    if not isinstance(m, dict) or not {"name", "file", "key"} <= set(m):
        raise ConfigError(f"{where}: metric needs name, file and key (the JSON key path of the figure)")
    if raw["expected"] is not None and not isinstance(raw["expected"], (int, float)):
        raise ConfigError(f"{where}: expected must be a number (the published figure) or null")
    if not isinstance(raw["tolerance"], (int, float)) or raw["tolerance"] < 0:
        raise ConfigError(f"{where}: tolerance must be a number >= 0")
    hw = raw["hardware"]
    if not isinstance(hw, dict) or hw.get("class") not in HARDWARE_CLASSES or not hw.get("wall"):
        raise ConfigError(f"{where}: hardware needs class (one of {', '.join(HARDWARE_CLASSES)}) and wall "
                          "(measured or estimated)")


def load_matrix(folder: str | Path | None = None) -> Matrix:
    """Every `*.yaml` of the matrix folder, checked; a cell id or dataset name used twice is refused."""
    from .config import read_yaml

    folder = Path(folder) if folder is not None else matrix_dir()
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise ConfigError(f"{folder}: no reproduction matrix here (repro/*.yaml)")
    families, datasets, cells, docs = {}, {}, {}, []
    for f in files:  # every file's datasets first: a cell may use one another family describes
        doc = read_yaml(f)
        unknown = set(doc) - {"family", "title", "notes", "datasets", "cells"}
        if unknown or "family" not in doc or "cells" not in doc:
            raise ConfigError(f"{f}: a matrix file has family, title, notes, datasets and cells"
                              + (f" (unknown: {', '.join(sorted(unknown))})" if unknown else ""))
        fam = str(doc["family"])
        if fam in families:
            raise ConfigError(f"{f}: family {fam} is also {families[fam]['file']}'s")
        families[fam] = {"title": doc.get("title", fam), "notes": doc.get("notes", ""), "file": f.name}
        for name, spec in (doc.get("datasets") or {}).items():
            bad = set(spec or {}) - DATASET_KEYS
            if bad or not (spec or {}).get("layout") or not ((spec or {}).get("get") or (spec or {}).get("bundled")):
                raise ConfigError(f"{f}: dataset {name}: needs layout and get (or bundled)"
                                  + (f"; unknown {', '.join(sorted(bad))}" if bad else ""))
            if name in datasets:
                raise ConfigError(f"{f}: dataset {name} is described in {datasets[name]['file']} too")
            datasets[name] = {**spec, "family": fam, "file": f.name}
        docs.append((f, fam, doc))
    for f, fam, doc in docs:
        for i, raw in enumerate(doc["cells"] or []):
            where = f"{f}: cell {i + 1}" + (f" ({raw.get('id')})" if isinstance(raw, dict) and raw.get("id") else "")
            if not isinstance(raw, dict):
                raise ConfigError(f"{where}: a cell is a mapping")
            _check_cell(raw, where, datasets)
            if raw["id"] in cells:
                raise ConfigError(f"{where}: id {raw['id']} is used twice")
            cells[raw["id"]] = Cell(
                id=raw["id"], family=fam, title=raw["title"], data=list(raw["data"]), commands=list(raw["commands"]),
                metric=dict(raw["metric"]), expected=raw["expected"], tolerance=float(raw["tolerance"]),
                tolerance_why=str(raw["tolerance_why"]), source=str(raw["source"]), hardware=dict(raw["hardware"]),
                model=str(raw.get("model", "")), runs_here=bool(raw.get("runs_here", True)),
                deviations=list(raw.get("deviations") or []), project=bool(raw.get("project", False)),
                notes=str(raw.get("notes", "")), file=f.name)
    return Matrix(families, datasets, cells)


# ------------------------------------------------------------------------------------ results


def results_dir(folder: str | Path | None = None) -> Path:
    return (Path(folder) if folder is not None else matrix_dir()) / "results"


def read_result(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "cell" in data else None


def cell_status(cell: Cell, work_root: Path | None = None, folder: str | Path | None = None) -> dict | None:
    """The newest result of `cell`: the repository's record (`repro/results/<id>.json`) or a run's
    `<work_root>/<id>/result.json`; None when it was never run."""
    found = [r for r in (read_result(results_dir(folder) / f"{cell.id}.json"),
                         read_result(work_root / cell.id / "result.json") if work_root is not None else None) if r]
    return max(found, key=lambda r: r.get("date", "")) if found else None


def judge(got: float, cell: Cell) -> tuple[bool, float | None]:
    """(passed, difference): within `tolerance` of `expected` (a cell without a figure never passes)."""
    if cell.expected is None:
        return False, None
    diff = got - float(cell.expected)
    return abs(diff) <= cell.tolerance + 1e-12, diff


def dig(data, key: str):
    """`metrics.nDCG@10` -> data["metrics"]["nDCG@10"] (a key may hold dots when it is a whole key)."""
    if key in data:
        return data[key]
    head, _, rest = key.partition(".")
    while head not in data and rest:
        nxt, _, rest = rest.partition(".")
        head = f"{head}.{nxt}"
    if head not in data:
        raise KeyError(key)
    return dig(data[head], rest) if rest else data[head]


# ------------------------------------------------------------------------------------ the page


def _status_text(status: dict | None, cell: Cell) -> str:
    if not cell.runs_here and status is None:
        return "not run here (" + cell.hardware.get("class", "?") + ")"
    if status is None:
        return "never run"
    got = status.get("got")
    if status.get("error") or not isinstance(got, (int, float)):
        what = "error"
    elif cell.expected is None:
        what = "recorded"  # no figure to compare with yet
    else:  # judged against the figure the cell states now
        what = "passed" if judge(float(got), cell)[0] else "missed"
    machine = (status.get("machine") or {}).get("cpu", "?")
    return (f"{what}" + (f": {got:.4f}" if isinstance(got, (int, float)) else "")
            + f" ({str(status.get('date', ''))[:10]}, {machine}, {str(status.get('commit') or '?')[:10]})")


def render_report(matrix: Matrix, work_root: Path | None = None, folder: str | Path | None = None) -> str:
    """docs/reproductions.md: every family, every cell with its figure, source, status and commands."""
    out = ["# Reproductions",
           "",
           "Every published figure this pipeline can reach, one cell per figure, as data in `repro/*.yaml`: the",
           "data it needs, the exact commands, the figure with its source and tolerance, the hardware it needs.",
           "`pipeline reproduce run CELL --data NAME=PATH` runs a cell and compares; this page is made by",
           "`pipeline reproduce report` from the matrix and the recorded results (`repro/results/`).",
           "Project cells (marked *project*) are this project's own figures, not published ones.", "",
           "| cell | figure | expected | tolerance | hardware | status |", "|---|---|---|---|---|---|"]
    for cell in matrix.cells.values():
        st = cell_status(cell, work_root, folder)
        exp = "—" if cell.expected is None else f"{cell.expected:g}"
        out.append(f"| [`{cell.id}`](#{cell.id.replace('.', '')}) | {cell.metric['name']}"
                   + (" *(project)*" if cell.project else "")
                   + f" | {exp} | ±{cell.tolerance:g} | {cell.hardware.get('class')}, {cell.hardware.get('wall')} | "
                   f"{_status_text(st, cell)} |")
    for fam, info in matrix.families.items():
        out += ["", f"## {info['title']}", ""]
        if info.get("notes"):
            out += [str(info["notes"]).strip(), ""]
        for cell in [c for c in matrix.cells.values() if c.family == fam]:
            st = cell_status(cell, work_root, folder)
            out += [f"### {cell.id}", "", f"**{cell.title}**" + (" (the project's own figure)" if cell.project else ""),
                    "", f"- figure: {cell.metric['name']} = {'—' if cell.expected is None else cell.expected} "
                    f"± {cell.tolerance:g} ({cell.tolerance_why})",
                    f"- source: {cell.source}",
                    f"- data: " + ", ".join(f"`{d}` ({matrix.datasets[d]['layout']})" for d in cell.data),
                    f"- hardware: {cell.hardware.get('class')}, {cell.hardware.get('wall')}"
                    + (" (measured)" if cell.hardware.get("wall_measured") else " (estimated)"),
                    f"- status: {_status_text(st, cell)}"]
            if cell.deviations:
                out.append("- deviations from the paper: " + "; ".join(cell.deviations))
            if cell.notes:
                out.append(f"- notes: {cell.notes.strip()}")
            data = " ".join(f"--data {d}=PATH" for d in cell.data if not matrix.datasets[d].get("bundled"))
            out += ["", "```bash", f"pipeline reproduce run {cell.id}" + (f" {data}" if data else ""), "# which runs:"]
            out += [c for c in cell.commands] + ["```"]
    out += ["", "## Datasets", "", "| name | layout | ir_datasets | identified by | where to get it |", "|---|---|---|---|---|"]
    for name, spec in sorted(matrix.datasets.items()):
        ident = ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in (spec.get("identify") or {}).items())
        out.append(f"| `{name}` | {spec['layout']} | {spec.get('irds') or '—'} | {ident or '—'} | "
                   f"{'bundled with the project' if spec.get('bundled') else spec.get('get')} |")
    return "\n".join(out) + "\n"
