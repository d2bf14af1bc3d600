"""Readers in pipeline/data/readers.py on small hand-written files.

Every malformed-input case checks that InputError carries the file and the
1-based line of the offending record, and that its message reads `path:line`.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from pipeline.data import readers
from pipeline.errors import InputError


def _write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def _raises_at(path: Path, line: int | None, fn, *args, **kwargs) -> InputError:
    """Run fn (consuming a generator if it returns one) and check the InputError location."""
    with pytest.raises(InputError) as info:
        result = fn(*args, **kwargs)
        if hasattr(result, "__next__"):
            list(result)
    err = info.value
    assert Path(err.path) == Path(path)
    assert err.line == line
    if line is not None:
        assert f"{path}:{line}" in str(err)
    return err


# --------------------------------------------------------------------------- DPR wiki


DPR_WIKI = (
    "id\ttext\ttitle\n"
    '1\t"Aaron is a prophet, called ""the elder""."\tAaron\n'
    "2\tplain text, no quotes\tAbba\n"
    '3\t"a\ttab inside quotes"\t"Quoted Title"\n'
)


def test_dpr_wiki_quoting(tmp_path):
    p = _write(tmp_path / "psgs.tsv", DPR_WIKI)
    rows = list(readers.read_dpr_wiki(p))
    assert rows == [
        {"pid": "1", "title": "Aaron", "text": 'Aaron is a prophet, called "the elder".', "line": 2},
        {"pid": "2", "title": "Abba", "text": "plain text, no quotes", "line": 3},
        {"pid": "3", "title": "Quoted Title", "text": "a\ttab inside quotes", "line": 4},
    ]


def test_dpr_wiki_gzip_and_bom(tmp_path):
    p = tmp_path / "psgs.tsv.gz"
    with gzip.open(p, "wb") as f:
        f.write(("\ufeff" + DPR_WIKI).encode("utf-8"))
    rows = list(readers.corpus_reader("dpr-wiki", p))
    assert [r["pid"] for r in rows] == ["1", "2", "3"]
    assert rows[0]["text"] == 'Aaron is a prophet, called "the elder".'


def test_dpr_wiki_wrong_header(tmp_path):
    p = _write(tmp_path / "psgs.tsv", "id\ttitle\ttext\n1\tx\ty\n")
    err = _raises_at(p, 1, readers.read_dpr_wiki, p)
    assert "header" in err.reason


def test_dpr_wiki_header_with_extra_columns(tmp_path):
    p = _write(tmp_path / "psgs.tsv", "id\ttext\ttitle\tscore\n1\tx\tT\t3\n")
    assert "header" in _raises_at(p, 1, readers.read_dpr_wiki, p).reason


def test_dpr_wiki_empty_file(tmp_path):
    p = _write(tmp_path / "psgs.tsv", "")
    _raises_at(p, 1, readers.read_dpr_wiki, p)


def test_dpr_wiki_missing_column(tmp_path):
    p = _write(tmp_path / "psgs.tsv", "id\ttext\ttitle\n1\tok\tT\n2\tonly text\n")
    err = _raises_at(p, 3, readers.read_dpr_wiki, p)
    assert "found 2" in err.reason


def test_dpr_wiki_unterminated_quote_names_the_first_line_of_the_record(tmp_path):
    # The open quote on line 2 swallows line 3; the record that is broken starts on line 2.
    p = _write(tmp_path / "psgs.tsv", 'id\ttext\ttitle\n1\t"unterminated\tT\n2\tok\tT2\n')
    _raises_at(p, 2, readers.read_dpr_wiki, p)


def test_dpr_wiki_quote_spanning_lines_never_merges_records(tmp_path):
    # A quote opened on line 3 and "closed" on line 5: csv quoting would read rows 2-4 as one
    # passage holding three lines. One record is one line: the open quote is an error at line 3.
    p = _write(tmp_path / "psgs.tsv", 'id\ttext\ttitle\n1\tok\tT1\n2\t"opens here\tT2\n'
                                      '3\tmiddle\tT3\n4\tcloses" here\tT4\n')
    err = _raises_at(p, 3, readers.read_dpr_wiki, p)
    assert "quote" in err.reason
    # Quotes that do not open a field are literal text; each line stays its own passage.
    p = _write(tmp_path / "psgs2.tsv", 'id\ttext\ttitle\n1\tsays "hi\tT1\n2\tmiddle\tT2\n3\tbye" now\tT3\n')
    assert [(r["pid"], r["text"], r["line"]) for r in readers.read_dpr_wiki(p)] == [
        ("1", 'says "hi', 2), ("2", "middle", 3), ("3", 'bye" now', 4)]


def test_dpr_wiki_bad_utf8(tmp_path):
    p = _write(tmp_path / "psgs.tsv", b"id\ttext\ttitle\n1\tok\tT\n2\tbad \xff byte\tT\n")
    err = _raises_at(p, 3, readers.read_dpr_wiki, p)
    assert "UTF-8" in err.reason


@pytest.mark.parametrize("pid, line_no", [("", 3), ("a b", 3)])
def test_dpr_wiki_bad_id(tmp_path, pid, line_no):
    p = _write(tmp_path / "psgs.tsv", f"id\ttext\ttitle\n1\tok\tT\n{pid}\ttext\tT\n")
    _raises_at(p, line_no, readers.read_dpr_wiki, p)


# --------------------------------------------------------------------------- MS MARCO


def test_msmarco_official(tmp_path):
    p = _write(tmp_path / "collection.tsv", "0\tThe presence of communication.\n1\tManhattan Project\r\n")
    assert list(readers.read_msmarco(p)) == [
        {"pid": "0", "title": "", "text": "The presence of communication.", "line": 1},
        {"pid": "1", "title": "", "text": "Manhattan Project", "line": 2},
    ]


def test_msmarco_official_gzip(tmp_path):
    p = tmp_path / "collection.tsv.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write("7\tseven\n8\teight\n")
    assert [(r["pid"], r["text"], r["line"]) for r in readers.corpus_reader("msmarco", p)] == [
        ("7", "seven", 1), ("8", "eight", 2)]


def test_msmarco_official_rejects_titled_rows(tmp_path):
    p = _write(tmp_path / "collection.tsv", "0\tfine\n1\tTitle\ttext\n")
    err = _raises_at(p, 2, readers.read_msmarco, p)
    assert "found 3" in err.reason


def test_msmarco_official_bad_utf8_and_bad_id(tmp_path):
    p = _write(tmp_path / "a.tsv", b"0\tok\n1\tok\n2\t\xc3\x28\n")
    _raises_at(p, 3, readers.read_msmarco, p)
    p = _write(tmp_path / "b.tsv", "0\tok\n1 2\tid with space\n")
    err = _raises_at(p, 2, readers.read_msmarco, p)
    assert "whitespace" in err.reason
    p = _write(tmp_path / "c.tsv", "0\tok\n \tempty id\n")
    err = _raises_at(p, 2, readers.read_msmarco, p)
    assert "empty" in err.reason


def test_msmarco_titled(tmp_path):
    p = _write(tmp_path / "para.title.tsv", "0\t-\tno title here\n1\tManhattan Project\tThe project was...\n")
    assert list(readers.read_msmarco_titled(p)) == [
        {"pid": "0", "title": "", "text": "no title here", "line": 1},
        {"pid": "1", "title": "Manhattan Project", "text": "The project was...", "line": 2},
    ]


def test_msmarco_titled_missing_column(tmp_path):
    p = _write(tmp_path / "para.title.tsv", "0\t-\tok\n1\tonly two\n")
    _raises_at(p, 2, readers.read_msmarco_titled, p)


# --------------------------------------------------------------------------- BEIR


def test_beir_corpus(tmp_path):
    p = _write(tmp_path / "corpus.jsonl",
               '{"_id": "d1", "title": "T1", "text": "one"}\n'
               "\n"
               '{"_id": 2, "text": "two, no title"}\n'
               '{"_id": "d3", "title": null, "text": "three"}\n')
    assert list(readers.read_beir_corpus(p)) == [
        {"pid": "d1", "title": "T1", "text": "one", "line": 1},
        {"pid": "2", "title": "", "text": "two, no title", "line": 3},
        {"pid": "d3", "title": "", "text": "three", "line": 4},
    ]
    # corpus_reader accepts the BEIR folder too
    assert [r["pid"] for r in readers.corpus_reader("beir", tmp_path)] == ["d1", "2", "d3"]


@pytest.mark.parametrize("bad_line, reason", [
    ('{"_id": "d2", "text": "unterminated}', "invalid JSON"),
    ('{"text": "no id"}', "_id"),
    ('{"_id": "", "text": "empty id"}', "empty"),
    ('{"_id": "d 2", "text": "space in id"}', "whitespace"),
    ('{"_id": "d2"}', "text"),
    ('["not", "an", "object"]', "object"),
    ('{"_id": "d2", "text": 5}', "string"),
])
def test_beir_corpus_malformed(tmp_path, bad_line, reason):
    p = _write(tmp_path / "corpus.jsonl", '{"_id": "d1", "text": "ok"}\n' + bad_line + "\n")
    err = _raises_at(p, 2, readers.read_beir_corpus, p)
    assert reason in err.reason


def test_beir_corpus_bad_utf8(tmp_path):
    p = _write(tmp_path / "corpus.jsonl", b'{"_id": "d1", "text": "ok"}\n{"_id": "d2", "text": "\xff"}\n')
    _raises_at(p, 2, readers.read_beir_corpus, p)


def test_beir_queries(tmp_path):
    p = _write(tmp_path / "queries.jsonl",
               '{"_id": "q1", "text": "what is python", "metadata": {}}\n{"_id": 2, "text": "why"}\n')
    assert list(readers.read_beir_queries(p)) == [
        {"qid": "q1", "text": "what is python", "line": 1},
        {"qid": "2", "text": "why", "line": 2},
    ]
    assert readers.load_queries(p) == {"q1": "what is python", "2": "why"}  # auto: .jsonl -> beir


def test_beir_queries_malformed(tmp_path):
    p = _write(tmp_path / "queries.jsonl", '{"_id": "q1", "text": "a"}\n{"_id": "q2"}\n')
    _raises_at(p, 2, readers.read_beir_queries, p)
    p = _write(tmp_path / "q2.jsonl", '{"_id": "q1", "text": "a"}\n{"_id": "q2", "text": "  "}\n')
    _raises_at(p, 2, readers.read_beir_queries, p)


def test_beir_qrels_crlf_and_header(tmp_path):
    p = _write(tmp_path / "test.tsv", "query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\nq1\td2\t2\r\nq2\td1\t0\r\n")
    rows = list(readers.read_beir_qrels(p))
    assert rows == [
        {"qid": "q1", "docid": "d1", "rel": 1, "line": 2},
        {"qid": "q1", "docid": "d2", "rel": 2, "line": 3},
        {"qid": "q2", "docid": "d1", "rel": 0, "line": 4},
    ]
    assert readers.load_qrels(p) == {"q1": {"d1": 1, "d2": 2}, "q2": {"d1": 0}}  # auto-detects BEIR


def test_beir_qrels_wrong_header(tmp_path):
    p = _write(tmp_path / "test.tsv", "qid\tdocid\trel\nq1\td1\t1\n")
    _raises_at(p, 1, readers.read_beir_qrels, p)


@pytest.mark.parametrize("bad_line, reason", [
    ("q2\td2\tyes", "not an integer"),
    ("q2\td2\t1.5", "not an integer"),
    ("q2\td2", "found 2"),
    ("q2\t\t1", "empty"),
])
def test_beir_qrels_malformed(tmp_path, bad_line, reason):
    p = _write(tmp_path / "test.tsv", f"query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\n{bad_line}\r\n")
    err = _raises_at(p, 3, readers.read_beir_qrels, p)
    assert reason in err.reason


# --------------------------------------------------------------------------- queries TSV


def test_queries_tsv(tmp_path):
    p = _write(tmp_path / "queries.dev.tsv", "1048585\twhat is paula deen's brother\n2\tAndorra\n\n3\tx\n")
    assert list(readers.read_queries_tsv(p)) == [
        {"qid": "1048585", "text": "what is paula deen's brother", "line": 1},
        {"qid": "2", "text": "Andorra", "line": 2},
        {"qid": "3", "text": "x", "line": 4},
    ]
    assert readers.load_queries(p) == {"1048585": "what is paula deen's brother", "2": "Andorra", "3": "x"}


def test_queries_tsv_malformed(tmp_path):
    p = _write(tmp_path / "a.tsv", "1\tok\n2\ttoo\tmany\n")
    _raises_at(p, 2, readers.read_queries_tsv, p)
    p = _write(tmp_path / "b.tsv", "1\tok\n2\t \n")
    _raises_at(p, 2, readers.read_queries_tsv, p)
    p = _write(tmp_path / "c.tsv", b"1\tok\n2\t\xff\n")
    _raises_at(p, 2, readers.read_queries_tsv, p)


def test_load_queries_duplicate_qid(tmp_path):
    p = _write(tmp_path / "queries.tsv", "1\tfirst\n2\tsecond\n1\tagain\n")
    err = _raises_at(p, 3, readers.load_queries, p)
    assert "duplicate" in err.reason and "'1'" in err.reason


# --------------------------------------------------------------------------- TREC qrels


def test_trec_qrels(tmp_path):
    p = _write(tmp_path / "qrels.dev.tsv", "1185869\t0\t0\t1\n19335 0 1017759 3\n\n19335  0  1082489  0\n")
    assert list(readers.read_trec_qrels(p)) == [
        {"qid": "1185869", "docid": "0", "rel": 1, "line": 1},
        {"qid": "19335", "docid": "1017759", "rel": 3, "line": 2},
        {"qid": "19335", "docid": "1082489", "rel": 0, "line": 4},
    ]
    assert readers.load_qrels(p) == {"1185869": {"0": 1}, "19335": {"1017759": 3, "1082489": 0}}


def test_trec_qrels_gzip(tmp_path):
    p = tmp_path / "qrels.txt.gz"
    with gzip.open(p, "wb") as f:
        f.write(b"q1 0 d1 1\nq1 0 d2 0\n")
    assert readers.load_qrels(p) == {"q1": {"d1": 1, "d2": 0}}


@pytest.mark.parametrize("bad_line, reason", [
    ("q1 0 d3", "found 3"),
    ("q1 0 d3 1 extra", "found 5"),
    ("q1 0 d3 high", "not an integer"),
])
def test_trec_qrels_malformed(tmp_path, bad_line, reason):
    p = _write(tmp_path / "qrels.txt", f"q1 0 d1 1\nq1 0 d2 0\n{bad_line}\n")
    err = _raises_at(p, 3, readers.read_trec_qrels, p)
    assert reason in err.reason


def test_load_qrels_duplicate_judgement(tmp_path):
    p = _write(tmp_path / "qrels.txt", "q1 0 d1 1\nq2 0 d1 1\nq1 0 d2 0\nq1 0 d1 2\n")
    err = _raises_at(p, 4, readers.load_qrels, p)
    assert "duplicate" in err.reason
    p = _write(tmp_path / "qrels.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t1\n")
    _raises_at(p, 3, readers.load_qrels, p)


# --------------------------------------------------------------------------- DPR QA


def test_dpr_qa_json_and_python_literals(tmp_path):
    p = _write(tmp_path / "nq-test.csv",
               'who got the first nobel prize in physics\t["Wilhelm Conrad R\u00f6ntgen"]\n'
               "when is the next deadpool movie being released\t['May 18 , 2018']\n"
               '"a ""quoted"" question"\t["a", "b"]\n')
    rows = list(readers.read_dpr_qa(p))
    assert rows == [
        {"qid": "0", "text": "who got the first nobel prize in physics",
         "answers": ["Wilhelm Conrad R\u00f6ntgen"], "line": 1},
        {"qid": "1", "text": "when is the next deadpool movie being released",
         "answers": ["May 18 , 2018"], "line": 2},
        {"qid": "2", "text": 'a "quoted" question', "answers": ["a", "b"], "line": 3},
    ]
    assert list(readers.read_queries(p, "dpr-qa")) == rows


@pytest.mark.parametrize("bad_line, reason", [
    ("question\tnot a list", "not a list literal"),
    ("question\t[]", "empty answer list"),
    ("question\t[1, 2]", "list of strings"),
    ("question\t{'a': 1}", "list of strings"),
    ("question only", "found 1"),
    ('""\t["a"]', "empty question"),
])
def test_dpr_qa_malformed(tmp_path, bad_line, reason):
    p = _write(tmp_path / "qa.csv", 'q one\t["a"]\n' + bad_line + "\n")
    err = _raises_at(p, 2, readers.read_dpr_qa, p)
    assert reason in err.reason


# --------------------------------------------------------------------------- Hugging Face datasets


@pytest.fixture
def hf_offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    return datasets


def test_hf_save_to_disk(tmp_path, hf_offline):
    folder = tmp_path / "ds"
    hf_offline.Dataset.from_dict({
        "docid": ["a", "b", "c"],
        "heading": ["A", None, ""],
        "body": ["alpha", "beta", None],
    }).save_to_disk(str(folder))
    rows = list(readers.corpus_reader("hf", folder, id_field="docid", title_field="heading", text_field="body"))
    assert rows == [
        {"pid": "a", "title": "A", "text": "alpha", "line": 1},
        {"pid": "b", "title": "", "text": "beta", "line": 2},
        {"pid": "c", "title": "", "text": "", "line": 3},
    ]
    err = _raises_at(folder, None, lambda: list(readers.read_hf(folder, id_field="docid", text_field="contents")))
    assert "contents" in err.reason


def test_hf_save_to_disk_dataset_dict(tmp_path, hf_offline):
    folder = tmp_path / "dd"
    d = hf_offline.Dataset.from_dict({"id": [1, 2], "text": ["x", "y"]})
    hf_offline.DatasetDict({"train": d, "dev": d.select([1])}).save_to_disk(str(folder))
    assert [r["pid"] for r in readers.read_hf(folder, title_field=None, split="dev")] == ["2"]
    _raises_at(folder, None, lambda: list(readers.read_hf(folder, split="test")))


def test_hf_jsonl_file(tmp_path, hf_offline):
    p = _write(tmp_path / "corpus.jsonl",
               '{"id": "p1", "title": "T", "text": "one"}\n'
               '{"id": 2, "title": null, "text": "two"}\n'
               '{"text": "no id", "title": "x"}\n')
    rows = readers.read_hf(p)
    assert next(rows) == {"pid": "p1", "title": "T", "text": "one", "line": 1}
    assert next(rows) == {"pid": "2", "title": "", "text": "two", "line": 2}
    # A row without an id must not become a passage called "None".
    _raises_at(p, 3, lambda: list(rows))


def test_hf_bad_inputs(tmp_path, hf_offline):
    _raises_at(tmp_path / "nope.jsonl", None, readers.read_hf, tmp_path / "nope.jsonl")
    p = _write(tmp_path / "corpus.txt", "x\n")
    _raises_at(p, None, readers.read_hf, p)
    # Files the parser cannot read are InputErrors, not pyarrow/datasets tracebacks.
    p = _write(tmp_path / "broken.jsonl", '{"id": 1, "text": "a"}\n{"id": 2, "text": \n')
    assert "cannot read" in _raises_at(p, None, readers.read_hf, p).reason
    p = _write(tmp_path / "fake.parquet", "not parquet")
    assert "parquet" in _raises_at(p, None, readers.read_hf, p).reason
    (tmp_path / "plain_dir").mkdir()
    _raises_at(tmp_path / "plain_dir", None, readers.read_hf, tmp_path / "plain_dir")
    (tmp_path / "damaged").mkdir()
    _write(tmp_path / "damaged" / "dataset_info.json", "{not json")
    assert "save_to_disk" in _raises_at(tmp_path / "damaged", None, readers.read_hf, tmp_path / "damaged").reason


def test_hf_nul_in_text_and_id(tmp_path, hf_offline):
    p = _write(tmp_path / "c.jsonl", '{"id": "a", "text": "ok"}\n{"id": "b", "text": "x\\u0000y"}\n')
    assert "NUL" in _raises_at(p, 2, readers.read_hf, p).reason
    p = _write(tmp_path / "d.jsonl", '{"id": "a\\u0000", "text": "ok"}\n')
    assert "control character" in _raises_at(p, 1, readers.read_hf, p).reason


# --------------------------------------------------------------------------- dispatch and common


def test_corpus_reader_rejects_unknown_format_and_stray_options(tmp_path):
    p = _write(tmp_path / "c.tsv", "1\tx\n")
    _raises_at(p, None, readers.corpus_reader, "trec-car", p)
    _raises_at(p, None, readers.corpus_reader, "msmarco", p, id_field="pid")


def test_missing_file(tmp_path):
    p = tmp_path / "missing.tsv"
    _raises_at(p, None, readers.read_msmarco, p)


# --------------------------------------------------------------------------- NUL, gzip, folders


@pytest.mark.parametrize("fn, content, line", [
    (readers.read_dpr_wiki, b"id\ttext\ttitle\n1\tok\tT\n2\x00\ttext\tT\n", 3),      # NUL in an id
    (readers.read_dpr_wiki, b"id\ttext\ttitle\n1\tte\x00xt\tT\n", 2),                 # NUL in text
    (readers.read_msmarco, b"1\tok\n2\x00\ttext\n", 2),
    (readers.read_msmarco, b"1\tte\x00xt\n", 1),
    (readers.read_msmarco_titled, b"1\tT\x00\ttext\n", 1),
    (readers.read_queries_tsv, b"q1\tok\nq\x002\ttext\n", 2),
    (readers.read_trec_qrels, b"q1 0 d1 1\nq1 0 d\x002 1\n", 2),
])
def test_nul_bytes_are_errors(tmp_path, fn, content, line):
    p = _write(tmp_path / "f.tsv", content)
    err = _raises_at(p, line, lambda q: list(fn(q)), p)
    assert "NUL" in err.reason


def test_nul_escapes_in_json_and_control_characters_in_ids(tmp_path):
    p = _write(tmp_path / "corpus.jsonl", '{"_id": "d1", "text": "ok"}\n{"_id": "d2", "text": "a\\u0000b"}\n')
    assert "NUL" in _raises_at(p, 2, readers.read_beir_corpus, p).reason
    p = _write(tmp_path / "corpus2.jsonl", '{"_id": "d\\u0000", "text": "ok"}\n')
    assert "control character" in _raises_at(p, 1, readers.read_beir_corpus, p).reason
    p = _write(tmp_path / "c.tsv", "1\tok\n2\x07\ttext\n")
    assert "control character" in _raises_at(p, 2, readers.read_msmarco, p).reason


def test_truncated_and_fake_gzip(tmp_path):
    good = gzip.compress(("".join(f"{i}\tpassage number {i} " + "x" * 50 + "\n" for i in range(2000))).encode())
    p = _write(tmp_path / "trunc.tsv.gz", good[: len(good) // 2])
    with pytest.raises(InputError) as info:
        list(readers.read_msmarco(p))
    assert info.value.path == str(p) and info.value.line is not None and info.value.line > 1
    assert "gzip" in info.value.reason
    p = _write(tmp_path / "fake.tsv.gz", b"1\tnot gzip at all\n")
    assert "gzip" in _raises_at(p, 1, readers.read_msmarco, p).reason


def test_gzip_recognised_without_gz_name(tmp_path):
    p = _write(tmp_path / "collection.tsv", gzip.compress(b"1\tone\n2\ttwo\n"))
    assert [r["pid"] for r in readers.read_msmarco(p)] == ["1", "2"]


def test_folder_where_a_file_is_expected(tmp_path):
    d = tmp_path / "collection.tsv"
    d.mkdir()
    for fn in (readers.read_msmarco, readers.read_dpr_wiki, readers.read_queries_tsv, readers.read_trec_qrels):
        err = _raises_at(d, None, lambda q: list(fn(q)), d)
        assert "folder" in err.reason
