"""`pipeline index --out URI` (moto's S3 server on 127.0.0.1 through pyarrow): built locally, uploaded
with index.json last; read back (retrieve, Searcher) from the URI through a local copy keyed by
index.json; the output rules of a local folder hold on the store."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from fixtures import random_embeddings
from s3_emulator import make_bucket, uri

from pipeline.config import IndexConfig
from pipeline.data.ingest import ingest
from pipeline.errors import InputError
from pipeline.io_utils import OutputError
from pipeline.index.faiss_index import LoadedIndex, build_index, local_index_dir
from pipeline.storage import resolve


@pytest.fixture()
def emb(tmp_path):
    raw = tmp_path / "collection.tsv"
    raw.write_text("".join(f"{i}\tpassage number {i}\n" for i in range(10)))
    corpus = tmp_path / "corpus"
    ingest([raw], "msmarco", corpus, part_rows=6, progress=False)
    return random_embeddings(corpus, tmp_path / "emb")


def test_an_index_on_s3_equals_the_local_one_and_is_read_back_from_the_uri(emb, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_STAGING_DIR", str(tmp_path / "staging"))
    out = uri(make_bucket(), "idx/flat")
    local = tmp_path / "index"
    build_index(emb, local, IndexConfig(), progress=False)
    info = build_index(emb, out, IndexConfig(), progress=False)
    assert info["ntotal"] == 10
    remote = resolve(out)
    assert sorted(p.name for p in remote.iterdir()) == ["index.faiss", "index.json", "pids.txt"]
    assert (remote / "pids.txt").read_text() == (local / "pids.txt").read_text()
    a, b = LoadedIndex(local), LoadedIndex(out)
    q = np.random.default_rng(1).standard_normal((3, 8)).astype("float32")
    np.testing.assert_array_equal(a.index.search(q, 5)[1], b.index.search(q, 5)[1])
    assert b.pids == a.pids
    copy = local_index_dir(out)
    assert local_index_dir(out) == copy  # fetched once per index.json

    # the rules of a local output folder: the same command again keeps the index there, another one is
    # refused without overwrite, anything else is never replaced
    before = {p.name: p.read_bytes() for p in remote.iterdir()}
    assert build_index(emb, out, IndexConfig(), progress=False, overwrite=False) == json.loads(before["index.json"])
    assert {p.name: p.read_bytes() for p in remote.iterdir()} == before  # nothing was written
    with pytest.raises(OutputError, match=r"a different one \(factory 'Flat' there, 'HNSW8' asked now\); pass --overwrite"):
        build_index(emb, out, IndexConfig(factory="HNSW8"), progress=False, overwrite=False)
    build_index(emb, out, IndexConfig(factory="HNSW8"), progress=False, overwrite=True)
    assert json.loads((remote / "index.json").read_text())["factory"] == "HNSW8"
    assert local_index_dir(out) != copy  # a replaced index is fetched again
    other = uri(make_bucket(), "data")
    (resolve(other) / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="notes.txt"):
        build_index(emb, other, IndexConfig(), progress=False, overwrite=True)
    assert (resolve(other) / "notes.txt").read_text() == "mine"


def test_an_index_on_a_uri_built_again_from_changed_vectors_is_refused_naming_the_uri(emb, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("PIPELINE_STAGING_DIR", str(tmp_path / "staging"))
    out = uri(make_bucket(), "idx/changed")
    build_index(emb, out, IndexConfig(), progress=False)
    before = {p.name: p.read_bytes() for p in resolve(out).iterdir()}
    corpus = json.loads((emb / "embeddings.json").read_text())["corpus"]
    shutil.rmtree(emb)
    random_embeddings(Path(corpus), emb, seed=1)  # other vectors under the same path
    with pytest.raises(OutputError, match=re.escape(str(out)) + r" already holds .*other vectors or ids.*--overwrite"):
        build_index(emb, out, IndexConfig(), progress=False, overwrite=False)
    assert {p.name: p.read_bytes() for p in resolve(out).iterdir()} == before


def test_a_uri_without_a_complete_index_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_STAGING_DIR", str(tmp_path / "staging"))
    out = uri(make_bucket(), "half")
    (resolve(out) / "index.faiss").write_bytes(b"partial")  # an upload cut short: no index.json (written last)
    with pytest.raises(InputError, match="no complete index"):
        LoadedIndex(out)


def test_cli_refuses_pyserini_layout_on_a_uri(tmp_path, capsys):
    from pipeline.cli import main

    assert main(["index", "--embeddings", str(tmp_path), "--out", "s3://bucket/idx", "--pyserini"]) == 2
    err = capsys.readouterr().err
    assert "--pyserini writes pyserini's layout into a local folder" in err and "Traceback" not in err


def test_an_index_built_for_a_uri_says_what_a_local_build_says_and_one_done_line_naming_the_uri(
        emb, tmp_path, monkeypatch, capfd):
    """The build staged for upload prints its training and FAISS's note as a local build does (they were lost),
    and one done line: the URI's, never the staging folder's."""
    monkeypatch.setenv("PIPELINE_STAGING_DIR", str(tmp_path / "staging"))
    out = uri(make_bucket(), "idx/pq")
    capfd.readouterr()
    build_index(emb, out, IndexConfig(factory="PQ2x2"), progress=True)
    lines = capfd.readouterr().out.splitlines()
    assert [ln for ln in lines if ln.startswith("[index] note: FAISS trained")]  # 10 vectors for 4 centroids
    assert any(ln.startswith("[index] training PQ2x2 on 10 sampled vectors") for ln in lines)
    done = [ln for ln in lines if ln.startswith("[index] done:")]
    assert len(done) == 1 and done[0].endswith(f"uploaded -> {out}") and str(tmp_path / "staging") not in "\n".join(lines)
