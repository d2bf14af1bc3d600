"""`pipeline reproduce list | run | report | check`: the reproduction matrix (`repro/*.yaml`, pipeline/reproduce/).

    pipeline reproduce list [--json]                         every cell, its figure, status and whether its data is here
    pipeline reproduce run CELL... [--data NAME=PATH]       run a cell's commands, compare, write <work>/result.json
                                                             (exit 0 passed, 1 ran and missed, 2 error, 3 no figure)
    pipeline reproduce run --family effects --data nfcorpus=PATH
                                                             an experiment: every arm and seed (resumable), its cells
    pipeline reproduce report [--out docs/reproductions.md] the matrix as a page (and --html)
    pipeline reproduce check                                 every cell's commands parsed by the real CLI and configs
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ..errors import ConfigError, PipelineError

WORK_ROOT = Path("runs") / "reproduce"
EXIT_RECORDED = 3


def _matrix(args):
    from ..reproduce import load_matrix

    for flag in ("work", "matrix"):
        value = getattr(args, flag, None)
        if value:
            try:
                path = Path(value).expanduser()
            except RuntimeError:  # ~someone who is not a user here
                path = Path(value)
            if str(path).startswith("~"):
                raise ConfigError(f"--{flag} {value}: {str(path).split('/')[0]} is not a user of this machine")
            setattr(args, flag, str(path))
    return load_matrix(getattr(args, "matrix", None))


def cmd_list(args) -> None:
    from ..reproduce import cell_status
    from ..reproduce.run import data_location

    matrix = _matrix(args)
    work_root = Path(args.work)
    rows = []
    for cell in matrix.cells.values():
        st = cell_status(cell, work_root, getattr(args, "matrix", None))
        data = {n: data_location(n, matrix.datasets[n], {})[1] for n in cell.data}
        rows.append((cell, st, data))
    from ..reproduce import _status_text

    if args.json:
        from ..reproduce.status import status_word

        out = []
        for cell, st, data in rows:
            out.append({**cell.as_json(), "status": status_word(st, cell),
                        "status_detail": st and {k: st.get(k) for k in ("got", "difference", "date", "commit",
                                                                         "machine", "verdict")},
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
    from ..reproduce.run import data_args, run_cell

    matrix = _matrix(args)
    given = data_args(args.data)
    unknown = [n for n in given if n not in matrix.datasets]
    if unknown:
        raise ConfigError(f"--data {', '.join(unknown)}: no such dataset in the matrix; known: "
                          + ", ".join(sorted(matrix.datasets)))
    if not args.cells and not args.family:
        raise ConfigError("reproduce run needs CELL ids, or --family FAMILY (an experiment: every arm and seed)")
    if args.family and args.cells:
        raise ConfigError("give CELL ids or --family, not both")
    experiment_flags = [f for f, v in (("--seeds", args.seeds), ("--arms", args.arms), ("--set", args.set),
                                       ("--on", args.on)) if v is not None and v != []]
    if args.family:
        return _run_family(args, matrix, given)
    cells = [matrix.cell(c) for c in args.cells]
    effect = [c for c in cells if c.experiment]
    if effect and len(effect) != len(cells):
        raise ConfigError("effect cells (an experiment's comparisons) and other cells are run by separate commands")
    if effect:
        return _run_effect_cells(args, matrix, given, effect)
    if experiment_flags:
        raise ConfigError(f"{', '.join(experiment_flags)}: options of an experiment (--family, or its cells)")
    from ..reproduce.run import run_paired

    codes = [(run_paired if cell.paired else run_cell)(
        cell, matrix, given, Path(args.work) if cell.paired else Path(args.work) / cell.id, record=args.record,
        folder=getattr(args, "matrix", None)) for cell in cells]
    return 1 if 1 in codes else (EXIT_RECORDED if EXIT_RECORDED in codes else 0)


def _seeds_arg(text: str | None, defined: list[int] | None = None) -> list[int] | None:
    """--seeds as a list (None: not given). Refused: an empty value, a range that runs backwards (4-0), a seed
    named twice, and (with `defined`, the experiment's seeds) a seed the experiment does not name: its run could
    never be recorded."""
    if text is None:
        return None
    out = []
    for part in text.split(","):
        a, dash, b = part.strip().partition("-")
        try:
            lo, hi = int(a), int(b) if dash else int(a)
        except ValueError:
            raise ConfigError(f"--seeds {text!r}: seeds as 0,1,2 or 0-4") from None
        if hi < lo:
            raise ConfigError(f"--seeds {text!r}: the range {part.strip()} runs backwards (write {hi}-{lo})")
        out += list(range(lo, hi + 1))
    twice = sorted({s for s in out if out.count(s) > 1})
    if twice:
        raise ConfigError(f"--seeds {text!r}: seed {', '.join(map(str, twice))} named twice")
    if defined is not None:
        foreign = [s for s in out if s not in defined]
        if foreign:
            raise ConfigError(f"--seeds {text!r}: seed {', '.join(map(str, foreign))} is not one the experiment "
                              f"names ({', '.join(map(str, defined))}); its run could not be recorded. Add it to the "
                              "experiment's seeds to run it")
    return out


def _arms_arg(text: str | None) -> list[str] | None:
    if text is None:
        return None
    arms = [a.strip() for a in text.split(",")]
    if not all(arms):
        raise ConfigError(f"--arms {text!r}: arm ids, comma-separated (an empty one is not an arm)")
    twice = sorted({a for a in arms if arms.count(a) > 1})
    if twice:
        raise ConfigError(f"--arms {text!r}: {', '.join(twice)} named twice")
    return arms


def set_work_folder(work: Path, exp, set_vars: dict) -> Path:
    """Where a run with --set values goes: a folder of its own beside the experiment's, named by the values
    (`<family>-<dataset>-set-<digest>`), so a smoke run never shares, nor sets aside, a defined run."""
    import hashlib
    import json

    changed = {k: str(v) for k, v in sorted(set_vars.items()) if str(exp.vars.get(k)) != str(v)}
    if not changed:
        return work
    return work.with_name(f"{work.name}-set-{hashlib.sha256(json.dumps(changed).encode()).hexdigest()[:8]}")


def _set_args(pairs: list[str] | None) -> dict:
    import yaml

    out = {}
    for p in pairs or []:
        k, eq, v = p.partition("=")
        if not eq or not k:
            raise ConfigError(f"--set {p!r}: expected NAME=VALUE (a var of the experiment)")
        out[k] = yaml.safe_load(v) if v else v
    return out


def _run_family(args, matrix, given: dict, arms: list[str] | None = None) -> int:
    """Every dataset of the experiment whose data is here (or --on DATASET), every arm and seed."""
    from ..effects.runner import ExperimentRun
    from ..reproduce.run import data_location, resolve_data

    exp = matrix.experiments.get(args.family)
    if exp is None:
        known = ", ".join(sorted(matrix.experiments)) or "none"
        raise ConfigError(f"--family {args.family}: not an experiment of the matrix (experiments: {known}; other "
                          "families' cells run by their ids)")
    if args.on:
        if args.on not in matrix.datasets:
            raise ConfigError(f"--on {args.on}: no such dataset in the matrix")
        datasets = [args.on]
    else:
        datasets = [d for d in exp.datasets if data_location(d, matrix.datasets[d], given)[0] is not None]
        if not datasets:
            d = exp.datasets[0]
            from ..reproduce.run import missing_line

            raise PipelineError(missing_line(exp.cell_id(d, next(iter(exp.comparisons))), d, matrix.datasets[d])
                                .replace(f"reproduce run {exp.cell_id(d, next(iter(exp.comparisons)))}",
                                         f"reproduce run --family {exp.family}"))
    seeds = _seeds_arg(args.seeds, list(exp.seeds))
    arm_ids = arms or _arms_arg(args.arms)
    set_vars = _set_args(args.set)
    worst = 0
    for d in datasets:
        work = set_work_folder(Path(args.work) / f"{exp.family}-{d}", exp, set_vars)
        loc = resolve_data(f"{exp.family} on {d}", [d], matrix, given, work)[d]
        run = ExperimentRun(exp, d, loc, work, seeds=seeds, arms=arm_ids, set_vars=set_vars)
        if run.changed_vars:
            run.say(f"vars changed ({', '.join(f'{k}={v}' for k, v in run.changed_vars.items())}): this run has a "
                    f"work folder of its own, {work}, and is never recorded")
        if args.record and (run.changed_vars or args.on or arm_ids or seeds is not None):
            raise ConfigError("--record keeps a run of the experiment as it is defined: every arm and seed, no --set, "
                              "--arms, --seeds or --on")
        result = run.run()
        if args.record:
            _keep_family_record(exp, d, result, getattr(args, "matrix", None), work, run.say)
        _print_effects(result, run.say)
        if result.get("failed"):
            raise PipelineError(f"{len(result['failed'])} run(s) of {exp.family} on {d} failed (each said above, "
                                f"its output in its logs/); re-run the same command to try them again")
        if not result["complete"]:
            run.say(f"the experiment as defined: {result['runs_finished']} of {result['runs_planned']} runs finished; "
                    "the same command without --arms/--seeds runs the rest")
        # this command's exit status says whether what it was asked to run finished
        worst = max(worst, 0 if result["this_invocation"]["complete"] else 1)
    return worst


def _run_effect_cells(args, matrix, given: dict, cells: list) -> int:
    fams = {c.experiment for c in cells}
    datasets = {c.data[0] for c in cells}
    if len(fams) > 1 or len(datasets) > 1:
        raise ConfigError("effect cells of one experiment and one dataset at a time")
    arms = []
    for c in cells:
        exp = matrix.experiments[c.experiment]
        for a in (exp.comparisons[c.comparison].baseline, exp.comparisons[c.comparison].method):
            if a not in arms:
                arms.append(a)
    args.family, args.on = fams.pop(), args.on or datasets.pop()
    return _run_family(args, matrix, given, arms=arms)


def _print_effects(result: dict, say) -> None:
    for cid, row in result["comparisons"].items():
        e = (row.get("parts") or {}).get("all")
        if not e or e.get("n_seeds", 0) == 0:
            continue
        if row.get("not_comparable"):  # the difference is not the method's effect: no figure, the reason
            say(f"{cid}: not comparable: {row['not_comparable']}")
            continue
        iv = e.get("interval")
        say(f"{cid}: {e['difference']:+.4f}" + (f" [{iv[0]:+.4f}, {iv[1]:+.4f}]" if iv else "")
            + (f", p {e['p_randomization']:.3f}" if e.get("p_randomization") is not None else "")
            + f", {e['n_seeds']} seed(s): {row['verdict']}"
            + (f" (smallest detectable {e['mde']:.4f})" if e.get("mde") is not None else ""))


def _keep_family_record(exp, d: str, r: dict, folder, work: Path, say) -> None:
    """Write an experiment's result into the matrix's results/: merged with the record already there (its runs
    kept, this result's where both hold an arm and seed; effects/record.py), so that seeds run in another work
    folder, session or machine add to the record instead of replacing it."""
    from ..effects.record import merge
    from ..io_utils import write_json_atomic
    from ..reproduce import results_dir
    from ..reproduce.run import relative_record
    from ..reproduce.status import read_result

    from ..effects.record import recordable

    out = results_dir(folder) / f"{exp.family}-{d}.json"
    wrong = recordable(exp, r)
    if wrong:
        raise PipelineError(f"{work / 'result.json'}: not the experiment as the matrix defines it: "
                            + "; ".join(wrong[:5]) + (f"; and {len(wrong) - 5} more" if len(wrong) > 5 else "")
                            + "; nothing was recorded (run it as defined, or keep it local)")
    new = relative_record(r, {d: r.get("data") or "", "work": str(work.resolve())})
    earlier = read_result(out) if out.exists() else None
    if out.exists() and earlier is None:
        raise PipelineError(f"{out}: not a readable result, so not replaced; move it away to record here")
    if earlier is not None:
        try:
            new, notes = merge(exp, earlier, new)
        except PipelineError as e:
            raise PipelineError(f"{out}: {e}; record into another matrix (--matrix), or move that file away first")
        for line in notes:
            say(line)
    write_json_atomic(out, new)
    say(f"{new.get('runs_finished')} of {new.get('runs_planned')} runs" + ("" if new.get("complete") else
                                                                            " (incomplete)") + f" -> {out}")


def cmd_record(args) -> None:
    """Keep a finished run's result in the matrix's results/ without running anything again (what `run --record`
    writes): a cell's <work>/<cell>/result.json, or an experiment's <work>/<family>-<dataset>/result.json."""
    from ..io_utils import write_json_atomic
    from ..reproduce import results_dir
    from ..reproduce.run import relative_record
    from ..reproduce.status import cell_digest, read_result

    matrix = _matrix(args)
    folder = getattr(args, "matrix", None)
    if bool(args.cells) == bool(args.family):
        raise ConfigError("reproduce record needs CELL ids or --family FAMILY")
    if args.family:
        exp = matrix.experiments.get(args.family)
        if exp is None:
            raise ConfigError(f"--family {args.family}: not an experiment of the matrix")
        for d in ([args.on] if args.on else exp.datasets):
            work = Path(args.work) / f"{exp.family}-{d}"
            r = read_result(work / "result.json")
            if r is None:
                if args.on:
                    raise PipelineError(f"{work / 'result.json'}: no result of {exp.family} on {d} to record")
                continue
            if r.get("experiment") != exp.family or r.get("dataset") != d:
                raise PipelineError(f"{work / 'result.json'}: not a result of {exp.family} on {d}")
            # its vars as defined, and arms and seeds among the defined ones: a run of --arms/--seeds is a part
            # of the experiment (recorded as incomplete, each row with its seeds; an arm not run shows "not run")
            arms_run, seeds = list(r.get("arms_run") or []), list(r.get("seeds_run", r.get("seeds")) or [])
            if r.get("changed_vars") or not arms_run or not seeds or not set(arms_run) <= set(exp.arms) \
                    or not set(seeds) <= set(exp.seeds):
                raise PipelineError(f"{work / 'result.json'}: a run with other arms, seeds or vars than the experiment "
                                    "defines is never recorded (run it as defined, or keep it local)")
            _keep_family_record(exp, d, r, folder, work, lambda text: print(f"[reproduce] {exp.family} on {d}: {text}"))
        return
    for cid in args.cells:
        cell = matrix.cell(cid)
        path = Path(args.work) / cell.id / "result.json"
        r = read_result(path)
        if r is None or r.get("cell") != cell.id:
            raise PipelineError(f"{path}: no result of cell {cell.id} to record")
        if r.get("cell_digest") != cell_digest(cell):
            raise PipelineError(f"{path}: made by another definition of {cell.id} (its commands, metric or data "
                                "changed since); run it again")
        out = results_dir(folder) / f"{cell.id}.json"
        write_json_atomic(out, relative_record(r, {**(r.get("data") or {})}))
        print(f"[reproduce] {cell.id} -> {out}")


REPORT_MARK = "<!-- made by pipeline reproduce report: edit repro/*.yaml, not this file -->"


def _check_report_target(path: str, what: str) -> None:
    """A report replaces only a page this command wrote (its first line is REPORT_MARK): never a user's file."""
    p = Path(path)
    if p.is_dir():
        raise PipelineError(f"{what} {path}: is a folder; give a file path")
    if p.exists():
        try:
            with open(p, encoding="utf-8", errors="replace") as f:
                head = f.read(len(REPORT_MARK) + 200)
        except OSError as e:
            raise PipelineError(f"{what} {path}: cannot read it to check it is a report ({e.strerror})") from None
        if REPORT_MARK not in head:
            raise PipelineError(f"{what} {path}: exists and is not a page `pipeline reproduce report` wrote; "
                                "nothing was written (choose another path, or move the file)")


def cmd_report(args) -> None:
    from ..io_utils import write_text_atomic
    from ..reproduce import render_report

    _check_report_target(args.out, "--out")
    if args.html:
        _check_report_target(args.html, "--html")
    matrix = _matrix(args)
    from ..reproduce.page import write_figures

    work_root = Path(args.work) if args.local else None
    text = render_report(matrix, work_root, getattr(args, "matrix", None))
    write_text_atomic(args.out, REPORT_MARK + "\n" + text)
    for png in write_figures(matrix, Path(args.out).parent, work_root, getattr(args, "matrix", None)):
        print(f"[reproduce] figure -> {png}")
    print(f"[reproduce] {len(matrix.cells)} cells -> {args.out}")
    if args.html:
        write_text_atomic(args.html, _html(text).replace("<!doctype html>", "<!doctype html>" + REPORT_MARK, 1))
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


def check_command(line: str | list[str], parser) -> str:
    """Parse one `pipeline ...` command (a line, or its arguments) with the real CLI parser
    (`pipeline.cli.build_parser()`) and load its config (file + overrides) with the real config system, without
    running it: a ConfigError naming the command when it would not. A relative --config is read from the
    repository wherever this runs. Returns "checked", or "made by a step" for a config an earlier step of the
    cell writes (its keys are checked when it exists)."""
    import contextlib
    import io

    from ..provenance import repo_root

    argv = shlex.split(line) if isinstance(line, str) else list(line)
    shown = line if isinstance(line, str) else shlex.join(argv)
    if not argv or argv[0] != "pipeline":
        raise ConfigError(f"not a pipeline command: {shown}")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv[1:])
    except SystemExit:
        raise ConfigError(f"{shown}: the CLI refuses it: {err.getvalue().strip().splitlines()[-1]}") from None
    verb = argv[1]
    overrides = list(getattr(args, "overrides", None) or [])
    config = getattr(args, "config", None)
    if config is not None and not Path(config).exists():
        in_repo = repo_root() / config
        if not Path(config).is_absolute() and in_repo.exists():
            config = str(in_repo)
        elif _CHECK_WORK in config:
            return "made by a step"  # a config an earlier step writes (best.yaml): checked when it exists
        else:
            raise ConfigError(f"{shown}: --config {config} exists neither here nor in the repository ({repo_root()})")
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
        raise ConfigError(f"{shown}: {e}") from None
    return "checked"


_CHECK_WORK = "/tmp/reproduce-check-work"


def cmd_check(args) -> None:
    """Every cell's commands parsed and configs loaded; the matrix's own rules (reproduce/checks.py)."""
    from ..effects.spec import split_command
    from ..reproduce.checks import check_records, check_rules

    matrix = _matrix(args)
    n, made = 0, 0
    for cell in matrix.cells.values():
        if cell.experiment:
            continue  # an experiment's commands are checked once below, with its placeholders filled
        values = {name: f"/data/{name}" for name in cell.data}
        values["work"] = _CHECK_WORK
        for c in cell.commands:
            argv = [a.format(**values) for a in split_command(c, f"cell {cell.id}")]
            made += check_command(argv, args.parser) == "made by a step"
            n += 1
    for fam, exp in matrix.experiments.items():
        from ..provenance import repo_root

        values = {**exp.vars, "data": "/data/dataset", "prep": "/tmp/prep", "run": "/tmp/run", "seed": 0,
                  "repo": str(repo_root()), "model_path": "/tmp/run/model/model"}
        commands = exp.prepare + [c for arm in exp.arms.values() for c in exp.arm_commands(arm)]
        for argv in commands:
            check_command([a.format(**values) for a in argv], args.parser)
            n += 1
    problems = check_rules(matrix) + check_records(matrix, getattr(args, "matrix", None))
    for p in problems:
        print(f"[reproduce] {p}")
    if problems:
        raise PipelineError(f"{len(problems)} cell(s) break the matrix's rules (above)")
    print(f"[reproduce] {len(matrix.cells)} cells, {n} commands: every one parses and its config loads"
          + (f" ({made} configs made by an earlier step of their cell are checked when they exist)" if made else "")
          + "; every cell keeps the matrix's rules")


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
                                    "1 missed, 2 error, 3 no figure to compare), or an experiment (--family)")
    common(q)
    q.add_argument("cells", nargs="*", metavar="CELL")
    q.add_argument("--data", action="append", default=[], metavar="NAME=PATH",
                   help="where a dataset is, in its published layout (repeatable)")
    q.add_argument("--record", action="store_true", help="also write the result into the matrix's results/ "
                                                         "(what `list` and `report` show)")
    q.add_argument("--family", help="an experiment (e.g. effects): every arm and seed of it, on each of its datasets "
                                    "whose data is here; resumable (finished seeds are not run again)")
    q.add_argument("--on", metavar="DATASET", help="an experiment on another dataset of the matrix (e.g. python_faq, "
                                                   "bundled: the machinery on a small case)")
    q.add_argument("--seeds", help="an experiment's seeds to run, e.g. 0,1 or 0-4 (default: all it names)")
    q.add_argument("--arms", help="an experiment's arms to run, comma-separated (default: all)")
    q.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="change a var of the experiment (e.g. --set max_steps=2); such a run is never --record'ed")
    q.set_defaults(func=cmd_run)
    q = rsub.add_parser("record", help="keep a finished run's result in the matrix's results/ (what list and report "
                                       "show) without running it again")
    common(q)
    q.add_argument("cells", nargs="*", metavar="CELL")
    q.add_argument("--family", help="an experiment: its result on each dataset run under --work")
    q.add_argument("--on", metavar="DATASET", help="only this dataset of the experiment")
    q.set_defaults(func=cmd_record)
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
