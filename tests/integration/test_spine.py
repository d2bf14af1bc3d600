"""ingest -> encode (Ray Data) -> index -> retrieve -> evaluate on local Ray, with a tiny BERT."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fixtures import kill_after, random_collection

from pipeline.config import load_config
from pipeline.data.ingest import ingest
from pipeline.errors import PipelineError
from pipeline.index import encode as encode_mod
from pipeline.index.encode import encode_corpus
from pipeline.index.faiss_index import LoadedIndex, build_index
from pipeline.index.retrieve import retrieve
from pipeline.index.shards import completed_shards, iter_shards
from pipeline.eval.metrics import evaluate_files

pytestmark = pytest.mark.integration

WORDS = ("python list dict tuple set string integer float loop class object module package import "
         "function lambda generator iterator exception error file path thread process memory garbage").split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    texts = random_collection(root / "collection.tsv", 300, words=WORDS, min_words=8, max_words=30)
    # queries are the first words of some passages; qrels point at that passage
    qids = list(range(0, 300, 15))
    (root / "queries.tsv").write_text("".join(f"q{i}\t{' '.join(texts[i].split()[:6])}\n" for i in qids))
    (root / "qrels.trec").write_text("".join(f"q{i} 0 {i} 1\n" for i in qids))
    out = root / "ingested"
    ingest([root / "collection.tsv"], "msmarco", out, part_rows=40, queries=root / "queries.tsv",
           qrels={"dev": root / "qrels.trec"}, progress=False)
    return out


def _cfg(model_dir, *extra):
    return load_config(None, [f"model.name_or_path={model_dir}", "model.pooling=mean", "model.normalize=true",
                              "encode.cpus_per_actor=0.5", "encode.num_actors=2", "encode.batch_size=16",
                              "encode.show_progress=false", "encode.precision=fp32", *extra])


def test_end_to_end(ray_session, tiny_model_dir, corpus, tmp_path):
    cfg = _cfg(tiny_model_dir)
    summary = encode_corpus(corpus, tmp_path / "emb", cfg)
    assert summary["rows"] == 300 and summary["shards"] == 8
    pids = [p for ids, _ in iter_shards(tmp_path / "emb") for p in ids]
    assert sorted(pids, key=int) == [str(i) for i in range(300)]

    # the shards equal a plain in-process encoding of the same texts
    from pipeline.models import BiEncoder

    model = BiEncoder.load(cfg.model)
    ids, vecs = next(iter_shards(tmp_path / "emb"))
    texts = {l.split("\t")[0]: l.split("\t")[1] for l in (corpus.parent / "collection.tsv").read_text().splitlines()}
    ref = model.embed([texts[i] for i in ids], "doc")
    np.testing.assert_allclose(np.asarray(vecs), ref, atol=1e-5)

    info = build_index(tmp_path / "emb", tmp_path / "index", cfg.index, progress=False)
    assert info["ntotal"] == 300 and info["variant"] == "msmarco-official"
    retrieve(tmp_path / "index", corpus / "queries.tsv", tmp_path / "run.trec", cfg, progress=False)
    lines = (tmp_path / "run.trec").read_text().splitlines()
    assert len(lines) == 20 * 100
    first = lines[0].split()
    assert first[1] == "Q0" and first[3] == "1"
    # brute force agrees with FAISS's exact top-1
    all_vecs = np.concatenate([np.asarray(v) for _, v in iter_shards(tmp_path / "emb")])
    all_ids = [p for i, _ in iter_shards(tmp_path / "emb") for p in i]
    q = model.embed([(corpus / "queries.tsv").read_text().splitlines()[0].split("\t")[1]], "query")
    assert all_ids[int(np.argmax(all_vecs @ q[0]))] == first[2]

    result = evaluate_files(tmp_path / "run.trec", corpus / "qrels" / "dev.trec", cfg.eval)
    assert result["queries"]["evaluated"] == 20
    assert 0.0 <= result["metrics"]["RR@10"] <= 1.0
    meta = json.loads((tmp_path / "run.trec.meta.json").read_text())
    assert meta["corpus_fingerprint"] == json.loads((corpus / "manifest.json").read_text())["fingerprint"]


def test_resume_after_kill(ray_session, tiny_model_dir, corpus, tmp_path, monkeypatch):
    """A run killed after 3 shards, started again, encodes only the rest; every pid exactly once."""
    cfg = _cfg(tiny_model_dir, "encode.num_actors=1", "encode.cpus_per_actor=1")
    out = tmp_path / "emb"

    def on_disk(name):  # the shard is on disk the moment its receipt reaches the driver
        assert (out / f"{name}.done").exists() and (out / f"{name}.npy").exists()

    kill_after(monkeypatch, 3, KeyboardInterrupt, check=on_disk)
    with pytest.raises(KeyboardInterrupt):
        encode_corpus(corpus, out, cfg)
    kept = completed_shards(out)
    assert 3 <= len(kept) < 8  # actors may finish the shard they hold; the rest was never encoded
    # a writer killed mid-shard: vectors on disk, no ids, no .done marker; and a stray temporary
    np.save(out / "shard-00007-000000000.npy", np.zeros((5, 32), np.float32))
    (out / ".tmp-shard-00007-000000000.pids.txt-dead").write_text("x\n")
    # an actor killed inside `atomic_path` while writing a marker leaves a temporary folder
    (out / ".tmp-shard-00007-000000000.done-999999-0badc0de").mkdir()
    (out / ".tmp-shard-00007-000000000.done-999999-0badc0de" / "shard-00007-000000000.done").write_text("{")
    assert not json.loads((out / "embeddings.json").read_text())["complete"]
    with pytest.raises(Exception):
        list(iter_shards(out))  # an incomplete encoding is never read as complete

    monkeypatch.setattr(encode_mod, "_report_shard", lambda name, rows: None)
    summary = encode_corpus(corpus, out, cfg)
    # an actor may still finish the shard it held after the driver died: reused >= what we saw
    assert len(kept) <= summary["reused_shards"] < 8
    assert summary["encoded"] <= 300 - 40 * len(kept) and summary["encoded"] > 0
    pids = [p for ids, _ in iter_shards(out) for p in ids]
    assert len(pids) == len(set(pids)) == 300
    assert sum(len(v) for _, v in iter_shards(out)) == 300
    assert not list(out.glob(".tmp-*"))

    # nothing left to do: a third run encodes nothing
    assert encode_corpus(corpus, out, cfg)["encoded"] == 0


def test_refuses_other_model(ray_session, tiny_model_dir, corpus, tmp_path):
    from pipeline.models.tiny import build_tiny_bert

    encode_corpus(corpus, tmp_path / "emb", _cfg(tiny_model_dir, "encode.num_actors=1", "encode.cpus_per_actor=1"))
    other = build_tiny_bert(tmp_path / "other", seed=1)
    with pytest.raises(PipelineError, match="different"):
        encode_corpus(corpus, tmp_path / "emb", _cfg(other))


def test_resource_check_fails_fast(ray_session, tiny_model_dir, corpus, tmp_path):
    from pipeline.errors import ResourceError

    with pytest.raises(ResourceError, match="do not fit"):
        encode_corpus(corpus, tmp_path / "emb", _cfg(tiny_model_dir, "encode.num_actors=3", "encode.cpus_per_actor=1"))
    with pytest.raises(ResourceError, match="fits on no node"):
        encode_corpus(corpus, tmp_path / "emb", _cfg(tiny_model_dir, "encode.num_actors=1", "encode.cpus_per_actor=2.5"))


def test_ivf_index_and_loaded_search(ray_session, tiny_model_dir, corpus, tmp_path):
    cfg = _cfg(tiny_model_dir, "index.factory=IVF4,Flat", "index.nprobe=4")
    encode_corpus(corpus, tmp_path / "emb", cfg)
    build_index(tmp_path / "emb", tmp_path / "ivf", cfg.index, progress=False)
    build_index(tmp_path / "emb", tmp_path / "flat", load_config(None, []).index, progress=False)
    ivf, flat = LoadedIndex(tmp_path / "ivf", cfg.index), LoadedIndex(tmp_path / "flat")
    q = np.asarray(next(iter_shards(tmp_path / "emb"))[1][:5], dtype=np.float32)
    # nprobe = nlist: IVF search is exhaustive, so it must equal exact search
    np.testing.assert_array_equal(ivf.search(q, 10)[1], flat.search(q, 10)[1])
