"""Running a cell: `pipeline reproduce run CELL --data NAME=PATH`.

Before the first command: every dataset is found (`--data`, bundled, or an ir_datasets identifier), checked
against its declared `identify` counts (data/identify.py), and refused when it lies inside the cell's work folder.
The work folder is new, or one an earlier run of this cell made (its marker): what the cell's commands write
there (`{work}/<name>` in its commands) and this command's own files are replaced, anything else in it is
refused, never deleted. A lock keeps two runs of one cell apart.

Commands are split into arguments once and each argument's placeholders filled afterwards, so a path with spaces,
quotes or `=` stays one argument. The result file records the figure, the verdict, the commands, the machine
(CPU, ISA flags, threads), the encoder's backend and precision, the library versions and the commit; a run that
cannot read its metric writes a failed result too. Exit codes: 0 passed, 1 ran and missed, 2 error, 3 ran but the
cell has no figure to compare with (its result is recorded, nothing is judged).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ..errors import ConfigError, PipelineError
from .matrix import Cell, Matrix

OWN = {"result.json"}
EXIT_RECORDED = 3


def data_location(name: str, spec: dict, given: dict[str, str]) -> tuple[str | None, str]:
    """(what the cell's commands get for dataset `name`, how it was found), or (None, why it is missing)."""
    if name in given:
        path = Path(given[name]).expanduser()
        if not path.exists():
            return None, f"--data {name}={given[name]}: nothing there"
        return str(path.resolve()), "--data"
    if spec.get("bundled"):
        from ..data.bundled import python_faq_dir

        bundled = {"python_faq": python_faq_dir()}
        return str(bundled[spec["bundled"]]), "bundled"
    if spec.get("irds"):
        from ..data import irds

        try:
            irds.check_local(spec["irds"])
            return spec["irds"], "ir_datasets"
        except PipelineError:
            pass
    return None, "missing"


def missing_line(cell_id: str, name: str, spec: dict) -> str:
    irds = f" (or its ir_datasets files for {spec['irds']} in IR_DATASETS_HOME)" if spec.get("irds") else ""
    return (f"cell {cell_id} needs dataset {name}: {spec['layout']}; get it from {spec['get']}; then run "
            f"`pipeline reproduce run {cell_id} --data {name}=PATH`{irds}")


def resolve_data(cell_id: str, names: list[str], matrix: Matrix, given: dict[str, str], work: Path,
                 print_fn=print) -> dict[str, str]:
    """Each dataset's location, checked: present, its identify counts, not inside the work folder."""
    from ..data.identify import check_identity

    values = {}
    for name in names:
        loc, how = data_location(name, matrix.datasets[name], given)
        if loc is None:
            raise PipelineError(missing_line(cell_id, name, matrix.datasets[name]) if how == "missing" else how)
        if Path(loc).exists():
            w, p = work.resolve(), Path(loc).resolve()
            if p == w or w in p.parents or p in w.parents:
                raise PipelineError(f"--data {name}={loc}: inside (or holding) the cell's work folder {w}; a run "
                                    "replaces what it made there, so the data must live elsewhere (move it, or "
                                    "choose another --work)")
        for line in check_identity(name, matrix.datasets[name], loc):
            print_fn(f"[reproduce] {cell_id}: {line}", flush=True)
        values[name] = loc
    return values


def own_entries(cell: Cell) -> set[str]:
    """The top-level names the cell's commands write under {work}."""
    names = set(OWN)
    for c in cell.commands:
        names |= set(re.findall(r"\{work\}/([^/\s'\"]+)", c))
    return names


def prepare_work(work: Path, cell: Cell):
    """The cell's work folder, locked: new, or this command's own from an earlier run (see the module doc), whose
    earlier outputs are removed. Returns the lock's open file (closing it releases the lock)."""
    import shutil

    from ..io_utils import WORK_MARKER, claim_work_folder

    lock = claim_work_folder(work, own_entries(cell), "this cell's commands")
    for e in work.iterdir():  # the earlier run's outputs: this cell's own (checked above)
        if e.name in (WORK_MARKER, ".lock"):
            continue
        if e.is_dir() and not e.is_symlink():
            shutil.rmtree(e)
        else:
            e.unlink()
    return lock


def _runtime(work: Path) -> dict:
    """What computed the figure: the encoder's backend and precision (from the embeddings' record), threads."""
    out = {"cpu_threads": os.cpu_count()}
    try:
        import torch

        out["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    for meta in sorted(work.glob("*/embeddings.json")):
        try:
            m = json.loads(meta.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        out.setdefault("encoders", {})[meta.parent.name] = {
            "backend": m.get("backend_resolved") or m.get("backend"),
            "precision": m.get("precision_resolved") or m.get("precision"), "dtype": m.get("dtype")}
    return out


def relative_record(result: dict, values: dict[str, str]) -> dict:
    """The result with every local path written as its placeholder ({work}, {dataset}), for the repository."""
    text = json.dumps(result)
    for name, loc in sorted(values.items(), key=lambda kv: -len(kv[1])):
        if loc and Path(loc).is_absolute():
            text = text.replace(json.dumps(loc)[1:-1], "{" + name + "}")
    return json.loads(text)


def run_cell(cell: Cell, matrix: Matrix, given: dict[str, str], work: Path, record: bool = False,
             folder=None, print_fn=print) -> int:
    """Run one cell's commands (their usual progress on this terminal), compare, write the result."""
    from ..io_utils import write_json_atomic
    from ..models.checkpoint import library_versions
    from ..provenance import code_digest, commit, machine
    from ..effects.spec import split_command
    from .status import cell_digest, dig, judge, results_dir

    argvs = [split_command(c, f"cell {cell.id}") for c in cell.commands]
    values = resolve_data(cell.id, cell.data, matrix, given, work, print_fn)
    if not cell.runs_here:
        print_fn(f"[reproduce] {cell.id}: needs {cell.hardware['class']} ({cell.hardware.get('wall')}); running it "
                 "here anyway", flush=True)
    lock = prepare_work(work, cell)
    try:
        values["work"] = str(work.resolve())
        steps, t0 = [], time.time()
        result = {"cell": cell.id, "cell_digest": cell_digest(cell), "title": cell.title, "expected": cell.expected,
                  "tolerance": cell.tolerance, "metric": cell.metric["name"], "source": cell.source,
                  "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(), "versions": library_versions(),
                  "commit": commit(), "code_digest": code_digest(), "data": dict(values)}

        def finish(**extra) -> None:
            result.update(steps=steps, wall_seconds=round(time.time() - t0, 1), runtime=_runtime(work), **extra)
            write_json_atomic(work / "result.json", result)
            if record:
                write_json_atomic(results_dir(folder) / f"{cell.id}.json", relative_record(result, values))

        for i, argv in enumerate(argvs, 1):
            line = [a.format(**values) for a in argv]
            print_fn(f"[reproduce] {cell.id} step {i}/{len(argvs)}: {shlex.join(line)}", flush=True)
            s0 = time.time()
            rc = subprocess.run([sys.executable, "-m", "pipeline.cli", *line[1:]]).returncode
            steps.append({"command": shlex.join(line), "seconds": round(time.time() - s0, 1), "rc": rc})
            if rc != 0:
                finish(error=f"step {i} exited {rc}: {shlex.join(line)}", passed=False)
                raise PipelineError(f"reproduce {cell.id}: step {i} of {len(argvs)} failed (exit {rc}); its "
                                    f"output is above; record: {work / 'result.json'}")
        try:
            got = float(dig(json.loads((work / cell.metric["file"]).read_text()), cell.metric["key"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            why = f"cannot read {cell.metric['key']} from {work / cell.metric['file']} ({type(e).__name__}: {e})"
            finish(error=why, passed=False)
            raise PipelineError(f"reproduce {cell.id}: {why}; record: {work / 'result.json'}") from None
        passed, diff = judge(got, cell)
        finish(got=got, difference=diff, passed=passed)
    finally:
        lock.close()
    if cell.expected is None:
        print_fn(f"[reproduce] {cell.id}: {cell.metric['name']} {got:.4f}: recorded; the cell has no figure to "
                 f"compare with (exit {EXIT_RECORDED}) in {result['wall_seconds'] / 60:.1f} min -> "
                 f"{work / 'result.json'}", flush=True)
        return EXIT_RECORDED
    print_fn(f"[reproduce] {cell.id}: {cell.metric['name']} {got:.4f} vs {cell.expected:g} ({cell.source}), difference "
             f"{diff:+.4f}, tolerance ±{cell.tolerance:g}: {'PASSED' if passed else 'MISSED'} in "
             f"{result['wall_seconds'] / 60:.1f} min -> {work / 'result.json'}", flush=True)
    return 0 if passed else 1


def data_args(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs or []:
        name, eq, path = p.partition("=")
        if not eq or not name or not path:
            raise ConfigError(f"--data {p!r}: expected NAME=PATH (e.g. --data scifact=datasets/scifact)")
        out[name] = path
    return out


def _evaluated_files(cell: Cell, values: dict[str, str]) -> tuple[str, str, str] | None:
    """(run file, judgements, "qrels" or "qa") of the cell's `pipeline evaluate` step, as its arguments name
    them (None: no evaluate step with --run and --qrels or --qa)."""
    from ..effects.spec import fill, split_command

    for c in reversed(cell.commands):
        argv = fill(split_command(c, cell.id), values)
        if len(argv) > 1 and argv[1] == "evaluate" and "--run" in argv:
            for flag in ("--qrels", "--qa"):
                if flag in argv:
                    return argv[argv.index("--run") + 1], argv[argv.index(flag) + 1], flag[2:]
    return None


def _same_judgements(files: list) -> bool:
    """Both cells judge with one qrels or QA file (each may hold its own copy: compared by content), or name
    the same ir_datasets identifier."""
    from ..io_utils import sha256_file

    if not all(files) or files[0][2] != files[1][2]:
        return False
    paths = [Path(f[1]) for f in files]
    if all(p.is_file() for p in paths):
        return sha256_file(paths[0]) == sha256_file(paths[1])
    return files[0][1] == files[1][1] and not any(p.exists() for p in paths)


def _per_query(cell: Cell, files: tuple[str, str, str], work: Path) -> dict[str, float] | None:
    """Every query's value of the cell's metric: from its run and qrels (ir-measures), or, for a QA cell, from
    the per-question values its `evaluate --qa --per-query` step wrote into the metric file (None: not there)."""
    name = cell.metric["name"]
    if files[2] == "qrels":
        from ..config import EvalConfig
        from ..data.readers import load_qrels
        from ..eval.metrics import evaluate_run
        from ..eval.runs import read_run

        per = evaluate_run(read_run(files[0]), load_qrels(files[1]), EvalConfig(measures=(name,), per_query=True))
        return {q: v[name] for q, v in per["per_query"].items()}
    try:
        per = json.loads((work / cell.metric["file"]).read_text(encoding="utf-8")).get("per_query")
    except (OSError, ValueError):
        return None
    key = cell.metric["key"].rsplit(".", 1)[-1]
    if not isinstance(per, dict) or not all(isinstance(v, dict) and key in v for v in per.values()):
        return None
    return {q: float(v[key]) for q, v in per.items()}


def run_paired(cell: Cell, matrix: Matrix, given: dict[str, str], work_root: Path, record: bool = False,
               folder=None, print_fn=print) -> int:
    """A paired cell: its baseline cell and the cell itself run on the same data, then the difference of their
    figures is judged against the paper's (`published_difference` ± the cell's tolerance), and a paired
    randomization test over the queries both runs scored must agree on its sign (p < 0.05 in the published
    direction). The verdict is written into the cell's result (`paired`) and decides the exit code."""
    from ..eval.compare import paired_pvalue
    from ..io_utils import write_json_atomic
    from .status import results_dir

    base = matrix.cells[cell.baseline]
    figures = {}
    for c in (base, cell):
        run_cell(c, matrix, given, work_root / c.id, record=record, folder=folder, print_fn=print_fn)
        figures[c.id] = json.loads((work_root / c.id / "result.json").read_text())
    diff = figures[cell.id]["got"] - figures[base.id]["got"]
    published = float(cell.published_difference)
    within = abs(diff - published) <= cell.tolerance + 1e-12
    p, sign = None, None
    files = [_evaluated_files(c, {**figures[c.id]["data"]}) for c in (cell, base)]
    why_no_test = "the two cells do not score runs on one qrels or QA file"
    if _same_judgements(files):
        per = [_per_query(c, f, work_root / c.id) for c, f in zip((cell, base), files)]
        common = sorted(set(per[0]) & set(per[1])) if all(per) else []
        if common:
            import numpy as np

            m = np.array([per[0][q] for q in common])
            b = np.array([per[1][q] for q in common])
            p = paired_pvalue("randomization", m, b)
            sign = float(np.sign(m.mean() - b.mean()))
        else:
            why_no_test = ("the cells' metric files hold no per-question values of the metric (evaluate --qa "
                           "--per-query writes them)" if files[0][2] == "qa" else "the two runs share no query")
    agrees = p is not None and p < 0.05 and sign == (1.0 if published > 0 else -1.0 if published < 0 else 0.0)
    passed = bool(within and agrees)
    verdict = {"baseline": base.id, "method_figure": figures[cell.id]["got"], "baseline_figure": figures[base.id]["got"],
               "difference": diff, "published_difference": published, "tolerance": cell.tolerance,
               "within_tolerance": within, "p_randomization": p, "test_agrees_on_sign": agrees, "passed": passed}
    result = {**figures[cell.id], "paired": verdict, "passed": passed}
    write_json_atomic(work_root / cell.id / "result.json", result)
    if record:
        write_json_atomic(results_dir(folder) / f"{cell.id}.json", relative_record(result, dict(result["data"])))
    print_fn(f"[reproduce] {cell.id}: difference to {base.id} {diff:+.4f} vs the paper's {published:+.4f} "
             f"(tolerance ±{cell.tolerance:g}: {'within' if within else 'outside'}); paired test over queries "
             + (f"p {p:.3f}, sign {'agrees' if agrees else 'does not agree'}" if p is not None
                else f"not possible ({why_no_test})")
             + f": {'PASSED' if passed else 'MISSED'}", flush=True)
    return 0 if passed else 1
