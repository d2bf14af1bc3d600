"""pipeline.data.training: streaming DPR JSON, DPR/qrels examples, and build_examples reuse."""

from __future__ import annotations

import json
from dataclasses import replace
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.data.ingest import ingest
from pipeline.data.training import (EXAMPLES_META, build_examples, dpr_json_examples, iter_json_array, read_examples_table,
                                    qrels_examples)
from pipeline.errors import InputError
from pipeline.train.config import TrainDataConfig


def _ctx(title, text, pid):
    return {"title": title, "text": text, "passage_id": pid, "score": 1.0}


DPR = [
    {"dataset": "nq", "question": "who wrote hamlet", "answers": ["Shakespeare"],
     "positive_ctxs": [_ctx("Hamlet", "Hamlet is a tragedy by Shakespeare.", "1"), _ctx("X", "second pos", "9")],
     "negative_ctxs": [_ctx("Cats", "Cats purr.", "2")],
     "hard_negative_ctxs": [_ctx("Macbeth", "Macbeth is a tragedy.", "3"), _ctx("", "untitled hard", "4")]},
    {"dataset": "nq", "question": "no positive here", "answers": ["x"],
     "positive_ctxs": [], "negative_ctxs": [_ctx("A", "a", "5")], "hard_negative_ctxs": []},
    {"dataset": "nq", "question": "capital of france", "answers": ["Paris"],
     "positive_ctxs": [_ctx("Paris", "Paris is the capital of France. {braces} \"quotes\" [brackets], commas",
                            "6")],
     "negative_ctxs": [_ctx("Lyon", "Lyon is a city.", "7")],
     "hard_negative_ctxs": []},
    {"id": "custom-id", "question": "unicode é ü 漢字", "answers": ["y"],
     "positive_ctxs": [_ctx("Ünï", "text with\nnewline", "8")], "negative_ctxs": [], "hard_negative_ctxs": []},
]


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("layout", ["pretty", "compact"])
@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_iter_json_array_streams_objects_and_lines(tmp_path, layout, chunk):
    if layout == "pretty":
        text = json.dumps(DPR, indent=2, ensure_ascii=False)
        # each top-level element starts on a line that is exactly "  {"
        want_lines = [no for no, line in enumerate(text.split("\n"), 1) if line == "  {"]
    else:
        text = json.dumps(DPR, ensure_ascii=False)
        want_lines = [1] * len(DPR)
    assert len(want_lines) == len(DPR)
    path = _write(tmp_path / "train.json", text + "\n")
    got = list(iter_json_array(path, chunk_size=chunk))
    assert [i for i, _, _ in got] == list(range(len(DPR)))
    assert [o for _, _, o in got] == DPR
    assert [line for _, line, _ in got] == want_lines


def test_iter_json_array_edge_cases(tmp_path):
    assert list(iter_json_array(_write(tmp_path / "e.json", "[]"), chunk_size=1)) == []
    assert list(iter_json_array(_write(tmp_path / "w.json", "\n\n  [ \n ]\n"), chunk_size=2)) == []
    got = list(iter_json_array(_write(tmp_path / "n.json", '\n[{"a": 1},\n\n{"b": 2}]'), chunk_size=3))
    assert got == [(0, 2, {"a": 1}), (1, 4, {"b": 2})]
    with pytest.raises(InputError, match="file not found"):
        list(iter_json_array(tmp_path / "missing.json"))


@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_iter_json_array_malformed_names_the_line(tmp_path, chunk):
    text = ('[\n'
            '  {"question": "q1", "positive_ctxs": []},\n'
            '  {"question": "q2",\n'
            '   "positive_ctxs": [] "oops": 1},\n'   # line 4: missing comma
            '  {"question": "q3"}\n'
            ']\n')
    path = _write(tmp_path / "bad.json", text)
    it = iter_json_array(path, chunk_size=chunk)
    assert next(it)[2] == {"question": "q1", "positive_ctxs": []}  # streamed before the error
    with pytest.raises(InputError) as e:
        next(it)
    assert e.value.line == 4 and "invalid JSON" in e.value.reason and e.value.path == str(path)


def test_iter_json_array_unterminated(tmp_path):
    with pytest.raises(InputError) as e:
        list(iter_json_array(_write(tmp_path / "t.json", '[\n{"a": 1},\n{"b": '), chunk_size=4))
    assert e.value.line == 3
    with pytest.raises(InputError, match="unterminated"):
        list(iter_json_array(_write(tmp_path / "t2.json", '[\n{"a": 1},\n'), chunk_size=4))


@pytest.mark.parametrize("text", ['{"question": "q"}', 'question,answers\n', '  "x"', ",[]"])
def test_iter_json_array_needs_an_array(tmp_path, text):
    with pytest.raises(InputError) as e:
        list(iter_json_array(_write(tmp_path / "o.json", text)))
    assert e.value.line == 1 and "[" in e.value.reason


def test_iter_json_array_elements_must_be_objects(tmp_path):
    with pytest.raises(InputError, match="JSON object") as e:
        list(iter_json_array(_write(tmp_path / "l.json", '[{"a": 1},\n [1, 2]]')))
    assert e.value.line == 2


def test_dpr_json_examples_hard_with_fallback_and_skips(tmp_path):
    path = _write(tmp_path / "train.json", json.dumps(DPR, indent=2))
    skipped: dict = {}
    ex = list(dpr_json_examples(path, negatives="hard", skipped=skipped))
    assert skipped == {"no_positive": 1}
    assert [e["query"] for e in ex] == ["who wrote hamlet", "capital of france", "unicode é ü 漢字"]
    assert [e["qid"] for e in ex] == ["0", "2", "custom-id"]  # array index unless the example has an id
    # positive: the first positive ctx, title-joined
    assert ex[0]["positive"] == "Hamlet [SEP] Hamlet is a tragedy by Shakespeare."
    assert ex[2]["positive"] == "Ünï [SEP] text with\nnewline"
    # hard negatives, an empty title leaves no dangling separator
    assert ex[0]["negatives"] == ["Macbeth [SEP] Macbeth is a tragedy.", "untitled hard"]
    # no hard negatives -> falls back to negative_ctxs
    assert ex[1]["negatives"] == ["Lyon [SEP] Lyon is a city."]
    assert ex[2]["negatives"] == []


def test_dpr_json_examples_random_both_and_join(tmp_path):
    path = _write(tmp_path / "train.json", json.dumps(DPR))
    rand = list(dpr_json_examples(path, negatives="random"))
    assert rand[0]["negatives"] == ["Cats [SEP] Cats purr."]
    both = list(dpr_json_examples(path, negatives="both"))
    assert both[0]["negatives"] == ["Macbeth [SEP] Macbeth is a tragedy.", "untitled hard", "Cats [SEP] Cats purr."]
    assert both[1]["negatives"] == ["Lyon [SEP] Lyon is a city."]
    plain = list(dpr_json_examples(path, join="none"))
    assert plain[0]["positive"] == "Hamlet is a tragedy by Shakespeare."
    spaced = list(dpr_json_examples(path, join="{title} {text}"))
    assert spaced[0]["positive"] == "Hamlet Hamlet is a tragedy by Shakespeare."


def test_dpr_json_examples_missing_fields(tmp_path):
    path = _write(tmp_path / "bad.json", '[\n{"question": "q", "positive_ctxs": [{"title": "t", "text": "x"}]},\n'
                                        '{"answers": []}\n]')
    with pytest.raises(InputError) as e:
        list(dpr_json_examples(path))
    assert e.value.line == 3 and "example 1" in e.value.reason


# --------------------------------------------------------------------------- qrels + corpus


CORPUS = {f"p{i}": f"passage text number {i}" for i in range(1, 10)}
QUERIES = {"q1": "first query", "q2": "second query"}
QRELS = ("q1 0 p1 1\n"
         "q1 0 p2 2\n"
         "q1 0 p3 0\n"      # judged, not relevant: never a negative either
         "q2 0 p4 1\n"
         "q3 0 p5 0\n")     # a query with no relevant passage and no text: ignored
RUN = ("q1 Q0 p3 1 9.0 bm25\n"   # judged (rel 0) -> excluded
       "q1 Q0 p1 2 8.0 bm25\n"   # positive -> excluded
       "q1 Q0 p5 3 7.0 bm25\n"
       "q1 Q0 p6 4 6.0 bm25\n"
       "q1 Q0 p7 5 5.0 bm25\n"   # beyond depth 4
       "q2 Q0 p8 1 3.0 bm25\n"
       "q2 Q0 p4 2 2.0 bm25\n"   # positive -> excluded
       "q2 Q0 p1 3 1.0 bm25\n"   # relevant for q1, not judged for q2 -> a negative for q2
       "q9 Q0 p9 1 1.0 bm25\n")  # not a training query: ignored


@pytest.fixture()
def corpus(tmp_path):
    src = _write(tmp_path / "collection.tsv", "".join(f"{p}\t{t}\n" for p, t in CORPUS.items()))
    queries = _write(tmp_path / "queries.tsv", "".join(f"{q}\t{t}\n" for q, t in QUERIES.items()))
    qrels = _write(tmp_path / "qrels.train.trec", QRELS)
    out = tmp_path / "corpus"
    # q3 has no text: ingest drops (and counts) its judgement; qrels_examples reads the raw file below
    ingest([src], "msmarco", out, variant="custom", queries=queries, qrels={"train": qrels},
           on_unknown_qrels="skip", progress=False)
    run = _write(tmp_path / "bm25.trec", RUN)
    return {"dir": out, "queries": queries, "qrels": qrels, "run": run}


def test_qrels_examples_one_per_relevant_pair_and_clean_negatives(corpus):
    ex = list(qrels_examples(corpus["dir"], corpus["queries"], corpus["qrels"], corpus["run"], depth=4))
    assert [(e["qid"], e["positive"]) for e in ex] == [
        ("q1", CORPUS["p1"]), ("q1", CORPUS["p2"]), ("q2", CORPUS["p4"])]
    assert all(e["query"] == QUERIES[e["qid"]] for e in ex)
    assert ex[0]["negatives"] == ex[1]["negatives"] == [CORPUS["p5"], CORPUS["p6"]]
    assert ex[2]["negatives"] == [CORPUS["p8"], CORPUS["p1"]]
    judged = {"q1": {"p1", "p2", "p3"}, "q2": {"p4"}}
    for e in ex:
        assert not {CORPUS[p] for p in judged[e["qid"]]} & set(e["negatives"])


def test_qrels_examples_depth_cap_level_and_no_run(corpus):
    deep = list(qrels_examples(corpus["dir"], corpus["queries"], corpus["qrels"], corpus["run"], depth=100))
    assert deep[0]["negatives"] == [CORPUS["p5"], CORPUS["p6"], CORPUS["p7"]]
    capped = list(qrels_examples(corpus["dir"], corpus["queries"], corpus["qrels"], corpus["run"], depth=100,
                                 max_negatives=1))
    assert capped[0]["negatives"] == [CORPUS["p5"]]
    shallow = list(qrels_examples(corpus["dir"], corpus["queries"], corpus["qrels"], corpus["run"], depth=1))
    assert [e["negatives"] for e in shallow] == [[], [], [CORPUS["p8"]]]
    level2 = list(qrels_examples(corpus["dir"], corpus["queries"], corpus["qrels"], rel_level=2))
    assert [(e["qid"], e["positive"], e["negatives"]) for e in level2] == [("q1", CORPUS["p2"], [])]


def test_qrels_examples_query_missing_from_queries(corpus, tmp_path):
    qrels = _write(tmp_path / "more.trec", "q1 0 p1 1\nq7 0 p2 1\n")
    with pytest.raises(InputError) as e:
        list(qrels_examples(corpus["dir"], corpus["queries"], qrels))
    assert e.value.line == 2 and "q7" in e.value.reason


def test_qrels_examples_passage_missing_from_corpus(corpus, tmp_path):
    from pipeline.errors import PipelineError

    run = _write(tmp_path / "r.trec", "q1 Q0 nope 1 1.0 x\n")
    with pytest.raises(PipelineError, match="nope"):
        list(qrels_examples(corpus["dir"], corpus["queries"], corpus["qrels"], run))


# --------------------------------------------------------------------------- build_examples


def _rows(out: Path) -> list[dict]:
    return read_examples_table(out).to_pylist()


def test_build_examples_dpr_json_reuse_and_rebuild(tmp_path):
    src = _write(tmp_path / "train.json", json.dumps(DPR, indent=2))
    cfg = TrainDataConfig(source="dpr-json", path=str(src))
    out = tmp_path / "examples"
    meta = build_examples(cfg, out, progress=False)
    assert meta["examples"] == 3 and meta["skipped"] == {"no_positive": 1}
    rows = _rows(out)
    assert [r["idx"] for r in rows] == [0, 1, 2]
    assert rows[0]["positive"] == "Hamlet [SEP] Hamlet is a tragedy by Shakespeare."
    assert json.loads((out / EXAMPLES_META).read_text()) == meta

    stamp = os.stat(out / EXAMPLES_META).st_mtime_ns
    again = build_examples(cfg, out, progress=False)
    assert again == meta
    assert os.stat(out / EXAMPLES_META).st_mtime_ns == stamp  # reused, not rewritten

    # a changed option rebuilds
    both = build_examples(TrainDataConfig(source="dpr-json", path=str(src), negatives="both"), out, progress=False)
    assert both["negatives"] == "both"
    assert _rows(out)[0]["negatives"][-1] == "Cats [SEP] Cats purr."

    # a changed source file rebuilds (same size and name, different bytes)
    changed = json.loads(json.dumps(DPR))
    changed[1]["positive_ctxs"] = [_ctx("Now", "has one", "10")]
    _write(src, json.dumps(changed, indent=2))
    rebuilt = build_examples(TrainDataConfig(source="dpr-json", path=str(src), negatives="both"), out, progress=False)
    assert rebuilt["examples"] == 4 and rebuilt["skipped"] == {}
    assert rebuilt["sources_sha256"] != both["sources_sha256"]
    assert len(_rows(out)) == 4


def test_build_examples_qrels_defaults_reuse_and_run_change(corpus, tmp_path):
    cfg = TrainDataConfig(source="qrels", corpus=str(corpus["dir"]), negatives_run=str(corpus["run"]),
                          negatives_depth=4)
    out = tmp_path / "ex"
    meta = build_examples(cfg, out, progress=False)   # queries.tsv and qrels/train.trec of the corpus
    assert meta["examples"] == 3 and meta["variant"] == "custom"
    rows = _rows(out)
    assert [(r["qid"], r["negatives"]) for r in rows] == [
        ("q1", [CORPUS["p5"], CORPUS["p6"]]), ("q1", [CORPUS["p5"], CORPUS["p6"]]), ("q2", [CORPUS["p8"], CORPUS["p1"]])]
    stamp = os.stat(out / EXAMPLES_META).st_mtime_ns
    assert build_examples(cfg, out, progress=False) == meta
    assert os.stat(out / EXAMPLES_META).st_mtime_ns == stamp
    _write(corpus["run"], RUN.replace("q2 Q0 p8 1", "q2 Q0 p9 1"))
    build_examples(cfg, out, progress=False)
    assert os.stat(out / EXAMPLES_META).st_mtime_ns != stamp
    assert _rows(out)[2]["negatives"] == [CORPUS["p9"], CORPUS["p1"]]


@pytest.mark.parametrize("text,line", [
    ('[{"a": 1}\n {"b": 2}]', 2),          # missing comma
    ('[{"a": 1},\n,{"b": 2}]', 2),         # double comma
    ('[{"a": 1}]\n{"b": 2}', 2),           # data after the closing bracket
    ('[{"a": 1},\n {"b": oops}]', 2),      # a real error inside the buffer
])
def test_iter_json_array_rejects_bad_separators(tmp_path, text, line):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        list(iter_json_array(path, chunk_size=4))
    assert info.value.line == line


def test_iter_json_array_accepts_bom_and_empty_array(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf[ {\"a\": 1} , {\"a\": 2} ]\n")
    assert [o["a"] for _, _, o in iter_json_array(path, chunk_size=3)] == [1, 2]
    (tmp_path / "empty.json").write_text("[]")
    assert list(iter_json_array(tmp_path / "empty.json")) == []


def test_examples_without_negatives_are_skipped_when_required(tmp_path):
    path = tmp_path / "dpr.json"
    path.write_text(json.dumps([
        {"question": "q0", "answers": ["a"], "positive_ctxs": [{"title": "t", "text": "p"}],
         "negative_ctxs": [], "hard_negative_ctxs": []},
        {"question": "q1", "answers": ["a"], "positive_ctxs": [{"title": "t", "text": "p"}],
         "negative_ctxs": [{"title": "n", "text": "x"}], "hard_negative_ctxs": []},
    ]))
    skipped: dict = {}
    ex = list(dpr_json_examples(path, skipped=skipped, need_negatives=True))
    assert [e["query"] for e in ex] == ["q1"] and skipped == {"no_negatives": 1}
    assert len(list(dpr_json_examples(path, need_negatives=False))) == 2


def test_qrels_examples_from_an_interleaved_run_and_in_small_batches_are_the_same(corpus, tmp_path):
    grouped = list(qrels_examples(corpus["dir"], corpus["queries"], corpus["qrels"], corpus["run"], depth=4))
    lines = RUN.splitlines(keepends=True)
    mixed = _write(tmp_path / "mixed.trec", "".join(lines[i] for i in (5, 0, 6, 1, 2, 7, 3, 8, 4)))
    assert list(qrels_examples(corpus["dir"], corpus["queries"], corpus["qrels"], mixed, depth=4)) == grouped
    assert list(qrels_examples(corpus["dir"], corpus["queries"], corpus["qrels"], corpus["run"], depth=4,
                               batch=1)) == grouped
    assert not list(tmp_path.glob(".passages-*")) and not list(corpus["dir"].parent.glob(".passages-*"))


def test_qrels_examples_memory_does_not_grow_with_run_depth_or_corpus_size(tmp_path, monkeypatch):
    import random
    import tracemalloc

    # the run is read in blocks: make both runs span many, so what grows with the file would show
    monkeypatch.setattr("pipeline.data.run_table.BLOCK_BYTES", 1 << 15)

    rng = random.Random(0)
    n_q = 300

    def build(tag: str, depth: int, n_p: int) -> int:
        d = tmp_path / tag
        d.mkdir()
        src = _write(d / "collection.tsv", "".join(
            f"p{i}\t{' '.join(f'w{rng.randrange(999)}' for _ in range(20))}\n" for i in range(n_p)))
        queries = _write(d / "queries.tsv", "".join(f"q{i}\tquery {i}\n" for i in range(n_q)))
        qrels = _write(d / "qrels.trec", "".join(f"q{i} 0 p{i} 1\n" for i in range(n_q)))
        run = _write(d / "run.trec", "".join(f"q{i} Q0 p{(i * 7 + r + 1) % n_p} {r + 1} {1000 - r} t\n"
                                             for i in range(n_q) for r in range(depth)))
        ingest([src], "msmarco", d / "corpus", variant="custom", progress=False)
        tracemalloc.start()
        try:
            for ex in qrels_examples(d / "corpus", queries, qrels, run, depth=depth, max_negatives=5, batch=50):
                assert len(ex["negatives"]) == 5
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small = build("small", depth=20, n_p=3_000)
    big = build("big", depth=200, n_p=30_000)  # 10x the run's lines, 10x the corpus
    assert big < 1.5 * small, (small, big)


@pytest.mark.slow
def test_examples_built_in_a_child_process_equal_the_in_process_ones(corpus, tmp_path):
    """data.build_apart: the child's examples are the same files; its errors are raised here as they are."""
    from pipeline.errors import InputError
    from pipeline.train.config import load_train_config
    from pipeline.train.trainer import _build_apart, _build_examples_in_child

    job = load_train_config(None, [f"data.corpus={corpus['dir']}", f"data.queries={corpus['queries']}",
                                   f"data.qrels={corpus['qrels']}", f"data.negatives_run={corpus['run']}",
                                   "data.negatives_depth=4", "loss.name=dpr", "train.name=x"])
    assert not _build_apart(job.data)  # a few bytes of sources: built in this process
    assert _build_apart(replace(job.data, build_apart="yes")) and not _build_apart(replace(job.data, build_apart="no"))
    here = build_examples(job.data, tmp_path / "here", progress=False)
    meanwhile = []  # what the driver does while the child builds (Ray starts)
    there = _build_examples_in_child(job, tmp_path / "there", progress=False, meanwhile=lambda: meanwhile.append(1))
    assert there["digest"] == here["digest"] and there["examples"] == here["examples"] == 3 and meanwhile == [1]

    def fails():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # the driver stops while the child builds: the child stops too
        _build_examples_in_child(job, tmp_path / "stopped", progress=False, meanwhile=fails)
    assert not (tmp_path / "stopped").exists() and not list(tmp_path.glob(".build-*"))
    bad = replace(job, data=replace(job.data, qrels=str(tmp_path / "missing.trec")))
    with pytest.raises(InputError, match="missing.trec: file not found"):
        _build_examples_in_child(bad, tmp_path / "bad", progress=False)
    assert not (tmp_path / "bad").exists() and not list(tmp_path.glob(".build-*"))


def test_qrels_examples_are_stored_as_passage_rows_with_each_text_once(corpus, tmp_path):
    """The ids form: the parts name rows of passages.arrow, each passage's text is stored once however
    many examples name it, and every reader sees exactly the texts `qrels_examples` gives."""
    import pyarrow as pa

    from pipeline.data.corpus import PassageTexts
    from pipeline.data.training import PASSAGES_FILE, iter_example_tables

    cfg = TrainDataConfig(source="qrels", corpus=str(corpus["dir"]), negatives_run=str(corpus["run"]),
                          negatives_depth=4)
    out = tmp_path / "ex"
    meta = build_examples(cfg, out, progress=False)
    assert meta["form"] == "ids" and meta["passages"] == PASSAGES_FILE
    assert not list(tmp_path.glob(".passages-*")) and not list(tmp_path.glob(".tmp-*"))  # no scratch left
    parts = pa.concat_tables([pq.read_table(p) for p in sorted(out.glob("part-*.parquet"))])
    assert parts.column_names == ["idx", "qid", "query", "positive_row", "negative_rows"]  # no text in the parts
    store = PassageTexts(out / PASSAGES_FILE)
    named = {r["positive_row"] for r in parts.to_pylist()} | {n for r in parts.to_pylist() for n in r["negative_rows"]}
    assert len(store) == meta["passages_rows"] == len(named) == 6  # p1 p2 p4 p5 p6 p8, p5 and p6 named twice
    assert sorted(store.table["text"].to_pylist()) == sorted(CORPUS[p] for p in ("p1", "p2", "p4", "p5", "p6", "p8"))
    expected = list(qrels_examples(corpus["dir"], corpus["queries"], corpus["qrels"], corpus["run"], depth=4))
    assert [{k: r[k] for k in ("qid", "query", "positive", "negatives")} for r in _rows(out)] == expected
    assert [r["idx"] for r in _rows(out)] == [0, 1, 2]
    small = [r for t in iter_example_tables(out, batch_size=1) for r in t.to_pylist()]
    assert small == _rows(out)  # batch by batch, the same rows


def test_the_loop_reads_ids_form_examples_with_their_texts_per_rank(corpus, tmp_path):
    """The workers' file reader (train.loop._Rows): each rank its rows, with their texts."""
    from types import SimpleNamespace

    from pipeline.train.loop import _Rows

    cfg = TrainDataConfig(source="qrels", corpus=str(corpus["dir"]), negatives_run=str(corpus["run"]),
                          negatives_depth=4)
    run = tmp_path / "run"
    build_examples(cfg, run / "examples", progress=False)
    files = sorted(p.name for p in (run / "examples").glob("part-*.parquet"))
    method = SimpleNamespace(partition_key="idx")
    got = {rank: list(_Rows({"examples_files": files, "run_dir": str(run)}, method, rank, 2)) for rank in (0, 1)}
    rows = _rows(run / "examples")
    assert got == {0: [rows[0], rows[2]], 1: [rows[1]]}


@pytest.mark.slow
def test_the_passage_store_scales_with_distinct_passages_not_with_examples(tmp_path):
    """500k pairs must not carry a text per example: 200 examples naming the same 20 long passages
    store each text once (the parts hold row numbers), and 10x the examples adds no text."""
    from pipeline.data.training import PASSAGES_FILE

    text = {f"d{i}": f"passage {i} " + "word " * 2_000 for i in range(20)}  # ~10 kB each
    src = _write(tmp_path / "collection.tsv", "".join(f"{p}\t{t}\n" for p, t in text.items()))
    sizes = {}
    for n in (200, 2_000):
        queries = _write(tmp_path / f"q{n}.tsv", "".join(f"q{i}\tquery {i}\n" for i in range(n)))
        qrels = _write(tmp_path / f"qrels{n}.trec", "".join(f"q{i} 0 d{i % 20} 1\n" for i in range(n)))
        run = _write(tmp_path / f"run{n}.trec", "".join(f"q{i} Q0 d{(i + k) % 20} {k} {10 - k} x\n"
                                                        for i in range(n) for k in range(1, 10)))
        ingest([src], "msmarco", tmp_path / f"c{n}", variant="custom", progress=False)
        cfg = TrainDataConfig(source="qrels", corpus=str(tmp_path / f"c{n}"), queries=str(queries), qrels=str(qrels),
                              negatives_run=str(run), negatives_depth=9)
        out = tmp_path / f"ex{n}"
        meta = build_examples(cfg, out, progress=False)
        assert meta["examples"] == n and meta["passages_rows"] == 20
        parts = sum(p.stat().st_size for p in out.glob("part-*.parquet"))
        sizes[n] = (parts, (out / PASSAGES_FILE).stat().st_size)
        q7 = next(r for r in _rows(out) if r["qid"] == "q7")
        assert q7["positive"] == text["d7"] and q7["negatives"][:2] == [text["d8"], text["d9"]]
    texts = sum(len(t) for t in text.values())
    for parts, store in sizes.values():
        assert texts <= store < texts * 1.2  # each text once
        assert parts < texts / 4  # the parts carry ids, not texts (a texts form would be ~10x the texts)
    assert sizes[2_000][1] == sizes[200][1]


def _rewrite_store(path: Path, change) -> None:
    """Rewrite an Arrow passages file with `change(pids, texts) -> (pids, texts)`, in the same schema."""
    import pyarrow as pa

    table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    pids, texts = change(table["pid"].to_pylist(), table["text"].to_pylist())
    new = pa.table({"pid": pa.array(pids, pa.string()), "text": pa.array(texts, pa.string())})
    tmp = path.with_suffix(".new")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, new.schema) as w:
        w.write_table(new)
    os.replace(tmp, path)


@pytest.mark.parametrize("alteration", ["reversed", "edited", "truncated"])
def test_an_altered_training_store_is_refused_by_name(faq, tmp_path, alteration):
    """The store's passages rewritten in reverse order (the same rows: every query would be paired with
    another passage), texts edited, or the file truncated: a re-run or a resume refuses the store with
    one line naming it (every byte checked), and a reader refuses what it can see cheaply (sizes, the
    passages' ids in order), never a pyarrow traceback."""
    from pipeline.data.training import PASSAGES_FILE, check_store, open_passages
    from pipeline.errors import PipelineError

    cfg = TrainDataConfig(source="qrels", corpus=str(faq))
    out = tmp_path / "examples"
    meta = build_examples(cfg, out, progress=False)
    assert meta["files"][PASSAGES_FILE]["bytes"] > 0 and meta["passages_pids_sha256"]
    check_store(out, full=True)  # as built: accepted
    store = out / PASSAGES_FILE
    if alteration == "reversed":
        _rewrite_store(store, lambda p, t: (p[::-1], t[::-1]))
    elif alteration == "edited":
        _rewrite_store(store, lambda p, t: (p, [x.upper() if i < 50 else x for i, x in enumerate(t)]))
    else:
        data = store.read_bytes()
        store.write_bytes(data[: len(data) // 2])
    with pytest.raises(PipelineError, match=rf"{PASSAGES_FILE}: the training examples store was altered") as e:
        build_examples(cfg, out, progress=False)  # what a resumed or repeated run does first
    assert len(str(e.value).splitlines()) == 1 and "delete" in str(e.value)
    if alteration == "edited":  # same ids, same order, same size: only the full check can see it
        open_passages(out)
    else:
        with pytest.raises(PipelineError, match="the training examples store was altered"):
            open_passages(out)


def test_a_query_the_run_has_no_negative_for_is_skipped_or_given_random_unjudged_passages(corpus, tmp_path, capsys):
    # q1's run lines are all judged (p3 rel 0, p1 a positive); q2 is not in the run at all (BM25 matched none
    # of its words): with hard negatives both are left out by default, or drawn at random from the corpus
    run = _write(tmp_path / "thin.trec", "q1 Q0 p3 1 9.0 bm25\nq1 Q0 p1 2 8.0 bm25\n")
    cfg = TrainDataConfig(source="qrels", corpus=str(corpus["dir"]), negatives_run=str(run), hard_negatives=1)
    with pytest.raises(Exception, match="no training examples"):
        build_examples(cfg, tmp_path / "skip", progress=False)

    cfg = replace(cfg, missing_negatives="random")
    meta = build_examples(cfg, tmp_path / "random", progress=True)
    assert "3 with random negatives" in capsys.readouterr().out
    assert meta["examples"] == 3 and meta["skipped"] == {} and meta["random_negatives"] == 3
    assert meta["missing_negatives"] == "random"
    rows = _rows(tmp_path / "random")
    judged = {"q1": {"p1", "p2", "p3"}, "q2": {"p4"}}
    text_to_pid = {t: p for p, t in CORPUS.items()}
    for r in rows:
        pids = [text_to_pid[t] for t in r["negatives"]]
        assert len(pids) == len(set(pids)) == min(30, len(CORPUS) - len(judged[r["qid"]]))  # every unjudged one
        assert not set(pids) & judged[r["qid"]]
    # seeded by positives_seed and the query: the same draw again, another with another seed
    from pipeline.data.qrels_examples import random_negatives
    j = {q: tuple(v) for q, v in judged.items()}
    assert random_negatives(corpus["dir"], ["q2"], j, 3, 0)["q2"] == random_negatives(corpus["dir"], ["q1", "q2"], j, 3,
                                                                                     0)["q2"]
    draws = {random_negatives(corpus["dir"], ["q2"], j, 3, s)["q2"] for s in range(6)}
    assert len(draws) > 1 and all(len(d.split("\t")) == 3 and "p4" not in d.split("\t") for d in draws)
    # a query the run does name negatives for keeps the run's: only the missing ones are drawn
    mixed = _write(tmp_path / "mixed.trec", "q1 Q0 p5 1 9.0 bm25\n")
    meta = build_examples(replace(cfg, negatives_run=str(mixed)), tmp_path / "mixed", progress=False)
    rows = _rows(tmp_path / "mixed")
    assert meta["random_negatives"] == 1
    assert [r["negatives"] for r in rows if r["qid"] == "q1"] == [[CORPUS["p5"]], [CORPUS["p5"]]]


def test_hard_negative_overlap_counts_negatives_judged_for_a_near_duplicate_query(tmp_path, capsys):
    """scripts/hard_negative_overlap.py: q1 and q2 share 2 of their 3 judged passages (Jaccard 2/3), q3 shares
    none; q1's one hard negative (p4) is q2's positive, q3's (p1) is nobody's near-duplicate's."""
    import importlib.util

    corpus = {f"p{i}": f"text {i}" for i in range(1, 9)}
    src = _write(tmp_path / "collection.tsv", "".join(f"{p}\t{t}\n" for p, t in corpus.items()))
    queries = _write(tmp_path / "queries.tsv", "q1\tone\nq2\ttwo\nq3\tthree\n")
    qrels = _write(tmp_path / "train.trec", "q1 0 p1 1\nq1 0 p2 1\nq2 0 p1 1\nq2 0 p2 1\nq2 0 p4 1\nq3 0 p8 1\n")
    out = tmp_path / "corpus"
    ingest([src], "msmarco", out, variant="custom", queries=queries, qrels={"train": qrels}, progress=False)
    run = _write(tmp_path / "bm25.trec", "q1 Q0 p2 1 9 x\nq1 Q0 p4 2 8 x\nq3 Q0 p1 1 5 x\n")
    spec = importlib.util.spec_from_file_location("hno", Path(__file__).resolve().parents[2] / "scripts"
                                                  / "hard_negative_overlap.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--corpus", str(out), "--run", str(run), "--overlap", "0.6", "0.7"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("overlap >= 0.6: 2 of 3 training queries have a near-duplicate; of their hard "
                               "negatives 1.000 are judged relevant to one (1 negatives)")
    assert lines[1].startswith("overlap >= 0.7: 0 of 3")
