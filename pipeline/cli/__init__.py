"""`pipeline` console script: verbs over the library (ingest, subset, encode, index, retrieve, evaluate,
compare, sts, authorship, train, refresh, tune, demo, reproduce, config show, info). `pipeline <verb> --help`
lists the config keys the verb reads (pipeline/confdoc.py).

Every verb that reads config keys takes `--config FILE` and trailing `section.key=value` overrides (anywhere
after the verb), e.g. `pipeline encode --corpus runs/c --out runs/e encode.num_actors=2 encode.cpus_per_actor=0.5`;
ingest, subset, bm25, info, authorship evaluate|table and reproduce read no config section. `--help`,
`--version` and a config error import neither torch, transformers nor Ray (tests/unit/test_cli_light_imports.py).

The CLI is the roof: it parses arguments and calls the library; nothing in `pipeline/` imports it.
One module per group of verbs:

    corpus.py      ingest, subset
    spine.py       encode, index, retrieve
    evaluation.py  evaluate, compare, sts, authorship
    training.py    train, refresh, tune, demo
    tools.py       config show, info
    reproduce.py   reproduce list, run, report, check (the reproduction matrix, repro/*.yaml)
    common.py      --config/overrides, --batch-size/--fp16/--device
"""

from __future__ import annotations

import argparse
import sys

from ..errors import PipelineError
from . import corpus, evaluation, reproduce, spine, tools, training
from .common import VerbParser


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="pipeline", description="Dense retrieval on Ray: ingest, encode, index, "
                                                                   "retrieve, evaluate, train, tune.")
    parser.add_argument("--version", action="version", version=f"pipeline {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=VerbParser)
    for group in (corpus, spine, evaluation, training, reproduce, tools):
        group.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..runtime_env import setup_offline_env

    setup_offline_env()
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        verb = next((a for a in argv if not a.startswith("-")), None)
        if verb is not None:  # generated from the config dataclasses, only for the verb whose help is asked for
            _attach_config_help(parser, verb)
    args = parser.parse_args(argv)
    args.parser = parser  # `pipeline reproduce check` parses the cells' commands with it
    from ..ray_runtime import shutdown_local_ray

    _exit_on_hangup()
    rc = None  # the exit status, known before the finally block runs
    try:
        _refuse_symlink_loops(argv)
        rc = args.func(args) or 0  # a verb may return its own status (reproduce run: 1 = ran and missed)
        return rc
    except PipelineError as e:
        from ..credentials import redact

        print(f"error: {redact(str(e))}", file=sys.stderr)  # no credential of a URI reaches the terminal
        rc = 2
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        rc = 130
        return 130
    except (RuntimeError, OSError) as e:
        loop = symlink_loop(e)  # a path that is a symlink loop, wherever the command met it
        if loop is None:
            raise
        print(f"error: {_loop_line(loop)}", file=sys.stderr)
        rc = 2
        return 2
    except SystemExit as e:  # e.g. SIGHUP (see _exit_on_hangup)
        rc = e.code if isinstance(e.code, int) else 1
        raise
    finally:
        # a local Ray this command started stops with it, however it ends; if Ray's shutdown hangs,
        # the command still ends (with the status it had) and the watchdog ends Ray's processes
        if not shutdown_local_ray():
            import os
            import traceback

            if rc is None and sys.exc_info()[0] is not None:
                traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1 if rc is None else rc)
    return 0


def _refuse_symlink_loops(argv: list[str]) -> None:
    """A path given on the command line (an argument, `--flag=PATH` or a `key=PATH` override) that runs through a
    symlink loop is refused before any work, naming the link that loops. Up to Python 3.12 `Path.resolve()`
    raised wherever a command met such a path (caught below); 3.13's returns quietly, and the loop then surfaced
    as whatever the command checked first ("not a folder of embeddings", or a missing file of another option)."""
    for token in argv:
        value = token.split("=", 1)[1] if "=" in token else token
        loop = _first_loop(value) if value and "://" not in value else None
        if loop is not None:
            raise PipelineError(_loop_line(value, at=None if loop == value else loop))


def _loop_line(path: str, at: str | None = None) -> str:
    """The error for a path that is (or, `at` a link on its way, runs through) a symlink loop."""
    where = f": {at}" if at else ""
    return (f"{path}: a symlink loop (a link that leads back to itself{where}); point the option at a real folder "
            "or file")


def _first_loop(path: str) -> str | None:
    """The first part of `path` that is a symlink loop, or None (a path that exists, or is missing, or is no
    path at all)."""
    import os
    from pathlib import Path

    def loops(p) -> bool:
        try:
            os.stat(p)
        except OSError as e:
            return symlink_loop(e) is not None
        except ValueError:  # a NUL byte: not a path
            return False
        return False

    if not loops(path):
        return None
    parts = Path(path).parts
    for i in range(1, len(parts) + 1):
        if loops(Path(*parts[:i])):
            return str(Path(*parts[:i]))
    return path


def symlink_loop(e: BaseException) -> str | None:
    """The path of a symlink loop `e` reports (pathlib's RuntimeError, or an OSError ELOOP), else None."""
    import errno
    import re

    if isinstance(e, OSError) and e.errno == errno.ELOOP:
        return str(e.filename or e)
    m = re.match(r"Symlink loop from '(.*)'$", str(e)) if isinstance(e, RuntimeError) else None
    return m.group(1) if m else None


def _attach_config_help(parser: argparse.ArgumentParser, verb: str | None = None) -> None:
    """The verb's --help ends with the config keys it reads and their defaults (pipeline/confdoc.py);
    `verb` None: every verb's (`pipeline --help` itself lists none)."""
    from ..confdoc import example_override, verb_epilog

    for action in parser._subparsers._group_actions if parser._subparsers else []:
        for name, sub in getattr(action, "choices", {}).items():
            if verb is not None and name != verb:
                continue
            text = verb_epilog(name)
            if text:
                sub.epilog = text
                sub.formatter_class = argparse.RawDescriptionHelpFormatter
            for a in sub._actions:  # the override example names one of this verb's own keys
                if a.dest == "overrides" and not a.option_strings and example_override(name):
                    a.help = f"config overrides, e.g. {example_override(name)} (keys below)"


def _exit_on_hangup() -> None:
    """SIGHUP (terminal closed) exits through Python, so atexit hooks stop a local Ray."""
    import signal

    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
        try:
            signal.signal(signal.SIGHUP, lambda signum, frame: sys.exit(128 + signum))
        except ValueError:  # not the main thread (e.g. main() called from a worker thread)
            pass


if __name__ == "__main__":
    sys.exit(main())
