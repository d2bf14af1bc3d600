"""`pipeline reproduce list | run | report | check`: the reproduction matrix (`repro/*.yaml`, pipeline/reproduce.py).

    pipeline reproduce list [--json]                         every cell, its figure, status and whether its data is here
    pipeline reproduce run CELL... [--data NAME=PATH]       run a cell's commands, compare, write <work>/result.json
                                                             (exit 0 passed, 1 ran and missed, 2 error)
    pipeline reproduce report [--out docs/reproductions.md] the matrix as a page (and --html)
    pipeline reproduce check                                 every cell's commands parsed by the real CLI and configs
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ..errors import ConfigError, PipelineError

WORK_ROOT = Path("runs") / "reproduce"
WORK_MARKER = ".reproduce-work"


def _matrix(args):
    from ..reproduce import load_matrix

    return load_matrix(getattr(args, "matrix", None))


def _data_args(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs or []:
        name, eq, path = p.partition("=")
        if not eq or not name or not path:
            raise ConfigError(f"--data {p!r}: expected NAME=PATH (e.g. --data scifact=datasets/scifact)")
        out[name] = path
    return out


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


def _missing_line(cell, name: str, spec: dict) -> str:
    irds = f" (or its ir_datasets files for {spec['irds']} in IR_DATASETS_HOME)" if spec.get("irds") else ""
    return (f"cell {cell.id} needs dataset {name}: {spec['layout']}; get it from {spec['get']}; then run "
            f"`pipeline reproduce run {cell.id} --data {name}=PATH`{irds}")


def _machine() -> dict:
    import platform

    info = {"cpu": platform.processor() or "", "cores": os.cpu_count(), "isa": [], "gpu": None}
    try:
        text = Path("/proc/cpuinfo").read_text()
        info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")),
                           info["cpu"])
        flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))
        info["isa"] = sorted(flags & {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
                                      "amx_int8", "avx512_fp16"})
    except OSError:
        pass
    try:
        import psutil

        info["memory_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return info


def _commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return (out.stdout.strip() + ("+changes" if dirty else "")) or None  # "+changes": not exactly that commit
    except (OSError, subprocess.SubprocessError):
        return None


def _prepare_work(work: Path) -> None:
    """A cell's work folder: new, or one this command made before (its marker), which is emptied."""
    import shutil

    if work.exists():
        if not (work / WORK_MARKER).exists():
            raise PipelineError(f"{work}: exists and was not made by `pipeline reproduce`; refusing to use it "
                                "(choose another --work)")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / WORK_MARKER).write_text("made by pipeline reproduce\n")


def run_cell(cell, matrix, given: dict[str, str], work: Path, record: bool = False, folder=None) -> int:
    """Run one cell's commands (their usual progress on this terminal), compare, write the result."""
    from ..io_utils import write_json_atomic
    from ..models.checkpoint import library_versions
    from ..reproduce import dig, judge, results_dir

    values = {}
    for name in cell.data:
        loc, how = data_location(name, matrix.datasets[name], given)
        if loc is None:
            raise PipelineError(_missing_line(cell, name, matrix.datasets[name]) if how == "missing" else how)
        values[name] = loc
    if not cell.runs_here:
        print(f"[reproduce] {cell.id}: needs {cell.hardware['class']} ({cell.hardware.get('wall')}); running it here "
              "anyway", flush=True)
    _prepare_work(work)
    values["work"] = str(work.resolve())
    steps, t0 = [], time.time()
    result = {"cell": cell.id, "title": cell.title, "expected": cell.expected, "tolerance": cell.tolerance,
              "metric": cell.metric["name"], "source": cell.source, "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "machine": _machine(), "versions": library_versions(), "commit": _commit(), "data": values}
    for i, command in enumerate(cell.commands, 1):
        line = command.format(**values)
        print(f"[reproduce] {cell.id} step {i}/{len(cell.commands)}: {line}", flush=True)
        argv = shlex.split(line)
        s0 = time.time()
        rc = subprocess.run([sys.executable, "-m", "pipeline.cli", *argv[1:]]).returncode
        steps.append({"command": line, "seconds": round(time.time() - s0, 1), "rc": rc})
        if rc != 0:
            result.update(steps=steps, error=f"step {i} exited {rc}: {line}", passed=False,
                          wall_seconds=round(time.time() - t0, 1))
            write_json_atomic(work / "result.json", result)
            raise PipelineError(f"reproduce {cell.id}: step {i} of {len(cell.commands)} failed (exit {rc}); its "
                                f"output is above; record: {work / 'result.json'}")
    try:
        got = float(dig(json.loads((work / cell.metric["file"]).read_text()), cell.metric["key"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PipelineError(f"reproduce {cell.id}: cannot read {cell.metric['key']} from "
                            f"{work / cell.metric['file']} ({type(e).__name__}: {e})") from None
    passed, diff = judge(got, cell)
    result.update(steps=steps, got=got, difference=diff, passed=passed, wall_seconds=round(time.time() - t0, 1))
    write_json_atomic(work / "result.json", result)
    if record:
        write_json_atomic(results_dir(folder) / f"{cell.id}.json", result)
    verdict = ("PASSED" if passed else "MISSED") if cell.expected is not None else "no published figure to compare"
    print(f"[reproduce] {cell.id}: {cell.metric['name']} {got:.4f}"
          + (f" vs {cell.expected:g} ({cell.source}), difference {diff:+.4f}, tolerance ±{cell.tolerance:g}: "
             if cell.expected is not None else ": ") + f"{verdict} in {result['wall_seconds'] / 60:.1f} min "
          f"-> {work / 'result.json'}", flush=True)
    return 0 if passed or cell.expected is None else 1  # a cell without a figure yet: its first record


def cmd_list(args) -> None:
    from ..reproduce import cell_status

    matrix = _matrix(args)
    work_root = Path(args.work)
    rows = []
    for cell in matrix.cells.values():
        st = cell_status(cell, work_root, getattr(args, "matrix", None))
        data = {n: data_location(n, matrix.datasets[n], {})[1] for n in cell.data}
        rows.append((cell, st, data))
    from ..reproduce import _status_text

    if args.json:
        out = []
        for cell, st, data in rows:
            out.append({**cell.as_json(), "status": _status_text(st, cell).split(":")[0].split(" (")[0],
                        "status_detail": st and {k: st.get(k) for k in ("got", "date", "commit", "machine")},
                        "data_present": {n: h not in ("missing",) for n, h in data.items()}})
        print(json.dumps(out, indent=2))
        return

    w = max(len(c) for c in matrix.cells)
    print(f"{'cell':{w}}  {'figure':10}  {'expected':>9}  {'hardware':11}  status; data")
    for cell, st, data in rows:
        exp = "—" if cell.expected is None else f"{cell.expected:g}"
        have = ", ".join(f"{n}: {'here' if h != 'missing' else 'give --data ' + n + '=PATH'}"
                         + (f" ({h})" if h not in ("missing", "--data") else "") for n, h in data.items())
        print(f"{cell.id:{w}}  {cell.metric['name'][:10]:10}  {exp:>9}  {cell.hardware['class'][:11]:11}  "
              f"{_status_text(st, cell)}; {have}")
    print(f"[reproduce] {len(rows)} cells in {len(matrix.families)} families; "
          f"{sum(1 for c, st, _ in rows if _status_text(st, c).startswith('passed'))} passed, "
          f"{sum(1 for c, st, _ in rows if st is None and c.runs_here)} never run, "
          f"{sum(1 for c, st, _ in rows if not c.runs_here and st is None)} not run here (GPU scale)")


def cmd_run(args) -> int:
    matrix = _matrix(args)
    given = _data_args(args.data)
    unknown = [n for n in given if n not in matrix.datasets]
    if unknown:
        raise ConfigError(f"--data {', '.join(unknown)}: no such dataset in the matrix; known: "
                          + ", ".join(sorted(matrix.datasets)))
    cells = [matrix.cell(c) for c in args.cells]
    worst = 0
    for cell in cells:
        rc = run_cell(cell, matrix, given, Path(args.work) / cell.id, record=args.record,
                      folder=getattr(args, "matrix", None))
        worst = max(worst, rc)
    return worst


def cmd_report(args) -> None:
    from ..io_utils import write_text_atomic
    from ..reproduce import render_report

    matrix = _matrix(args)
    text = render_report(matrix, Path(args.work) if args.local else None, getattr(args, "matrix", None))
    write_text_atomic(args.out, text)
    print(f"[reproduce] {len(matrix.cells)} cells -> {args.out}")
    if args.html:
        write_text_atomic(args.html, _html(text))
        print(f"[reproduce] -> {args.html}")


def _html(markdown: str) -> str:
    """The page as a static HTML file (tables and code blocks, no script)."""
    import html

    body, in_code, table = [], False, False
    for line in markdown.splitlines():
        if line.startswith("```"):
            body.append("</pre>" if in_code else "<pre>")
            in_code = not in_code
            continue
        if in_code:
            body.append(html.escape(line))
            continue
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("-: "):
                continue
            if not table:
                body.append("<table>")
                table = True
            body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
            continue
        if table:
            body.append("</table>")
            table = False
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{html.escape(line.lstrip('#').strip())}</h{level}>")
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
    return ("<!doctype html><meta charset=utf-8><title>Reproductions</title><style>body{font-family:sans-serif;"
            "max-width:70em;margin:auto}td{border:1px solid #ccc;padding:2px 6px}pre{background:#f4f4f4;padding:6px}"
            "</style>" + "\n".join(body) + "\n")


def check_command(line: str, parser) -> None:
    """Parse one `pipeline ...` command line with the real CLI parser (`pipeline.cli.build_parser()`) and load
    its config (file + overrides) with the real config system, without running it: a ConfigError naming the
    command when it would not."""
    import contextlib
    import io

    argv = shlex.split(line)
    if not argv or argv[0] != "pipeline":
        raise ConfigError(f"not a pipeline command: {line}")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv[1:])
    except SystemExit:
        raise ConfigError(f"{line}: the CLI refuses it: {err.getvalue().strip().splitlines()[-1]}") from None
    verb = argv[1]
    overrides = list(getattr(args, "overrides", None) or [])
    config = getattr(args, "config", None)
    if config is not None and not Path(config).exists():
        return  # a config a user writes or a run makes (best.yaml): its keys are checked when it exists
    try:
        if verb in ("train", "refresh"):
            from ..train.config import load_train_config

            load_train_config(config, overrides)
        elif verb == "tune":
            from ..tune.space import load_sweep_config

            if config:
                load_sweep_config(config, overrides)
        elif verb == "authorship":
            from ..config import from_dict, merge_overrides
            from ..data.authorship import SplitConfig

            data = merge_overrides({}, overrides)
            from_dict(SplitConfig, data.get("authorship") or {}, prefix="authorship.")
        elif hasattr(args, "overrides"):
            from ..config import load_config

            load_config(config, overrides)
    except ConfigError as e:
        raise ConfigError(f"{line}: {e}") from None


def cmd_check(args) -> None:
    matrix = _matrix(args)
    n = 0
    for cell in matrix.cells.values():
        values = {name: f"/data/{name}" for name in cell.data}
        values["work"] = "/tmp/work"
        for c in cell.commands:
            check_command(c.format(**values), args.parser)
            n += 1
    print(f"[reproduce] {len(matrix.cells)} cells, {n} commands: every one parses and its config loads")


def add_parsers(sub) -> None:
    p = sub.add_parser("reproduce", help="the reproduction matrix: published figures, one command per cell "
                                         "(list, run, report, check)")
    rsub = p.add_subparsers(dest="reproduce_command", required=True)

    def common(q):
        q.add_argument("--matrix", help="the matrix folder (default: the repository's repro/)")
        q.add_argument("--work", default=str(WORK_ROOT), help="where cells run (one folder per cell; default "
                                                              "runs/reproduce)")

    q = rsub.add_parser("list", help="every cell: its figure, source, hardware, status and whether its data is here")
    common(q)
    q.add_argument("--json", action="store_true", help="the matrix as data (id, title, data, metric, expected, "
                                                       "tolerance, hardware, source, status)")
    q.set_defaults(func=cmd_list)
    q = rsub.add_parser("run", help="run cells' commands and compare with the expected figure (exit 0 passed, "
                                    "1 missed, 2 error)")
    common(q)
    q.add_argument("cells", nargs="+", metavar="CELL")
    q.add_argument("--data", action="append", default=[], metavar="NAME=PATH",
                   help="where a dataset is, in its published layout (repeatable)")
    q.add_argument("--record", action="store_true", help="also write the result into the matrix's results/ "
                                                         "(what `list` and `report` show)")
    q.set_defaults(func=cmd_run)
    q = rsub.add_parser("report", help="render the matrix to a page (docs/reproductions.md)")
    common(q)
    q.add_argument("--out", default="docs/reproductions.md")
    q.add_argument("--html", help="also a static HTML page here")
    q.add_argument("--local", action="store_true", help="also show this machine's runs (under --work), not only the "
                                                        "matrix's recorded results")
    q.set_defaults(func=cmd_report)
    q = rsub.add_parser("check", help="parse every cell's commands with the real CLI and configs (no run)")
    common(q)
    q.set_defaults(func=cmd_check)
