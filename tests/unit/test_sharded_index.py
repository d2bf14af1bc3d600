"""An index of several parts (#61): built part by part (resumable), searched part by part and merged into the
one-part answer (Flat: the same passages, order and scores; ties in corpus order), parts sharing one trained
quantizer, bad parts named, merged back into one part, described by `pipeline info`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.config import IndexConfig
from pipeline.errors import ConfigError, InputError, PipelineError, ResourceError
from pipeline.index import sharded
from pipeline.index.faiss_index import build_index, load_index
from pipeline.index.shards import plan_part, write_shard


def _embeddings(folder: Path, vectors: np.ndarray, per_shard: int) -> Path:
    folder.mkdir(parents=True)
    pids = [f"p{i}" for i in range(len(vectors))]
    specs = plan_part(0, "corpus/part-00000.parquet", pids, per_shard)
    for s in specs:
        write_shard(folder, s, pids[s["start"]:s["end"]], vectors[s["start"]:s["end"]])
    (folder / "embeddings.json").write_text(json.dumps({
        "complete": True, "shard_names": [s["name"] for s in specs], "rows": len(vectors), "dim": vectors.shape[1],
        "corpus_fingerprint": "fp", "model_config": {}, "model": {"path": "/models/x"}}))
    return folder


@pytest.fixture
def vectors():
    rng = np.random.default_rng(0)
    v = rng.standard_normal((1200, 16)).astype(np.float32)
    v[300] = v[7]
    v[1100] = v[7]  # the same passage three times, in three parts: a tie on every query
    return v


def test_a_flat_index_in_parts_answers_as_one_part_with_ties_in_corpus_order(tmp_path, vectors):
    emb = _embeddings(tmp_path / "emb", vectors, 100)
    one = build_index(emb, tmp_path / "one", IndexConfig(shards=1), progress=False)
    four = build_index(emb, tmp_path / "four", IndexConfig(shards=4), progress=False)
    assert "parts" not in one and len(four["parts"]) == 4 and four["ntotal"] == 1200
    assert [p["offset"] for p in four["parts"]] == [0, 300, 600, 900]
    rng = np.random.default_rng(1)
    queries = np.vstack([vectors[[7]], rng.standard_normal((40, 16)).astype(np.float32)])
    a, b = load_index(tmp_path / "one"), load_index(tmp_path / "four", resident=False)
    s1, i1 = a.search(queries, 25)
    s4, i4 = b.search(queries, 25)
    assert np.array_equal(i1, i4) and np.allclose(s1, s4, rtol=0, atol=1e-5)
    tied = [int(i) for i, s in zip(i4[0], s4[0]) if s == s4[0][list(i4[0]).index(7)]]
    assert tied == [7, 300, 1100]  # equal scores: the passage first in the corpus first
    assert [b.pids[i] for i in i4[0][:3]] == [a.pids[i] for i in i1[0][:3]]
    assert b._loaded == {}  # one part at a time: nothing kept
    c = load_index(tmp_path / "four")  # the Python API keeps its parts once searched
    assert np.array_equal(c.search(queries, 25)[1], i1) and len(c._loaded) == 4
    # more than the corpus: every passage once, then -1
    s, i = b.search(queries[:2], 1300)
    assert sorted(i[0][:1200]) == list(range(1200)) and (i[:, 1200:] == -1).all()


def test_ivf_parts_share_one_quantizer_trained_on_a_sample_of_the_whole_corpus(tmp_path, vectors):
    emb = _embeddings(tmp_path / "emb", vectors, 100)
    cfg = dict(factory="IVF8,Flat", nprobe=3, train_sample=1000)
    build_index(emb, tmp_path / "one", IndexConfig(**cfg, shards=1), progress=False)
    info = build_index(emb, tmp_path / "parts", IndexConfig(**cfg, shards=3), progress=False)
    assert info["shared_quantizer"] == "trained.faiss" and info["train_sample"] == 1000
    q = np.random.default_rng(2).standard_normal((30, 16)).astype(np.float32)
    a = load_index(tmp_path / "one", IndexConfig(nprobe=3))
    b = load_index(tmp_path / "parts", IndexConfig(nprobe=3))
    assert np.array_equal(a.search(q, 10)[1], b.search(q, 10)[1])  # the same lists probed in every part


def test_plans_by_count_by_size_and_by_memory_and_their_refusals():
    shards = [(f"s{i}", 100) for i in range(10)]
    parts, why = sharded.plan_parts(shards, 64.0, 0, 0, 0.0, 1e9)
    assert len(parts) == 1 and why == "one part"
    parts, why = sharded.plan_parts(shards, 64.0, 0, 0, 0.0, 20_000)  # 64,000 bytes, 20,000 a part
    assert len(parts) == 4 and "more than the" in why and sum(p["rows"] for p in parts) == 1000
    parts, _ = sharded.plan_parts(shards, 1e6, 0, 0, 0.25, 1e12)  # 1 GB of vectors, parts of 0.25 GB
    assert len(parts) == 4 and all(p["bytes"] <= 0.3e9 for p in parts)
    parts, _ = sharded.plan_parts(shards, 64.0, 0, 3, 0.0, 1e12)
    assert [p["rows"] for p in parts] == [300, 400, 300] and [p["offset"] for p in parts] == [0, 300, 700]
    assert [s for p in parts for s in p["shards"]] == [n for n, _ in shards]  # contiguous, in corpus order
    with pytest.raises(ConfigError, match="a part holds whole shards: at most 10 parts"):
        sharded.plan_parts(shards, 64.0, 0, 11, 0.0, 1e12)
    with pytest.raises(ResourceError, match=r"part part-000 \(100 vectors\) needs .* more than"):
        sharded._part_fits({"name": "part-000", "rows": 100, "bytes": 10_000}, 5_000, "index Flat")


def test_a_killed_build_keeps_its_finished_parts_and_a_rerun_builds_only_the_missing_ones(tmp_path, vectors,
                                                                                           monkeypatch):
    emb = _embeddings(tmp_path / "emb", vectors, 100)
    real = sharded._build_part
    built = []

    def dies_at_the_third(faiss, emb_dir, folder, part, plan, trained, cfg):
        if part["name"] == "part-002" and not built.count("died"):
            built.append("died")
            raise KeyboardInterrupt  # as a kill
        built.append(part["name"])
        real(faiss, emb_dir, folder, part, plan, trained, cfg)

    monkeypatch.setattr(sharded, "_build_part", dies_at_the_third)
    out = tmp_path / "idx"
    with pytest.raises(KeyboardInterrupt):
        build_index(emb, out, IndexConfig(shards=4), progress=False)
    assert not (out / "index.json").exists() and (out / "plan.json").exists()
    with pytest.raises(InputError, match="no index here"):
        load_index(out)
    first = (out / "part-000" / "index.faiss").stat().st_ino
    build_index(emb, out, IndexConfig(shards=4), progress=False)
    assert built == ["part-000", "part-001", "died", "part-002", "part-003"]
    assert (out / "part-000" / "index.faiss").stat().st_ino == first and not (out / "plan.json").exists()
    assert load_index(out).index.ntotal == 1200
    # a killed build of another plan is refused, never mixed in
    other = tmp_path / "other"
    monkeypatch.setattr(sharded, "_build_part", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        build_index(emb, other, IndexConfig(shards=4), progress=False)
    monkeypatch.setattr(sharded, "_build_part", real)
    with pytest.raises(PipelineError, match="unfinished build of another plan"):
        build_index(emb, other, IndexConfig(shards=3), progress=False)


@pytest.mark.parametrize("damage, named", [
    ("remove", r"part part-001 of the index is missing"),
    ("truncate", r"part-001: (holds|not a readable)"),
    ("corpus", r"part part-001 of the index is of another corpus fingerprint"),
    ("pids", r"part part-001: 299 ids for its 300 vectors"),
])
def test_a_part_missing_truncated_or_of_another_corpus_is_one_error_naming_it(tmp_path, vectors, damage, named,
                                                                            capsys):
    emb = _embeddings(tmp_path / "emb", vectors, 100)
    out = tmp_path / "idx"
    build_index(emb, out, IndexConfig(shards=4), progress=False)
    part = out / "part-001"
    if damage == "remove":
        shutil.rmtree(part)
    elif damage == "truncate":
        data = (part / "index.faiss").read_bytes()
        (part / "index.faiss").write_bytes(data[: len(data) // 2])
    elif damage == "corpus":
        record = json.loads((part / "part.json").read_text())
        (part / "part.json").write_text(json.dumps({**record, "corpus_fingerprint": "another"}))
    else:
        lines = (part / "pids.txt").read_text().splitlines()
        (part / "pids.txt").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(InputError, match=named):
        load_index(out)
    queries = tmp_path / "q.tsv"
    queries.write_text("q1\thello\n")
    assert main(["retrieve", "--index", str(out), "--queries", str(queries), "--out", str(tmp_path / "r.trec")]) == 2
    err = capsys.readouterr().err
    assert "part-001" in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "r.trec").exists()


def test_parts_merge_into_one_part_that_answers_the_same_and_info_describes_both(tmp_path, vectors, capsys):
    from pipeline.search import export_pyserini

    emb = _embeddings(tmp_path / "emb", vectors, 100)
    assert main(["index", "--embeddings", str(emb), "--out", str(tmp_path / "parts"), "index.shards=3"]) == 0
    assert main(["index", "--merge", str(tmp_path / "parts"), "--out", str(tmp_path / "one")]) == 0
    q = np.random.default_rng(3).standard_normal((20, 16)).astype(np.float32)
    one, parts = load_index(tmp_path / "one"), load_index(tmp_path / "parts")
    assert "parts" not in one.meta and one.index.ntotal == 1200
    assert np.array_equal(one.search(q, 30)[1], parts.search(q, 30)[1])
    capsys.readouterr()
    assert main(["info", str(tmp_path / "parts")]) == 0
    assert "1,200 x dim 16, 3 parts of 400 vectors" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="an index of several parts; pyserini's FaissSearcher reads one"):
        export_pyserini(tmp_path / "parts")
    export_pyserini(tmp_path / "one")  # the merged one is today's layout
    assert (tmp_path / "one" / "docid").read_text().splitlines()[:2] == ["p0", "p1"]
    # the same build again: kept as it is
    assert main(["index", "--embeddings", str(emb), "--out", str(tmp_path / "parts"), "index.shards=3"]) == 0
    assert "unchanged" in capsys.readouterr().out


def test_a_search_that_would_not_fit_is_refused_before_any_part_is_loaded(tmp_path, vectors, monkeypatch):
    emb = _embeddings(tmp_path / "emb", vectors, 100)
    build_index(emb, tmp_path / "idx", IndexConfig(shards=4), progress=False)
    index = load_index(tmp_path / "idx", resident=False)
    sharded.check_search_memory(index, "retrieve", 0.8)
    with pytest.raises(ResourceError, match=r"retrieve: its largest part need ~.* GiB, more than 0% of"):
        sharded.check_search_memory(index, "retrieve", 1e-12)


def test_a_killed_build_never_keeps_parts_of_vectors_encoded_again_into_the_same_folder(tmp_path, vectors,
                                                                                        monkeypatch):
    """The plan names the embedding set as written: vectors encoded again into the same folder (same rows, same
    corpus) are another plan, refused, not resumed with the old vectors' parts beside the new."""
    emb = _embeddings(tmp_path / "emb", vectors, 100)
    monkeypatch.setattr(sharded, "_build_part", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        build_index(emb, tmp_path / "idx", IndexConfig(shards=4), progress=False)
    meta = json.loads((emb / "embeddings.json").read_text())
    (emb / "embeddings.json").write_text(json.dumps({**meta, "model": {"path": "/models/another"}}))
    monkeypatch.undo()
    with pytest.raises(PipelineError, match="unfinished build of another plan"):
        build_index(emb, tmp_path / "idx", IndexConfig(shards=4), progress=False)


def _nprobe(path: Path) -> int:
    import faiss

    return faiss.extract_index_ivf(faiss.read_index(str(path))).nprobe


def test_search_settings_given_to_index_are_kept_in_the_index_and_a_search_may_override_them(tmp_path, vectors,
                                                                                                capsys):
    """`pipeline index ... index.nprobe=4` (it was accepted and ignored): the index file keeps nprobe 4 (each part's
    file too), index.json records it, a search given none probes 4 lists, one given its own probes those; a re-run
    asking other settings, or a resume of a killed build asking other ones, is refused; a factory without the
    setting is refused before anything is built."""
    emb = _embeddings(tmp_path / "emb", vectors, 100)
    cfg = dict(factory="IVF16,Flat", train_sample=1200)
    info = build_index(emb, tmp_path / "one", IndexConfig(**cfg, nprobe=4), progress=False)
    parts = build_index(emb, tmp_path / "parts", IndexConfig(**cfg, nprobe=4, shards=3), progress=False)
    plain = build_index(emb, tmp_path / "plain", IndexConfig(**cfg), progress=False)
    assert info["search"] == {"nprobe": 4} and parts["search"] == {"nprobe": 4} and plain["search"] == {}
    assert _nprobe(tmp_path / "one" / "index.faiss") == 4 and _nprobe(tmp_path / "plain" / "index.faiss") == 1
    assert [_nprobe(tmp_path / "parts" / p["name"] / "index.faiss") for p in parts["parts"]] == [4, 4, 4]

    q = np.random.default_rng(5).standard_normal((40, 16)).astype(np.float32)

    def ids(path, **kw):
        return load_index(path, IndexConfig(**kw) if kw else None).search(q, 10)[1]

    assert np.array_equal(ids(tmp_path / "one"), ids(tmp_path / "plain", nprobe=4))  # searched as built
    assert np.array_equal(ids(tmp_path / "parts"), ids(tmp_path / "one"))
    assert not np.array_equal(ids(tmp_path / "one"), ids(tmp_path / "plain"))  # 4 lists, not FAISS's 1
    assert np.array_equal(ids(tmp_path / "one", nprobe=1), ids(tmp_path / "plain"))  # a search's own wins
    assert np.array_equal(ids(tmp_path / "parts", nprobe=16), ids(tmp_path / "plain", nprobe=16))

    with pytest.raises(PipelineError, match="nprobe"):  # a re-run asking other settings: another request
        build_index(emb, tmp_path / "one", IndexConfig(**cfg, nprobe=8), progress=False, overwrite=False)
    build_index(emb, tmp_path / "one", IndexConfig(**cfg, nprobe=4), progress=False, overwrite=False)  # the same
    with pytest.raises(ConfigError, match=r"index.nprobe=4: the Flat index has no nprobe \(only IVF indexes do\)"):
        build_index(emb, tmp_path / "flat", IndexConfig(nprobe=4), progress=False)
    with pytest.raises(ConfigError, match=r"index.ef_search=32: the IVF16,Flat index has no efSearch"):
        build_index(emb, tmp_path / "ivf-ef", IndexConfig(**cfg, ef_search=32), progress=False)
    assert not (tmp_path / "flat").exists() and not (tmp_path / "ivf-ef").exists()
    # through the CLI as the manual shows it: `pipeline index ... index.nprobe=4`, then retrieve with none given
    assert main(["index", "--embeddings", str(emb), "--out", str(tmp_path / "cli"), "--factory", "IVF16,Flat",
                 "index.train_sample=1200", "index.nprobe=4"]) == 0
    assert "searched with nprobe 4 unless a search sets its own ->" in capsys.readouterr().out
    assert _nprobe(tmp_path / "cli" / "index.faiss") == 4
    assert main(["index", "--embeddings", str(emb), "--out", str(tmp_path / "cli-flat"), "index.nprobe=4"]) == 2
    assert not (tmp_path / "cli-flat").exists()
    build_index(emb, tmp_path / "flat-ok", IndexConfig(), progress=False)
    with pytest.raises(ConfigError, match="index.nprobe=3: the Flat index has no nprobe"):  # at search too
        load_index(tmp_path / "flat-ok", IndexConfig(nprobe=3))


def test_a_killed_build_resumed_with_other_search_settings_is_refused(tmp_path, vectors, monkeypatch):
    emb = _embeddings(tmp_path / "emb", vectors, 100)
    cfg = dict(factory="IVF16,Flat", train_sample=1200, shards=3)
    real = sharded._build_part
    built = []

    def dies_after_one(*args, **kw):
        if built:
            raise KeyboardInterrupt
        built.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(sharded, "_build_part", dies_after_one)
    with pytest.raises(KeyboardInterrupt):
        build_index(emb, tmp_path / "idx", IndexConfig(**cfg, nprobe=4), progress=False)
    monkeypatch.setattr(sharded, "_build_part", real)
    with pytest.raises(PipelineError, match="another plan .*search settings"):
        build_index(emb, tmp_path / "idx", IndexConfig(**cfg, nprobe=2), progress=False)
    info = build_index(emb, tmp_path / "idx", IndexConfig(**cfg, nprobe=4), progress=False)
    assert info["search"] == {"nprobe": 4}
