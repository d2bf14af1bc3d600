"""BiEncoder.load(..., defer=True): the towers' weights load at their first use, and the model is then the
model a full load gives (vectors, state dict, mode, conversions asked for before); a warm OpenVINO encode
never loads them, and a broken weights file is still one ConfigError before anything is written."""

from __future__ import annotations

import copy
import json
import pickle
from dataclasses import asdict

import numpy as np
import pytest
import torch

from pipeline.config import ModelConfig, load_config
from pipeline.errors import ConfigError
from pipeline.models import BiEncoder
from pipeline.models.encoder import DeferredTower

TEXTS = ["a short text", "a somewhat longer text about python and its lists", "x"]


def _cfg(tiny_model_dir) -> ModelConfig:
    return ModelConfig(name_or_path=str(tiny_model_dir), pooling="mean", normalize=True)


def test_a_deferred_model_is_the_full_one_once_used(tiny_model_dir):
    full = BiEncoder.load(_cfg(tiny_model_dir))
    lazy = BiEncoder.load(_cfg(tiny_model_dir), defer=True)
    assert lazy.deferred and isinstance(lazy._modules["doc_encoder"], DeferredTower)
    # what needs no weights: the sizes, the tokenizer, the heads
    assert lazy.dim == full.dim and lazy.token_spec("doc")[1:] == full.token_spec("doc")[1:]
    assert lazy.cfg == full.cfg and lazy.deferred
    np.testing.assert_array_equal(lazy.embed(TEXTS, "doc"), full.embed(TEXTS, "doc"))
    assert not lazy.deferred and lazy.query_encoder is lazy.doc_encoder  # shared: one tower, loaded once
    a, b = full.state_dict(), lazy.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not any(p.requires_grad for p in lazy.doc_encoder.pooler.parameters())  # frozen, as at a full load


@pytest.mark.parametrize("first", ["parameters", "state_dict", "named_buffers", "modules", "doc_encoder",
                                   "deepcopy", "pickle"])
def test_every_way_in_loads_the_weights_first(tiny_model_dir, first):
    full = BiEncoder.load(_cfg(tiny_model_dir))
    lazy = BiEncoder.load(_cfg(tiny_model_dir), defer=True)
    got = {"parameters": lambda m: list(m.parameters()), "state_dict": lambda m: m.state_dict(),
           "named_buffers": lambda m: list(m.named_buffers()), "modules": lambda m: list(m.modules()),
           "doc_encoder": lambda m: m.doc_encoder, "deepcopy": copy.deepcopy,
           "pickle": lambda m: pickle.loads(pickle.dumps(m))}[first](lazy)
    model = got if isinstance(got, BiEncoder) else lazy
    assert not model.deferred
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in full.parameters())


def test_conversions_and_mode_set_before_the_load_are_applied_to_the_loaded_tower(tiny_model_dir):
    lazy = BiEncoder.load(_cfg(tiny_model_dir), defer=True)
    lazy.to(torch.float64).eval()
    assert lazy.deferred  # neither loads the weights
    assert all(p.dtype == torch.float64 for p in lazy.parameters())
    assert not lazy.doc_encoder.training
    lazy2 = BiEncoder.load(_cfg(tiny_model_dir), defer=True).train()
    assert lazy2.doc_encoder.training


def test_broken_weights_are_one_config_error_at_their_first_use(tiny_model_dir, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    for w in broken.rglob("*.safetensors"):
        w.write_bytes(w.read_bytes()[:100])  # truncated
    lazy = BiEncoder.load(ModelConfig(name_or_path=str(broken)), defer=True)  # config and tokenizer are fine
    with pytest.raises(ConfigError, match="cannot load the model"):
        lazy.embed(TEXTS, "doc")


def _counted_loads(monkeypatch, tmp_path) -> list:
    """The deferred towers loaded from here on (their paths), with an export cache of this test's own."""
    monkeypatch.setenv("PIPELINE_EXPORT_CACHE", str(tmp_path / "cache"))
    loads = []
    real = DeferredTower.load
    monkeypatch.setattr(DeferredTower, "load", lambda self: loads.append(self.path) or real(self))
    return loads


def _openvino_encode(tiny_model_dir, precision: str):
    return load_config(None, [f"model.name_or_path={tiny_model_dir}", "encode.runner=local", "encode.backend=openvino",
                              f"encode.precision={precision}", "encode.show_progress=false"])


@pytest.mark.slow
def test_a_warm_openvino_encode_never_loads_the_weights(tiny_model_dir, faq, tmp_path, monkeypatch):
    """An encode again of a corpus with the same model: the export, the tower's check and the model check
    are remembered, so the torch tower is never loaded; its vectors are the first encode's."""
    pytest.importorskip("openvino")
    from pipeline.index.encode import encode_corpus
    from pipeline.index.shards import completed_shards

    loads = _counted_loads(monkeypatch, tmp_path)
    cfg = _openvino_encode(tiny_model_dir, "fp32")
    encode_corpus(faq, tmp_path / "a", cfg)
    assert len(loads) == 1  # the first encode: the model check and the conversion need the weights (once)
    encode_corpus(faq, tmp_path / "b", cfg)
    assert len(loads) == 1  # the second: none
    names = completed_shards(tmp_path / "a")
    assert names
    for name in names:
        np.testing.assert_array_equal(np.load(tmp_path / "a" / f"{name}.npy"), np.load(tmp_path / "b" / f"{name}.npy"))


@pytest.mark.slow
def test_a_first_encode_of_another_corpus_with_the_export_cached_loads_no_weights(tiny_model_dir, faq, tmp_path,
                                                                                   monkeypatch):
    """The export's fp32 check against torch is kept when the export is made: a later encode of a corpus never seen,
    in bf16 (simulated where this CPU has none), checks its tower on that corpus's first passages against the export
    compiled in fp32, and the model check runs on the export too, so the torch tower is never loaded; the check's
    figures name what they were checked against, and its vectors are within bf16's gate of torch's."""
    pytest.importorskip("openvino")
    from pipeline.data.ingest import ingest
    from pipeline.index.encode import encode_corpus
    from pipeline.index.shards import completed_shards
    from pipeline.models.backends import OpenVinoTower
    from pipeline.models.tower_check import cosines

    real_compile = OpenVinoTower._compile

    def as_bf16(self, converted, xml, precision):  # the bf16 path (a check on the corpus's passages) on any CPU
        real_compile(self, converted, xml, precision)
        if precision == "bf16":
            self.precision = "bf16"

    monkeypatch.setattr(OpenVinoTower, "_compile", as_bf16)
    loads = _counted_loads(monkeypatch, tmp_path)
    cfg = _openvino_encode(tiny_model_dir, "fp32")
    encode_corpus(faq, tmp_path / "a", cfg)
    assert len(loads) == 1  # the export is made from the weights (and checked against torch then)
    raw = tmp_path / "other.tsv"
    raw.write_text("".join(f"{i}\ta passage never encoded before, number {i}: {' '.join(['words'] * (i % 17))}\n"
                           for i in range(40)))
    ingest([raw], "msmarco", tmp_path / "other", progress=False)
    cfg = _openvino_encode(tiny_model_dir, "bf16")
    encode_corpus(tmp_path / "other", tmp_path / "b", cfg)
    assert len(loads) == 1  # neither the tower's check nor the model check loaded the torch tower
    (check,) = json.loads((tmp_path / "b" / "embeddings.json").read_text())["backend_checks"]
    assert check["reference"] == "openvino-fp32" and check["on"] == "the corpus's first passages", check
    assert check["passed"] and check["texts"] == 32
    texts = [line.split("\t", 1)[1].rstrip("\n") for line in raw.read_text().splitlines(keepends=True)]
    full = BiEncoder.load(load_config(None, [f"model.name_or_path={tiny_model_dir}"]).model)
    got = np.concatenate([np.load(tmp_path / "b" / f"{n}.npy") for n in completed_shards(tmp_path / "b")])
    assert cosines(got.astype(np.float32), full.embed(texts, "doc")).min() >= 0.999  # torch's fp32 vectors


def test_a_torch_encoder_loads_a_deferred_model_in_its_start_up(tiny_model_dir, tmp_path):
    """encode.backend=torch: the driver's deferred model is loaded when the encoder starts (counted in the
    start-up, as before), not inside the first shard's encoding (the warm OpenVINO case, which leaves it
    deferred, is test_a_warm_openvino_encode_never_loads_the_weights)."""
    from pipeline.index.encode_workers import ShardEncoder

    cfg = _cfg(tiny_model_dir)
    lazy = BiEncoder.load(cfg, defer=True)
    ShardEncoder(asdict(cfg), " ", 1, "fp32", 4, "float32", str(tmp_path / "out"), model=lazy, backend="torch")
    assert not lazy.deferred
