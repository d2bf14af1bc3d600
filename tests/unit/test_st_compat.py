"""sentence-transformers compatibility, both ways, checked against sentence-transformers itself.

Saving: every `BiEncoder.save` directory loads in `SentenceTransformer(path)` and gives our
vectors (encode / encode_document = documents, encode_query = queries) to 1e-5.
Loading: directories built and saved by sentence-transformers (every pooling mode, Dense,
Normalize, Router, prompts) give its vectors through `BiEncoder.load(...).embed`, or a
ConfigError naming the module we cannot reproduce.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.config import ModelConfig
from pipeline.errors import ConfigError
from pipeline.models import BiEncoder
from pipeline.models.tiny import build_tiny_bert

st = pytest.importorskip("sentence_transformers")
from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import (  # noqa: E402
    Dense, LayerNorm, Normalize, Pooling, Router, Transformer)

LONG = " ".join(f"word{i} and more text" for i in range(60))  # > 64 and > 100 tokens: truncation matters
DOCS = ["How do I sort a list in Python?", "short", LONG, "Tuples are immutable; lists are not.",
        "The quick brown fox jumps over the lazy dog " * 3]
QUERIES = ["sort a list", LONG, "what is a tuple"]
ATOL = 1e-5


@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    root = tmp_path_factory.mktemp("st_towers")
    return build_tiny_bert(root / "a", seed=0), build_tiny_bert(root / "b", seed=1)


def _st(path) -> SentenceTransformer:
    return SentenceTransformer(str(path), device="cpu")


def _ours(path, **kw) -> BiEncoder:
    return BiEncoder.load(ModelConfig(name_or_path=str(path), **kw))


def _check_same(model: BiEncoder, path) -> SentenceTransformer:
    """SentenceTransformer(path) reproduces `model` for documents and queries."""
    s = _st(path)
    docs = model.embed(DOCS, "doc")
    np.testing.assert_allclose(s.encode(DOCS), docs, atol=ATOL)
    np.testing.assert_allclose(s.encode_document(DOCS), docs, atol=ATOL)
    np.testing.assert_allclose(s.encode_query(QUERIES), model.embed(QUERIES, "query"), atol=ATOL)
    return s


# ---------------------------------------------------------------------------- what we save
def test_shared_cls_unnormalised_saves_a_complete_st_directory(towers, tmp_path):
    model = _ours(towers[0])
    assert (model.pooling, model.normalize, model.default_max_lengths) == ("cls", False, {"query": 64, "doc": 256})
    model.save(tmp_path / "m")
    out = tmp_path / "m"
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling"]  # no Normalize
    assert json.loads((out / "1_Pooling/config.json").read_text())["pooling_mode_cls_token"] is True
    sbert = json.loads((out / "sentence_bert_config.json").read_text())
    assert (sbert["max_seq_length"], sbert["query_length"], sbert["document_length"]) == (256, 64, 256)
    s = _check_same(model, out)
    assert s.max_seq_length == 256
    assert s.similarity_fn_name == "dot"
    # still a plain HF model, and still ours
    from transformers import AutoModel

    hf = AutoModel.from_pretrained(str(out))
    assert torch.equal(hf.embeddings.word_embeddings.weight, model.doc_encoder.embeddings.word_embeddings.weight)
    again = _ours(out)
    np.testing.assert_allclose(again.embed(DOCS, "doc"), model.embed(DOCS, "doc"), atol=1e-6)


def test_shared_mean_normalised_with_prefixes(towers, tmp_path):
    model = _ours(towers[0], pooling="mean", normalize=True, query_prefix="query: ", doc_prefix="passage: ")
    model.save(tmp_path / "m")
    types = [m["type"].rsplit(".", 1)[1] for m in json.loads((tmp_path / "m/modules.json").read_text())]
    assert types == ["Transformer", "Pooling", "Normalize"]
    s = _check_same(model, tmp_path / "m")
    assert s.prompts["query"] == "query: " and s.prompts["document"] == "passage: "
    assert np.allclose(np.linalg.norm(s.encode(DOCS), axis=1), 1.0, atol=1e-5)
    # the prefixes travel with the model: loading it again applies them without being told
    again = _ours(tmp_path / "m")
    assert (again.cfg.query_prefix, again.cfg.doc_prefix, again.pooling, again.normalize) == \
        ("query: ", "passage: ", "mean", True)
    np.testing.assert_allclose(again.embed(QUERIES, "query"), model.embed(QUERIES, "query"), atol=1e-6)


def test_separate_towers_save_as_a_router(towers, tmp_path):
    model = _ours(towers[0], query_name_or_path=str(towers[1]), pooling="mean", normalize=True,
                  query_prefix="query: ", doc_prefix="passage: ")
    model.save(tmp_path / "m")
    out = tmp_path / "m"
    assert json.loads((out / "modules.json").read_text())[0]["type"].endswith("Router")
    s = _check_same(model, out)
    # the routes really differ: the query tower is not the document tower
    assert not np.allclose(s.encode_query(DOCS[:2], prompt=""), s.encode_document(DOCS[:2], prompt=""), atol=1e-3)
    again = _ours(out)
    assert not again.shared
    np.testing.assert_allclose(again.embed(QUERIES, "query"), model.embed(QUERIES, "query"), atol=1e-6)
    np.testing.assert_allclose(again.embed(DOCS, "doc"), model.embed(DOCS, "doc"), atol=1e-6)
    from transformers import AutoModel

    AutoModel.from_pretrained(str(out / "doc_encoder"))  # each tower stays a HF model


def test_minilm_saved_keeps_normalize_and_its_max_length(tmp_path):
    """The reported bug: a saved MiniLM loaded in sentence-transformers without Normalize, at 512 tokens."""
    model = BiEncoder.load(ModelConfig(name_or_path="minilm", query_max_length=32, doc_max_length=128))  # training lengths
    model.save(tmp_path / "m")
    s = _st(tmp_path / "m")
    assert s.max_seq_length == 256  # the model's own limit, not training's 128 nor the tokenizer's 512
    vecs = s.encode(DOCS)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    again = _ours(tmp_path / "m")
    np.testing.assert_allclose(vecs, again.embed(DOCS, "doc"), atol=ATOL)
    np.testing.assert_allclose(s.encode_query(QUERIES), again.embed(QUERIES, "query"), atol=ATOL)
    meta = json.loads((tmp_path / "m/biencoder.json").read_text())
    assert meta["trained_max_lengths"] == {"query": 32, "doc": 128}


def test_directories_saved_before_the_st_layout_still_load(towers, tmp_path):
    """biencoder.json + HF files only (shared), and query_encoder/ + doc_encoder/ (separate)."""
    model = _ours(towers[0], query_name_or_path=str(towers[1]), pooling="mean", normalize=True)
    old = tmp_path / "old_sep"
    for name, enc, tok in (("doc_encoder", model.doc_encoder, model.doc_tokenizer),
                           ("query_encoder", model.query_encoder, model.query_tokenizer)):
        enc.save_pretrained(old / name)
        tok.save_pretrained(old / name)
    (old / "biencoder.json").write_text(json.dumps({"shared": False, "pooling": "mean", "normalize": True}))
    again = _ours(old)
    assert not again.shared and (again.pooling, again.normalize) == ("mean", True)
    np.testing.assert_allclose(again.embed(QUERIES, "query"), model.embed(QUERIES, "query"), atol=1e-6)
    old_shared = tmp_path / "old_shared"
    model.doc_encoder.save_pretrained(old_shared)
    model.doc_tokenizer.save_pretrained(old_shared)
    (old_shared / "biencoder.json").write_text(json.dumps({"shared": True, "pooling": "mean", "normalize": True}))
    again = _ours(old_shared)
    np.testing.assert_allclose(again.embed(DOCS, "doc"), model.embed(DOCS, "doc"), atol=1e-6)


# ---------------------------------------------------------------------------- what sentence-transformers saves
def _build_st(path, modules, **kw):
    SentenceTransformer(modules=modules, device="cpu", **kw).save(str(path))
    return path


@pytest.mark.parametrize("mode", ["cls", "mean", "max", "lasttoken", "weightedmean", "mean_sqrt_len_tokens"])
def test_every_pooling_mode_matches_sentence_transformers(towers, tmp_path, mode):
    path = _build_st(tmp_path / mode, [Transformer(str(towers[0]), max_seq_length=100), Pooling(32, mode)])
    model = _ours(path)
    assert (model.pooling, model.normalize, model.cfg.doc_max_length) == (mode, False, 100)
    np.testing.assert_allclose(model.embed(DOCS, "doc"), _st(path).encode(DOCS), atol=ATOL)


@pytest.mark.parametrize("activation", [torch.nn.Tanh(), torch.nn.ReLU(), torch.nn.Identity()])
def test_dense_and_normalize_are_applied(towers, tmp_path, activation):
    torch.manual_seed(0)
    path = _build_st(tmp_path / "dense", [Transformer(str(towers[0])), Pooling(32, "mean"),
                                          Dense(32, 16, activation_function=activation), Normalize()])
    model = _ours(path)
    assert model.dim == 16 and model.normalize
    ours, theirs = model.embed(DOCS, "doc"), _st(path).encode(DOCS)
    assert ours.shape == (len(DOCS), 16)
    np.testing.assert_allclose(ours, theirs, atol=ATOL)
    # and they survive our save: sentence-transformers reads our Dense back
    model.save(tmp_path / "ours")
    np.testing.assert_allclose(_st(tmp_path / "ours").encode(DOCS), theirs, atol=ATOL)


def test_dense_on_token_embeddings_before_pooling(towers, tmp_path):
    torch.manual_seed(1)
    path = _build_st(tmp_path / "tok", [Transformer(str(towers[0])),
                                        Dense(32, 24, module_input_name="token_embeddings"), Pooling(24, "max")])
    model = _ours(path)
    np.testing.assert_allclose(model.embed(DOCS, "doc"), _st(path).encode(DOCS), atol=ATOL)


def test_prompts_and_prompt_exclusion(towers, tmp_path):
    path = _build_st(tmp_path / "p", [Transformer(str(towers[0])), Pooling(32, "mean", include_prompt=False)],
                     prompts={"query": "query: ", "document": "passage: "})
    model = _ours(path)
    assert (model.cfg.query_prefix, model.cfg.doc_prefix) == ("query: ", "passage: ")
    s = _st(path)
    np.testing.assert_allclose(model.embed(QUERIES, "query"), s.encode_query(QUERIES), atol=ATOL)
    np.testing.assert_allclose(model.embed(DOCS, "doc"), s.encode_document(DOCS), atol=ATOL)
    # encode_document's order: "document", then "passage", then "corpus"
    _edit_json(path / "config_sentence_transformers.json",
               lambda c: {**c, "prompts": {"query": "q: ", "passage": "p: ", "corpus": "c: "}})
    assert _ours(path).cfg.doc_prefix == _st(path).prompts["passage"] == "p: "


def test_router_built_by_sentence_transformers(towers, tmp_path):
    torch.manual_seed(2)
    router = Router.for_query_document(
        query_modules=[Transformer(str(towers[1]), max_seq_length=48), Pooling(32, "cls")],
        document_modules=[Transformer(str(towers[0]), max_seq_length=128), Pooling(32, "cls"), Dense(32, 32)])
    path = _build_st(tmp_path / "r", [router, Normalize()])
    model = _ours(path)
    assert not model.shared and model.cfg.query_max_length == 48 and model.cfg.doc_max_length == 128
    s = _st(path)
    np.testing.assert_allclose(model.embed(QUERIES, "query"), s.encode_query(QUERIES), atol=ATOL)
    np.testing.assert_allclose(model.embed(DOCS, "doc"), s.encode_document(DOCS), atol=ATOL)


def test_lowercasing_transformer(towers, tmp_path):
    path = _build_st(tmp_path / "lc", [Transformer(str(towers[0]), do_lower_case=True), Pooling(32, "mean")])
    model = _ours(path)
    np.testing.assert_allclose(model.embed(["MiXeD CaSe Text"], "doc"), _st(path).encode(["MiXeD CaSe Text"]),
                               atol=ATOL)


# ---------------------------------------------------------------------------- refusals
def _edit_json(path, fn):
    path.write_text(json.dumps(fn(json.loads(path.read_text()))))


def test_unsupported_modules_are_refused_by_name(towers, tmp_path):
    path = _build_st(tmp_path / "ln", [Transformer(str(towers[0])), Pooling(32, "mean"), LayerNorm(32)])
    with pytest.raises(ConfigError, match="LayerNorm"):
        _ours(path)


def test_custom_code_module_is_refused(towers, tmp_path):
    path = _build_st(tmp_path / "c", [Transformer(str(towers[0])), Pooling(32, "mean")])
    _edit_json(path / "modules.json", lambda m: m + [{"idx": 2, "name": "2", "path": "2_Custom",
                                                      "type": "my_package.Whitening"}])
    with pytest.raises(ConfigError, match="my_package.Whitening"):
        _ours(path)


def test_concatenated_pooling_modes_are_refused(towers, tmp_path):
    path = _build_st(tmp_path / "cat", [Transformer(str(towers[0])), Pooling(32, ("cls", "mean"))])
    with pytest.raises(ConfigError, match="Pooling"):
        _ours(path)


def test_untrusted_dense_activation_is_refused(towers, tmp_path):
    path = _build_st(tmp_path / "act", [Transformer(str(towers[0])), Pooling(32, "mean"), Dense(32, 8)])
    dense = next(p for p in path.iterdir() if p.name.endswith("Dense"))
    _edit_json(dense / "config.json", lambda c: {**c, "activation_function": "my_package.Swish"})
    with pytest.raises(ConfigError, match="my_package.Swish"):
        _ours(path)


def test_no_pooling_module_is_refused_not_cls(towers, tmp_path):
    path = _build_st(tmp_path / "np", [Transformer(str(towers[0])), Pooling(32, "mean")])
    _edit_json(path / "modules.json", lambda m: m[:1])
    with pytest.raises(ConfigError, match="no Pooling"):
        _ours(path)
