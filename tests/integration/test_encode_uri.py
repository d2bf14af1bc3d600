"""Encoding to an object store (moto's S3 server and gcp-storage-emulator's GCS on 127.0.0.1, through
pyarrow's S3FileSystem and GcsFileSystem) with
the tokenising CPU stage ahead of the encoder actors: a killed run resumes redoing only the missing
shards, every pid lands exactly once, `pipeline index` reads the shards from the URI; an output the
workers cannot write to is refused before any work."""

from __future__ import annotations

import json
from pathlib import Path

import gcs_emulator
import pytest
import s3_emulator
from fixtures import GREEK, SimulatedKill, kill_after, random_collection, watch_resume
from s3_emulator import uri

from pipeline.config import load_config
from pipeline.data.ingest import ingest
from pipeline.errors import ConfigError
from pipeline.index import encode as encode_mod
from pipeline.index.encode import encode_corpus
from pipeline.index.shards import completed_shards, iter_shards, load_meta, location

pytestmark = pytest.mark.integration

N = 240


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("enc_uri")
    random_collection(root / "collection.tsv", N, seed=2, words=GREEK[:10], max_words=100)
    ingest([root / "collection.tsv"], "msmarco", root / "corpus", part_rows=120, progress=False)
    return root / "corpus"


def _cfg(model_dir, *extra):
    return load_config(None, [f"model.name_or_path={model_dir}", "model.pooling=mean", "model.normalize=true",
                              "encode.batch_size=16", "encode.show_progress=false", "encode.shard_rows=40",
                              "encode.tokenize=stage", *extra])


@pytest.mark.parametrize("store", ["s3", "gs"])
def test_stage_encode_to_a_store_resumes_after_a_kill_and_indexes_from_the_uri(ray_session, tiny_model_dir, corpus,
                                                                               tmp_path, monkeypatch, store):
    emu = {"s3": s3_emulator, "gs": gcs_emulator}[store]
    out = emu.uri(emu.make_bucket(), "scifact/emb")
    cfg = _cfg(tiny_model_dir)
    kill_after(monkeypatch, 2)
    with pytest.raises(SimulatedKill):
        encode_corpus(corpus, out, cfg)
    kept = completed_shards(out)
    assert len(kept) >= 2 and load_meta(out)["complete"] is False
    if len(kept) > 4:  # the actors outran the kill: make two shards half-written (vectors, no marker)
        for name in sorted(kept)[-2:]:
            (location(out) / f"{name}.done").unlink()
            del kept[name]

    monkeypatch.setattr(encode_mod, "_report_shard", lambda name, rows: None)
    found = watch_resume(monkeypatch)
    summary = encode_corpus(corpus, out, cfg)
    assert summary["tokenize"] == "stage" and summary["shards"] == 6
    # an actor may finish the shard it held after the kill: the re-run reuses what it found, and
    # that includes every shard complete when we looked
    assert set(kept) <= set(found)
    assert summary["reused_shards"] == len(found) and summary["encoded"] == N - 40 * len(found)
    assert load_meta(out)["complete"] is True
    assert [p for ids, _ in iter_shards(out) for p in ids] == [str(i) for i in range(N)]  # each once, in order
    markers = completed_shards(out)
    for name, marker in kept.items():  # the kept shards were not rewritten
        assert markers[name] == marker
    for marker in markers.values():  # tokenised by a task process, not by the actor that ran the model
        assert marker["tokenize"] == "stage" and marker["tokenize_pid"] != marker["pid"]
    assert not [p for p in location(out).iterdir() if p.name.startswith((".tmp-", ".write-probe", ".shared-probe"))]

    # a complete run is reused whole; `pipeline index --embeddings URI` reads the shards from the store
    again = encode_corpus(corpus, out, cfg)
    assert again["encoded"] == 0 and again["reused_shards"] == 6
    from pipeline.index.faiss_index import build_index

    info = build_index(out, tmp_path / "index", load_config(None, []).index, progress=False)
    assert info["ntotal"] == N and info["embeddings"].startswith(f"{store}://")
    assert (tmp_path / "index" / "pids.txt").read_text().split() == [str(i) for i in range(N)]
    assert json.loads((tmp_path / "index" / "index.json").read_text())["corpus_fingerprint"] == \
        load_meta(out)["corpus_fingerprint"]


def test_an_output_the_workers_cannot_write_is_refused_before_any_work(ray_session, tiny_model_dir, corpus):
    missing = uri("no-such-bucket-for-encode", "emb")
    with pytest.raises(ConfigError, match="bucket does not exist") as err:
        encode_corpus(corpus, missing, _cfg(tiny_model_dir))
    assert "no-such-bucket-for-encode" in str(err.value)
