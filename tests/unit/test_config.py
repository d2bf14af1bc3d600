"""pipeline.config: YAML + overrides, strict keys and types, round-trip."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config import (EncodeConfig, EvalConfig, PipelineConfig, dump_config, load_config,
                             parse_override, save_config)
from pipeline.errors import ConfigError


def _yaml(tmp_path, text: str):
    p = tmp_path / "cfg.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_defaults():
    cfg = load_config()
    assert cfg == PipelineConfig()
    assert cfg.encode.batch_size == 64
    assert cfg.eval.recall_ks == (10, 20, 100)
    assert cfg.extra == {}


def test_yaml_and_overrides(tmp_path):
    p = _yaml(tmp_path, """
encode:
  batch_size: 32
  num_actors: 2
  cpus_per_actor: 1
index:
  factory: IVF16,Flat
  metric: l2
model:
  pooling: mean
""")
    cfg = load_config(p, ["encode.batch_size=128", "ray.num_cpus=2", "eval.rel_level=2",
                          "retrieve.run_tag=42", "model.query_prefix='query: '"])
    assert cfg.encode.batch_size == 128          # override wins over the file
    assert cfg.encode.num_actors == 2            # file value kept
    assert cfg.encode.cpus_per_actor == 1.0 and isinstance(cfg.encode.cpus_per_actor, float)
    assert cfg.index.factory == "IVF16,Flat" and cfg.index.metric == "l2"
    assert cfg.model.pooling == "mean"
    assert cfg.ray.num_cpus == 2
    assert cfg.eval.rel_level == 2
    assert cfg.retrieve.run_tag == "42"          # yaml int -> str field
    assert cfg.model.query_prefix == "query: "
    assert cfg.encode.fp16 is False              # untouched default
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.encode.batch_size = 1  # type: ignore[misc]


def test_override_values_are_yaml():
    # Values are parsed as YAML: an E5-style prefix "query: " must be quoted, else it is a mapping.
    assert load_config(None, ["model.doc_prefix='passage: '"]).model.doc_prefix == "passage: "
    with pytest.raises(ConfigError, match=r"model\.doc_prefix"):
        load_config(None, ["model.doc_prefix=passage: "])


def test_optional_fields_accept_null(tmp_path):
    cfg = load_config(None, ["model.pooling=null", "ray.num_gpus=1", "ray.num_gpus=null"])
    assert cfg.model.pooling is None and cfg.ray.num_gpus is None


@pytest.mark.parametrize("override, key", [
    ("encode.batch_size=abc", "encode.batch_size"),
    ("encode.batch_size=1.5", "encode.batch_size"),
    ("encode.batch_size=true", "encode.batch_size"),
    ("encode.fp16=maybe", "encode.fp16"),
    ("encode.cpus_per_actor=lots", "encode.cpus_per_actor"),
    ("ray.num_cpus=many", "ray.num_cpus"),
    ("eval.recall_ks=[10, x]", "eval.recall_ks"),
    ("eval.recall_ks={a: 1}", "eval.recall_ks"),
    ("encode=5", "encode"),
])
def test_type_errors_name_the_key(override, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert key in str(info.value)


def test_type_error_in_yaml_names_the_key(tmp_path):
    p = _yaml(tmp_path, "index:\n  train_sample: lots\n")
    with pytest.raises(ConfigError, match=r"index\.train_sample"):
        load_config(p)


@pytest.mark.parametrize("override, key", [
    ("encode.batchsize=128", "encode.batchsize"),
    ("model.pool=cls", "model.pool"),
    ("eval.recall_ks.x=1", "eval.recall_ks"),
])
def test_unknown_key_is_named(override, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert key in str(info.value)


def test_unknown_key_in_yaml(tmp_path):
    p = _yaml(tmp_path, "retrieve:\n  topk: 10\n")
    with pytest.raises(ConfigError, match=r"retrieve\.topk"):
        load_config(p)


@pytest.mark.parametrize("override, key", [
    ("index.metric=cosine", "index.metric"),
    ("index.use_gpu=maybe", "index.use_gpu"),
    ("model.pooling=max", "model.pooling"),     # Literal inside Optional
    ("index.use_gpu=true", "index.use_gpu"),    # yaml bool is not 'yes'
])
def test_literal_violations(override, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert key in str(info.value)


def test_tuples_from_list_and_scalar(tmp_path):
    cfg = load_config(None, ["eval.recall_ks=[5, 50]", "eval.qa_ks=20"])
    assert cfg.eval.recall_ks == (5, 50)
    assert cfg.eval.qa_ks == (20,)
    cfg = load_config(_yaml(tmp_path, "eval:\n  recall_ks: [1, 2, 3]\n  qa_ks: 7\n"))
    assert cfg.eval.recall_ks == (1, 2, 3) and cfg.eval.qa_ks == (7,)
    assert isinstance(cfg.eval.recall_ks, tuple)


def test_unknown_sections_go_to_extra(tmp_path):
    p = _yaml(tmp_path, "train:\n  lr: 2.0e-5\n  epochs: 3\nloss:\n  name: infonce\n")
    cfg = load_config(p, ["train.epochs=5", "tune.trials=4"])
    assert cfg.extra == {"train": {"lr": 2.0e-5, "epochs": 5}, "loss": {"name": "infonce"}, "tune": {"trials": 4}}
    assert cfg.encode == EncodeConfig()


def test_round_trip(tmp_path):
    cfg = load_config(None, ["encode.batch_size=128", "encode.fp16=true", "eval.recall_ks=[1, 10]",
                             "model.pooling=cls", "ray.address=auto", "index.factory=HNSW32",
                             "model.query_prefix='query: '", "train.lr=0.001", "train.layers=[1, 2]"])
    path = tmp_path / "sub" / "resolved.yaml"
    save_config(cfg, path)
    assert path.read_text(encoding="utf-8") == dump_config(cfg)
    again = load_config(path)
    assert again == cfg
    assert again.eval.recall_ks == (1, 10)
    assert dump_config(again) == dump_config(cfg)
    assert [p.name for p in path.parent.iterdir()] == ["resolved.yaml"]  # no temp files left


def test_bad_yaml_and_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    p = _yaml(tmp_path, "encode:\n  batch_size: [1,\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(p)
    p = _yaml(tmp_path, "- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(p)


def test_parse_override():
    assert parse_override("a.b=1") == (["a", "b"], 1)
    assert parse_override("a=") == (["a"], "")
    assert parse_override("a=x=y") == (["a"], "x=y")
    with pytest.raises(ConfigError):
        parse_override("no-equals")
    with pytest.raises(ConfigError):
        parse_override("=1")


def test_eval_config_default_types():
    cfg = load_config(None, ["eval.per_query=true"], cls=PipelineConfig)
    assert cfg.eval == EvalConfig(per_query=True)
