"""models/backends: encode.backend (torch / openvino / auto), the export cache and the cosine check."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from pipeline.config import ModelConfig
from pipeline.errors import ConfigError, PipelineError
from pipeline.models import BiEncoder
from pipeline.models import backends
from pipeline.models.backends import OpenVinoTower, resolve_backend, tower_runner
from pipeline.models.tokens import tokenize_sorted

pytest.importorskip("openvino")

TEXTS = [f"passage {i} about " + "dense retrieval " * (i % 13) for i in range(40)]


def _model(path, **kw) -> BiEncoder:
    return BiEncoder.load(ModelConfig(name_or_path=str(path), doc_max_length=64, **kw)).eval()


def _tokens(model):
    tok, prefix, max_len = model.token_spec("doc")
    return tokenize_sorted(tok, TEXTS, prefix, max_len)


def test_resolve_backend_rules():
    assert resolve_backend("auto", "cpu") == "openvino" and resolve_backend("torch", "cpu") == "torch"
    assert resolve_backend("auto", "cuda") == "torch"  # GPUs: torch
    with pytest.raises(ConfigError, match="runs on the CPU"):
        resolve_backend("openvino", "cuda")
    with pytest.raises(ConfigError, match="expected one of"):
        resolve_backend("onnx", "cpu")


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_openvino_tower_gives_torchs_vectors(tiny_model_dir, tmp_path, pooling):
    model = _model(tiny_model_dir, pooling=pooling, normalize=pooling == "mean")
    toks = _tokens(model)
    ref = model.embed_tokens(toks, "doc", batch_size=8, precision="fp32")
    used, runner, precision, note = tower_runner(model, "doc", "auto", "fp32", 1, cache=tmp_path)
    assert (used, precision, note) == ("openvino", "fp32", None) and runner.check["passed"]
    got = model.embed_tokens(toks, "doc", batch_size=8, precision="fp32", runner=runner)
    np.testing.assert_allclose(got, ref, atol=1e-5)  # same rows, same order, same values


def test_the_export_is_cached_by_digest_and_never_stale(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    cache = tmp_path / "cache"
    first = OpenVinoTower(_model(model_dir), cache=cache)
    again = OpenVinoTower(_model(model_dir), cache=cache)
    assert first.converted and not again.converted and again.folder == first.folder
    assert json.loads((first.folder / "export.json").read_text())["digest"] == first.digest
    # the same folder with other weights: another digest, converted anew, and its own vectors
    changed = _model(model_dir)
    with torch.no_grad():
        for p in changed.doc_encoder.parameters():
            p.add_(0.05)
    changed.doc_encoder.save_pretrained(model_dir)
    changed = _model(model_dir)
    fresh = OpenVinoTower(changed, cache=cache)
    assert fresh.converted and fresh.digest != first.digest and fresh.check["passed"]
    toks = _tokens(changed)
    np.testing.assert_allclose(changed.embed_tokens(toks, "doc", runner=fresh), changed.embed_tokens(toks, "doc"),
                               atol=1e-5)
    # an export without its completion file (a kill half-way) is made again, not read
    (fresh.folder / "export.json").unlink()
    assert OpenVinoTower(changed, cache=cache).converted


def test_a_tower_that_fails_its_check_is_refused_or_replaced_by_torch(tiny_model_dir, tmp_path, monkeypatch):
    model = _model(tiny_model_dir)
    monkeypatch.setattr(backends, "COSINE_GATE", 1.5)  # no tower can pass
    used, runner, precision, note = tower_runner(model, "doc", "auto", "fp32", 1, cache=tmp_path)
    assert (used, runner, precision) == ("torch", None, "fp32") and "minimum cosine" in note and "torch used" in note
    with pytest.raises(PipelineError, match="encode.backend=openvino: openvino's vectors had a minimum cosine"):
        tower_runner(model, "doc", "openvino", "fp32", 1, cache=tmp_path)
    assert tower_runner(model, "doc", "torch", "fp32", 1) == ("torch", None, "fp32", None)


def test_int8_is_opt_in_calibrated_cached_and_refused_without_openvino(tiny_model_dir, tmp_path):
    """encode.precision=int8: OpenVINO + NNCF only (torch or a GPU refused), quantised on the given
    texts and cached under their digest; its vectors stay near fp32 (a known cost, bounded here)."""
    pytest.importorskip("nncf")
    model = _model(tiny_model_dir)
    calib = TEXTS[:24]
    used, runner, precision, note = tower_runner(model, "doc", "auto", "int8", 1, cache=tmp_path, calibration=calib)
    assert (used, precision, note) == ("openvino", "int8", None) and runner.quantized
    toks = _tokens(model)
    ref = model.embed_tokens(toks, "doc", precision="fp32")
    got = model.embed_tokens(toks, "doc", precision="int8", runner=runner)
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.mean() >= 0.99 and runner.check["passed"] and "mean_cosine" in runner.check
    again = OpenVinoTower(model, "doc", "int8", 1, tmp_path, calibration=calib)
    assert not again.quantized and not again.converted  # both the export and the int8 tower from the cache
    other = OpenVinoTower(model, "doc", "int8", 1, tmp_path, calibration=TEXTS[24:])
    assert other.quantized  # other calibration texts: quantised anew
    with pytest.raises(ConfigError, match="int8 runs in OpenVINO"):
        tower_runner(model, "doc", "torch", "int8", 1)
    with pytest.raises(ConfigError, match="int8 runs in OpenVINO"):
        resolve_backend("auto", "cuda", "int8")
    with pytest.raises(PipelineError, match="calibration texts"):
        tower_runner(model, "doc", "openvino", "int8", 1, cache=tmp_path / "none", calibration=[])
