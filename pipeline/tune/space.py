"""The sweep file (`pipeline tune --config jobs/configs/tune_dar.yaml`): parsing and validation.

    base: jobs/configs/dar.yaml        # a training config file, or the training config inline
    overrides: [train.max_steps=60]    # optional training overrides applied to the base
    space:                             # training config keys -> Tune's vocabulary
      loss.n_perturb: {grid: [3, 5, 7, 9]}
      loss.dropout_p: {uniform: [0.05, 0.3]}
      loss.temperature: {loguniform: [0.01, 0.1]}
      optim.lr: {choice: [1.0e-5, 3.0e-5]}
      train.seed: {randint: [0, 1000]}  # as Tune: the upper bound is excluded
    search: {searcher: grid, num_samples: 1, metric: val_metric, mode: max,
             scheduler: asha, grace_period: 10, reduction_factor: 2, max_t: 0,
             max_concurrent_trials: 0, seed: 0, replicate_key: null}
    output: runs/tune/dar

`search.replicate_key: train.seed` makes one swept key a replicate, not a hyperparameter: trials
that differ only in it are one configuration, the best configuration is the one with the best
mean over its replicates, and results.md reports mean ± sd per configuration and each replicate's
value (results.py). It needs the grid searcher (every configuration under every replicate value,
listed in the space), num_samples 1, and `scheduler: none`: ASHA ranks every trial that reaches a
rung against all others, across replicates (a lucky seed would stop another seed's run of a better
configuration, and a configuration would keep some replicates and lose others), so with
replicates every trial runs to its last step.

Everything here runs without Ray: a space key that is not a training config key, a value
the training config refuses, a metric the trainer does not report and a searcher that
cannot take a distribution are `ConfigError`s before any trial starts.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from annotated_types import Gt

from ..config import NonNegFloat, NonNegInt, PosInt, Section, Seed, from_dict, merge_overrides, read_yaml
from ..errors import ConfigError

KINDS = ("choice", "grid", "uniform", "loguniform", "randint")
# Keys the sweep sets itself for every trial (its own run folder, resume on restore, one Ray).
RESERVED = ("train.name", "train.storage_path", "train.resume")
RESERVED_SECTIONS = ("ray",)


@dataclass(frozen=True)
class SearchConfig(Section):
    searcher: Literal["grid", "random", "optuna"] = "grid"
    # grid: repeats of the whole grid; random/optuna: trials
    num_samples: PosInt = 1
    metric: str = "val_metric"
    mode: Literal["auto", "max", "min"] = "auto"   # auto: max for val_*, min for loss terms
    scheduler: Literal["asha", "none"] = "asha"
    # ASHA, in training steps (the trainer's own `step`, which survives a restore)
    grace_period: PosInt = 10
    reduction_factor: Annotated[float, Gt(1)] = 2.0
    max_t: NonNegInt = 0                           # 0 = the base config's train.max_steps
    max_concurrent_trials: NonNegInt = 0           # 0 = as many as the cluster holds
    seed: Seed = 0
    trial_cpus: NonNegFloat = 0.1                  # the per-trial driver (the workers ask their own)
    # a space key whose values are replicates (e.g. train.seed): select by the mean over them
    replicate_key: str | None = None
    # a sweep never selects on a test split (validation qrels named `test`, or an ir_datasets test
    # split); true is the only way past, and results.md then says so
    allow_test_selection: bool = False

    SECTION = "search"

    def validate(self) -> None:
        if self.replicate_key is not None and not str(self.replicate_key).strip():
            raise ConfigError("search.replicate_key must name a space key (e.g. train.seed) or be null")


@dataclass(frozen=True)
class Param:
    key: str            # training config key, e.g. loss.n_perturb
    kind: str           # one of KINDS
    values: tuple       # choice/grid: the values; uniform/loguniform/randint: (low, high)

    def candidates(self) -> list:
        """The values checked against the training config: every listed value, or both ends."""
        if self.kind in ("choice", "grid"):
            return list(self.values)
        lo, hi = self.values
        return [lo, hi - 1] if self.kind == "randint" else [lo, hi]

    def describe(self) -> str:
        if self.kind in ("choice", "grid"):
            return f"{self.kind} {list(self.values)}"
        return f"{self.kind} [{self.values[0]}, {self.values[1]}{')' if self.kind == 'randint' else ']'}"


@dataclass(frozen=True)
class SweepConfig:
    base: dict                              # the base training config (plain data)
    base_source: str                        # its file, or "inline"
    overrides: tuple[str, ...]              # training overrides applied to the base
    space: tuple[Param, ...]
    search: SearchConfig
    output: str
    config_path: str | None = None
    raw: dict = field(default_factory=dict)  # the sweep file as given (plus CLI overrides)

    def base_data(self) -> dict:
        return merge_overrides(self.base, list(self.overrides))


# --------------------------------------------------------------------------- parsing

def parse_param(key: str, spec: Any) -> Param:
    where = f"space.{key}"
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ConfigError(f"{where}: expected one of {{{', '.join(k + ': ...' for k in KINDS)}}}, got {spec!r}")
    (kind, val), = spec.items()
    if kind not in KINDS:
        raise ConfigError(f"{where}: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    if kind in ("choice", "grid"):
        if not isinstance(val, list) or not val:
            raise ConfigError(f"{where}: {kind} needs a non-empty list of values, got {val!r}")
        if len({repr(v) for v in val}) != len(val):
            raise ConfigError(f"{where}: {kind} lists a value twice: {val!r}")
        return Param(key, kind, tuple(val))
    if not isinstance(val, list) or len(val) != 2:
        raise ConfigError(f"{where}: {kind} needs [low, high], got {val!r}")
    lo, hi = val
    if kind == "randint":
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in val):
            raise ConfigError(f"{where}: randint needs two integers [low, high), got {val!r}")
        if hi - lo < 2:
            raise ConfigError(f"{where}: randint [{lo}, {hi}) holds fewer than two values "
                              "(as in Tune, the upper bound is excluded)")
        return Param(key, kind, (lo, hi))
    try:
        lo, hi = float(lo), float(hi)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {kind} needs two numbers [low, high], got {val!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
        raise ConfigError(f"{where}: {kind} needs low < high, got {val!r}")
    if kind == "loguniform" and lo <= 0:
        raise ConfigError(f"{where}: loguniform needs low > 0, got {val!r}")
    return Param(key, kind, (lo, hi))


def parse_space(space: Any) -> tuple[Param, ...]:
    if not isinstance(space, dict) or not space:
        raise ConfigError("space: expected a mapping of training config keys to search domains, e.g. "
                          "space: {loss.n_perturb: {grid: [3, 5, 7]}}")
    params = []
    for key, spec in space.items():
        key = str(key)
        if key in RESERVED or key.split(".")[0] in RESERVED_SECTIONS:
            raise ConfigError(f"space.{key}: set by the sweep itself (each trial has its own run folder and "
                              "resumes its own checkpoints; one Ray for the sweep); it cannot be searched")
        if "." not in key:
            raise ConfigError(f"space.{key}: expected a training config key such as loss.n_perturb "
                              "(section.key)")
        params.append(parse_param(key, spec))
    return tuple(params)


def _split_cli(overrides: list[str]) -> tuple[list[str], list[str]]:
    """CLI overrides: `search.*`, `space.*` (`space.loss.n_perturb={grid: [3, 5]}`: a dotted training key),
    `output=`, `base=` change the sweep file, anything else (`train.max_steps=20`) is a training override
    applied to the base."""
    sweep, training = [], []
    for ov in overrides:
        head = ov.split("=", 1)[0].split(".", 1)[0].strip()
        (sweep if head in ("search", "space", "output", "base", "overrides") else training).append(ov)
    return sweep, training


def _override_space(raw: dict, overrides: list[str]) -> dict:
    """`space.<training key>=<domain>` from the command line: the space's keys are dotted training keys
    (`loss.n_perturb`), so the override sets that key of `space` (added, or replacing the file's), instead
    of nesting sections as other overrides do. `space.loss.n_perturb={grid: [3, 5]}`."""
    from ..config import parse_override

    raw = dict(raw)
    for ov in overrides:
        path, value = parse_override(ov)
        if len(path) < 2:
            raise ConfigError(f"override {ov!r}: expected space.<training key>=<domain>, e.g. "
                              "space.loss.n_perturb='{grid: [3, 5]}'")
        space = raw.get("space")
        if space is None:
            space = {}
        if not isinstance(space, dict):
            raise ConfigError(f"override {ov!r}: the sweep file's space is not a mapping")
        raw["space"] = {**space, ".".join(path[1:]): value}
    return raw


def load_sweep_config(path: str | Path | None, overrides: list[str] | None = None) -> SweepConfig:
    """The sweep file + CLI overrides -> a SweepConfig (keys and values of the space checked
    against the training config, metric and searcher checked)."""
    sweep_ov, train_ov = _split_cli(list(overrides or []))
    space_ov = [ov for ov in sweep_ov if ov.split("=", 1)[0].strip().startswith("space.")]
    raw = merge_overrides(read_yaml(path), [ov for ov in sweep_ov if ov not in space_ov])
    raw = _override_space(raw, space_ov)
    unknown = set(raw) - {"base", "overrides", "space", "search", "output"}
    if unknown:
        raise ConfigError(f"unknown sweep key(s): {', '.join(sorted(map(str, unknown)))}; "
                          "known: base, overrides, space, search, output")
    base = raw.get("base")
    if isinstance(base, str):
        base_path = Path(base)
        if not base_path.exists() and path is not None and (Path(path).parent / base).exists():
            base_path = Path(path).parent / base
        base_data, source = read_yaml(base_path), str(base_path)
    elif isinstance(base, dict):
        base_data, source = copy.deepcopy(base), "inline"
    else:
        raise ConfigError("base: expected a training config file path or the training config inline")
    given = raw.get("overrides") or []
    if not isinstance(given, list) or not all(isinstance(o, str) for o in given):
        raise ConfigError(f"overrides: expected a list of key=value strings, got {given!r}")
    search = from_dict(SearchConfig, raw.get("search") or {}, prefix="search.")
    output = raw.get("output")
    if not output or not isinstance(output, str):
        raise ConfigError("output: the sweep folder is required (e.g. output: runs/tune/dar)")
    cfg = SweepConfig(base=base_data, base_source=source, overrides=tuple(given) + tuple(train_ov),
                      space=parse_space(raw.get("space")), search=search, output=output,
                      config_path=str(path) if path else None, raw=raw)
    validate_sweep(cfg)
    return cfg


# --------------------------------------------------------------------------- validation

def set_key(data: dict, key: str, value: Any) -> dict:
    """A copy of `data` with the dotted `key` set to `value` (sections created as needed)."""
    out = copy.deepcopy(data)
    node = out
    parts = key.split(".")
    for p in parts[:-1]:
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"space.{key}: {p} is not a section of the training config")
        node = nxt
    node[parts[-1]] = value
    return out


def trial_data(cfg: SweepConfig, params: dict) -> dict:
    """The training config (plain data) of one trial: base + overrides + the trial's values."""
    data = cfg.base_data()
    for key, value in params.items():
        data = set_key(data, key, value)
    return data


def load_job(data: dict, what: str):
    """A trial's training config, checked as the trial would check it before it writes anything."""
    from ..train.config import job_from_dict
    from ..train.dev_split import check_dev_split

    try:
        job = job_from_dict(data)
        check_dev_split(job)
        return job
    except ConfigError as e:
        raise ConfigError(f"{what}: {e}") from None


def validate_sweep(cfg: SweepConfig):
    """Every candidate value of every key loads as a training config; the searcher can take the
    space; the metric is one the trainer reports. Returns the base job."""
    base = load_job(cfg.base_data(), f"base ({cfg.base_source})")
    for p in cfg.space:
        for v in p.candidates():
            load_job(set_key(cfg.base_data(), p.key, v), f"space.{p.key}={v!r}")
    # all first values together (catches keys that only clash in combination, e.g. method blocks)
    load_job(trial_data(cfg, {p.key: p.candidates()[0] for p in cfg.space}), "space (first values together)")
    s = cfg.search
    if s.searcher == "grid":
        cont = [p.key for p in cfg.space if p.kind not in ("choice", "grid")]
        if cont:
            raise ConfigError(f"search.searcher=grid needs finite values (grid or choice); "
                              f"{', '.join(cont)} {'is' if len(cont) == 1 else 'are'} a distribution: "
                              "use searcher random or optuna")
    if s.searcher == "optuna":
        grids = [p.key for p in cfg.space if p.kind == "grid"]
        if grids:
            raise ConfigError(f"search.searcher=optuna does not take grid ({', '.join(grids)}): use choice")
    metric_mode(cfg, base)
    from .drivers import check_space

    check_space(cfg, base)
    check_replicates(cfg)
    check_not_test_split(cfg, base)
    if s.scheduler == "asha":
        max_t = s.max_t or base.train.max_steps
        if not max_t:
            raise ConfigError("search.scheduler=asha needs search.max_t (steps) or train.max_steps in the base config")
        if s.grace_period >= max_t:
            raise ConfigError(f"search.grace_period={s.grace_period} must be below max_t={max_t} steps")
        metric = metric_mode(cfg, base)[0]
        if metric.startswith("val_") and not base.train.eval_every:
            raise ConfigError(f"search.metric={metric} with ASHA needs train.eval_every (steps) in the base "
                              "config: validation otherwise runs only at the end, after every ASHA rung")
        if metric.startswith("val_") and base.train.eval_every > s.grace_period:
            raise ConfigError(f"train.eval_every={base.train.eval_every} is above search.grace_period="
                              f"{s.grace_period}: ASHA's first rung would see no {metric}")
    return base


_TEST_NAME = re.compile(r"(^|[^a-z])test([^a-z]|$)", re.IGNORECASE)


def is_test_split(spec: str | None) -> bool:
    """A qrels/pairs file whose name names the test split (test.trec, qrels.test.tsv, sts-test.csv),
    or an ir_datasets identifier whose split is test (beir/scifact/test)."""
    if not spec:
        return False
    return bool(_TEST_NAME.search(str(spec).rstrip("/").rsplit("/", 1)[-1]))


def selection_split(base) -> tuple[str, str | None]:
    """(the config key, the file) a sweep over `base` selects on, as the trial's validator reads it."""
    v = base.validation
    if base.loss.name == "rcl":
        s = base.section("rcl")
        if getattr(s, "sts_dev", None):
            return "rcl.sts_dev", s.sts_dev
        if s.dev_split and not s.pairs:
            return "rcl.dev_split", None
    if v.dev_split:
        return "validation.dev_split", None
    if v.corpus:  # the Validator's default qrels: <corpus>/qrels/test.trec
        return "validation.qrels", v.qrels or str(Path(v.corpus) / "qrels" / "test.trec")
    return "validation", None


def _selection_source(base, key: str, spec: str | None) -> str | None:
    """The qrels file whose queries a sweep selects on: the validation qrels, or, for a dev split carved
    from the training queries, the training qrels it is carved from."""
    if spec:
        return spec
    if key in ("validation.dev_split", "rcl.dev_split") and base.data.source == "qrels" and base.data.corpus:
        return base.data.qrels or str(Path(base.data.corpus) / "qrels" / "train.trec")
    return None


def _test_splits(base) -> list[Path]:
    """The qrels files that the corpora of `base` (training and validation) name as a test split."""
    from ..data.manifest import MANIFEST_NAME

    out = []
    for corpus in dict.fromkeys(c for c in (base.data.corpus, base.validation.corpus) if c):
        try:
            manifest = json.loads((Path(corpus) / MANIFEST_NAME).read_text())
        except (OSError, ValueError):
            continue  # no corpus there (yet): nothing to compare with
        for split in sorted(manifest.get("qrels") or {}):
            if is_test_split(split) and (Path(corpus) / "qrels" / f"{split}.trec").is_file():
                out.append(Path(corpus) / "qrels" / f"{split}.trec")
    return out


def _judgements(path) -> set[tuple[str, str]]:
    from ..data.readers import load_qrels

    return {(q, d) for q, docs in load_qrels(path).items() for d, rel in docs.items() if rel > 0}


def selects_on_test(base) -> str | None:
    """Why a sweep over `base` would select on a test split, or None. By name (validation qrels named
    `test`, an ir_datasets test split) and by content: the qrels it selects on hold judgements of a
    split that a corpus of the run names as test, under whatever file name."""
    key, spec = selection_split(base)
    if is_test_split(spec):
        return f"{key}={spec} names a test split"
    source = _selection_source(base, key, spec)
    if not source or is_identifier_spec(source):
        return None
    try:
        chosen = _judgements(source)
    except Exception:  # unreadable here: the run itself reports it
        return None
    what = f"{key}={spec}" if spec else f"{key} (carved from {source})"
    for test in _test_splits(base):
        if Path(source).resolve() == test.resolve():
            return f"{what} is {test}, a test split"
        held = _judgements(test)
        shared = chosen & held
        if shared and shared == held == chosen:
            return f"{what} holds the same judgements as {test}, the corpus's test split, under another name"
        if shared:
            queries = len({q for q, _ in shared})
            return (f"{what} holds {len(shared):,} judgements of {queries:,} queries of {test}, the corpus's "
                    "test split")
    return None


def is_identifier_spec(spec: str) -> bool:
    from ..data.irds import is_identifier

    return bool(is_identifier(spec)) and not Path(spec).exists()


def check_not_test_split(cfg: SweepConfig, base) -> None:
    """Refuse a sweep that would select on a test split (by the file's name or its content), naming the
    key to set."""
    if cfg.search.allow_test_selection:
        return
    why = selects_on_test(base)
    if why is None:
        return
    key, _ = selection_split(base)
    fix = ("rcl.dev_split (a held-out share of the training queries) or an STS dev file" if key == "rcl.sts_dev"
           else "validation.dev_split: 0.1 (a seeded share of the training queries, held out) or a dev qrels file "
                "with no test query")
    raise ConfigError(f"the sweep would select on a test split: {why}; set {fix} in the base config. "
                      "search.allow_test_selection: true is the only way past (results.md then says so)")


def check_replicates(cfg: SweepConfig) -> None:
    """`search.replicate_key`: a listed space key, every configuration under every value, no ASHA."""
    s = cfg.search
    key = s.replicate_key
    if key is None:
        return
    param = next((p for p in cfg.space if p.key == key), None)
    if param is None:
        raise ConfigError(f"search.replicate_key={key!r} is not a key of space ({', '.join(p.key for p in cfg.space)}); "
                          f"list the replicates there, e.g. space: {{{key}: {{grid: [0, 43, 314]}}}}")
    if param.kind not in ("grid", "choice"):
        raise ConfigError(f"search.replicate_key={key}: space.{key} must list its replicate values (grid), "
                          f"not draw them ({param.kind})")
    if s.searcher != "grid":
        raise ConfigError(f"search.replicate_key={key} needs search.searcher=grid (every configuration under every "
                          f"value of {key}), got {s.searcher}")
    if s.num_samples != 1:
        raise ConfigError(f"search.replicate_key={key} with search.num_samples={s.num_samples}: the grid would run "
                          f"each {key} value {s.num_samples} times; list the replicates in space.{key} instead")
    if s.scheduler != "none":
        raise ConfigError(f"search.replicate_key={key} with search.scheduler={s.scheduler}: ASHA compares every trial "
                          f"with all others, across {key} values, and would stop some replicates of a configuration "
                          "but not others; set search.scheduler: none (every trial runs to its last step)")


def check_inputs(cfg: SweepConfig) -> None:
    """The training and validation inputs a trial reads exist (an ir_datasets identifier or an
    object-store URI is checked where it is read): a missing file fails the sweep before any trial,
    not every trial after Ray has started it. Relative paths are relative to the working directory,
    as for `pipeline train`."""
    from ..data import irds
    from ..storage import is_uri

    source = cfg.base_source
    job = load_job(trial_data(cfg, {p.key: p.candidates()[0] for p in cfg.space}), f"base ({source})")
    d, v = job.data, job.validation
    wanted: list[tuple[str, str | None]] = [("data.path", d.path), ("data.negatives_run", d.negatives_run)]
    if d.source == "qrels" and d.corpus:
        wanted.append(("data.corpus", d.corpus))
        if Path(d.corpus).expanduser().exists():  # (a missing corpus is reported, not its default files)
            wanted += [("data.queries", d.queries or str(Path(d.corpus) / "queries.tsv")),
                       ("data.qrels", d.qrels or str(Path(d.corpus) / "qrels" / "train.trec"))]
    else:
        wanted += [("data.queries", d.queries), ("data.qrels", d.qrels)]
    wanted += [("validation.corpus", v.corpus), ("validation.queries", v.queries), ("validation.qrels", v.qrels)]
    missing = []
    for key, value in wanted:
        if not value or is_uri(value) or Path(value).expanduser().exists() or irds.is_identifier(value):
            continue
        missing.append(f"{key}={value}")
    if missing:
        raise ConfigError(f"base ({source}): input(s) not found (relative paths are relative to {Path.cwd()}): "
                          + ", ".join(missing) + "; every trial would fail on them")


def reported_metrics(job) -> list[str]:
    """The names the trainer reports that a sweep can rank trials by (per method: drivers.py)."""
    from .drivers import reported_metrics as by_method

    return by_method(job)[0]


def metric_mode(cfg: SweepConfig, job) -> tuple[str, str]:
    """(metric name as the trainer reports it, max|min); an unknown metric is a ConfigError."""
    from .drivers import reported_metrics as by_method

    metric = cfg.search.metric
    names, hint = by_method(job)
    if metric not in names and metric.startswith("val_") and "val_metric" in names:
        from ..measures import measure_name

        try:  # an alias: val_MRR@10 -> val_RR@10
            alias = f"val_{measure_name(metric[4:], job.eval.rel_level)}"
        except ConfigError:
            alias = None
        if alias in names:
            metric = alias
    if metric not in names:
        raise ConfigError(f"search.metric={cfg.search.metric!r} is not reported by the {job.loss.name} trainer; "
                          f"it reports {', '.join(names)}{hint}")
    mode = cfg.search.mode
    if mode == "auto":
        mode = "max" if metric.startswith("val_") else "min"
    return metric, mode


def to_tune(space: tuple[Param, ...]) -> dict:
    """Tune's param_space: {"loss.n_perturb": tune.grid_search([...]), ...}."""
    from ray import tune

    out = {}
    for p in space:
        if p.kind == "grid":
            out[p.key] = tune.grid_search(list(p.values))
        elif p.kind == "choice":
            out[p.key] = tune.choice(list(p.values))
        elif p.kind == "uniform":
            out[p.key] = tune.uniform(*p.values)
        elif p.kind == "loguniform":
            out[p.key] = tune.loguniform(*p.values)
        else:
            out[p.key] = tune.randint(*p.values)
    return out


def grid_space(space: tuple[Param, ...]) -> tuple[Param, ...]:
    """For searcher=grid: choice lists are searched exhaustively too."""
    return tuple(Param(p.key, "grid", p.values) if p.kind == "choice" else p for p in space)
