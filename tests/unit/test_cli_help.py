"""Per-verb --help lists the verb's own config keys (generated from the dataclasses), and
`pipeline config show` prints the resolved config."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from pipeline.cli import main
from pipeline.config import EncodeConfig, EvalConfig, IndexConfig, PipelineConfig, RetrieveConfig, to_dict


def _help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _keys(prefix, cls):
    return [f"{prefix}.{f.name} = " for f in dataclasses.fields(cls)]


def test_each_verb_lists_its_own_keys_with_defaults(capsys):
    enc = _help(capsys, "encode")
    assert all(k in enc for k in _keys("encode", EncodeConfig))
    assert "encode.batch_size = 64" in enc and "model.name_or_path = minilm" in enc and "ray.address = null" in enc
    assert "encode.precision = auto" in enc and "auto|fp32|bf16|fp16" in enc  # Literal choices shown
    assert "Rows per shard" in enc  # the comment written beside the field
    assert "eval." not in enc and "train.epochs" not in enc

    idx = _help(capsys, "index")
    assert all(k in idx for k in _keys("index", IndexConfig)) and "index.factory = Flat" in idx
    assert "encode." not in idx and "model." not in idx

    ret = _help(capsys, "retrieve")
    assert all(k in ret for k in _keys("retrieve", RetrieveConfig)) and "retrieve.top_k = 100" in ret
    assert "index.nprobe = 0" in ret and "encode." not in ret

    for verb in ("evaluate", "compare"):
        ev = _help(capsys, verb)
        assert all(k in ev for k in _keys("eval", EvalConfig)) and "eval.recall_ks = [10, 20, 100]" in ev
        assert "encode." not in ev and "model." not in ev

    tr = _help(capsys, "train")
    for key in ("train.epochs = 1", "train.batch_size = 32", "optim.lr = 2e-05", "data.source = qrels",
                "loss.name = dpr", "validation.metric = MRR@10", "loss.n_perturb = 7"):
        assert key in tr, key
    assert "encode." not in tr
    assert len({enc, idx, ret, ev, tr}) == 5


def test_config_show_defaults_and_overrides(capsys):
    assert main(["config", "show"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == to_dict(PipelineConfig())
    assert main(["config", "show", "encode.batch_size=7", "eval.measures=AP nDCG@10"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["encode"]["batch_size"] == 7 and shown["eval"]["measures"] == ["AP nDCG@10"]
    assert main(["config", "show", "encode.batch_siz=7"]) == 2
    assert "did you mean encode.batch_size" in capsys.readouterr().err


def test_config_show_detects_a_training_job(capsys, tmp_path):
    from pipeline.train.config import job_to_dict, load_train_config

    cfg = tmp_path / "job.yaml"
    cfg.write_text("loss:\n  name: dar\n  n_perturb: 3\ntrain:\n  epochs: 2\n")
    assert main(["config", "show", "--config", str(cfg), "optim.lr=1e-4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# train config")
    shown = yaml.safe_load(out)
    expected = job_to_dict(load_train_config(str(cfg), ["optim.lr=1e-4"]))
    assert shown == expected and shown["loss"]["n_perturb"] == 3 and shown["loss"]["mix_weight"] == 0.1
    assert shown["optim"]["lr"] == 1e-4 and shown["train"]["epochs"] == 2


def _verbs_and_config():
    """{verb (with its action): whether it takes --config}, from the real parser."""
    from pipeline.cli import build_parser

    out = {}

    def walk(parser, prefix):
        for action in parser._actions:
            if isinstance(getattr(action, "choices", None), dict):
                for name, sub in action.choices.items():
                    if any(isinstance(getattr(a, "choices", None), dict) for a in sub._actions):
                        walk(sub, prefix + name + " ")
                    else:
                        out[prefix + name] = any("--config" in a.option_strings for a in sub._actions)

    walk(build_parser(), "")
    return out


def _listed(text: str) -> set[str]:
    """`encode`, `authorship evaluate|table` -> {"encode", "authorship evaluate", "authorship table"}."""
    import re

    out = set()
    for item in re.findall(r"`([^`]+)`", text):
        head, _, tail = item.rpartition(" ")
        out |= {f"{head} {t}".strip() for t in tail.split("|")}
    return out


@pytest.mark.parametrize("page", ["README.md", "docs/spine.md"])
def test_the_manual_says_exactly_which_verbs_take_config(page):
    import re
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[2] / page).read_text(encoding="utf-8").split())
    takes = re.search(r"read config keys \(([^)]*)\) take `--config[^`]*`(.*?)read no config section", text)
    assert takes, page
    verbs = _verbs_and_config()
    with_config = {v for v, has in verbs.items() if has}
    without = {v for v, has in verbs.items() if not has}
    assert _listed(takes.group(1)) == with_config
    named = {w for w in _listed(takes.group(2)) if not any(c in w for c in "-=.")}  # the verbs, not the flags
    flags_only = {v for v in verbs if any(v == w or v.startswith(w + " ") for w in named)}
    assert flags_only == without


def test_help_names_compute_and_storage_precision(capsys):
    enc = " ".join(_help(capsys, "encode").split())
    assert "--fp16 compute precision" in enc and "storage precision is encode.fp16=true" in enc
    assert "encode.fp16 = false Storage precision" in enc
    tr = " ".join(_help(capsys, "train").split())
    assert "--fp16 compute precision" in tr and "checkpoints and the saved model stay float32" in tr
