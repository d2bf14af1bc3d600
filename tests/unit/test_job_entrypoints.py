"""jobs/*.py are thin: without --smoke-test they hand their arguments to `pipeline <verb>` unchanged;
with it they run the verb's smoke test with the output folder and overrides they were given."""

from __future__ import annotations

import importlib
import runpy
import sys
from pathlib import Path

import pytest

JOBS = Path(__file__).resolve().parents[2] / "jobs"
VERBS = {"encode_corpus": "encode", "encode": "encode", "build_index": "index", "retrieve": "retrieve",
         "train": "train", "tune": "tune", "evaluate": "evaluate"}


@pytest.fixture
def smoke(monkeypatch):
    monkeypatch.syspath_prepend(str(JOBS))
    mod = importlib.import_module("smoke")
    calls = []
    monkeypatch.setattr(mod, "cli_main", lambda argv: calls.append(list(argv)) or 0)
    return mod, calls


@pytest.mark.parametrize("script", sorted(VERBS))
def test_arguments_go_to_the_cli_unchanged(smoke, monkeypatch, script):
    mod, calls = smoke
    argv = ["--config", "c.yaml", "--out", "/x/out", "encode.batch_size=8"]
    monkeypatch.setattr(sys, "argv", [str(JOBS / f"{script}.py"), *argv])
    with pytest.raises(SystemExit) as ex:
        runpy.run_path(str(JOBS / f"{script}.py"), run_name="__main__")
    assert ex.value.code == 0
    assert calls == [[VERBS[script], *argv]]


@pytest.mark.parametrize("name,verb", [("smoke_encode", "encode"), ("smoke_index", "index"),
                                       ("smoke_retrieve", "retrieve"), ("smoke_evaluate", "evaluate")])
def test_smoke_mode_parses_out_and_overrides(smoke, tmp_path, monkeypatch, name, verb):
    mod, calls = smoke
    seen = {}

    def fake(out, config, overrides):
        seen.update(out=out, config=config, overrides=overrides)
        return 0

    assert mod.run(verb, ["--smoke-test", "--out", str(tmp_path / "o"), "a.b=1", "--config", "k.yaml"], smoke=fake) == 0
    assert seen == {"out": tmp_path / "o", "config": "k.yaml", "overrides": ["a.b=1"]}
    assert calls == []  # the smoke function decides what to run


def test_ance_entrypoint_refuses_other_losses(smoke, capsys):
    mod, calls = smoke
    ance = runpy.run_path(str(JOBS / "ance.py"))
    assert ance["main"](["--config", str(JOBS / "configs" / "dar.yaml")]) == 2
    assert "loss.name ance or ance_dar" in capsys.readouterr().err and calls == []
    assert ance["main"](["--config", str(JOBS / "configs" / "ance.yaml"), "train.max_steps=3"]) == 0
    assert calls == [["train", "--config", str(JOBS / "configs" / "ance.yaml"), "train.max_steps=3"]]


def test_the_demo_finds_the_configs_of_the_checkout():
    """recipes/demo.py trains with jobs/configs/{dpr,dar}.yaml of the checkout it runs from."""
    from pipeline.recipes.demo import METHODS, REPO

    for method in METHODS:
        assert (REPO / "jobs" / "configs" / f"{method}.yaml").is_file()
