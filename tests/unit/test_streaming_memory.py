"""What must not grow with the input: the readers and writers behind the spine stream.

Each test runs the same code on an input and on one 10x bigger and compares the peak of Python
allocations (tracemalloc): a streaming reader's peak stays flat, a reader that holds the file grows
~10x. The numbers a streamed path gives are also checked equal to the whole-file path's.
"""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import EvalConfig
from pipeline.data.readers import load_qrels
from pipeline.eval.metrics import evaluate_files, evaluate_run
from pipeline.eval.runs import iter_run_groups, read_run


def _write_run(path: Path, n_queries: int, depth: int, seed: int = 0, interleave: bool = False) -> None:
    rng = random.Random(seed)
    lines = []
    for q in range(n_queries):
        for r in range(depth):
            lines.append((f"q{q}", f"d{(q * 7 + r) % (2 * depth)}", r + 1, round(100 - r - rng.random(), 6)))
    if interleave:
        rng.shuffle(lines)
    path.write_text("".join(f"{q} Q0 {d} {r} {s} t\n" for q, d, r, s in lines))


def _write_qrels(path: Path, n_queries: int, depth: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for q in range(0, n_queries, 1):
            if q % 7 == 3:
                continue  # some run queries unjudged
            for d in rng.sample(range(2 * depth), 3):  # about half of them retrieved, at any rank
                f.write(f"q{q} 0 d{d} {rng.choice([1, 2])}\n")
        f.write("q_missing 0 dz 1\n")  # judged, not in the run


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("per_query", [False, True])
@pytest.mark.parametrize("interleave", [False, True])
def test_streamed_evaluation_equals_whole_file_evaluation(tmp_path, per_query, interleave):
    run, qrels = tmp_path / "run.trec", tmp_path / "qrels.trec"
    _write_run(run, 23, 30, interleave=interleave)
    _write_qrels(qrels, 23, 30)
    cfg = EvalConfig(per_query=per_query, measures=("RR@10", "nDCG@10", "AP@100", "R@20", "P@5", "NumRet"))
    whole = evaluate_run(read_run(run), load_qrels(qrels), cfg)
    for chunk in (1, 100, 10**6):
        got = evaluate_files(run, qrels, cfg, chunk_lines=chunk)
        assert got["queries"] == whole["queries"]
        assert got["run_depth"] == whole["run_depth"]
        assert got["metrics"] == pytest.approx(whole["metrics"], abs=1e-12)
        assert 0 < got["metrics"]["nDCG@10"] < 1
        if per_query:
            assert got["per_query"].keys() == whole["per_query"].keys()
            for q, vals in whole["per_query"].items():
                assert got["per_query"][q] == pytest.approx(vals, abs=1e-12)


def test_run_groups_stream_and_detect_interleaving(tmp_path):
    run = tmp_path / "run.trec"
    _write_run(run, 5, 4)
    groups = list(iter_run_groups(run))
    assert [q for q, _ in groups] == [f"q{i}" for i in range(5)]
    assert {q: d for q, d in groups} == read_run(run)
    run.write_text("a Q0 d1 1 2.0 t\nb Q0 d1 1 2.0 t\na Q0 d2 2 1.0 t\n")
    from pipeline.eval.runs import RunNotGrouped

    with pytest.raises(RunNotGrouped):
        list(iter_run_groups(run))


@pytest.mark.slow
def test_evaluation_memory_does_not_grow_with_the_run(tmp_path):
    small, big, qrels = tmp_path / "small.trec", tmp_path / "big.trec", tmp_path / "qrels.trec"
    _write_run(small, 200, 50)
    _write_run(big, 2000, 50)
    _write_qrels(qrels, 2000, 50)
    cfg = EvalConfig(measures=("RR@10", "nDCG@10", "R@50"))
    p_small = _peak(lambda: evaluate_files(small, qrels, cfg, chunk_lines=5000))
    p_big = _peak(lambda: evaluate_files(big, qrels, cfg, chunk_lines=5000))
    # the whole-file reader would hold 10x the lines; the streamed one holds a 100-query chunk
    assert p_big < 1.5 * p_small, (p_small, p_big)


# --------------------------------------------------------------------------- the run writer

def test_run_writer_holds_one_batch(tmp_path):
    from pipeline.eval.runs import RunWriter

    pids = [f"p{i}" for i in range(5000)]
    rng = np.random.default_rng(0)
    scores = np.sort(rng.random((50, 100)).astype("float32"), axis=1)[:, ::-1]
    ids = rng.integers(0, len(pids), (50, 100))

    def write(batches: int, path: Path):
        with RunWriter(path, "t") as w:
            for b in range(batches):
                w.write([f"q{b}_{i}" for i in range(50)], pids, scores, ids)
        return w.lines

    assert write(3, tmp_path / "a.trec") == 3 * 50 * 100
    small = _peak(lambda: write(4, tmp_path / "s.trec"))
    big = _peak(lambda: write(40, tmp_path / "b.trec"))
    assert big < 1.3 * small, (small, big)
    lines = (tmp_path / "b.trec").read_text().splitlines()
    assert len(lines) == 40 * 50 * 100 and lines[0].split()[3] == "1"


def test_failed_run_writer_leaves_nothing(tmp_path):
    from pipeline.eval.runs import RunWriter

    with pytest.raises(RuntimeError):
        with RunWriter(tmp_path / "run.trec", "t") as w:
            w.write(["q"], ["a"], np.ones((1, 1)), np.zeros((1, 1), dtype=int))
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- the index's pid table

@pytest.mark.parametrize("text", ["a\nb\n", "a\nb", "", "\n\n", "é\nß€\n", "x\r\ny\r\n", "12\n7\n" * 50])
@pytest.mark.parametrize("chunk", [3, 1 << 24])
def test_pid_table_reads_as_splitlines(tmp_path, monkeypatch, text, chunk):
    import pipeline.index.pid_table as pt

    monkeypatch.setattr(pt, "_CHUNK", chunk)
    (tmp_path / "pids.txt").write_bytes(text.encode("utf-8"))
    table = pt.PidTable(tmp_path / "pids.txt")
    want = text.splitlines()
    assert len(table) == len(want) and table.tolist() == want and table == want
    if want:
        assert table[-1] == want[-1] and table[1:] == want[1:]
        with pytest.raises(IndexError):
            table[len(want)]


def test_pid_table_refuses_bytes_that_are_not_utf8(tmp_path, monkeypatch):
    import pipeline.index.pid_table as pt
    from pipeline.errors import InputError

    monkeypatch.setattr(pt, "_CHUNK", 4)
    (tmp_path / "pids.txt").write_bytes(b"ok\n\xc3\xa9\nbad\xff\n")
    with pytest.raises(InputError, match="not UTF-8"):
        pt.PidTable(tmp_path / "pids.txt")


def test_pid_table_costs_8_bytes_a_passage(tmp_path, monkeypatch):
    import pipeline.index.pid_table as pt

    monkeypatch.setattr(pt, "_CHUNK", 1 << 16)  # the scan's temporaries: a few 64 KiB blocks
    (tmp_path / "pids.txt").write_text("".join(f"passage-{i:09d}\n" for i in range(200_000)))
    peak = _peak(lambda: pt.PidTable(tmp_path / "pids.txt"))
    table = pt.PidTable(tmp_path / "pids.txt")
    assert table[123_456] == "passage-000123456"
    # 8 bytes of line end a passage (+ the per-block arrays while scanning), never a string per passage
    # (a list of these ids costs ~70 bytes a passage)
    assert peak < 8 * 200_000 * 2.2 + (1 << 20), peak


# --------------------------------------------------------------------------- the index build

def _corpus_with_vectors(tmp_path: Path, n: int, shard_rows: int, dim: int = 16) -> Path:
    from fixtures import random_collection, random_embeddings

    from pipeline.data.ingest import ingest

    random_collection(tmp_path / f"c{n}.tsv", n, min_words=2, max_words=4)
    corpus = ingest([tmp_path / f"c{n}.tsv"], "msmarco", tmp_path / f"corpus{n}", progress=False) and \
        tmp_path / f"corpus{n}"
    return random_embeddings(corpus, tmp_path / f"emb{n}", shard_rows=shard_rows, dim=dim)


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["IVF8,SQ8", "PQ4"])
def test_index_build_holds_a_bounded_sample_and_one_batch(tmp_path, factory):
    from pipeline.config import IndexConfig
    from pipeline.index.faiss_index import build_index

    # 128 dimensions: the vectors outweigh the per-shard bookkeeping (36 more shards in the big corpus); at 16
    # the bookkeeping alone made the big build 1.43x the small one on Python 3.11 and 1.73x on 3.13
    small = _corpus_with_vectors(tmp_path, 2_000, 500, dim=128)
    big = _corpus_with_vectors(tmp_path, 20_000, 500, dim=128)
    cfg = IndexConfig(factory=factory, train_sample=1_000, add_batch_size=500)
    p_small = _peak(lambda: build_index(small, tmp_path / "i_small", cfg, progress=False))
    p_big = _peak(lambda: build_index(big, tmp_path / "i_big", cfg, progress=False))
    # 10x the vectors: the training sample is capped and vectors are added a batch at a time (holding them all
    # would be 10 MB against the small build's ~1 MB; measured 1.04-1.13x on Python 3.11 and 3.13)
    assert p_big < 1.5 * p_small, (p_small, p_big)


def test_flat_index_that_would_not_fit_is_refused_naming_a_factory_that_would(tmp_path):
    import faiss

    from pipeline.config import IndexConfig
    from pipeline.errors import ResourceError
    from pipeline.index.faiss_index import build_index, compressed_factory

    emb = _corpus_with_vectors(tmp_path, 3_000, 1_000)
    # a memory budget of 1e-9 of what is available: nothing fits, and nothing is written
    with pytest.raises(ResourceError, match=r"needs ~.* GiB.*--factory 'IVF\d+,PQ\d+' would take") as e:
        build_index(emb, tmp_path / "idx", IndexConfig(max_ram_fraction=1e-9), progress=False)
    assert not (tmp_path / "idx").exists()
    factory = str(e.value).split("--factory '")[1].split("'")[0]
    assert factory == compressed_factory(3_000, 16)[0]
    index = faiss.index_factory(16, factory)  # a valid factory for this corpus: at least 39 vectors a list
    assert int(factory[3:].split(",")[0]) * 39 <= 3_000 and not index.is_trained


def test_pid_table_take_equals_indexing(tmp_path):
    import pipeline.index.pid_table as pt

    (tmp_path / "pids.txt").write_bytes("a\r\nbé\r\n\r\nlast".encode("utf-8"))
    table = pt.PidTable(tmp_path / "pids.txt")
    assert table.take([3, 0, 1, 2, 1]) == ["last", "a", "bé", "", "bé"] == [table[i] for i in (3, 0, 1, 2, 1)]
    with pytest.raises(IndexError):
        table.take([4])


def test_passage_store_looks_texts_up_by_pid(tmp_path):
    import pyarrow as pa

    from pipeline.data.corpus import PassageStore
    from pipeline.data.ingest import ingest

    (tmp_path / "c.tsv").write_text("b\tsecond\na\tfirst\né\tthird\nzz9\tfourth\n10\tfifth\n")
    ingest([tmp_path / "c.tsv"], "msmarco", tmp_path / "corpus", variant="custom", progress=False)
    store = PassageStore(tmp_path / "corpus", pa.array(["a", "é", "10", "10", "nope"]), tmp_path / "s.arrow")
    assert len(store) == 3 and store.missing.to_pylist() == ["nope"]
    assert store.get(["é", "a", "nope", "10", "a", "b"]) == ["third", "first", None, "fifth", "first", None]
    assert store.get([]) == []


def test_passage_store_with_decimal_pids_keys_them_by_value_and_gathers_across_parts(tmp_path):
    """Decimal pids (MS MARCO, DPR) are looked up by their integer value; an id that only looks
    like one of them ("007", "+7", "7.0", " 7", one past int64) is not found, and texts come from
    every corpus part (chunk) in the asked order."""
    import pyarrow as pa

    from pipeline.data.corpus import PassageStore
    from pipeline.data.ingest import ingest

    (tmp_path / "c.tsv").write_text("".join(f"{i}\tpassage {i}\n" for i in (0, 7, 70, 9, 123456789012345678, 5, 12)))
    ingest([tmp_path / "c.tsv"], "msmarco", tmp_path / "corpus", variant="custom", part_rows=2, progress=False)
    store = PassageStore(tmp_path / "corpus", pa.array(["0", "7", "70", "9", "123456789012345678", "5", "12"]),
                         tmp_path / "s.arrow")
    assert store._numeric and store._table["text"].num_chunks > 1
    asked = ["12", "007", "7", "+7", "7.0", " 7", "0", "9223372036854775808", "123456789012345678", "5", "x", "70"]
    assert store.get(asked) == ["passage 12", None, "passage 7", None, None, None, "passage 0", None,
                                "passage 123456789012345678", "passage 5", None, "passage 70"]
    assert store.take(pa.array(["9", "9"])).to_pylist() == ["passage 9", "passage 9"]


def test_a_full_disk_during_the_index_build_is_a_message_and_keeps_the_old_index(tmp_path, monkeypatch):
    import errno

    import pipeline.index.faiss_index as fi
    from pipeline.config import IndexConfig
    from pipeline.io_utils import OutputError

    emb = _corpus_with_vectors(tmp_path, 2_000, 500)
    out = tmp_path / "idx"
    fi.build_index(emb, out, IndexConfig(), progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_write = fi._faiss().write_index

    def full(*args):  # what FAISS raises when the disk fills under it (writing the index file)
        real_write(*args)
        if not (len(args) == 2 and str(args[1]).endswith("index.faiss")):
            return  # serialize_index (the size estimate) writes through it too
        raise RuntimeError("Error in void faiss::write_index(...) at index_write.cpp:499: Error: 'ret == "
                           "(size * 4)' failed: write error in x: 1 != 2 (No space left on device)")

    monkeypatch.setattr(fi._faiss(), "write_index", full)
    with pytest.raises(OutputError, match=r"cannot write the index \(.*No space left on device\)+; nothing was "
                                          r"written, the existing index is kept"):
        fi.build_index(emb, out, IndexConfig(), progress=False, overwrite=True)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []

    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fi, "_write_index", no_space)
    with pytest.raises(OutputError, match=r"cannot write the index \(No space left on device\)"):
        fi.build_index(emb, tmp_path / "new", IndexConfig(), progress=False)
    assert not (tmp_path / "new").exists()


def test_a_real_full_disk_leaves_nothing(tmp_path):
    """The same on a 300 KB tmpfs (root only: skipped where mounting is not allowed)."""
    import subprocess

    import pipeline.index.faiss_index as fi
    from pipeline.config import IndexConfig
    from pipeline.io_utils import OutputError

    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        emb = _corpus_with_vectors(tmp_path, 5_000, 1_000)  # 5,000 x 16 float32 = 320 KB of index
        with pytest.raises(OutputError, match="No space left on device"):
            fi.build_index(emb, mnt / "idx", IndexConfig(), progress=False)
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


# --------------------------------------------------------------------------- ingest

def test_pid_hash_check_spilled_to_buckets_finds_the_same_repeats(tmp_path):
    from pipeline.data.ingest import _PidHashes

    rng = np.random.default_rng(5)
    values = rng.integers(0, 2**64, 5_000, dtype=np.uint64, endpoint=False).tolist()
    values += values[17:40] + values[4_000:4_003] * 2  # repeats far from their first sight, one thrice
    rng.shuffle(values)
    want = {v for v in set(values) if values.count(v) > 1}
    spilled, in_memory = _PidHashes(tmp_path / "spill"), _PidHashes(tmp_path / "mem")
    spilled.SPILL_AT, in_memory.SPILL_AT = 300, 10**6
    for v in values:
        spilled.add(v)
        in_memory.add(v)
    assert spilled.repeated() == in_memory.repeated() == want and len(want) == 26
    files = sorted((tmp_path / "spill").glob("*.u64"))
    assert len(files) > 200 and sum(f.stat().st_size for f in files) == 8 * len(values)
    assert not (tmp_path / "mem").exists()


def test_ingest_finds_a_duplicate_id_across_spilled_hashes(tmp_path, monkeypatch):
    from pipeline.data import ingest as ingest_mod
    from pipeline.errors import InputError

    monkeypatch.setattr(ingest_mod._PidHashes, "SPILL_AT", 50)
    lines = [f"{i}\tpassage {i}\n" for i in range(1_000)] + ["17\tagain\n"]
    (tmp_path / "c.tsv").write_text("".join(lines))
    with pytest.raises(InputError, match=r"c\.tsv:1001: duplicate passage id '17' \(first seen at .*c\.tsv:18\)"):
        ingest_mod.ingest([tmp_path / "c.tsv"], "msmarco", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_ingest_memory_does_not_grow_with_the_corpus(tmp_path, monkeypatch):
    from fixtures import random_collection

    from pipeline.data import ingest as ingest_mod

    # a row group of 1,000 rows and hashes spilled beyond 2,000: the 10x corpus fits one 100k-row part,
    # which a writer that buffered the part (or a reader that held the file) would hold whole
    monkeypatch.setattr(ingest_mod._PartWriter, "ROW_GROUP", 1_000)
    monkeypatch.setattr(ingest_mod._PidHashes, "SPILL_AT", 2_000)
    for n in (4_000, 40_000):
        random_collection(tmp_path / f"c{n}.tsv", n, min_words=5, max_words=30)
    ingest_mod.ingest([tmp_path / "c4000.tsv"], "msmarco", tmp_path / "warm", progress=False)  # lazy imports
    p_small = _peak(lambda: ingest_mod.ingest([tmp_path / "c4000.tsv"], "msmarco", tmp_path / "small",
                                              progress=False))
    p_big = _peak(lambda: ingest_mod.ingest([tmp_path / "c40000.tsv"], "msmarco", tmp_path / "big",
                                            progress=False))
    assert p_big < 1.5 * p_small, (p_small, p_big)
    import pyarrow.parquet as pq

    part = pq.ParquetFile(tmp_path / "big" / "corpus" / "part-00000.parquet")
    assert part.metadata.num_rows == 40_000 and part.metadata.num_row_groups == 40


def test_ingest_parts_and_row_groups_follow_part_rows(tmp_path):
    import pyarrow.parquet as pq
    from fixtures import random_collection

    from pipeline.data.ingest import ingest

    texts = random_collection(tmp_path / "c.tsv", 40_000, min_words=1, max_words=3)
    manifest = ingest([tmp_path / "c.tsv"], "msmarco", tmp_path / "out", part_rows=17_000, progress=False)
    assert [p["rows"] for p in manifest["parts"]] == [17_000, 17_000, 6_000]
    groups = [[pq.ParquetFile(tmp_path / "out" / p["file"]).metadata.row_group(g).num_rows
               for g in range(pq.ParquetFile(tmp_path / "out" / p["file"]).metadata.num_row_groups)]
              for p in manifest["parts"]]
    assert groups == [[16_384, 616], [16_384, 616], [6_000]]
    got = [t for p in manifest["parts"] for t in pq.read_table(tmp_path / "out" / p["file"]).column("text").to_pylist()]
    assert got == texts


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["Flat", "SQ8", "PQ4"])
def test_an_index_with_one_code_array_is_sized_once_and_never_copied(factory):
    """Flat/SQ/PQ keep their codes in one array that adding would grow (each growth a copy: the build
    peaked at ~1.4x the index): sized up front, its storage never moves while the vectors go in."""
    import faiss

    from pipeline.index.faiss_index import _reserve_codes, new_index

    x = np.random.default_rng(0).random((6_000, 16), dtype=np.float32)

    def storage_moves(reserve: bool) -> int:
        index = new_index(16, factory, faiss.METRIC_L2)  # as the build makes it
        if not index.is_trained:
            index.train(x[:2_000])
        if reserve:
            _reserve_codes(index, len(x))
        where = set()
        for s in range(0, len(x), 500):
            index.add(x[s:s + 500])
            where.add(int(index.codes.data()))
        assert index.ntotal == len(x) and index.codes.size() == len(x) * index.code_size
        return len(where) - 1

    assert storage_moves(reserve=False) > 0
    assert storage_moves(reserve=True) == 0


@pytest.mark.slow
def test_faiss_training_warnings_come_back_as_one_line_of_ours(tmp_path, capfd):
    """A PQ factory trained on a corpus smaller than FAISS advises printed FAISS's C++ warning once per
    sub-quantizer (64 identical stderr lines for PQ64): now one `[index] note:` line, nothing on stderr."""
    from pipeline.config import IndexConfig
    from pipeline.index.faiss_index import build_index

    emb = _corpus_with_vectors(tmp_path, 2_000, 500)
    capfd.readouterr()
    build_index(emb, tmp_path / "pq", IndexConfig(factory="PQ8"), progress=True)
    out, err = capfd.readouterr()
    assert "WARNING" not in err  # stderr holds only the progress bar
    notes = [line for line in out.splitlines() if line.startswith("[index] note:")]
    assert notes == ["[index] note: FAISS trained 8 clusterings of 256 centroids on 2,000 vectors, fewer than the "
                     "9,984 it advises: the codes are coarser (compare its recall with Flat; on a corpus this small "
                     "Flat is exact and fast)"]
    build_index(emb, tmp_path / "pq-sample", IndexConfig(factory="PQ8", train_sample=1_000), progress=True)
    assert [line for line in capfd.readouterr().out.splitlines() if "note:" in line] == [
        "[index] note: FAISS trained 8 clusterings of 256 centroids on 1,000 vectors, fewer than the 9,984 it "
        "advises: the codes are coarser (raise index.train_sample to 9,984, or compare its recall with Flat)"]
    build_index(emb, tmp_path / "flat", IndexConfig(factory="Flat"), progress=True)  # nothing to train: no note
    assert "note:" not in capfd.readouterr().out
