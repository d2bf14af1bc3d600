"""Malformed input through the real CLI: exit code 2, `error: file:line: reason`, nothing written or deleted.

Each case builds its files in a fresh folder, snapshots every file under it (path,
bytes) and runs `pipeline.cli.main` in-process. Any exception other than the
CLI's own `error:` path fails the test (that would be a traceback for the user).
Only verbs that fail before Ray starts are used (ingest, config, evaluate parsing).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from pipeline.cli import main

DATA = Path(__file__).parent.parent / "data"


def _snapshot(root: Path) -> dict:
    snap = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            snap[rel] = ("link", str(p.readlink()))
        elif p.is_file():
            snap[rel] = p.read_bytes()
        else:
            snap[rel] = "dir"
    return snap


@dataclass
class Case:
    name: str
    setup: Callable[[Path], list[str]]   # writes files under the folder, returns argv
    expect: list[str]                     # substrings of stderr; "{d}" is the folder
    writes_nothing: bool = True
    marks: list = field(default_factory=list)


def w(d: Path, name: str, content: str | bytes) -> str:
    p = d / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(content.encode() if isinstance(content, str) else content)
    return str(p)


def ingest(*args: str) -> list[str]:
    return ["ingest", *args]


WIKI_HEAD = "id\ttext\ttitle\n"


def _corpus(d: Path) -> str:
    """An ingested corpus at d/c, made before the snapshot (setup runs ingest directly)."""
    from pipeline.data.ingest import ingest as do_ingest

    src = w(d, "ok.tsv", "1\tone\n2\ttwo\n")
    do_ingest([src], "msmarco", d / "c", progress=False)
    return str(d / "c")


def _gz_truncated(d: Path) -> str:
    data = gzip.compress("".join(f"{i}\tpassage {i} {'x' * 40}\n" for i in range(3000)).encode())
    return w(d, "collection.tsv.gz", data[: len(data) // 2])


def _not_corpus(d: Path) -> str:
    w(d, "out/notes.txt", "my notes")
    w(d, "out/sub/data.bin", b"\x00\x01\x02")
    return str(d / "out")


CASES = [
    # ---- the formats as written (DPR wiki, MS MARCO): one record per line, exact columns
    Case("dpr-wiki quote opened and closed lines later",
         lambda d: ingest(w(d, "psgs.tsv", WIKI_HEAD + '1\tok\tA\n2\t"opens\tB\n3\tmid\tC\n4\tcloses"\tD\n'),
                          "--format", "dpr-wiki", "--out", f"{d}/out"),
         ["{d}/psgs.tsv:3:", "quote"]),
    Case("dpr-wiki two columns",
         lambda d: ingest(w(d, "psgs.tsv", WIKI_HEAD + "1\tok\tA\n2\tno title\n"), "--format", "dpr-wiki",
                          "--out", f"{d}/out"),
         ["{d}/psgs.tsv:3:", "expected 3 tab-separated columns", "found 2"]),
    Case("dpr-wiki wrong header",
         lambda d: ingest(w(d, "psgs.tsv", "id\ttitle\ttext\n1\tA\tok\n"), "--format", "dpr-wiki",
                          "--out", f"{d}/out"),
         ["{d}/psgs.tsv:1:", "header"]),
    Case("msmarco three columns",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n2\tT\ttext\n"), "--format", "msmarco", "--out", f"{d}/out"),
         ["{d}/collection.tsv:2:", "expected 2 tab-separated columns"]),
    Case("titled with two columns",
         lambda d: ingest(w(d, "t.tsv", "1\tT\tok\n2\tno title\n"), "--format", "msmarco-titled", "--out", f"{d}/out"),
         ["{d}/t.tsv:2:", "found 2"]),
    Case("invalid UTF-8",
         lambda d: ingest(w(d, "collection.tsv", b"1\tok\n2\tbad \xff\n"), "--format", "msmarco", "--out", f"{d}/out"),
         ["{d}/collection.tsv:2:", "UTF-8"]),
    Case("empty file",
         lambda d: ingest(w(d, "collection.tsv", ""), "--format", "msmarco", "--out", f"{d}/out"),
         ["{d}/collection.tsv", "no passages"]),
    # ---- NUL bytes and ids
    Case("NUL in a passage id",
         lambda d: ingest(w(d, "collection.tsv", b"1\tok\n2\x00\ttext\n"), "--format", "msmarco", "--out", f"{d}/out"),
         ["{d}/collection.tsv:2:", "NUL"]),
    Case("NUL in passage text",
         lambda d: ingest(w(d, "psgs.tsv", WIKI_HEAD.encode() + b"1\tte\x00xt\tA\n"), "--format", "dpr-wiki",
                          "--out", f"{d}/out"),
         ["{d}/psgs.tsv:2:", "NUL"]),
    Case("NUL escape in BEIR JSON text",
         lambda d: ingest(w(d, "beir/corpus.jsonl", '{"_id": "d1", "text": "ok"}\n{"_id": "d2", "text": "a\\u0000"}\n')
                          and str(d / "beir"), "--format", "beir", "--out", f"{d}/out"),
         ["{d}/beir/corpus.jsonl:2:", "NUL"]),
    Case("non-integer pid labelled msmarco-official",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\nD2\ttext\n"), "--format", "msmarco", "--out", f"{d}/out"),
         ["{d}/collection.tsv:2:", "'D2'", "integer", "msmarco-official"]),
    Case("duplicate passage id",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n2\ttwo\n1\tagain\n"), "--format", "msmarco",
                          "--out", f"{d}/out"),
         ["{d}/collection.tsv:3:", "duplicate passage id '1'", "collection.tsv:1"]),
    Case("whitespace inside an id",
         lambda d: ingest(w(d, "corpus.jsonl", '{"_id": "a b", "text": "x"}\n') and str(d),
                          "--format", "beir", "--out", f"{d}/out"),
         ["{d}/corpus.jsonl:1:", "whitespace"]),
    # ---- BEIR ids are JSON strings (or integers); anything else would become an id nobody wrote
    *[Case(f"BEIR corpus _id {shown}",
           lambda d, v=value: ingest(w(d, "beir/corpus.jsonl", '{"_id": "d1", "text": "ok"}\n'
                                     f'{{"_id": {v}, "text": "x"}}\n') and str(d / "beir"),
                                     "--format", "beir", "--out", f"{d}/out"),
           ["{d}/beir/corpus.jsonl:2:", f"_id must be a string (or an integer), got {shown}"])
      for value, shown in [("null", "null"), ("true", "true"), ("false", "false"), ("1.5", "a number with a fraction"),
                           ('{"a": 1}', "an object"), ("[1]", "an array")]],
    *[Case(f"BEIR query _id {shown}",
           lambda d, v=value: ingest(w(d, "beir/corpus.jsonl", '{"_id": "d1", "text": "ok"}\n') and
                                     w(d, "beir/queries.jsonl", f'{{"_id": "q1", "text": "a"}}\n{{"_id": {v}, '
                                                                '"text": "b"}\n') and str(d / "beir"),
                                     "--format", "beir", "--out", f"{d}/out"),
           ["{d}/beir/queries.jsonl:2:", f"_id must be a string (or an integer), got {shown}"])
      for value, shown in [("null", "null"), ("true", "true"), ("2.0", "a number with a fraction")]],
    Case("BEIR query text null",
         lambda d: ingest(w(d, "beir/corpus.jsonl", '{"_id": "d1", "text": "ok"}\n') and
                          w(d, "beir/queries.jsonl", '{"_id": "q1", "text": null}\n') and str(d / "beir"),
                          "--format", "beir", "--out", f"{d}/out"),
         ["{d}/beir/queries.jsonl:1:", "'text' must be a string, got NoneType"]),
    Case("BEIR qrels naming a query absent from queries.jsonl",
         lambda d: ingest(w(d, "beir/corpus.jsonl", '{"_id": "d1", "text": "ok"}\n') and
                          w(d, "beir/queries.jsonl", '{"_id": "q1", "text": "a"}\n') and
                          w(d, "beir/qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq9\td1\t1\n")
                          and str(d / "beir"), "--format", "beir", "--out", f"{d}/out"),
         ["{d}/beir/qrels/test.tsv:3:", "query 'q9'", "not in the queries file", "--on-unknown-qrels skip"]),
    # ---- a bare CR inside a line (CR-only line endings) never merges records, in any TSV reader
    Case("CR-only MS MARCO collection",
         lambda d: ingest(w(d, "collection.tsv", "0\tzero\r1\tone\r"), "--format", "msmarco", "--out", f"{d}/out"),
         ["{d}/collection.tsv:1:", "carriage return (CR)", "CR-only line endings"]),
    Case("CR-only MS MARCO collection, the issue's bytes",
         lambda d: ingest(w(d, "collection.tsv", "0\tzero\r1 one\r"), "--format", "msmarco", "--out", f"{d}/out"),
         ["{d}/collection.tsv:1:", "carriage return (CR)"]),
    Case("bare CR inside a titled MS MARCO line",
         lambda d: ingest(w(d, "t.tsv", "1\tT\tok\r\n2\tT\ta\rb\n"), "--format", "msmarco-titled",
                          "--out", f"{d}/out"),
         ["{d}/t.tsv:2:", "carriage return (CR) at character 5"]),
    Case("bare CR inside a DPR wiki line",
         lambda d: ingest(w(d, "psgs.tsv", WIKI_HEAD + "1\tok\tA\r2\tb\tB\n"), "--format", "dpr-wiki",
                          "--out", f"{d}/out"),
         ["{d}/psgs.tsv:2:", "carriage return (CR)"]),
    Case("CR-only queries TSV",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--queries",
                          w(d, "q.tsv", "q1\ta\rq2\tb\r"), "--out", f"{d}/out"),
         ["{d}/q.tsv:1:", "carriage return (CR)"]),
    Case("CR-only qrels",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--qrels",
                          f"dev={w(d, 'q.trec', 'q1 0 1 1' + chr(13) + 'q1 0 1 1' + chr(13))}", "--out", f"{d}/out"),
         ["{d}/q.trec:1:", "carriage return (CR)"]),
    Case("CR-only run file",
         lambda d: ["evaluate", "--run", w(d, "r.trec", "q1 Q0 d1 1 0.5 t\rq1 Q0 d2 2 0.4 t\r"),
                    "--qrels", w(d, "q.qrels", "q1 0 d1 1\n")],
         ["{d}/r.trec:1:", "carriage return (CR)"]),
    # ---- options that cannot be right
    Case("--variant msmarco-titled on a two-column file",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--variant", "msmarco-titled",
                          "--out", f"{d}/out"),
         ["--variant msmarco-titled does not fit --format msmarco"]),
    Case("--part-rows 0",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--part-rows", "0",
                          "--out", f"{d}/out"),
         ["--part-rows must be a positive number", "0"]),
    Case("--part-rows negative",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--part-rows", "-3",
                          "--out", f"{d}/out"),
         ["--part-rows must be a positive number", "-3"]),
    Case("--id-field with a fixed-column format",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--id-field", "docid",
                          "--out", f"{d}/out"),
         ["--id-field only apply to --format hf"]),
    Case("--title-field and --text-field with dpr-wiki",
         lambda d: ingest(w(d, "psgs.tsv", WIKI_HEAD + "1\tok\tA\n"), "--format", "dpr-wiki", "--title-field", "t",
                          "--text-field", "x", "--out", f"{d}/out"),
         ["--text-field, --title-field only apply to --format hf"]),
    Case("the same file twice",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), str(d / "collection.tsv"), "--format", "msmarco",
                          "--out", f"{d}/out"),
         ["{d}/collection.tsv is given twice"]),
    Case("the same file under another name",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), str((d / "link.tsv").symlink_to(d / "collection.tsv")
                                                                 or d / "link.tsv"),
                          "--format", "msmarco", "--out", f"{d}/out"),
         ["{d}/link.tsv is the same file as {d}/collection.tsv"]),
    Case("qrels split given twice",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--qrels",
                          f"dev={w(d, 'a.trec', 'q 0 1 1')}", "--qrels", f"dev={w(d, 'b.trec', 'q 0 1 1')}",
                          "--out", f"{d}/out"),
         ["--qrels split 'dev' is given twice"]),
    Case("qrels naming an unknown passage",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--qrels",
                          f"dev={w(d, 'q.trec', 'q1 0 1 1' + chr(10) + 'q1 0 9 1' + chr(10))}", "--out", f"{d}/out"),
         ["{d}/q.trec:2:", "'9'"]),
    Case("duplicate query id",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--queries",
                          w(d, "q.tsv", "q1\ta\nq1\tb\n"), "--out", f"{d}/out"),
         ["{d}/q.tsv:2:", "duplicate query id"]),
    # ---- files that are not what they claim
    Case("truncated gzip",
         lambda d: ingest(_gz_truncated(d), "--format", "msmarco", "--out", f"{d}/out"),
         ["{d}/collection.tsv.gz:", "gzip"]),
    Case("fake gzip",
         lambda d: ingest(w(d, "collection.tsv.gz", "1\tnot gzip\n"), "--format", "msmarco", "--out", f"{d}/out"),
         ["{d}/collection.tsv.gz:1:", "gzip"]),
    Case("a folder where a file is expected",
         lambda d: ingest(str((d / "dir.tsv").mkdir() or d / "dir.tsv"), "--format", "msmarco", "--out", f"{d}/out"),
         ["{d}/dir.tsv: is a folder"]),
    Case("queries that are a folder",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco",
                          "--queries", str((d / "qdir").mkdir() or d / "qdir"), "--out", f"{d}/out"),
         ["{d}/qdir: is a folder"]),
    Case("hf: JSON lines the parser cannot read",
         lambda d: ingest(w(d, "c.jsonl", '{"id": 1, "text": "a"}\n{"id": 2, "text": \n'), "--format", "hf",
                          "--out", f"{d}/out"),
         ["{d}/c.jsonl: cannot read"]),
    Case("hf: fake parquet",
         lambda d: ingest(w(d, "c.parquet", "not parquet"), "--format", "hf", "--out", f"{d}/out"),
         ["{d}/c.parquet: cannot read as parquet"]),
    Case("missing input",
         lambda d: ingest(f"{d}/nope.tsv", "--format", "msmarco", "--out", f"{d}/out"),
         ["{d}/nope.tsv: file not found"]),
    Case("beir given a file",
         lambda d: ingest(w(d, "corpus.jsonl", '{"_id": "1", "text": "x"}\n'), "--format", "beir", "--out", f"{d}/out"),
         ["format 'beir' takes one BEIR folder"]),
    # ---- output paths
    Case("--out is a file",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--out", w(d, "out", "precious")),
         ["{d}/out exists and is a file"]),
    Case("--out is a file, with --overwrite",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--overwrite",
                          "--out", w(d, "out", "precious")),
         ["{d}/out exists and is a file"]),
    Case("--out below a file",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--out", w(d, "f", "x") + "/out"),
         ["{d}/f is a file"]),
    Case("--out holds unrelated files",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--out", _not_corpus(d)),
         ["{d}/out exists and is not an ingested corpus", "notes.txt", "sub"]),
    Case("--out holds unrelated files, with --overwrite",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--overwrite",
                          "--out", _not_corpus(d)),
         ["{d}/out exists and is not an ingested corpus", "Nothing was changed"]),
    Case("--out is a corpus, no --overwrite",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco", "--out", _corpus(d)),
         ["{d}/c already holds an ingested corpus", "--overwrite"]),
    Case("--out is a read-only location",
         lambda d: ingest(w(d, "collection.tsv", "1\tok\n"), "--format", "msmarco",
                          "--out", "/sys/pipeline-test-out/c"),
         ["cannot write to /sys/pipeline-test-out/c"]),
    # ---- configuration (refused before any reading or writing)
    Case("misspelt section in a config file",
         lambda d: ["evaluate", "--run", f"{d}/r", "--qrels", f"{d}/q", "--config",
                    w(d, "cfg.yaml", "encoder:\n  batch_size: 8\n")],
         ["unknown config section(s): encoder", "did you mean encode?",
          "known sections: encode, eval, index, model, ray, retrieve"]),
    Case("misspelt section in an override",
         lambda d: ["evaluate", "--run", f"{d}/r", "--qrels", f"{d}/q", "evl.per_query=true"],
         ["unknown config section(s): evl", "did you mean eval?"]),
    Case("misspelt key",
         lambda d: ["evaluate", "--run", f"{d}/r", "--qrels", f"{d}/q", "eval.recall_k=[5]"],
         ["unknown config key(s): eval.recall_k", "known keys of eval:"]),
    Case("malformed YAML in an override",
         lambda d: ["evaluate", "--run", f"{d}/r", "--qrels", f"{d}/q", "encode.batch_size=[1,"],
         ["override 'encode.batch_size=[1,'", "not valid YAML"]),
    Case("malformed YAML in a config file",
         lambda d: ["evaluate", "--run", f"{d}/r", "--qrels", f"{d}/q", "--config",
                    w(d, "cfg.yaml", "eval:\n  recall_ks: [1,\n")],
         ["{d}/cfg.yaml:", "invalid YAML"]),
    Case("a section given twice in a config file",
         lambda d: ["evaluate", "--run", f"{d}/r", "--qrels", f"{d}/q", "--config",
                    w(d, "cfg.yaml", "eval:\n  rel_level: 2\nindex:\n  nprobe: 4\neval:\n  per_query: true\n")],
         ["{d}/cfg.yaml:5: key 'eval' given twice (first at line 1)"]),
    Case("config path is a folder",
         lambda d: ["evaluate", "--run", f"{d}/r", "--qrels", f"{d}/q", "--config", str(d)],
         ["{d}: is a folder"]),
    Case("encode.num_actors=0",
         lambda d: ["evaluate", "--run", f"{d}/r", "--qrels", f"{d}/q", "encode.num_actors=0"],
         ["encode.num_actors: must be >= 1"]),
    Case("retrieve --top-k 0",
         lambda d: ["retrieve", "--index", f"{d}/i", "--queries", f"{d}/q", "--out", f"{d}/run", "--top-k", "0"],
         ["retrieve.top_k: must be >= 1, got 0"]),
    Case("retrieve --top-k negative",
         lambda d: ["retrieve", "--index", f"{d}/i", "--queries", f"{d}/q", "--out", f"{d}/run", "--top-k", "-4"],
         ["retrieve.top_k: must be >= 1, got -4"]),
    # ---- evaluation inputs
    Case("run line with five columns",
         lambda d: ["evaluate", "--run", w(d, "r.trec", "q1 Q0 d1 1 0.5 t\nq1 Q0 d2 2 0.4\n"),
                    "--qrels", w(d, "q.qrels", "q1 0 d1 1\n")],
         ["{d}/r.trec:2:", "expected 6 columns"]),
    Case("run score not a number",
         lambda d: ["evaluate", "--run", w(d, "r.trec", "q1 Q0 d1 1 high t\n"), "--qrels", w(d, "q.qrels", "q1 0 d1 1\n")],
         ["{d}/r.trec:1:", "score 'high' is not a number"]),
    Case("qrels relevance not an integer",
         lambda d: ["evaluate", "--run", w(d, "r.trec", "q1 Q0 d1 1 0.5 t\n"),
                    "--qrels", w(d, "q.qrels", "q1 0 d1 1\nq1 0 d2 x\n")],
         ["{d}/q.qrels:2:", "relevance 'x' is not an integer"]),
    Case("NUL in a run file",
         lambda d: ["evaluate", "--run", w(d, "r.trec", b"q1 Q0 d1 1 0.5 t\nq1 Q0 d\x002 2 0.4 t\n"),
                    "--qrels", w(d, "q.qrels", "q1 0 d1 1\n")],
         ["{d}/r.trec:2:", "NUL"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_a_clear_error_and_changes_nothing(tmp_path, capsys, case):
    d = tmp_path / "work"
    d.mkdir()
    argv = case.setup(d)
    capsys.readouterr()
    before = _snapshot(tmp_path)
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert err.startswith("error: "), err
    assert "Traceback" not in err
    for piece in case.expect:
        assert piece.replace("{d}", str(d)) in err, err
    assert _snapshot(tmp_path) == before    # nothing written, nothing deleted
    assert not Path("/sys/pipeline-test-out").exists()


def test_the_same_cases_succeed_once_fixed(tmp_path, capsys):
    """Guards against a check that refuses everything: valid input passes the same paths."""
    d = tmp_path
    ok = w(d, "psgs.tsv", WIKI_HEAD + '1\t"quoted ""text"""\tA\n2\tsays "hi\tB\n')
    assert main(ingest(ok, "--format", "dpr-wiki", "--out", f"{d}/wiki")) == 0
    m = json.loads((d / "wiki" / "manifest.json").read_text())
    assert m["rows"] == 2 and m["variant"] == "wiki-dpr"
    src = w(d, "collection.tsv", "1\tone\n2\ttwo\n")
    assert main(ingest(src, "--format", "msmarco", "--part-rows", "1", "--out", f"{d}/ms")) == 0
    assert len(json.loads((d / "ms" / "manifest.json").read_text())["parts"]) == 2
    w(d, "ms/notes.txt", "kept")
    assert main(ingest(src, "--format", "msmarco", "--overwrite", "--out", f"{d}/ms")) == 0
    assert (d / "ms" / "notes.txt").read_text() == "kept"


def test_integer_beir_ids_crlf_lines_and_skipped_unknown_queries_are_accepted_and_reported(tmp_path, capsys):
    """The accepting side of the BEIR-id, CR and unknown-query cases above."""
    d = tmp_path
    w(d, "beir/corpus.jsonl", '{"_id": 7, "text": "seven"}\r\n{"_id": "d8", "text": "eight"}\r\n')
    w(d, "beir/queries.jsonl", '{"_id": 1, "text": "one"}\n{"_id": "q2", "text": "two"}\n')
    w(d, "beir/qrels/test.tsv", "query-id\tcorpus-id\tscore\r\n1\t7\t1\r\nq2\td8\t1\r\nq9\t7\t1\r\nq9\td8\t1\r\n"
                                "q10\t7\t1\r\n")
    assert main(ingest(str(d / "beir"), "--format", "beir", "--out", f"{d}/strict")) == 2
    assert "test.tsv:4:" in capsys.readouterr().err
    assert main(ingest(str(d / "beir"), "--format", "beir", "--on-unknown-qrels", "skip", "--out", f"{d}/out")) == 0
    out = capsys.readouterr().out
    assert "qrels test: 3 judgements name 2 unknown queries: q9, q10; dropped" in out
    m = json.loads((d / "out" / "manifest.json").read_text())
    assert m["qrels"]["test"]["judgements"] == 2 and m["qrels"]["test"]["dropped_unknown_queries"] == 3
    assert m["qrels"]["test"]["unknown_queries"] == ["q9", "q10"]
    assert (d / "out" / "queries.tsv").read_text() == "1\tone\nq2\ttwo\n"
    assert (d / "out" / "qrels" / "test.trec").read_text() == "1 0 7 1\nq2 0 d8 1\n"
    import pyarrow.parquet as pq

    assert pq.read_table(d / "out" / "corpus" / "part-00000.parquet")["pid"].to_pylist() == ["7", "d8"]


def test_a_beir_folder_without_queries_and_qrels_of_only_a_header_are_errors(tmp_path, capsys):
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "title": "", "text": "hello"}\n'
                                       '{"_id": "d2", "title": "", "text": "world"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    assert main(["ingest", str(beir), "--format", "beir", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert f"{beir / 'queries.jsonl'}: missing: the BEIR folder has qrels (qrels/test.tsv)" in err
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "hi"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")  # a header and nothing else
    assert main(["ingest", str(beir), "--format", "beir", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "qrels/test.tsv: no judgement to ingest (only a header, or an empty file)" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_symlink_loop_is_named_where_path_resolve_passes_it_quietly(tmp_path, capsys, monkeypatch):
    """Python 3.13's `Path.resolve()` returns quietly on a loop where 3.12's raised, and the loop surfaced as
    "not a folder of embeddings": the command line's paths are checked themselves (3.13 simulated here)."""
    import os
    import pathlib

    monkeypatch.setattr(pathlib.Path, "resolve", lambda self, strict=False: pathlib.Path(os.path.realpath(self)))
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    loop = tmp_path / "a" / "x"
    assert main(["index", f"--embeddings={loop}", "--out", str(tmp_path / "i")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {loop}: a symlink loop (a link that leads back to itself: {tmp_path / 'a'}); point the "
                   "option at a real folder or file"]
    assert not (tmp_path / "i").exists()


@pytest.mark.parametrize("verb", ["encode", "index", "retrieve", "train"])
def test_a_symlink_loop_is_one_line_not_a_traceback(tmp_path, capsys, verb, faq):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    loop = tmp_path / "a" / "x"
    argv = {"encode": ["encode", "--corpus", str(faq), "--out", str(loop)],
            "index": ["index", "--embeddings", str(loop), "--out", str(tmp_path / "i")],
            "retrieve": ["retrieve", "--index", str(loop), "--queries", str(faq / "queries.tsv"),
                         "--out", str(tmp_path / "r.trec")],
            "train": ["train", "--config", "jobs/configs/dpr.yaml", f"train.storage_path={loop}"]}[verb]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a symlink loop" in err[0] and str(tmp_path / "a") in err[0], err
