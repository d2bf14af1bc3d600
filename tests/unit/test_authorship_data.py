"""Authorship records reader and the cross-topic-open-set split."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.data.authorship import (SPLITS, SplitConfig, bundled_fortunes, load_split, read_manifest,
                                      read_records, split_records, write_split)
from pipeline.errors import InputError, PipelineError


def _synthetic(n_authors=60, n_topics=10, seed=1):
    """Authors with 1..12 texts spread over topics with skewed sizes (deterministic)."""
    import random

    rng = random.Random(seed)
    recs = []
    for a in range(n_authors):
        for k in range(1 + (a * 7) % 12):
            t = min(int(rng.expovariate(0.4)), n_topics - 1)
            recs.append({"text": f"text {a}-{k} about t{t}", "author": f"a{a:02d}", "topic": f"t{t}"})
    return recs


def test_reader_csv_jsonl_parquet_same_records(tmp_path):
    rows = [{"body": "hello, world", "who": "ann", "subj": "x"}, {"body": "line\nbreak", "who": "bob", "subj": "y"}]
    (tmp_path / "r.csv").write_text('body,who,subj\n"hello, world",ann,x\n"line\nbreak",bob,y\n')
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "r.parquet")
    cfg = SplitConfig(text_column="body", author_column="who", topic_column="subj")
    want = [{"text": "hello, world", "author": "ann", "topic": "x"}, {"text": "line\nbreak", "author": "bob", "topic": "y"}]
    for name in ("r.csv", "r.jsonl", "r.parquet"):
        assert read_records(tmp_path / name, cfg) == want


@pytest.mark.parametrize("name,content,line,reason", [
    ("a.jsonl", '{"text": "a", "author": "x", "topic": "t"}\n{"text": "b", "topic": "t"}\n', 2, "missing field 'author'"),
    ("b.jsonl", '{"text": "a", "author": "x", "topic": "t"}\n{"text": "  ", "author": "x", "topic": "t"}\n', 2,
     "empty text"),
    ("c.jsonl", '{"text": "a", "author": "x", "topic": "t"}\n{oops\n', 2, "invalid JSON"),
    ("d.csv", "text,author,topic\na,x,t\n,y,t\n", 3, "empty text"),
    ("e.csv", "text,author\na,x\n", 1, "missing column(s) 'topic'"),
    ("g.csv", 'text,author,topic\n"multi\nline",x,t\nb,,t\n', 4, "empty author"),
])
def test_reader_errors_name_file_and_line(tmp_path, name, content, line, reason):
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(InputError) as e:
        read_records(p)
    assert e.value.line == line and reason in e.value.reason and str(p) in str(e.value)


def test_reader_bad_utf8_names_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b'{"text": "a", "author": "x", "topic": "t"}\n{"text": "\xff", "author": "x", "topic": "t"}\n')
    with pytest.raises(InputError) as e:
        read_records(p)
    assert e.value.line == 2 and "UTF-8" in e.value.reason


def test_reader_parquet_row_number(tmp_path):
    p = tmp_path / "r.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "a", "author": "x", "topic": "t"},
                                         {"text": "b", "author": None, "topic": "t"}]), p)
    with pytest.raises(InputError) as e:
        read_records(p)
    assert e.value.line == 2


def test_split_relations_hold():
    recs = _synthetic()
    cfg = SplitConfig(author_fraction=0.3, topic_fraction=0.3, seed=3)
    splits, stats = split_records(recs, cfg)
    train_portion = splits["train"] + splits["val"]
    seen_a = {r["author"] for r in train_portion}
    seen_t = {r["topic"] for r in train_portion}
    by_a, by_t = Counter(r["author"] for r in recs), Counter(r["topic"] for r in recs)
    top_a = sorted(by_a, key=lambda k: (-by_a[k], k))[:18]
    top_t = sorted(by_t, key=lambda k: (-by_t[k], k))[:3]
    # training portion: top authors x top topics only, 80 % of the candidates
    assert all(r["author"] in top_a and r["topic"] in top_t for r in train_portion)
    n_cand = sum(1 for r in recs if r["author"] in top_a and r["topic"] in top_t)
    assert len(train_portion) == round(0.8 * n_cand)
    for name in ("cross_topic_test", "same_topic_test"):
        assert splits[name] and not {r["author"] for r in splits[name]} & seen_a  # unseen authors
    assert not {r["topic"] for r in splits["cross_topic_test"]} & seen_t      # unseen topics
    assert {r["topic"] for r in splits["same_topic_test"]} <= seen_t          # seen topics
    assert len(splits["val"]) == len(splits["cross_topic_test"])
    # every record of an unseen author lands in exactly one test split; no record twice
    unseen = [r for r in recs if r["author"] not in seen_a]
    assert len(unseen) == len(splits["cross_topic_test"]) + len(splits["same_topic_test"])
    # file order kept
    for name in SPLITS:
        idx = [recs.index(r) for r in splits[name]]
        assert idx == sorted(idx)
    assert stats["train"]["texts"] == len(splits["train"])
    # deterministic given the seed, different for another seed
    assert split_records(recs, cfg)[0] == splits
    assert split_records(recs, SplitConfig(author_fraction=0.3, topic_fraction=0.3, seed=4))[0] != splits


def test_split_too_small_names_threshold():
    recs = _synthetic()
    with pytest.raises(PipelineError, match="topic_fraction"):
        split_records(recs, SplitConfig(author_fraction=0.3, topic_fraction=1.0))  # no unseen topic left


def test_write_split_and_manifest(tmp_path):
    src = tmp_path / "recs.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in _synthetic()) + "\n")
    m = write_split(src, tmp_path / "split", SplitConfig(author_fraction=0.3, topic_fraction=0.3), progress=False)
    man = read_manifest(tmp_path / "split")
    assert man == m and len(man["source_sha256"]) == 64 and man["config"]["seed"] == 0
    for name in SPLITS:
        rows = load_split(tmp_path / "split", name)
        assert pq.read_schema(tmp_path / "split" / f"{name}.parquet").names == ["text", "author", "topic"]
        assert man["counts"][name]["texts"] == len(rows)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "mine.txt").write_text("x")
    with pytest.raises(PipelineError, match="refusing"):
        write_split(src, tmp_path / "other", progress=False)


def test_bundled_fortunes():
    recs = read_records(bundled_fortunes())
    assert 7000 < len(recs) < 8000
    per_author = Counter(r["author"] for r in recs)
    assert 150 < sum(1 for c in per_author.values() if c >= 5) < 260
    splits, _ = split_records(recs, SplitConfig(author_fraction=0.1, topic_fraction=0.4))
    assert all(splits[k] for k in SPLITS)


def test_vectorizer_fitted_on_train_only_and_persisted(tmp_path):
    from pipeline.data.authorship import fit_vectorizer_on, vectorizer

    src = tmp_path / "recs.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in _synthetic()) + "\n")
    d = tmp_path / "split"
    write_split(src, d, SplitConfig(author_fraction=0.3, topic_fraction=0.3), progress=False)
    v = vectorizer(d, "tfidf")
    analyze = v._v.build_analyzer()
    train_words = {w for r in load_split(d, "train") for w in analyze(r["text"])}
    vocab = set(v._v.vocabulary_)
    assert vocab == train_words
    # a token only in the cross-topic test is not in the vocabulary (fitted on train only)
    test_only = {w for r in load_split(d, "cross_topic_test") for w in analyze(r["text"])} - train_words
    assert test_only and not (test_only & vocab)
    meta = json.loads((d / "vectorizers" / "tfidf.json").read_text())
    assert meta["fitted_on"] == "train" and meta["sha256"] == v.sha256
    assert vectorizer(d, "tfidf").sha256 == v.sha256  # loaded, not refitted
    for split in ("val", "cross_topic_test", "same_topic_test"):
        with pytest.raises(PipelineError, match="training split only"):
            fit_vectorizer_on(load_split(d, split), split)
    # a tampered pickle is refused
    (d / "vectorizers" / "tfidf.pkl").write_bytes(b"x" + (d / "vectorizers" / "tfidf.pkl").read_bytes())
    with pytest.raises(PipelineError, match="sha256"):
        vectorizer(d, "tfidf")
    sim = vectorizer(d, "bow").similarity(["text about", "about text", "zzz"])
    assert abs(sim[0, 1] - 1) < 1e-6 and sim.shape == (3, 3)
