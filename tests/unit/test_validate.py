"""index/validate: validation inside training encodes as `pipeline encode` would (lengths, precision,
backend) and says which encoder ran, at what rate and why."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.config import ModelConfig
from pipeline.index import validate as validate_mod
from pipeline.index.validate import Validator
from pipeline.models import BiEncoder
from pipeline.models.precision import resolve_precision

TEXTS = [f"passage {i} about " + "dense retrieval " * (i % 13) for i in range(24)]


def _model(path, **kw) -> BiEncoder:
    return BiEncoder.load(ModelConfig(name_or_path=str(path), pooling="mean", normalize=True, **kw)).eval()


def _nudged(model: BiEncoder) -> BiEncoder:
    """The model as training leaves it: its weights no longer its folder's."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def test_validation_scores_the_texts_the_exported_model_sees(tiny_model_dir, faq):
    """Training's shorter lengths (doc 16 tokens here) are not what the export declares: validation
    encodes at the declared lengths, so its figure is the exported model's, whatever training truncated to."""
    trained = _model(tiny_model_dir, query_max_length=8, doc_max_length=16)
    exported = _model(tiny_model_dir)  # what encode/retrieve load: the declared lengths
    assert exported.cfg.doc_max_length > 16
    v = Validator(str(faq), qrels=str(faq / "qrels" / "test.trec"), metric="nDCG@10", backend="torch")
    got, want = v(trained), v(exported)
    assert got["val_nDCG@10"] == want["val_nDCG@10"] and got["val_RR@10"] == want["val_RR@10"]
    assert trained.cfg.doc_max_length == 16  # the training lengths are back after validation
    truncated = trained.embed(["word " * 200], "doc")
    with trained.inference_lengths():
        full = trained.embed(["word " * 200], "doc")
    assert not np.allclose(truncated, full)  # (the lengths do change what is scored)


def test_the_encoder_plan_follows_encode_and_says_why(tiny_model_dir, faq, monkeypatch):
    model = _model(tiny_model_dir)
    want = resolve_precision("auto", "cpu")  # bf16 where the CPU computes it natively, else fp32
    v = Validator(str(faq), qrels=str(faq / "qrels" / "test.trec"))
    backend, precision, why = v.encoder_plan(model, "cpu", 176)
    assert (backend, precision) == ("torch", want) and "176 passages < 1,000" in why
    pytest.importorskip("openvino")
    assert v.encoder_plan(model, "cpu", 5_000) == ("openvino", want, None)
    assert Validator(str(faq), precision="fp32", backend="torch").encoder_plan(model, "cpu", 5_000) == \
        ("torch", "fp32", None)
    assert Validator(str(faq), backend="openvino").encoder_plan(model, "cpu", 10)[0] == "openvino"
    gpu = v.encoder_plan(model, "cuda", 5_000) if torch.cuda.is_available() else ("torch", None, "a GPU")
    assert gpu[0] == "torch" and "GPU" in gpu[2]


def test_openvino_validation_converts_the_trained_weights_and_caches_nothing(tiny_model_dir, faq, tmp_path,
                                                                            monkeypatch):
    """The model being trained is converted as it is (not its folder's weights, which the export cache is
    keyed by), and nothing is written to the cache: a conversion per validation would fill it."""
    pytest.importorskip("openvino")
    from pipeline.models.backends import tower_runner

    cache = tmp_path / "cache"
    monkeypatch.setenv("PIPELINE_EXPORT_CACHE", str(cache))
    model = _nudged(_model(tiny_model_dir))
    ref = model.embed(TEXTS, "doc", precision="fp32")
    used, runner, precision, note = tower_runner(model, "doc", "openvino", "fp32", 1, keep=False, option="validation")
    assert (used, precision, note) == ("openvino", "fp32", None) and runner.check["passed"]
    np.testing.assert_allclose(model.embed(TEXTS, "doc", precision="fp32", runner=runner), ref, atol=1e-5)
    monkeypatch.setattr(validate_mod, "OPENVINO_MIN_PASSAGES", 100)  # the FAQ's 176 passages go to OpenVINO
    v = Validator(str(faq), qrels=str(faq / "qrels" / "test.trec"), metric="nDCG@10", precision="fp32")
    got = v(model)
    assert got["validation_encoder"] == "openvino fp32" and got["validation_rate"] > 0
    torch_run = Validator(str(faq), qrels=str(faq / "qrels" / "test.trec"), metric="nDCG@10", precision="fp32",
                          backend="torch")(model)
    assert torch_run["validation_encoder"].startswith("torch fp32")
    assert abs(got["val_nDCG@10"] - torch_run["val_nDCG@10"]) <= 0.002
    assert not cache.exists() or not any(cache.rglob("*.xml"))
