"""The field's training files as `data.source` (#62): Tevatron's JSONL, MS MARCO's text triples, and
sentence-transformers' column datasets as Parquet, JSONL or a `datasets` folder; bad input named by file and
line, counted skips; a tiny run from each trains and exports a model sentence-transformers opens."""

from __future__ import annotations

import json

import pytest
from fixtures import dpr_job

from pipeline.data.training_files import columns_examples, msmarco_triples_examples, tevatron_examples
from pipeline.errors import InputError

ROWS = [("how do I sort a list", "Use sorted() or list.sort().", "Tuples are immutable."),
        ("what is a tuple", "A tuple is an immutable sequence.", "Dictionaries map keys to values."),
        ("unique elements", "Sets hold unique elements.", "Generators yield values lazily."),
        ("lazy values", "Generators produce values lazily with yield.", "Strings are sequences.")] * 4


def _tevatron(path, rows=ROWS):
    path.write_text("".join(json.dumps({"query_id": f"q{i}", "query": q,
                                        "positive_passages": [{"docid": f"p{i}", "title": "FAQ", "text": p}],
                                        "negative_passages": [{"docid": f"n{i}", "title": "", "text": n}]}) + "\n"
                            for i, (q, p, n) in enumerate(rows)))
    return path


def _triples(path, rows=ROWS):
    path.write_text("".join(f"{q}\t{p}\t{n}\n" for q, p, n in rows))
    return path


def _columns(folder, kind, rows=ROWS):
    data = [{"anchor": q, "positive": p, "negative_1": n, "negative_2": n + " (again)"} for q, p, n in rows]
    if kind == "jsonl":
        path = folder / "train.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
        return path
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / "train.parquet"
        pq.write_table(pa.Table.from_pylist(data), path)
        return path
    import datasets

    path = folder / "train-ds"
    datasets.Dataset.from_list(data).save_to_disk(str(path))
    return path


def test_each_reader_gives_the_examples_and_counts_what_it_skips(tmp_path):
    skipped = {}
    tev = list(tevatron_examples(_tevatron(tmp_path / "t.jsonl"), "{title} [SEP] {text}", skipped, True))
    assert tev[0] == {"qid": "q0", "query": ROWS[0][0], "positive": "FAQ [SEP] " + ROWS[0][1],
                      "negatives": [ROWS[0][2]],  # no title: the text alone
                      "positive_id": "p0", "negative_ids": ["n0"]}  # (what a teacher's scores are joined by)
    tri = list(msmarco_triples_examples(_triples(tmp_path / "tri.tsv"), skipped, True))
    assert tri[1] == {"qid": "2", "query": ROWS[1][0], "positive": ROWS[1][1], "negatives": [ROWS[1][2]]}
    for kind in ("jsonl", "parquet", "datasets"):
        folder = tmp_path / kind
        folder.mkdir()
        got = list(columns_examples(_columns(folder, kind), skipped, True))
        assert len(got) == len(ROWS) and got[2]["negatives"] == [ROWS[2][2], ROWS[2][2] + " (again)"], kind
    assert skipped == {}
    (tmp_path / "gaps.jsonl").write_text(
        json.dumps({"query": "a", "positive_passages": []}) + "\n"
        + json.dumps({"query": "b", "positive_passages": [{"text": "x"}], "negative_passages": []}) + "\n")
    assert list(tevatron_examples(tmp_path / "gaps.jsonl", "{text}", skipped, True)) == []
    assert skipped == {"no_positive": 1, "no_negatives": 1}


@pytest.mark.parametrize("write, line, reason", [
    (lambda p: p.write_text('{"query": "a", "positive_passages": [{"text": "x"}]}\n{"query": broken\n'), 2,
     "invalid JSON"),
    (lambda p: p.write_text('{"query": "a"}\n'), 1, "a Tevatron line has query and positive_passages"),
    (lambda p: p.write_text('{"query": "a", "positive_passages": [{"title": "t"}]}\n'), 1,
     "a passage is an object with text"),
])
def test_a_bad_tevatron_line_is_named_by_file_and_line(tmp_path, write, line, reason):
    path = tmp_path / "bad.jsonl"
    write(path)
    with pytest.raises(InputError, match=rf"bad.jsonl:{line}: .*{reason}"):
        list(tevatron_examples(path, "{text}", {}, False))


def test_a_bad_triple_or_column_row_is_named(tmp_path):
    (tmp_path / "t.tsv").write_text("q\tp\tn\nq only\tp\n")
    with pytest.raises(InputError, match=r"t.tsv:2: 2 tab-separated columns"):
        list(msmarco_triples_examples(tmp_path / "t.tsv", {}, False))
    (tmp_path / "c.jsonl").write_text('{"anchor": "a", "positive": "p"}\n{"anchor": 3, "positive": "p"}\n')
    with pytest.raises(InputError, match=r"c.jsonl:2: line 2: anchor is not a string"):
        list(columns_examples(tmp_path / "c.jsonl", {}, False))
    (tmp_path / "n.jsonl").write_text('{"question": "a", "answer": "p"}\n')
    with pytest.raises(InputError, match=r"no anchor or positive column \(columns: question, answer\)"):
        list(columns_examples(tmp_path / "n.jsonl", {}, False))


@pytest.mark.parametrize("source", ["tevatron", "msmarco-triples", "columns-parquet", "columns-jsonl",
                                    "columns-datasets"])
def test_a_tiny_run_from_each_training_file_trains_and_exports_a_model_sentence_transformers_opens(
        source, tiny_model_dir, faq, tmp_path):
    from sentence_transformers import SentenceTransformer

    from pipeline.train.config import load_train_config
    from pipeline.train.trainer import train

    if source == "tevatron":
        path = _tevatron(tmp_path / "train.jsonl")
    elif source == "msmarco-triples":
        path = _triples(tmp_path / "triples.tsv")
    else:
        path = _columns(tmp_path, source.split("-")[1])
    name = source.split("-")[0] if source.startswith("columns") else source
    job = dpr_job(tiny_model_dir, faq, tmp_path / "runs", "run", "train.num_workers=1", "train.runner=local",
                  "train.max_steps=2", "train.batch_size=4", f"data.source={name}", f"data.path={path}",
                  "data.hard_negatives=1")
    done = train(job, progress=False)
    assert done["steps"] == 2 and done["examples"] == len(ROWS)
    meta = json.loads((tmp_path / "runs" / "run" / "examples" / "examples.json").read_text())
    assert meta["source"] == name and meta["sources_sha256"]
    st = SentenceTransformer(str(tmp_path / "runs" / "run" / "model"), device="cpu")
    assert st.encode(["a query"]).shape[0] == 1
    assert load_train_config(None, [f"data.source={name}"]).data.source == name


def test_msmarco_id_triples_read_through_the_corpus_and_queries_and_train(tiny_model_dir, faq, tmp_path):
    """MS MARCO's id triples name the query and passages by id: their texts come from the ingested corpus and
    the queries file (each passage copied once into the store); a line naming an unknown query or passage is a
    counted skip, a malformed one an error naming its line; a tiny run from them trains."""
    from pipeline.data.readers import load_qrels
    from pipeline.train.trainer import train

    judged = load_qrels(faq / "qrels" / "train.trec")
    pids = sorted({d for docs in judged.values() for d in docs})
    lines = [f"{q}\t{d}\t{pids[(i * 7) % len(pids)]}" for i, (q, docs) in enumerate(sorted(judged.items()))
             for d in list(docs)[:1]]
    path = tmp_path / "qidpidtriples.tsv"
    path.write_text("\n".join(lines + ["no-such-query\tx\ty", f"{lines[0].split()[0]}\tno-such-pid\t{pids[0]}"]) + "\n")
    job = dpr_job(tiny_model_dir, faq, tmp_path / "runs", "run", "train.num_workers=1", "train.runner=local",
                  "train.max_steps=2", "train.batch_size=4", "data.source=msmarco-id-triples", f"data.path={path}",
                  f"data.queries={faq / 'queries.tsv'}", "data.hard_negatives=1")
    done = train(job, progress=False)
    meta = json.loads((tmp_path / "runs" / "run" / "examples" / "examples.json").read_text())
    assert done["examples"] == len(lines) and meta["form"] == "ids"
    assert meta["skipped"] == {"query_not_in_queries": 1, "pid_not_in_corpus": 1}
    from sentence_transformers import SentenceTransformer

    assert SentenceTransformer(str(tmp_path / "runs" / "run" / "model"), device="cpu").encode(["q"]).shape[0] == 1
    (tmp_path / "bad.tsv").write_text(lines[0] + "\n" + "q1\tp1\n")
    from pipeline.data.training_files import msmarco_id_triple_tables

    with pytest.raises(InputError, match=r"bad.tsv:2: 2 columns; an id triple is qid<TAB>pid_pos<TAB>pid_neg"):
        list(msmarco_id_triple_tables(tmp_path / "bad.tsv", faq, faq / "queries.tsv", tmp_path / "s.arrow", {}, {}))
