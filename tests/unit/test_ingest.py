"""pipeline.data.ingest.ingest on tiny corpora: Parquet parts, manifest, qrels, atomicity."""

from __future__ import annotations

import hashlib
import os
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


def test_the_same_ingest_after_an_upgrade_keeps_the_corpus(tmp_path, monkeypatch, capsys):
    """The manifest's tool_version was compared as a setting: after a release bump every corpus ingested
    before was "a different one (its tool_version differ)" and its own ingest command refused."""
    import pipeline.data.ingest as ingest_module

    folder = _beir_folder(tmp_path)
    out = tmp_path / "out"
    first = ingest([folder], "beir", out, progress=False)
    monkeypatch.setattr(ingest_module, "__version__", "99.0.0")
    assert ingest([folder], "beir", out) == first  # the corpus as that release wrote it, tool_version kept
    assert "[ingest] unchanged" in capsys.readouterr().out


def test_the_same_ingest_again_keeps_the_corpus_and_another_is_refused_without_overwrite(tmp_path, capsys):
    folder = _beir_folder(tmp_path)
    out = tmp_path / "out"
    first = ingest([folder], "beir", out, progress=False)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    # run again as it was run: nothing is written, the corpus there is what it returns
    assert ingest([folder], "beir", out) == first
    assert "[ingest] unchanged" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in out.iterdir()) == ["corpus", "manifest.json", "qrels", "queries.tsv"]  # no stage
    # another request: refused before anything is read (settings, sources), or after staging (what came out)
    with pytest.raises(PipelineError, match=r"a different one \(title_join .* 'none' asked now\).*--overwrite"):
        ingest([folder], "beir", out, title_join="none", progress=False)
    with pytest.raises(PipelineError, match=r"a different one \(its parts differ\).*--overwrite"):
        ingest([folder], "beir", out, part_rows=2, progress=False)
    queries = out / "queries.tsv"
    queries.write_text(queries.read_text() + "q9\tadded by hand\n")  # the manifest's, but not ingest's file now
    with pytest.raises(PipelineError, match=r"a different one \(queries.tsv changed or gone since it was ingested"):
        ingest([folder], "beir", out, progress=False)
    queries.write_bytes(before[queries])
    corpus = folder / "corpus.jsonl"
    corpus.write_text(corpus.read_text().replace("number 3", "number 9"), encoding="utf-8")  # same size, other text
    with pytest.raises(PipelineError, match=r"a different one \(its .*sources.* differ\)"):
        ingest([folder], "beir", out, progress=False)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in out.iterdir()) == ["corpus", "manifest.json", "qrels", "queries.tsv"]
    second = ingest([folder], "beir", out, part_rows=2, overwrite=True, progress=False)
    assert len(second["parts"]) == 4
    assert sorted(p.name for p in (out / "corpus").iterdir()) == [f"part-0000{i}.parquet" for i in range(4)]
    assert second["fingerprint"] != first["fingerprint"]


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
    assert not (tmp_path / "sub").exists()  # folders the failed run created are removed too


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


# --------------------------------------------------------------------------- the output folder


def _tree(root: Path) -> dict:
    """Every file under root (relative path -> bytes), plus empty folders."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_file():
            out[rel] = p.read_bytes()
        elif p.is_dir() and not any(p.iterdir()):
            out[rel + "/"] = None
    return out


def _tsv(path: Path, rows) -> Path:
    path.write_text("".join(f"{pid}\t{text}\n" for pid, text in rows), encoding="utf-8")
    return path


def _corpus_rows(out: Path) -> list[tuple]:
    m = load_manifest(out)
    return [row for part in _read_parts(out, m) for row in part]


def test_refuses_a_folder_that_is_not_a_corpus_and_deletes_nothing(tmp_path):
    src = _tsv(tmp_path / "c.tsv", [(1, "one"), (2, "two")])
    out = tmp_path / "d"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("my notes")
    (out / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before = _tree(tmp_path)
    for overwrite in (False, True):
        with pytest.raises(PipelineError, match="not an ingested corpus") as info:
            ingest([src], "msmarco", out, overwrite=overwrite, progress=False)
        assert "notes.txt" in str(info.value) and "Nothing was changed" in str(info.value)
        assert _tree(tmp_path) == before


def test_an_empty_folder_is_used(tmp_path):
    src = _tsv(tmp_path / "c.tsv", [(1, "one")])
    (tmp_path / "d").mkdir()
    ingest([src], "msmarco", tmp_path / "d", progress=False)
    assert _corpus_rows(tmp_path / "d") == [("1", "", "one")]


def test_refuses_an_output_path_that_is_a_file(tmp_path):
    src = _tsv(tmp_path / "c.tsv", [(1, "one")])
    (tmp_path / "d").write_text("precious")
    with pytest.raises(PipelineError, match="is a file"):
        ingest([src], "msmarco", tmp_path / "d", overwrite=True, progress=False)
    assert (tmp_path / "d").read_text() == "precious"
    with pytest.raises(PipelineError, match="is a file"):
        ingest([src], "msmarco", tmp_path / "d" / "sub", progress=False)
    assert (tmp_path / "d").read_text() == "precious"


def test_overwrite_replaces_only_what_ingest_wrote(tmp_path):
    old_src = _tsv(tmp_path / "old.tsv", [(i, f"old {i}") for i in range(10)])
    queries = _tsv(tmp_path / "q.tsv", [(100, "a query")])
    qrels = tmp_path / "qrels.trec"
    qrels.write_text("100 0 3 1\n")
    out = tmp_path / "d"
    ingest([old_src], "msmarco", out, part_rows=3, queries=queries, qrels={"dev": qrels, "train": qrels},
           progress=False)
    # What users put beside the corpus (the README's own layout), and a file of theirs in qrels/.
    for rel, data in {"emb/shard-00000.npy": b"vectors", "index/index.faiss": b"faiss", "run.trec": b"q 0 d 1 1 x\n",
                      "notes.txt": b"notes", "qrels/mine.txt": b"my own qrels"}.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    users = {k: v for k, v in _tree(out).items() if k.split("/")[0] in ("emb", "index", "run.trec", "notes.txt")
             or k == "qrels/mine.txt"}

    new_src = _tsv(tmp_path / "new.tsv", [(i, f"new {i}") for i in range(5)])
    with pytest.raises(PipelineError, match="--overwrite"):
        ingest([new_src], "msmarco", out, progress=False)
    m = ingest([new_src], "msmarco", out, part_rows=2, qrels={"dev": qrels}, overwrite=True, progress=False)

    after = _tree(out)
    assert {k: after.get(k) for k in users} == users                     # every user file survives
    assert _corpus_rows(out) == [(str(i), "", f"new {i}") for i in range(5)]
    assert sorted(p.name for p in (out / "corpus").iterdir()) == [f"part-0000{i}.parquet" for i in range(3)]
    assert not (out / "queries.tsv").exists() and "queries" not in m   # the old run's queries went with it
    assert (out / "qrels" / "dev.trec").exists() and not (out / "qrels" / "train.trec").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "new.tsv", "old.tsv", "q.tsv", "qrels.trec"]


def test_overwrite_refuses_foreign_files_inside_what_it_replaces(tmp_path):
    src = _tsv(tmp_path / "c.tsv", [(1, "one")])
    out = tmp_path / "d"
    ingest([src], "msmarco", out, progress=False)
    (out / "corpus" / "README").write_text("mine")
    before = _tree(tmp_path)
    with pytest.raises(PipelineError, match="README"):
        ingest([src], "msmarco", out, overwrite=True, progress=False)
    assert _tree(tmp_path) == before
    (out / "corpus" / "README").unlink()
    (out / "queries.tsv").write_text("my queries, not ingest's\n")     # the old manifest lists no queries
    queries = _tsv(tmp_path / "q.tsv", [(5, "q")])
    before = _tree(tmp_path)
    with pytest.raises(PipelineError, match="not written by ingest"):
        ingest([src], "msmarco", out, queries=queries, overwrite=True, progress=False)
    assert _tree(tmp_path) == before


class _Killed(BaseException):
    """Stands in for SIGKILL: not an Exception, so no handler in ingest catches it as an error."""


def test_interrupted_swap_is_finished_by_the_next_run(tmp_path, monkeypatch):
    """A run stopped after any rename of the swap never leaves a trusted half corpus, and the
    next ingest into the folder completes it; user files are never touched."""
    import pipeline.data.ingest as ingest_mod

    old_src = _tsv(tmp_path / "old.tsv", [(i, f"old {i}") for i in range(6)])
    new_src = _tsv(tmp_path / "new.tsv", [(i, f"new {i}") for i in range(4)])
    queries = _tsv(tmp_path / "q.tsv", [(100, "a query")])
    real_replace = os.replace
    for kill_after in range(0, 5):  # 3 renames move the old entries aside, 2 move the new ones in
        out = tmp_path / f"d{kill_after}"
        ingest([old_src], "msmarco", out, part_rows=4, queries=queries, progress=False)
        (out / "emb").mkdir()
        (out / "emb" / "x.npy").write_bytes(b"mine")
        old_rows = _corpus_rows(out)
        calls = []

        def replace(src, dst):
            if "/old/" in str(dst) or ("/new/" in str(src) and ".tmp-ingest-" not in str(dst)):  # the swap's
                if len(calls) == kill_after:
                    raise _Killed()
                calls.append(src)
            return real_replace(src, dst)

        monkeypatch.setattr(ingest_mod.os, "replace", replace)
        with pytest.raises(_Killed):
            ingest([new_src], "msmarco", out, part_rows=3, overwrite=True, progress=False)
        monkeypatch.setattr(ingest_mod.os, "replace", real_replace)
        if kill_after == 0:
            assert _corpus_rows(out) == old_rows           # stopped before the first rename: old corpus intact
        else:
            with pytest.raises(InputError, match="interrupted"):
                load_manifest(out)                         # no manifest: not trusted, and says why
        assert (out / "emb" / "x.npy").read_bytes() == b"mine"

        # The next run finishes the swap (then, as always, needs --overwrite to replace it again).
        m = ingest([new_src], "msmarco", out, part_rows=3, overwrite=True, progress=False)
        assert _corpus_rows(out) == [(str(i), "", f"new {i}") for i in range(4)] and m["rows"] == 4
        assert not (out / "queries.tsv").exists()
        assert (out / "emb" / "x.npy").read_bytes() == b"mine"
        assert not [p for p in out.iterdir() if p.name.startswith(".tmp")]


def test_failure_while_building_keeps_the_old_corpus(tmp_path, monkeypatch):
    import pipeline.data.ingest as ingest_mod

    old_src = _tsv(tmp_path / "old.tsv", [(i, f"old {i}") for i in range(6)])
    out = tmp_path / "d"
    ingest([old_src], "msmarco", out, part_rows=2, progress=False)
    before = _tree(tmp_path)
    real_close = ingest_mod._PartWriter._close_part

    def close_part(self):
        real_close(self)
        if len(self.parts) == 2:
            # while the new corpus is half written, the old one is still complete and readable
            assert _corpus_rows(out) == [(str(i), "", f"old {i}") for i in range(6)]
            raise _Killed()

    monkeypatch.setattr(ingest_mod._PartWriter, "_close_part", close_part)
    with pytest.raises(_Killed):
        ingest([_tsv(tmp_path / "new.tsv", [(i, "n") for i in range(9)])], "msmarco", out, part_rows=2,
               overwrite=True, progress=False)
    before["new.tsv"] = (tmp_path / "new.tsv").read_bytes()
    assert _tree(tmp_path) == before


def test_stale_temporary_folder_of_a_killed_run_is_removed_and_reported(tmp_path, capsys):
    src = _tsv(tmp_path / "c.tsv", [(1, "one")])
    out = tmp_path / "d"
    ingest([src], "msmarco", out, progress=False)
    stale = out / ".tmp-ingest-dead"
    (stale / "new" / "corpus").mkdir(parents=True)
    (stale / "new" / "corpus" / "part-00000.parquet").write_bytes(b"half")
    ingest([src], "msmarco", out, overwrite=True, progress=False)
    assert not stale.exists()
    assert "interrupted ingest" in capsys.readouterr().err


@pytest.mark.slow
def test_killed_process_leaves_the_old_corpus_and_the_next_run_cleans_up(tmp_path):
    """A real SIGKILL while the new parts are being written."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "d"
    _tsv(tmp_path / "small.tsv", [(i, f"old {i}") for i in range(5)])
    ingest([tmp_path / "small.tsv"], "msmarco", out, progress=False)
    old_rows = _corpus_rows(out)
    big = _tsv(tmp_path / "big.tsv", [(i, f"passage {i} " + "word " * 20) for i in range(300_000)])
    code = ("from pipeline.data.ingest import ingest; "
            f"ingest([{str(big)!r}], 'msmarco', {str(out)!r}, part_rows=500, overwrite=True, progress=False)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 60
        while not list(out.glob(".tmp-ingest-*/new/corpus/part-00003.parquet")):
            assert proc.poll() is None, "ingest finished before it could be killed; make the corpus bigger"
            assert time.time() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert list(out.glob(".tmp-ingest-*"))                  # the killed run's temporary folder is left...
    assert _corpus_rows(out) == old_rows                    # ...and the old corpus is untouched and readable
    again = ingest([big], "msmarco", out, part_rows=500, overwrite=True, progress=False)
    assert not list(out.glob(".tmp-ingest-*"))              # the next run removed it
    # and what it made is what an uninterrupted run makes: the same manifest, fingerprint and parts
    whole = ingest([big], "msmarco", tmp_path / "whole", part_rows=500, progress=False)
    assert again["fingerprint"] == whole["fingerprint"]
    drop = lambda m: {k: v for k, v in m.items() if k != "created_at"}  # noqa: E731
    assert drop(again) == drop(whole)
    assert [(out / p["file"]).read_bytes() for p in again["parts"]] == \
        [(tmp_path / "whole" / p["file"]).read_bytes() for p in whole["parts"]]


@pytest.mark.parametrize("kwargs, match", [
    ({"part_rows": 0}, "part-rows"),
    ({"part_rows": -5}, "part-rows"),
    ({"variant": "msmarco-titled"}, "msmarco-titled"),
    ({"variant": "wiki-dpr"}, "wiki-dpr"),
    ({"hf_fields": {"id_field": "docid"}}, "--id-field"),
    ({"qrels": {"../escape": "q.trec"}}, "split name"),
])
def test_option_errors_write_nothing(tmp_path, kwargs, match):
    src = _tsv(tmp_path / "c.tsv", [(1, "one")])
    (tmp_path / "q.trec").write_text("q 0 1 1\n")
    if "qrels" in kwargs:
        kwargs = {"qrels": {k: tmp_path / v for k, v in kwargs["qrels"].items()}}
    before = _tree(tmp_path)
    with pytest.raises(PipelineError, match=match):
        ingest([src], "msmarco", tmp_path / "out", progress=False, **kwargs)
    assert _tree(tmp_path) == before


def test_same_file_twice_is_refused_as_such(tmp_path):
    src = _tsv(tmp_path / "c.tsv", [(1, "one")])
    (tmp_path / "link.tsv").symlink_to(src)
    for second in (src, tmp_path / "link.tsv", tmp_path / "." / "c.tsv"):
        with pytest.raises(PipelineError) as info:
            ingest([src, second], "msmarco", tmp_path / "out", progress=False)
        assert "give each corpus file once" in str(info.value) and "duplicate" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_msmarco_pids_must_be_integers(tmp_path):
    src = _tsv(tmp_path / "c.tsv", [(1, "one"), ("2a", "two")])
    with pytest.raises(InputError) as info:
        ingest([src], "msmarco", tmp_path / "out", progress=False)
    assert (info.value.line, Path(info.value.path)) == (2, src) and "integer" in info.value.reason
    m = ingest([src], "msmarco", tmp_path / "out", variant="custom", progress=False)
    assert m["variant"] == "custom" and m["rows"] == 2


def test_titled_variant_needs_titles(tmp_path):
    src = tmp_path / "t.tsv"
    src.write_text("1\t-\tone\n2\t\ttwo\n")
    with pytest.raises(PipelineError, match="no passage .* has a title"):
        ingest([src], "msmarco-titled", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_leftovers_of_the_older_replacement_are_reported_not_deleted(tmp_path, capsys):
    src = _tsv(tmp_path / "c.tsv", [(1, "one")])
    (tmp_path / ".old-d-1234" / "corpus").mkdir(parents=True)   # an older version's half-done swap
    ingest([src], "msmarco", tmp_path / "d", progress=False)
    assert (tmp_path / ".old-d-1234" / "corpus").is_dir()
    assert ".old-d-1234" in capsys.readouterr().err


def test_disk_errors_are_messages_and_keep_the_old_corpus(tmp_path, monkeypatch):
    import errno

    import pipeline.data.ingest as ingest_mod

    src = _tsv(tmp_path / "c.tsv", [(i, f"p {i}") for i in range(5)])
    out = tmp_path / "d"
    ingest([src], "msmarco", out, part_rows=2, progress=False)
    before = _tree(tmp_path)

    class Full(ingest_mod.pq.ParquetWriter):
        def write_table(self, *a, **k):
            raise OSError(errno.ENOSPC, "No space left on device", "part-00000.parquet")

    monkeypatch.setattr(ingest_mod.pq, "ParquetWriter", Full)
    with pytest.raises(PipelineError, match="No space left on device.*nothing of this run was kept"):
        ingest([src], "msmarco", out, overwrite=True, progress=False)
    monkeypatch.undo()
    assert _tree(tmp_path) == before

    # A rename failing in the middle of the swap: a message, and the next run finishes the job.
    real_replace = os.replace
    calls = []

    def replace(a, b):
        if "/old/" in str(b):
            calls.append(a)
            if len(calls) == 2:
                raise OSError(errno.EIO, "Input/output error", str(a))
        return real_replace(a, b)

    monkeypatch.setattr(ingest_mod.os, "replace", replace)
    with pytest.raises(PipelineError, match="run the ingest again"):
        ingest([src], "msmarco", out, part_rows=3, overwrite=True, progress=False)
    monkeypatch.undo()
    m = ingest([src], "msmarco", out, part_rows=3, overwrite=True, progress=False)
    assert len(m["parts"]) == 2 and _corpus_rows(out) == [(str(i), "", f"p {i}") for i in range(5)]
    assert not list(out.glob(".tmp-ingest-*"))


def test_hf_save_to_disk_folder_ingests_and_fields_are_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"docid": ["a", "b"], "text": ["one", "two"], "title": ["", "T"]}).save_to_disk(
        str(tmp_path / "saved"))
    with pytest.raises(InputError, match="missing column 'id'"):
        ingest([tmp_path / "saved"], "hf", tmp_path / "out", progress=False)
    m = ingest([tmp_path / "saved"], "hf", tmp_path / "out", hf_fields={"id_field": "docid"}, progress=False)
    assert m["rows"] == 2 and m["sources"][0]["bytes"] > 0 and len(m["sources"][0]["sha256"]) == 64
    assert _corpus_rows(tmp_path / "out") == [("a", "", "one"), ("b", "T", "two")]
    with pytest.raises(PipelineError, match="msmarco-official"):   # labelled MS MARCO: pids must be integers
        ingest([tmp_path / "saved"], "hf", tmp_path / "o2", variant="msmarco-official",
               hf_fields={"id_field": "docid"}, progress=False)
