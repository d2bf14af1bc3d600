"""Every numeric config key declares its range, and a value outside it (or nan/inf) is refused with
the key before anything runs: read from the dataclasses, so a new key cannot be forgotten."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import pytest

from pipeline.config import PipelineConfig, Section, _numeric_bounds, from_dict, load_config
from pipeline.data.authorship import SplitConfig
from pipeline.errors import ConfigError
from pipeline.train.config import TrainJobConfig, load_train_config
from pipeline.train.methods import get_method, method_names
from pipeline.tune.space import SearchConfig


def _sections() -> dict[type, str]:
    """Every config section class a user can set, with the key prefix it is set under."""
    found: dict[type, str] = {}

    def walk(cls, prefix: str) -> None:
        if cls in found:
            return
        found[cls] = prefix
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            for t in (tp, *typing.get_args(tp)):
                if dataclasses.is_dataclass(t):
                    walk(t, f"{prefix}{f.name}.")

    walk(PipelineConfig, "")
    walk(TrainJobConfig, "")
    for name in method_names():
        method = get_method(name)
        walk(method.config_cls, "loss.")
        for sec, cls in method.sections.items():
            walk(cls, f"{sec}.")
    walk(SplitConfig, "authorship.")
    walk(SearchConfig, "search.")
    return found


def _numeric_fields():
    for cls, prefix in _sections().items():
        hints = typing.get_type_hints(cls, include_extras=True)
        for f in dataclasses.fields(cls):
            base, bounds = _numeric_bounds(hints[f.name])
            if base is not None:
                yield cls, prefix, f, base, bounds


def test_every_numeric_key_declares_its_range():
    fields = list(_numeric_fields())
    assert len(fields) > 100  # the walk reaches every section (pipeline, training, methods, sweeps)
    undeclared = [f"{p}{f.name} ({cls.__name__})" for cls, p, f, _, bounds in fields if not bounds]
    assert not undeclared, "numeric config keys without a declared range: " + ", ".join(undeclared)
    not_checked = sorted({cls.__name__ for cls, *_ in fields if not issubclass(cls, Section)})
    assert not not_checked, f"config sections that do not check their ranges: {not_checked}"


def _outside(base, bounds):
    """A value just outside the declared range (below the lower bound, else above the upper)."""
    for b in bounds:
        if hasattr(b, "ge"):
            return b.ge - 1
        if hasattr(b, "gt"):
            return b.gt if base is int else b.gt - 0.5
    for b in bounds:
        if hasattr(b, "le"):
            return b.le + 1
        if hasattr(b, "lt"):
            return b.lt
    raise AssertionError("no bound")


@pytest.mark.parametrize("case", list(_numeric_fields()), ids=lambda c: f"{c[1]}{c[2].name}")
def test_out_of_range_and_non_finite_values_are_refused_with_the_key(case):
    cls, prefix, f, base, bounds = case
    key = f"{prefix}{f.name}"  # the key as the user wrote it
    seq = typing.get_origin(typing.get_type_hints(cls)[f.name]) is tuple or isinstance(f.default, tuple)
    bad = [_outside(base, bounds)] + ([float("nan"), float("inf"), float("-inf")] if base is float else [])
    for value in bad:
        data = {f.name: [value] if seq else value}
        with pytest.raises(ConfigError) as e:
            from_dict(cls, data, prefix=prefix)
        assert key in str(e.value), (key, value, str(e.value))
    # the default is inside the range (constructing the section checks it)
    cls()


@pytest.mark.parametrize("override, message", [
    ("optim.lr=inf", "optim.lr: must be a finite number"),
    ("optim.lr=.nan", "optim.lr: must be a finite number"),
    ("optim.lr=nan", "optim.lr: must be a finite number"),
    ("optim.lr=0", "optim.lr: must be > 0"),
    ("optim.lr=-1e-5", "optim.lr: must be > 0"),
    ("optim.warmup_ratio=1.5", "optim.warmup_ratio: must be in [0, 1]"),
    ("optim.warmup_ratio=-0.1", "optim.warmup_ratio: must be in [0, 1]"),
    ("loss.temperature=0", "loss.temperature: must be > 0"),
    ("loss.dropout_p=1", "loss.dropout_p: must be in [0, 1)"),
    ("train.batch_size=0", "train.batch_size: must be >= 1"),
    ("validation.dev_split=1", "validation.dev_split: must be in [0, 1)"),
])
def test_training_overrides_outside_their_meaning(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_train_config("jobs/configs/dar.yaml", [override])


def test_ance_refresh_every_zero_is_refused():
    with pytest.raises(ConfigError, match=r"ance.refresh_every: must be >= 1, got 0"):
        load_train_config("jobs/configs/ance.yaml", ["ance.refresh_every=0"])


def test_pipeline_config_ranges():
    with pytest.raises(ConfigError, match=r"index.max_ram_fraction: must be > 0"):
        load_config(None, ["index.max_ram_fraction=0"])
    with pytest.raises(ConfigError, match=r"eval.recall_ks: must be >= 1"):
        load_config(None, ["eval.recall_ks=[10, 0]"])


def test_cli_train_with_nan_lr_is_one_line_and_leaves_nothing(tmp_path):
    """`optim.lr=nan` used to end in a Ray traceback with the run folder left behind."""
    store = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "train", "--config", "jobs/configs/dpr.yaml",
                        "optim.lr=nan", f"train.storage_path={store}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == ["error: optim.lr: must be a finite number, got nan"], r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert not store.exists()
