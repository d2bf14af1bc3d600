"""A model fine-tuned by `pipeline train` opens in sentence-transformers, with unit-norm vectors
equal to `pipeline encode`'s (documents, on Ray Data's encoder actors) and to the Searcher's / `pipeline
retrieve`'s (queries). The training runs in this process (train.runner=local): the driver exports the model
from the final checkpoint for either runner, and test_train's Ray Train export is loaded by transformers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.data.corpus import fetch_passages
from pipeline.index.encode import encode_corpus
from pipeline.index.faiss_index import build_index
from pipeline.index.shards import iter_shards
from pipeline.search import Searcher
from pipeline.train.config import load_train_config
from pipeline.train.trainer import train

pytestmark = pytest.mark.integration
st = pytest.importorskip("sentence_transformers")


def test_trained_model_is_a_sentence_transformers_model(ray_session, tiny_model_dir, faq, tmp_path):
    job = load_train_config(None, [
        f"model.name_or_path={tiny_model_dir}", "model.pooling=mean", "model.normalize=true",
        "model.query_prefix='query: '", "model.query_max_length=32", "model.doc_max_length=64",
        f"data.corpus={faq}", "train.num_workers=1", "train.runner=local", "train.batch_size=8",
        f"train.storage_path={tmp_path / 'runs'}", "train.name=st", "train.max_steps=2", "optim.lr=1e-4"])
    model_dir = train(job, progress=False)["model"]

    types = [m["type"].rsplit(".", 1)[1] for m in json.loads((tmp_path / "runs/st/model/modules.json").read_text())]
    assert types == ["Transformer", "Pooling", "Normalize"]
    s = st.SentenceTransformer(model_dir, device="cpu")
    assert s.max_seq_length == 256  # the model's inference length, not training's 64

    cfg = load_config(None, [f"model.name_or_path={model_dir}", "encode.cpus_per_actor=0.5", "encode.num_actors=1",
                             "encode.show_progress=false", "encode.precision=fp32"])
    encode_corpus(faq, tmp_path / "emb", cfg)
    for pids, vecs in iter_shards(tmp_path / "emb"):
        texts = fetch_passages(faq, pids, join=None)
        theirs = s.encode([texts[p] for p in pids])
        assert np.allclose(np.linalg.norm(theirs, axis=1), 1.0, atol=1e-5)
        np.testing.assert_allclose(np.asarray(vecs), theirs, atol=1e-5)

    build_index(tmp_path / "emb", tmp_path / "index", cfg.index, progress=False)
    queries = ["How do I sort a list?", "what is a lambda", "Why are floating point results inexact?"]
    searcher = Searcher(tmp_path / "index", device="cpu")
    assert searcher.model.cfg.query_prefix == "query: "  # recorded in the model, used by both tools
    np.testing.assert_allclose(searcher.encode(queries), s.encode_query(queries), atol=1e-5)
