"""Config keys as text, generated from the config dataclasses (never written by hand).

`verb_epilog(verb)` is what `pipeline <verb> --help` prints under the options: every
config key the verb reads, its default and the comment written beside the field in
pipeline/config.py or pipeline/train/config.py (the first line of it). `config_kind`
tells a pipeline config from a training job config, for `pipeline config show`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import typing

# verb -> the sections of PipelineConfig it reads ("train" = the whole training job config)
VERB_SECTIONS: dict[str, tuple[str, ...]] = {
    "encode": ("encode", "model", "ray"),
    "index": ("index",),
    "retrieve": ("retrieve", "model", "index"),
    "evaluate": ("eval",),
    "compare": ("eval",),
    "sts": ("model",),
    "demo": ("model", "encode", "index", "retrieve", "eval", "ray"),
    "train": ("train",),
    "refresh": ("train",),
    "tune": ("sweep",),
}

_FIELD = re.compile(r"^\s+([A-Za-z_]\w*)\s*:\s*[^=#]+?(?:=\s*(.*?))?\s*(?:#\s*(.*))?$")


@functools.lru_cache(maxsize=None)
def _class_spans(filename: str) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """A source file's lines and {class qualname: (first line, last line)}, decorators included (as
    inspect.getsource gives them), parsed once per file: inspect parses the whole file again for every
    class, which made `--help` pay for ~60 parses."""
    with open(filename, encoding="utf-8") as f:
        source = f.read()
    spans: dict[str, tuple[int, int]] = {}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                spans[prefix + child.name] = (first, child.end_lineno or child.lineno)
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, f"{prefix}{child.name}.<locals>.")

    visit(ast.parse(source), "")
    return source.splitlines(), spans


def _class_lines(cls) -> list[str]:
    try:
        lines, spans = _class_spans(inspect.getsourcefile(cls))
        first, last = spans[cls.__qualname__]
        return lines[first - 1:last]
    except (OSError, TypeError, KeyError, SyntaxError):
        return inspect.getsource(cls).splitlines()


def field_comments(cls) -> dict[str, str]:
    """{field: comment} from the class source: the comment on the field's line, else the
    comment lines just above it (joined)."""
    out: dict[str, str] = {}
    try:
        lines = _class_lines(cls)
    except (OSError, TypeError):
        return out
    above: list[str] = []
    for line in lines[1:]:
        s = line.strip()
        if s.startswith("#"):
            above.append(s.lstrip("#").strip())
            continue
        m = _FIELD.match(line)
        if m and not s.startswith(("def ", "@", "return", "raise", "if ", "for ")) and line.startswith("    ") \
                and not line.startswith("        "):
            out[m.group(1)] = (m.group(3) or " ".join(above)).strip()
        above = []
    return out


def _fmt(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, str):
        return repr(v) if (not v or v.strip() != v or any(c in v for c in " #:{}[]")) else v
    return str(v)


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _choices(tp) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    lits = []
    for a in [tp, *args]:
        if typing.get_origin(a) is typing.Literal:
            lits = list(typing.get_args(a))
    return "|".join(map(str, lits))


def section_lines(prefix: str, cls, width: int = 100, skip=()) -> list[str]:
    """One line per key: `prefix.key = default   comment` (Literal choices, or the key's declared
    range, in the comment)."""
    from .config import _numeric_bounds, bounds_text

    comments = field_comments(cls)
    hints = typing.get_type_hints(cls)
    extras = typing.get_type_hints(cls, include_extras=True)
    rows = []
    for f in dataclasses.fields(cls):
        if f.name in skip or dataclasses.is_dataclass(hints.get(f.name)) or f.name == "sections":
            continue
        key = f"{prefix}.{f.name} = {_fmt(_default(f))}"
        note = comments.get(f.name, "")
        choices = _choices(hints.get(f.name))
        if choices and choices not in note:
            note = f"{choices}; {note}" if note else choices
        bounds = bounds_text(_numeric_bounds(extras.get(f.name))[1])
        if bounds:
            note = f"({bounds}) {note}".strip()
        rows.append((key, note))
    keyw = min(max((len(k) for k, _ in rows), default=0), 44)
    lines = []
    for key, note in rows:
        if not note:
            lines.append(f"  {key}")
            continue
        first, *rest = textwrap.wrap(note, max(30, width - keyw - 6)) or [""]
        lines.append(f"  {key.ljust(keyw)}  {first}" if len(key) <= keyw else f"  {key}\n  {'':{keyw}}  {first}")
        lines += [f"  {'':{keyw}}  {r}" for r in rest]
    return lines


def _pipeline_sections():
    from .config import PipelineConfig

    return {f.name: typing.get_type_hints(PipelineConfig)[f.name] for f in dataclasses.fields(PipelineConfig)}


def _train_sections():
    from .train.config import TrainJobConfig

    hints = typing.get_type_hints(TrainJobConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(TrainJobConfig) if f.name != "sections"}


def _method_lines() -> list[str]:
    """Each registered method's own loss keys (beyond the common ones) and extra sections (from
    train/methods/configs.py: no torch is imported to print them)."""
    from .losses.configs import LossConfig
    from .train.methods.registry import config_method_names, method_config

    base = {f.name for f in dataclasses.fields(LossConfig)}
    lines = ["", "method-specific keys (loss.name=<method>; each method's loss block refuses the others' keys):"]
    sections: dict = {}
    for name in config_method_names():
        m = method_config(name)
        own = [ln for ln in section_lines("loss", m.config_cls, skip=base)]
        lines.append(f" loss.name={name}" + ("" if own else " (no keys beyond the common ones)"))
        lines += ["  " + ln for ln in own]
        for sec, cls in (getattr(m, "sections", None) or {}).items():
            sections.setdefault((sec, cls), []).append(name)
    for (sec, cls), names in sections.items():
        lines.append(f" {sec}: (a section of loss.name={' or '.join(names)})")
        lines += section_lines(sec, cls)
    return lines


def verb_epilog(verb: str) -> str | None:
    sections = VERB_SECTIONS.get(verb)
    if not sections:
        return None
    head = ("config keys this verb reads (set as trailing section.key=value, or in --config FILE.yaml; "
            "defaults shown; `pipeline config show` prints the resolved config):")
    lines = textwrap.wrap(head, 100)
    if sections == ("sweep",):
        from .tune.space import SearchConfig

        lines.append(" the sweep file: base (training config file or inline), overrides, space, output; and")
        lines.append(" search:")
        lines += section_lines("search", SearchConfig)
        lines.append(" training keys (in base, overrides and space): see `pipeline train --help`")
    elif sections == ("train",):
        for name, cls in _train_sections().items():
            lines.append(f" {name}:")
            lines += section_lines(name, cls)
        lines += _method_lines()
    else:
        secs = _pipeline_sections()
        for name in sections:
            lines.append(f" {name}:")
            lines += section_lines(name, secs[name])
    return "\n".join(lines)


_EXAMPLES = {"encode": "encode.batch_size=128", "index": "index.nprobe=64", "retrieve": "retrieve.batch_size=256",
             "evaluate": "eval.rel_level=2", "compare": "eval.rel_level=2", "sts": "model.pooling=mean",
             "demo": "encode.batch_size=32", "train": "train.num_workers=2", "refresh": "ance.top_k=100",
             "tune": "search.num_samples=4"}


def example_override(verb: str) -> str | None:
    return _EXAMPLES.get(verb)


# --------------------------------------------------------------------------- pipeline config show

TRAIN_ONLY_SECTIONS = ("train", "data", "optim", "loss", "validation")


def config_kind(data: dict) -> str:
    """'train' for a training job config (it has train/data/optim/loss/validation sections or a
    method's own section), 'sweep' for a Tune sweep file, else 'pipeline'."""
    if "base" in data and ("space" in data or "search" in data):
        return "sweep"
    if any(k in data for k in TRAIN_ONLY_SECTIONS):
        return "train"
    known = set(_pipeline_sections())
    extra = [k for k in data if k not in known]
    if extra:
        from .train.methods.configs import METHOD_CONFIGS

        method_secs = {s for m in METHOD_CONFIGS.values() for s in m.sections}
        if all(k in method_secs for k in extra):
            return "train"
    return "pipeline"
