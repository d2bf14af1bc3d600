"""`pipeline rerank` (#62): a run's pairs scored by a cross-encoder from a local folder (a tiny random one built
from a config), each query's passages sorted by the model's scores (checked against the model run by hand),
resumable after a kill without scoring a query twice, a run evaluate takes, and a teacher's scores a
distillation run reads."""

from __future__ import annotations

import json

import pytest

from pipeline.cli import main
from pipeline.errors import InputError, PipelineError


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, tiny_model_dir):
    """A tiny BERT with a one-label classification head, random weights, saved as CrossEncoder saves it."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("ce") / "cross-encoder"
    cfg = BertConfig(vocab_size=AutoTokenizer.from_pretrained(str(tiny_model_dir)).vocab_size, hidden_size=32,
                     num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=1,
                     architectures=["BertForSequenceClassification"])
    BertForSequenceClassification(cfg).save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(tiny_model_dir)).save_pretrained(str(out))
    return out


def _bm25(faq, tmp_path):
    run = tmp_path / "bm25.trec"
    assert main(["bm25", "--corpus", str(faq), "--out", str(run), "--qrels", str(faq / "qrels" / "test.trec"),
                 "--top-k", "10"]) == 0
    return run


@pytest.mark.slow
def test_a_run_is_reranked_by_the_cross_encoders_scores(faq, cross_encoder, tmp_path):
    from pipeline.data.corpus import fetch_passages
    from pipeline.data.readers import load_queries
    from pipeline.eval.rerank import load_cross_encoder, score_pairs
    from pipeline.eval.runs import read_run

    run = _bm25(faq, tmp_path)
    out = tmp_path / "ce.trec"
    assert main(["rerank", "--run", str(run), "--corpus", str(faq), "--queries", str(faq / "queries.tsv"),
                 "--model", str(cross_encoder), "--out", str(out), "--batch-size", "4"]) == 0
    got, before = read_run(out), read_run(run)
    assert set(got) == set(before) and all(set(got[q]) == set(before[q]) for q in got)
    tok, model = load_cross_encoder(cross_encoder)
    q = sorted(got)[0]
    texts = fetch_passages(faq, got[q], join=None)
    docs = sorted(got[q])
    want = dict(zip(docs, score_pairs(tok, model, [load_queries(faq / "queries.tsv")[q]] * len(docs),
                                      [texts[d] for d in docs], 512)))
    assert got[q] == pytest.approx(want, abs=1e-5)
    lines = [ln.split() for ln in out.read_text().splitlines() if ln.startswith(q + " ")]
    assert [float(ln[4]) for ln in lines] == sorted((float(ln[4]) for ln in lines), reverse=True)
    assert main(["evaluate", str(faq / "qrels" / "test.trec"), str(out)]) == 0
    assert json.loads((tmp_path / "ce.trec.meta.json").read_text())["n_queries"] == len(got)


@pytest.mark.slow
def test_a_killed_rerank_resumes_without_scoring_a_query_twice(faq, cross_encoder, tmp_path, monkeypatch):
    from pipeline.eval import rerank as R

    run = _bm25(faq, tmp_path)
    real, calls = R.score_pairs, []

    def dies(tok, model, queries, passages, max_length, device="cpu"):
        calls.append(queries[0])
        if len({*calls}) > 3:
            raise KeyboardInterrupt
        return real(tok, model, queries, passages, max_length, device)

    monkeypatch.setattr(R, "score_pairs", dies)
    out = tmp_path / "ce.trec"
    args = (run, faq, faq / "queries.tsv", cross_encoder, out)
    with pytest.raises(KeyboardInterrupt):
        R.rerank(*args, batch_size=4, progress=False)
    assert not out.exists() and (tmp_path / "ce.trec.rerank-partial" / "scored.trec").exists()
    monkeypatch.setattr(R, "score_pairs", real)
    meta = R.rerank(*args, batch_size=4, progress=False)
    assert meta["resumed_queries"] == 3 and not (tmp_path / "ce.trec.rerank-partial").exists()
    whole = tmp_path / "whole.trec"
    R.rerank(run, faq, faq / "queries.tsv", cross_encoder, whole, batch_size=4, progress=False)
    assert out.read_text() == whole.read_text()
    # a killed rerank of other inputs is never mixed in
    (tmp_path / "x.trec.rerank-partial").mkdir()
    (tmp_path / "x.trec.rerank-partial" / "state.json").write_text("{}")
    with pytest.raises(PipelineError, match="a killed rerank of other inputs"):
        R.rerank(run, faq, faq / "queries.tsv", cross_encoder, tmp_path / "x.trec", progress=False)


def test_a_folder_that_is_no_cross_encoder_is_refused(tiny_model_dir, faq, tmp_path):
    from pipeline.eval.rerank import load_cross_encoder

    with pytest.raises(InputError, match="not a sequence-classification model"):
        load_cross_encoder(tiny_model_dir)
    with pytest.raises(InputError, match="not a model folder"):
        load_cross_encoder(tmp_path)
