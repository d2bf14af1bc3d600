"""pipeline.config: YAML + overrides, strict keys and types, round-trip."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config import (EvalConfig, PipelineConfig, dump_config, load_config,
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
    assert not hasattr(cfg, "extra")  # no free-form section that could swallow a typo


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
    ("model.pooling=sum", "model.pooling"),     # Literal inside Optional
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


@pytest.mark.parametrize("yaml_text, overrides, named, suggestion", [
    ("encoder:\n  batch_size: 8\n", [], "encoder", "encode"),       # misspelt section in a file
    ("", ["evl.per_query=true"], "evl", "eval"),                      # misspelt section in an override
    ("train:\n  lr: 2.0e-5\n", [], "train", None),                   # a training section in a pipeline config
    ("", ["tune.trials=4"], "tune", None),
])
def test_unknown_sections_are_refused_with_the_known_ones(tmp_path, yaml_text, overrides, named, suggestion):
    p = _yaml(tmp_path, yaml_text or "{}\n")
    with pytest.raises(ConfigError) as info:
        load_config(p, overrides)
    msg = str(info.value)
    assert f"unknown config section(s): {named}" in msg
    assert "known sections: encode, eval, index, model, ray, retrieve" in msg
    if suggestion:
        assert f"did you mean {suggestion}?" in msg


def test_unknown_key_lists_the_known_keys():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["eval.perquery=true"])
    msg = str(info.value)
    assert "eval.perquery" in msg and "did you mean eval.per_query?" in msg
    assert "known keys of eval: " in msg and "recall_ks" in msg


@pytest.mark.parametrize("value, expected", [("yes", "yes"), ("no", "no"), ("true", "yes"), ("false", "no"),
                                             ("'yes'", "yes"), ("auto", "auto")])
def test_use_gpu_yes_no_as_documented(tmp_path, value, expected):
    assert load_config(None, [f"index.use_gpu={value}"]).index.use_gpu == expected
    assert load_config(_yaml(tmp_path, f"index:\n  use_gpu: {value}\n")).index.use_gpu == expected


def test_amp_no_is_the_documented_no_not_yamls_false(tmp_path):
    from pipeline.train.config import load_train_config

    assert load_train_config(None, ["train.amp=no"]).train.amp == "no"
    assert load_train_config(_yaml(tmp_path, "train:\n  amp: no\n")).train.amp == "no"
    with pytest.raises(ConfigError, match="train.amp: True is not one of"):  # no "yes" to map a true to
        load_train_config(None, ["train.amp=yes"])


@pytest.mark.parametrize("override", ["encode.batch_size=[1,", "model.doc_prefix={a", "encode.fp16='x"])
def test_malformed_yaml_in_an_override_names_it(override):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert f"override {override!r}" in str(info.value) and "YAML" in str(info.value)


@pytest.mark.parametrize("override, key", [
    ("encode.num_actors=0", "encode.num_actors"),
    ("encode.num_actors=-2", "encode.num_actors"),
    ("encode.batch_size=0", "encode.batch_size"),
    ("encode.cpus_per_actor=0", "encode.cpus_per_actor"),
    ("encode.gpus_per_actor=-1", "encode.gpus_per_actor"),
    ("retrieve.top_k=0", "retrieve.top_k"),
    ("retrieve.top_k=-5", "retrieve.top_k"),
    ("retrieve.batch_size=0", "retrieve.batch_size"),
    ("retrieve.run_tag='two words'", "retrieve.run_tag"),
    ("index.add_batch_size=0", "index.add_batch_size"),
    ("index.train_sample=0", "index.train_sample"),
    ("index.nprobe=-1", "index.nprobe"),
    ("eval.recall_ks=[10, 0]", "eval.recall_ks"),
    ("eval.qa_ks=-1", "eval.qa_ks"),
    ("model.doc_max_length=0", "model.doc_max_length"),
])
def test_numbers_out_of_range_are_refused(override, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert str(info.value).startswith(key + ":")


def test_training_config_loads_through_the_same_loader():
    from pipeline.train.config import TrainJobConfig

    job = load_config(None, ["train.epochs=2", "index.use_gpu=no"], cls=TrainJobConfig)
    assert job.train.epochs == 2 and job.index.use_gpu == "no"
    with pytest.raises(ConfigError, match="encode"):
        load_config(None, ["encode.batch_size=8"], cls=TrainJobConfig)  # not a section of a training job


def test_round_trip(tmp_path):
    cfg = load_config(None, ["encode.batch_size=128", "encode.fp16=true", "eval.recall_ks=[1, 10]",
                             "model.pooling=cls", "ray.address=auto", "index.factory=HNSW32",
                             "model.query_prefix='query: '", "index.use_gpu=no"])
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


@pytest.mark.parametrize("text, where", [
    ("encode:\n  batch_size: 8\neval:\n  per_query: true\nencode:\n  num_actors: 2\n", ":5: key 'encode' given twice"),
    ("encode:\n  batch_size: 8\n  batch_size: 9\n", ":3: key 'batch_size' given twice (first at line 2)"),
])
def test_a_key_given_twice_in_a_file_is_refused(tmp_path, text, where):
    p = _yaml(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert str(info.value).startswith(str(p) + where)


def test_config_path_that_is_a_folder_or_not_text(tmp_path):
    with pytest.raises(ConfigError, match="is a folder"):
        load_config(tmp_path)
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"encode:\n  batch_size: \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(p)


def test_a_yaml_file_read_again_is_its_current_text_and_each_caller_its_own_mapping(tmp_path):
    """read_yaml parses a text once (pipeline reproduce check loads the shipped configs ~2,000 times): a file
    rewritten in the same instant with a text of the same length is read as it is now, a caller's changes to its
    mapping never reach the next caller's, and a broken file is refused however often a good one was read."""
    from pipeline.config import read_yaml

    path = tmp_path / "c.yaml"
    path.write_text("encode:\n  batch_size: 16\n")
    first = read_yaml(path)
    first["encode"]["batch_size"] = 999
    assert read_yaml(path) == {"encode": {"batch_size": 16}}
    path.write_text("encode:\n  batch_size: 32\n")  # same size, same second
    assert read_yaml(path) == {"encode": {"batch_size": 32}}
    assert load_config(path).encode.batch_size == 32
    path.write_text("encode:\n  batch_size: 32\n  batch_size: 8\n")
    with pytest.raises(ConfigError, match="given twice"):
        read_yaml(path)
