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
        tolerance_why: why that tolerance, citing its evidence
        tolerance_evidence:                 # where the width comes from (reproduce/checks.py holds the tolerance to it)
          kind: resolution                  # seeds | resolution | reproduction_gap | published_rounding
          width: 0.00333                    # the measured spread, one query's worth, the gap (+ rounding), half a digit
          note: one of 300 test queries is 1/300 of nDCG@10
        source: paper, table, row, column (or the MTEB result)
        hardware: {class: 2-core CPU, wall: "6 min", wall_measured: true}
        runs_here: true                     # false: a GPU-scale cell, shown as "not run here", never dropped
        deviations: [...]                   # where the setup knowingly departs from the paper's
        project: false                      # true: the project's own figure, not a published one
        baseline: beir-scifact-bm25         # a method cell: the cell of its baseline row (same table and column)
        paired: true                        # the claim is the difference method - baseline (both cells run; needs
        published_difference: 0.0097        #   baseline and the paper's difference)
    uncovered:                              # the papers' figures no cell reproduces, each with its reason
      - {figures: "Table 7: memory and time (15 figures)", count: 15, reason: "GPU memory of baselines not built"}

`load_matrix` reads and checks every file (every key, every dataset a cell names, placeholders,
tolerance); `cell_status` reads the newest result of a cell (the repository's record in
`repro/results/`, or a run's `<work>/result.json`); `render_report` writes the matrix as Markdown.
Running a cell is `pipeline reproduce run` (cli/reproduce.py).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

CELL_KEYS = {"id", "title", "data", "model", "commands", "metric", "expected", "tolerance", "tolerance_why", "source",
             "hardware", "runs_here", "deviations", "project", "notes", "expected_origin", "baseline", "known_failure",
             "tolerance_evidence", "paired", "published_difference"}
REQUIRED = ("id", "title", "data", "commands", "metric", "expected", "tolerance", "tolerance_why", "source",
            "hardware")
DATASET_KEYS = {"layout", "irds", "identify", "get", "bundled"}
HARDWARE_CLASSES = ("2-core CPU", "one GPU", "eight GPUs", "two GPUs")
EVIDENCE_KINDS = ("seeds", "resolution", "reproduction_gap", "published_rounding")
FAMILY_KEYS = {"family", "title", "notes", "datasets", "cells", "experiment", "uncovered"}
ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def matrix_dir() -> Path:
    """The repository's `repro/` folder (beside the `pipeline` package)."""
    return Path(__file__).resolve().parents[2] / "repro"


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
    experiment: str = ""        # an effect cell: its experiment's family, comparison and baseline arm
    comparison: str = ""
    baseline: str = ""          # a method cell: the cell of its baseline (an effect cell: the baseline arm)
    expected_origin: dict = field(default_factory=dict)  # the project's own figure: {commit, cpu} that measured it
    known_failure: str = ""     # why the cell cannot pass with today's code (shown as its status until it is run)
    tolerance_evidence: dict = field(default_factory=dict)  # {kind, width, note}: where the tolerance comes from
    paired: bool = False        # the claim is checked as the difference to `baseline` (both cells run)
    published_difference: float | None = None  # a paired cell: the paper's method - baseline
    # an effect cell: what its arms are today ({"arms": {arm: definition digest}, "vars", "metric"}): a record
    # made by other definitions is stale (reproduce/status.effect_status)
    defined_as: dict = field(default_factory=dict)

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
    experiments: dict = field(default_factory=dict)   # family -> effects.spec.Experiment

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
    import math

    exp = raw["expected"]
    if exp is not None and (isinstance(exp, bool) or not isinstance(exp, (int, float)) or not math.isfinite(exp)):
        raise ConfigError(f"{where}: expected must be a finite number (the published figure) or null, got {exp!r}")
    tol = raw["tolerance"]
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
        raise ConfigError(f"{where}: tolerance must be a finite number >= 0, got {tol!r}")
    hw = raw["hardware"]
    if not isinstance(hw, dict) or hw.get("class") not in HARDWARE_CLASSES or not hw.get("wall"):
        raise ConfigError(f"{where}: hardware needs class (one of {', '.join(HARDWARE_CLASSES)}) and wall "
                          "(measured or estimated)")
    if "tolerance_evidence" in raw:
        _check_evidence(raw["tolerance_evidence"], where)
    if "baseline" in raw and (not isinstance(raw["baseline"], str) or not ID_RE.match(raw["baseline"])):
        raise ConfigError(f"{where}: baseline must be the id of the baseline's cell, got {raw['baseline']!r}")
    if "paired" in raw and not isinstance(raw["paired"], bool):
        raise ConfigError(f"{where}: paired must be true or false, got {raw['paired']!r}")
    if "published_difference" in raw:
        d = raw["published_difference"]
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d):
            raise ConfigError(f"{where}: published_difference must be a finite number (the paper's method - baseline), "
                              f"got {d!r}")
    if raw.get("paired"):
        missing = [k for k in ("baseline", "published_difference") if k not in raw]
        if missing:
            raise ConfigError(f"{where}: a paired cell needs {' and '.join(missing)} (its figure is the difference "
                              "method - baseline, checked against the paper's)")
    elif "published_difference" in raw:
        raise ConfigError(f"{where}: published_difference belongs to a paired cell (paired: true)")


def _check_evidence(ev, where: str) -> None:
    """`tolerance_evidence: {kind, width, note}`: what the tolerance's width rests on (reproduce/checks.py)."""
    import math

    if not isinstance(ev, dict) or set(ev) != {"kind", "width", "note"}:
        raise ConfigError(f"{where}: tolerance_evidence needs exactly kind, width and note, got "
                          f"{sorted(ev) if isinstance(ev, dict) else ev!r}")
    if ev["kind"] not in EVIDENCE_KINDS:
        raise ConfigError(f"{where}: tolerance_evidence.kind must be one of {', '.join(EVIDENCE_KINDS)}, "
                          f"got {ev['kind']!r}")
    w = ev["width"]
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
        raise ConfigError(f"{where}: tolerance_evidence.width must be a finite number >= 0, got {w!r}")
    if not isinstance(ev["note"], str) or not ev["note"].strip():
        raise ConfigError(f"{where}: tolerance_evidence.note must say where the width comes from")


def _check_uncovered(entries, where) -> list[dict]:
    """A family's `uncovered:` list: the papers' figures no cell reproduces, each {figures, reason[, count]}."""
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: uncovered must be a list of {{figures, reason}}")
    for i, e in enumerate(entries, 1):
        if not isinstance(e, dict) or not {"figures", "reason"} <= set(e) or set(e) - {"figures", "reason", "count"}:
            raise ConfigError(f"{where}: uncovered entry {i} needs figures and reason (and optionally count), got "
                              f"{sorted(e) if isinstance(e, dict) else e!r}")
        if not all(isinstance(e[k], str) and e[k].strip() for k in ("figures", "reason")):
            raise ConfigError(f"{where}: uncovered entry {i}: figures and reason are non-empty text")
        if "count" in e and (isinstance(e["count"], bool) or not isinstance(e["count"], int) or e["count"] < 1):
            raise ConfigError(f"{where}: uncovered entry {i}: count must be a whole number >= 1")
    return [dict(e) for e in entries]


def load_matrix(folder: str | Path | None = None) -> Matrix:
    """Every `*.yaml` of the matrix folder, checked; a cell id or dataset name used twice is refused."""
    from ..config import read_yaml

    folder = Path(folder) if folder is not None else matrix_dir()
    if not folder.is_dir():
        raise ConfigError(f"--matrix {folder}: not a folder (a matrix is a folder of *.yaml files, like repro/)")
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise ConfigError(f"{folder}: no reproduction matrix here (repro/*.yaml)")
    families, datasets, cells, docs = {}, {}, {}, []
    for f in files:  # every file's datasets first: a cell may use one another family describes
        doc = read_yaml(f)
        unknown = set(doc) - FAMILY_KEYS
        if unknown or "family" not in doc or ("cells" not in doc and "experiment" not in doc):
            raise ConfigError(f"{f}: a matrix file has family, title, notes, datasets and cells (or an experiment), "
                              "and optionally uncovered"
                              + (f" (unknown: {', '.join(sorted(unknown))})" if unknown else ""))
        fam = str(doc["family"])
        if fam in families:
            raise ConfigError(f"{f}: family {fam} is also {families[fam]['file']}'s")
        families[fam] = {"title": doc.get("title", fam), "notes": doc.get("notes", ""), "file": f.name,
                         "uncovered": _check_uncovered(doc.get("uncovered") or [], f)}
        for name, spec in (doc.get("datasets") or {}).items():
            bad = set(spec or {}) - DATASET_KEYS
            if bad or not (spec or {}).get("layout") or not ((spec or {}).get("get") or (spec or {}).get("bundled")):
                raise ConfigError(f"{f}: dataset {name}: needs layout and get (or bundled)"
                                  + (f"; unknown {', '.join(sorted(bad))}" if bad else ""))
            if name in datasets:
                raise ConfigError(f"{f}: dataset {name} is described in {datasets[name]['file']} too")
            _check_identify(f, name, spec)
            datasets[name] = {**spec, "family": fam, "file": f.name}
        docs.append((f, fam, doc))
    experiments = {}
    for f, fam, doc in docs:
        if doc.get("experiment") is not None:
            experiments[fam] = _experiment_cells(doc["experiment"], fam, f, datasets, cells)
        for i, raw in enumerate(doc.get("cells") or []):
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
                notes=str(raw.get("notes", "")), file=f.name, baseline=str(raw.get("baseline") or ""),
                expected_origin=dict(raw.get("expected_origin") or {}),
                known_failure=str(raw.get("known_failure") or ""),
                tolerance_evidence=dict(raw.get("tolerance_evidence") or {}), paired=bool(raw.get("paired", False)),
                published_difference=raw.get("published_difference"))
    return Matrix(families, datasets, cells, experiments)


def _check_identify(f: Path, name: str, spec: dict) -> None:
    """Every `identify` key is one data/identify.py counts for the dataset's layout: a key it cannot count (a
    misspelt one, a split statistic that is a cell's figure) would be reported and never checked."""
    from ..data.identify import FILE_KEYS, FOLDER_KEYS, countable

    identify = spec.get("identify") or {}
    if not isinstance(identify, dict):
        raise ConfigError(f"{f}: dataset {name}: identify is a mapping of counts")
    bad = [k for k in identify if not countable(k, spec.get("layout", ""))]
    if bad:
        folder = str(spec.get("layout", "")).startswith("a BEIR folder")
        known = (sorted(FOLDER_KEYS) + ["<split>_queries", "<split>_judgements_sha256"]) if folder else sorted(FILE_KEYS)
        raise ConfigError(f"{f}: dataset {name}: identify {', '.join(bad)} cannot be counted for its layout "
                          f"({'a BEIR folder' if folder else 'a single file'}: {', '.join(known)}); a key that is "
                          "not counted is never checked")


def _experiment_cells(raw: dict, fam: str, f: Path, datasets: dict, cells: dict):
    """An experiment's comparisons as cells, one per dataset: the figure is the difference to the baseline."""
    from ..effects.record import definition_digest
    from ..effects.spec import load_experiment

    exp = load_experiment(raw, fam, str(f), datasets)
    for d in exp.datasets:
        for c in exp.comparisons.values():
            cid = exp.cell_id(d, c.id)
            if cid in cells:
                raise ConfigError(f"{f}: id {cid} is used twice")
            method, base = exp.arms[c.method], exp.arms[c.baseline]
            commands = [exp.display(a) for a in exp.arm_commands(method)]
            cells[cid] = Cell(
                id=cid, family=fam, title=f"{method.title} against {base.title}, {d}", data=[d], commands=commands,
                metric={"name": f"{exp.metric} difference", "file": "result.json",
                        "key": f"comparisons.{c.id}.parts.all.difference"},
                expected=c.published_difference, tolerance=0.0,
                tolerance_why="an effect cell: its verdict comes from the interval over seeds and the paired test "
                              "over queries, not from a tolerance",
                source=c.source, hardware={"class": "2-core CPU", "wall": "see the experiment's result"},
                model=exp.vars.get("model", ""), notes=c.claim, file=f.name, experiment=fam, comparison=c.id,
                baseline=c.baseline,
                defined_as={"arms": {a.id: definition_digest(exp, a) for a in (method, base)},
                            "vars": {k: str(v) for k, v in exp.vars.items()}, "metric": exp.metric})
    return exp
