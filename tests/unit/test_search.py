"""The Python search API (no CLI, no Ray) against `pipeline retrieve`, and the pyserini layout."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import numpy as np
import pytest

from pipeline.config import ModelConfig
from pipeline.errors import ConfigError, PipelineError
from pipeline.models import BiEncoder
from pipeline.search import QueryEncoder, Searcher, export_pyserini

PASSAGES = {
    "p1": "Lists are mutable sequences; sort them in place with list.sort().",
    "p2": "Tuples are immutable sequences, typically used for heterogeneous data.",
    "p3": "A dictionary maps hashable keys to values.",
    "p4": "Use sorted() to get a new sorted list from any iterable.",
    "p5": "Sets hold unique elements and support union and intersection.",
    "p6": "Strings are immutable sequences of Unicode code points.",
    "p7": "Generators produce values lazily with yield.",
}
QUERIES = {"q1": "how do I sort a list", "q2": "what is a tuple", "q3": "unique elements", "q4": "lazy values"}


@pytest.fixture(scope="module")
def index_dir(tiny_model_dir, tmp_path_factory):
    """An index folder as `pipeline index` writes it, built in-process from BiEncoder.embed vectors."""
    import faiss

    cfg = ModelConfig(name_or_path=str(tiny_model_dir), pooling="mean", normalize=True,
                      query_prefix="query: ", doc_prefix="passage: ")
    model = BiEncoder.load(cfg)
    resolved = replace(model.cfg, pooling=model.pooling, normalize=model.normalize)
    pids = list(PASSAGES)
    vecs = model.embed([PASSAGES[p] for p in pids], "doc")
    index = faiss.IndexFlatIP(vecs.shape[1])
    index.add(vecs)
    out = tmp_path_factory.mktemp("search") / "index"
    out.mkdir()
    faiss.write_index(index, str(out / "index.faiss"))
    (out / "pids.txt").write_text("".join(p + "\n" for p in pids), encoding="utf-8")
    (out / "index.json").write_text(json.dumps({
        "factory": "Flat", "metric": "ip", "ntotal": len(pids), "dim": int(vecs.shape[1]),
        "model_config": asdict(resolved), "model": {"path": str(tiny_model_dir)}, "corpus_fingerprint": "test"}))
    return out


@pytest.fixture(scope="module")
def cli_run(index_dir, tmp_path_factory):
    """What `pipeline retrieve` writes for QUERIES: {qid: [(docid, score), ...]}."""
    from pipeline.cli import main

    d = tmp_path_factory.mktemp("cli")
    (d / "queries.tsv").write_text("".join(f"{q}\t{t}\n" for q, t in QUERIES.items()), encoding="utf-8")
    try:
        main(["retrieve", "--index", str(index_dir), "--queries", str(d / "queries.tsv"), "--out", str(d / "run.trec"),
              "--top-k", "5"])
    except SystemExit as e:
        assert not e.code
    run: dict[str, list] = {}
    for line in (d / "run.trec").read_text().splitlines():
        qid, _, docid, _, score, _ = line.split()
        run.setdefault(qid, []).append((docid, float(score)))
    return run


def _same(hits, expected):
    assert [d for d, _ in hits] == [d for d, _ in expected]
    np.testing.assert_allclose([s for _, s in hits], [s for _, s in expected], atol=2e-6)


def test_batch_search_equals_the_cli_run(index_dir, cli_run):
    searcher = Searcher(index_dir, device="cpu")
    got = searcher.batch_search(list(QUERIES.values()), k=5, qids=list(QUERIES))
    assert set(got) == set(cli_run) == set(QUERIES)
    for qid in QUERIES:
        _same(got[qid], cli_run[qid])
    as_list = searcher.batch_search(list(QUERIES.values()), k=5)
    assert [h for h in as_list] == [got[q] for q in QUERIES]


def test_search_one_query_and_k(index_dir, cli_run):
    searcher = Searcher(index_dir)
    _same(searcher.search(QUERIES["q2"], k=5), cli_run["q2"])
    assert len(searcher.search("anything", k=3)) == 3
    assert len(searcher.search("anything", k=100)) == len(PASSAGES)  # fewer than k exist: no -1 rows
    assert searcher.search("sort a list", 1)[0][0] in PASSAGES
    assert len(searcher) == len(PASSAGES) and searcher.docids == list(PASSAGES)


def test_the_recorded_model_settings_are_used(index_dir, tiny_model_dir):
    """With no model given, the prefixes/pooling the corpus was encoded with encode the queries."""
    searcher = Searcher(index_dir)
    assert searcher.model.cfg.query_prefix == "query: " and searcher.model.pooling == "mean"
    plain = BiEncoder.load(ModelConfig(name_or_path=str(tiny_model_dir)))  # CLS, no prefix: other vectors
    assert not np.allclose(plain.embed(["what is a tuple"], "query"), searcher.encode(["what is a tuple"]), atol=1e-3)
    mine = Searcher(index_dir, model=searcher.model)  # an already loaded model is used as is
    np.testing.assert_array_equal(mine.encode(["x"]), searcher.encode(["x"]))


def test_misuse_is_a_clear_error(index_dir, tmp_path):
    searcher = Searcher(index_dir)
    with pytest.raises(ConfigError, match="k must be"):
        searcher.search("q", k=0)
    with pytest.raises(ConfigError, match="batch_search"):
        searcher.search(["a", "b"])
    with pytest.raises(ConfigError, match="list of query strings"):
        searcher.batch_search("one string")
    with pytest.raises(ConfigError, match="qids"):
        searcher.batch_search(["a", "b"], qids=["x"])
    from pipeline.models.tiny import build_tiny_bert

    wide = build_tiny_bert(tmp_path / "wide", hidden=48)
    with pytest.raises(PipelineError, match="48-dimensional"):
        Searcher(index_dir, model=str(wide))
    with pytest.raises(PipelineError, match="no index here"):
        Searcher(tmp_path / "nothing")


def test_pyserini_export_opens_as_pyserini_does(index_dir, tmp_path):
    import faiss

    out = export_pyserini(index_dir, tmp_path / "pyserini")
    assert sorted(p.name for p in out.iterdir()) == ["docid", "index", "pipeline_export.json"]
    # pyserini's FaissSearcher.load_index / load_docids, verbatim in behaviour
    index = faiss.read_index(str(out / "index"))
    docids = [line.rstrip() for line in open(out / "docid").readlines()]
    assert docids == list(PASSAGES) and index.ntotal == len(docids)
    encoder = QueryEncoder(index_dir=index_dir)  # pyserini-style query encoder (encode -> (D,))
    q = encoder.encode(QUERIES["q1"])
    assert q.shape == (index.d,)
    scores, rows = index.search(q.reshape(1, -1).astype("float32"), 5)
    _same([(docids[r], float(s)) for s, r in zip(scores[0], rows[0])], Searcher(index_dir).search(QUERIES["q1"], 5))
    # and our Searcher opens the pyserini folder too, model taken from the export record
    _same(Searcher(out).search(QUERIES["q1"], 5), Searcher(index_dir).search(QUERIES["q1"], 5))


def test_pyserini_export_in_place_and_refusals(index_dir, tmp_path):
    import shutil

    here = tmp_path / "idx"
    shutil.copytree(index_dir, here)
    assert export_pyserini(here) == here
    assert {"index", "docid", "index.faiss", "pids.txt", "index.json"} <= {p.name for p in here.iterdir()}
    _same(Searcher(here).search("a tuple", 3), Searcher(index_dir).search("a tuple", 3))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(PipelineError):
        export_pyserini(index_dir, foreign)
    assert (foreign / "notes.txt").read_text() == "mine"
    out = export_pyserini(index_dir, tmp_path / "again")
    with pytest.raises(PipelineError, match="--overwrite"):
        export_pyserini(index_dir, out)
    export_pyserini(index_dir, out, overwrite=True)


def test_retrieve_refuses_an_empty_queries_file_and_a_broken_query_model(index_dir, tiny_model_dir, tmp_path, capsys):
    """An empty queries file is an error, not an empty run; a query model that cannot load is one line."""
    import shutil

    from pipeline.cli import main

    empty = tmp_path / "empty.tsv"
    empty.write_text("\n")
    assert main(["retrieve", "--index", str(index_dir), "--queries", str(empty), "--out", str(tmp_path / "r.trec")]) == 2
    assert f"error: {empty}: no queries" in capsys.readouterr().err
    assert not (tmp_path / "r.trec").exists()

    broken = tmp_path / "model"
    shutil.copytree(tiny_model_dir, broken)
    for p in broken.glob("*.safetensors"):
        p.write_bytes(p.read_bytes()[:100])
    (tmp_path / "q.tsv").write_text("q1\tsort a list\n")
    assert main(["retrieve", "--index", str(index_dir), "--queries", str(tmp_path / "q.tsv"), "--out",
                 str(tmp_path / "r.trec"), "--model", str(broken)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: model folder {broken}: cannot load the model: a weights file") and "Traceback" not in err
    assert not (tmp_path / "r.trec").exists()


def _index_variant(index_dir, tmp_path, name: str, **meta) -> "Path":
    """A copy of the index folder whose index.json says other things (documents' precision, model record)."""
    import shutil

    out = tmp_path / name
    shutil.copytree(index_dir, out)
    data = json.loads((out / "index.json").read_text())
    data.update(meta)
    (out / "index.json").write_text(json.dumps(data))
    return out


def _run_of(index, tmp_path, tag: str) -> dict:
    from pipeline.cli import main

    (tmp_path / "q.tsv").write_text("".join(f"{q}\t{t}\n" for q, t in QUERIES.items()), encoding="utf-8")
    try:
        main(["retrieve", "--index", str(index), "--queries", str(tmp_path / "q.tsv"), "--out",
              str(tmp_path / f"{tag}.trec"), "--top-k", "5"])
    except SystemExit as e:
        assert not e.code
    run: dict[str, list] = {}
    for line in (tmp_path / f"{tag}.trec").read_text().splitlines():
        qid, _, docid, _, score, _ = line.split()
        run.setdefault(qid, []).append((docid, float(score)))
    return run


@pytest.mark.parametrize("doc_precision", ["fp32", "bf16", "fp16", "int8", "auto"])
def test_retrieve_searcher_and_query_encoder_agree_for_every_index_precision(index_dir, tmp_path, doc_precision):
    """One way to encode a query (models/precision.query_precision): the CLI, Searcher and pyserini's
    QueryEncoder give the same top-k and scores whatever precision the documents were encoded in."""
    index = _index_variant(index_dir, tmp_path, f"idx-{doc_precision}", precision=doc_precision)
    cli = _run_of(index, tmp_path, doc_precision)
    searcher = Searcher(index, device="cpu")
    got = searcher.batch_search(list(QUERIES.values()), k=5, qids=list(QUERIES))
    enc = QueryEncoder(index_dir=index, device="cpu")
    for qid, text in QUERIES.items():
        _same(got[qid], cli[qid])
        one = enc.encode(text)  # pyserini encodes one query at a time
        np.testing.assert_allclose(one, searcher.encode([text])[0], atol=1e-6)
        scores, rows = searcher.index.search(one[None, :].astype("float32"), 5)
        _same([(searcher.docids[r], float(s)) for s, r in zip(scores[0], rows[0])], cli[qid])


def test_a_query_vector_does_not_depend_on_its_batch(index_dir):
    searcher = Searcher(index_dir, device="cpu")
    texts = list(QUERIES.values()) + ["a much longer query " * 8, "x"]
    together = searcher.encode(texts)
    for i, t in enumerate(texts):
        np.testing.assert_allclose(searcher.encode([t])[0], together[i], atol=1e-6)
    np.testing.assert_allclose(searcher.encoder.model.embed(texts, "query", batch_size=2, precision="fp32"),
                               together, atol=1e-6)


def test_the_index_finds_its_model_by_name_path_or_digest(index_dir, tiny_model_dir, tmp_path):
    import shutil

    from pipeline.models.loading import model_digest

    digest = model_digest(tiny_model_dir)
    link = tmp_path / "linked"
    link.mkdir()
    for f in tiny_model_dir.iterdir():  # a folder of symlinks to the same files: the same model
        (link / f.name).symlink_to(f)
    assert model_digest(link) == digest
    base = json.loads((index_dir / "index.json").read_text())
    moved = dict(base["model_config"], name_or_path=str(tmp_path / "gone"))
    # the path given at encode time is gone; the recorded folder holds the recorded digest: used
    ok = _index_variant(index_dir, tmp_path, "found", model_config=moved,
                        model={"name": str(tmp_path / "gone"), "path": str(link), "digest": digest})
    assert Searcher(ok).search("what is a tuple", k=1)
    # found nowhere: one error naming what was looked for and how to pass the model
    lost = _index_variant(index_dir, tmp_path, "lost", model_config=moved,
                          model={"name": "gone", "path": str(tmp_path / "gone2"), "digest": digest})
    with pytest.raises(ConfigError, match=r"is not on this machine .*retrieve --model PATH"):
        Searcher(lost)
    # found, but changed since: refused (queries from another model would be searched against the vectors)
    changed = tmp_path / "changed"
    shutil.copytree(tiny_model_dir, changed)
    (changed / "config.json").write_text((changed / "config.json").read_text() + "\n")
    assert model_digest(changed) != digest
    stale = _index_variant(index_dir, tmp_path, "stale", model_config=dict(base["model_config"], name_or_path=str(changed)),
                           model={"name": str(changed), "path": str(changed), "digest": digest})
    with pytest.raises(ConfigError, match="has changed"):
        QueryEncoder(index_dir=stale)
    Searcher(stale, model=str(changed))  # named explicitly: the caller's choice


def test_the_model_digest_covers_every_file_by_its_place(tiny_model_dir, tmp_path):
    import shutil

    from pipeline.models.loading import model_digest

    a = tmp_path / "a"
    shutil.copytree(tiny_model_dir, a)
    sub = tmp_path / "real_sub"
    sub.mkdir()
    (sub / "extra.txt").write_text("1")
    (a / "sub").symlink_to(sub, target_is_directory=True)  # a symlinked folder is followed
    d1 = model_digest(a)
    (sub / "extra.txt").write_text("2")
    d2 = model_digest(a)
    assert d1 != d2
    (a / "sub").unlink()
    (a / "other").mkdir()
    (a / "other" / "extra.txt").write_text("2")  # the same file in another place: another digest
    assert model_digest(a) not in (d1, d2)
