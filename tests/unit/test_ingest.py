"""pipeline.data.ingest.ingest on tiny corpora: Parquet parts, manifest, qrels, atomicity."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.data.ingest import ingest
from pipeline.data.manifest import check_comparable, load_manifest
from pipeline.errors import InputError, PipelineError

PASSAGES = [(f"d{i}", f"Title {i}" if i % 2 else "", f"passage number {i}") for i in range(1, 8)]


def _beir_folder(root: Path, name: str = "SciFact", passages=PASSAGES, qrels_extra: str = "",
                 corpus_extra: list[str] | None = None) -> Path:
    folder = root / name
    (folder / "qrels").mkdir(parents=True)
    lines = [json.dumps({"_id": pid, "title": title, "text": text}) for pid, title, text in passages]
    lines += corpus_extra or []
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "queries.jsonl").write_text(
        '{"_id": "q1", "text": "first  query"}\n{"_id": "q2", "text": "second query"}\n', encoding="utf-8")
    (folder / "qrels" / "test.tsv").write_bytes(
        ("query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\nq2\td3\t2\r\n" + qrels_extra).encode())
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\n", encoding="utf-8")
    return folder


def _read_parts(out: Path, manifest: dict) -> list[list[tuple]]:
    parts = []
    for part in manifest["parts"]:
        t = pq.read_table(out / part["file"])
        assert t.num_rows == part["rows"]
        assert t.column_names == ["pid", "title", "text"]
        parts.append(list(zip(*(t.column(c).to_pylist() for c in ("pid", "title", "text")))))
    return parts


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_beir_ingest_parts_and_manifest(tmp_path):
    folder = _beir_folder(tmp_path)
    out = tmp_path / "out"
    m = ingest([folder], "beir", out, part_rows=3, progress=False)

    assert sorted(p.name for p in (out / "corpus").iterdir()) == [
        "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    parts = _read_parts(out, m)
    assert [len(p) for p in parts] == [3, 3, 1]
    assert [row for part in parts for row in part] == PASSAGES  # order and content preserved

    assert m == load_manifest(out)  # what was returned is what was written
    assert m["variant"] == "beir-scifact"
    assert m["format"] == "beir"
    assert m["title_join"] == "{title} {text}"
    assert m["rows"] == 7
    assert [p["rows"] for p in m["parts"]] == [3, 3, 1]
    assert m["skipped"] == {"count": 0, "examples": []}
    [src] = m["sources"]
    assert Path(src["path"]) == (folder / "corpus.jsonl").resolve()
    assert src["sha256"] == _sha256(folder / "corpus.jsonl")
    assert src["bytes"] == (folder / "corpus.jsonl").stat().st_size
    assert isinstance(m["fingerprint"], str) and len(m["fingerprint"]) == 16

    assert (out / "queries.tsv").read_text(encoding="utf-8") == "q1\tfirst query\nq2\tsecond query\n"
    assert m["queries"]["count"] == 2
    assert m["queries"]["sha256"] == _sha256(folder / "queries.jsonl")
    assert (out / "qrels" / "test.trec").read_text() == "q1 0 d1 1\nq2 0 d3 2\n"
    assert (out / "qrels" / "train.trec").read_text() == "q1 0 d2 1\n"
    assert m["qrels"]["test"]["judgements"] == 2
    assert m["qrels"]["test"]["dropped_unknown"] == 0
    assert m["qrels"]["test"]["sha256"] == _sha256(folder / "qrels" / "test.tsv")
    # no temporary folders are left beside the output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SciFact", "out"]


def test_fingerprint_is_stable_and_tracks_content(tmp_path):
    folder = _beir_folder(tmp_path)
    a = ingest([folder], "beir", tmp_path / "a", part_rows=3, progress=False)
    b = ingest([folder], "beir", tmp_path / "b", part_rows=100, progress=False)
    assert a["fingerprint"] == b["fingerprint"]  # same corpus, different part size
    c = ingest([folder], "beir", tmp_path / "c", title_join="none", progress=False)
    assert c["fingerprint"] != a["fingerprint"]


def test_empty_passage_skipped_and_counted(tmp_path):
    folder = _beir_folder(tmp_path, corpus_extra=['{"_id": "d8", "title": "T", "text": "   "}',
                                                  '{"_id": "d9", "text": "last"}'])
    m = ingest([folder], "beir", tmp_path / "out", part_rows=3, progress=False)
    assert m["rows"] == 8
    assert m["skipped"]["count"] == 1
    (ex,) = m["skipped"]["examples"]
    assert (ex["line"], ex["pid"], ex["reason"]) == (8, "d8", "empty text") and ex["file"].endswith("corpus.jsonl")
    pids = [r[0] for part in _read_parts(tmp_path / "out", m) for r in part]
    assert "d8" not in pids and pids[-1] == "d9"


def test_empty_passage_error(tmp_path):
    folder = _beir_folder(tmp_path, corpus_extra=['{"_id": "d8", "title": "T", "text": ""}'])
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        ingest([folder], "beir", out, on_empty="error", progress=False)
    assert Path(info.value.path) == folder / "corpus.jsonl"
    assert info.value.line == 8
    assert not out.exists()


def test_duplicate_passage_id(tmp_path):
    passages = PASSAGES[:3] + [("d2", "", "again")] + PASSAGES[3:]
    folder = _beir_folder(tmp_path, passages=passages)
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        ingest([folder], "beir", out, part_rows=2, progress=False)
    err = info.value
    assert Path(err.path) == folder / "corpus.jsonl"
    assert err.line == 4
    assert "'d2'" in err.reason and "corpus.jsonl:2" in err.reason  # names the first occurrence
    assert f"{folder / 'corpus.jsonl'}:4" in str(err)
    assert not out.exists() and not (out / "manifest.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SciFact"]  # no partial or temp output


def test_unknown_doc_in_qrels(tmp_path):
    folder = _beir_folder(tmp_path, qrels_extra="q2\tnope\t1\r\n")
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        ingest([folder], "beir", out, progress=False)
    assert Path(info.value.path) == folder / "qrels" / "test.tsv"
    assert info.value.line == 4
    assert "nope" in info.value.reason
    assert not out.exists()

    m = ingest([folder], "beir", out, on_unknown_qrels="skip", progress=False)
    assert m["qrels"]["test"]["dropped_unknown"] == 1
    assert m["qrels"]["test"]["judgements"] == 2
    assert m["qrels"]["train"]["dropped_unknown"] == 0
    assert (out / "qrels" / "test.trec").read_text() == "q1 0 d1 1\nq2 0 d3 2\n"


def test_refuses_to_overwrite(tmp_path):
    folder = _beir_folder(tmp_path)
    out = tmp_path / "out"
    first = ingest([folder], "beir", out, progress=False)
    before = (out / "manifest.json").read_bytes()
    with pytest.raises(PipelineError, match="overwrite"):
        ingest([folder], "beir", out, progress=False)
    assert (out / "manifest.json").read_bytes() == before
    second = ingest([folder], "beir", out, part_rows=2, overwrite=True, progress=False)
    assert len(second["parts"]) == 4
    assert sorted(p.name for p in (out / "corpus").iterdir()) == [f"part-0000{i}.parquet" for i in range(4)]
    assert second["fingerprint"] == first["fingerprint"]


def test_failed_overwrite_keeps_previous_output(tmp_path):
    folder = _beir_folder(tmp_path)
    out = tmp_path / "out"
    ingest([folder], "beir", out, progress=False)
    before = (out / "manifest.json").read_bytes()
    bad = tmp_path / "bad.tsv"
    bad.write_text("1\tok\n2\tok\n3\ttoo\tmany\n")
    with pytest.raises(InputError) as info:
        ingest([bad], "msmarco", out, overwrite=True, progress=False)
    assert info.value.line == 3
    assert (out / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SciFact", "bad.tsv", "out"]


def test_failed_ingest_leaves_nothing(tmp_path):
    bad = tmp_path / "collection.tsv"
    bad.write_bytes(b"1\tfine\n2\tfine\n3\tbad \xff\n")
    out = tmp_path / "sub" / "out"
    with pytest.raises(InputError) as info:
        ingest([bad], "msmarco", out, part_rows=1, progress=False)
    assert (Path(info.value.path), info.value.line) == (bad, 3)
    assert not out.exists()
    assert list((tmp_path / "sub").iterdir()) == []


def test_no_passages_is_an_error(tmp_path):
    p = tmp_path / "c.tsv"
    p.write_text("1\t \n")
    with pytest.raises(InputError):
        ingest([p], "msmarco", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_msmarco_official_and_titled_are_not_comparable(tmp_path):
    official = tmp_path / "collection.tsv"
    official.write_text("0\tThe presence of communication.\n1\tManhattan Project text.\n")
    titled = tmp_path / "para.title.tsv"
    titled.write_text("0\t-\tThe presence of communication.\n1\tManhattan Project\tManhattan Project text.\n")
    a = ingest([official], "msmarco", tmp_path / "official", progress=False)
    b = ingest([titled], "msmarco-titled", tmp_path / "titled", progress=False)
    assert (a["variant"], a["title_join"]) == ("msmarco-official", "none")
    assert (b["variant"], b["title_join"]) == ("msmarco-titled", "{title} [SEP] {text}")
    parts = _read_parts(tmp_path / "titled", b)
    assert parts == [[("0", "", "The presence of communication."),
                      ("1", "Manhattan Project", "Manhattan Project text.")]]
    assert a["fingerprint"] != b["fingerprint"]

    metas = {"official": a, "titled": b}
    with pytest.raises(PipelineError, match="NOT comparable"):
        check_comparable(metas)
    warning = check_comparable(metas, allow_mixed=True)
    assert warning.startswith("WARNING")
    assert "msmarco-official" in warning and "msmarco-titled" in warning
    assert check_comparable({"x": a, "y": dict(a)}) is None


def test_msmarco_ingest_with_trec_qrels_and_tsv_queries(tmp_path):
    corpus = tmp_path / "collection.tsv"
    corpus.write_text("0\tzero\n1\tone\n2\ttwo\n")
    queries = tmp_path / "queries.tsv"
    queries.write_text("10\tq ten\n11\tq eleven\n")
    qrels = tmp_path / "qrels.dev.tsv"
    qrels.write_text("10\t0\t1\t1\n11\t0\t2\t1\n")
    m = ingest([corpus], "msmarco", tmp_path / "out", queries=queries, qrels={"dev": qrels}, progress=False)
    assert (tmp_path / "out" / "queries.tsv").read_text() == "10\tq ten\n11\tq eleven\n"
    assert (tmp_path / "out" / "qrels" / "dev.trec").read_text() == "10 0 1 1\n11 0 2 1\n"
    assert m["qrels"]["dev"]["judgements"] == 2


def test_duplicate_query_id_in_ingest(tmp_path):
    corpus = tmp_path / "collection.tsv"
    corpus.write_text("0\tzero\n")
    queries = tmp_path / "queries.tsv"
    queries.write_text("10\ta\n11\tb\n10\tc\n")
    with pytest.raises(InputError) as info:
        ingest([corpus], "msmarco", tmp_path / "out", queries=queries, progress=False)
    assert (Path(info.value.path), info.value.line) == (queries, 3)
    assert not (tmp_path / "out").exists()


def test_bad_options(tmp_path):
    corpus = tmp_path / "collection.tsv"
    corpus.write_text("0\tzero\n")
    with pytest.raises(PipelineError):
        ingest([corpus], "msmarco", tmp_path / "out", on_empty="ignore", progress=False)
    with pytest.raises(PipelineError):
        ingest([corpus], "msmarco", tmp_path / "out", variant="msmarco-v2", progress=False)
    with pytest.raises(PipelineError):
        ingest([corpus], "msmarco", tmp_path / "out", title_join="{text} {title}", progress=False)
    with pytest.raises(PipelineError):
        ingest([corpus], "beir", tmp_path / "out", progress=False)  # beir wants a folder
    assert not (tmp_path / "out").exists()
