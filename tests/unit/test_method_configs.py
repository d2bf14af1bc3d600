"""What each method reads from a config is known without importing torch (train/methods/configs.py), and
it cannot drift from the method classes: every built-in method agrees with its line, and `register`
refuses a class that does not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.train.methods import get_method, method_names, register
from pipeline.train.methods.configs import METHOD_CONFIGS
from pipeline.train.methods.registry import config_method_names, method_config


def test_every_builtin_method_agrees_with_its_config_line():
    assert set(method_names()) == set(METHOD_CONFIGS) == set(config_method_names())
    for name in method_names():
        m = get_method(name)
        assert method_config(name).config_cls is m.config_cls and method_config(name).sections == m.sections, name


def test_register_refuses_a_class_that_disagrees_with_its_line(monkeypatch):
    from pipeline.losses.configs import DARConfig
    from pipeline.train.methods import registry
    from pipeline.train.methods.pairs import DPR

    class Drifted(DPR):
        name = "dpr"
        config_cls = DARConfig

    get_method("dpr")
    monkeypatch.delitem(registry.METHODS, "dpr")  # as if the built-in had not registered yet
    with pytest.raises(ValueError, match="differ from its line in train/methods/configs.py"):
        register(Drifted)
    assert "dpr" not in registry.METHODS


def test_config_blocks_and_sections_import_without_torch():
    code = ("import sys\n"
            "from pipeline.train.config import load_train_config\n"
            "from pipeline.losses import DARConfig, LossConfig\n"
            "from pipeline.train.methods.configs import ANCESettings, AuthorshipSettings, RCLSettings\n"
            "job = load_train_config(None, ['loss.name=rcl', 'rcl.patience=5'])\n"
            "assert job.section('rcl').patience == 5\n"
            "print(sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_the_loss_modules_reexport_their_blocks():
    from pipeline.losses import ance, arr, base, configs, dar, rcl

    assert dar.DARConfig is configs.DARConfig and base.LossConfig is configs.LossConfig
    assert ance.ANCEConfig is configs.ANCEConfig and rcl.RCLConfig is configs.RCLConfig
    assert arr.ARRConfig is configs.ARRConfig and arr.MLLConfig is configs.MLLConfig
