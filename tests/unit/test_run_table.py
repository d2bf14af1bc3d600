"""pipeline.data.run_table: a plain TREC run's hard negatives read column-wise equal, key for key,
what the line reader makes of the same file; any other form is left to the line reader (None)."""

from __future__ import annotations

import gzip
import random

import pytest

from pipeline.data import run_negatives
from pipeline.data.run_table import BLOCK_BYTES, negatives_by_query
from pipeline.errors import InputError


def line_reader(monkeypatch, run, positives, judged, depth, max_negatives):
    monkeypatch.setattr(run_negatives, "negatives_by_query", lambda *a: None)
    return run_negatives.run_negatives(run, positives, judged, depth, max_negatives)


def random_run(path, seed: int, queries: int = 60, grouped: bool = True, ties: bool = True):
    """A run with ties in score (broken by docid), duplicate docids, queries without positives,
    rank columns that are 0- or 1-based and not the score's order; grouped by query or interleaved."""
    rng = random.Random(seed)
    lines, positives, judged = [], {}, {}
    for q in range(queries):
        qid = f"q{q}"
        docs = [f"d{rng.randrange(400)}" for _ in range(rng.randrange(0, 40))]
        for r, d in enumerate(docs):
            score = rng.choice([1.0, 2.0, 3.5]) if ties else rng.random() * 10
            lines.append(f"{qid} Q0 {d} {r + rng.choice([0, 1])} {score} tag")
        if rng.random() < 0.8:  # some queries have no positive: their lines are not wanted
            pos = tuple(dict.fromkeys(rng.sample(docs, min(2, len(docs))) + [f"p{q}"]))
            positives[qid] = pos
            judged[qid] = pos + tuple(f"d{rng.randrange(400)}" for _ in range(rng.randrange(3)))
            judged[qid] = tuple(dict.fromkeys(judged[qid]))
    if not grouped:
        rng.shuffle(lines)
    path.write_text("\n".join(lines) + "\n")
    return positives, judged


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_the_column_reader_equals_the_line_reader(tmp_path, monkeypatch, seed, grouped):
    run = tmp_path / "run.trec"
    positives, judged = random_run(run, seed, grouped=grouped, ties=seed % 2 == 0)
    for depth, most in ((5, 30), (100, 3), (1, 1)):
        fast = negatives_by_query(run, positives, judged, depth, most)
        assert fast is not None
        assert fast == line_reader(monkeypatch, run, positives, judged, depth, most)
        monkeypatch.undo()


def test_blocks_merge_a_query_split_between_them(tmp_path, monkeypatch):
    """A query whose lines straddle two CSV blocks keeps its true top (not each block's)."""
    monkeypatch.setattr("pipeline.data.run_table.BLOCK_BYTES", 1 << 12)
    run = tmp_path / "run.trec"
    positives, judged = random_run(run, 7, queries=300, grouped=True)
    assert run.stat().st_size > 4 * (1 << 12) and BLOCK_BYTES > 1 << 12
    fast = negatives_by_query(run, positives, judged, 4, 30)
    monkeypatch.undo()
    assert fast == line_reader(monkeypatch, run, positives, judged, 4, 30)


@pytest.mark.parametrize("text", [
    "q1 Q0 d1 1 2.0 t\r\nq1 Q0 d2 2 1.0 t\r\n",   # CRLF
    "q1\tQ0\td1\t1\t2.0\tt\nq1\tQ0\td2\t2\t1.0\tt\n",  # tabs
    "q1  Q0 d1 1 2.0 t\nq1 Q0 d2 2 1.0 t\n",        # two spaces
    "\ufeffq1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 1.0 t\n",   # BOM
    "q1 Q0 d1 1 2.0 t \nq1 Q0 d2 2 1.0 t\n",        # trailing space
])
def test_other_well_formed_runs_go_to_the_line_reader_and_give_the_same(tmp_path, monkeypatch, text):
    run = tmp_path / "run.trec"
    run.write_text(text, encoding="utf-8", newline="")
    assert negatives_by_query(run, {"q1": ("p",)}, {"q1": ("p",)}, 10, 30) is None
    assert run_negatives.run_negatives(run, {"q1": ("p",)}, {"q1": ("p",)}, 10, 30) == {"q1": "d1\td2"}


def test_a_gzipped_run_goes_to_the_line_reader(tmp_path):
    run = tmp_path / "run.trec.gz"
    run.write_bytes(gzip.compress(b"q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 1.0 t\n"))
    assert negatives_by_query(run, {"q1": ("p",)}, {"q1": ("p",)}, 10, 30) is None
    assert run_negatives.run_negatives(run, {"q1": ("p",)}, {"q1": ("p",)}, 10, 30) == {"q1": "d1\td2"}


@pytest.mark.parametrize("bad, reason", [
    ("q1 Q0 d2 x 1.0 t", "rank 'x' is not an integer"),
    ("q1 Q0 d2 2 high t", "score 'high' is not a number"),
    ("q1 Q0 d2 2 1.0", "expected 6 columns"),
    ("q1 Q0 d2 2 1.0 t extra", "expected 6 columns"),
])
def test_a_bad_line_is_named_by_the_line_reader(tmp_path, bad, reason):
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1 1 2.0 t\n" * 3 + bad + "\nq1 Q0 d3 3 0.5 t\n")
    assert negatives_by_query(run, {"q1": ("p",)}, {"q1": ("p",)}, 10, 30) is None
    with pytest.raises(InputError, match=reason) as e:
        run_negatives.run_negatives(run, {"q1": ("p",)}, {"q1": ("p",)}, 10, 30)
    assert ":4" in str(e.value)


def test_read_ahead_yields_in_order_raises_the_producers_error_and_stops_it(monkeypatch):
    """The examples are produced a batch ahead in a thread of their own: the same items in the same
    order, the producer's error raised in the consumer, a consumer that stops closes the producer,
    and the producer's progress reaches the consumer's sink."""
    from pipeline import progress
    from pipeline.data.training import _read_ahead

    assert list(_read_ahead(iter(range(50)))) == list(range(50))

    def failing():
        yield 1
        raise InputError("run.trec", 7, "bad line")

    with pytest.raises(InputError, match="run.trec:7"):
        list(_read_ahead(failing()))

    closed = []

    def endless():
        try:
            i = 0
            while True:
                progress.update("reading corpus parts", i, 10**9)
                yield i
                i += 1
        finally:
            closed.append(True)

    seen = []
    with progress.sink(seen.append, every=0):
        it = _read_ahead(endless())
        assert [next(it) for _ in range(5)] == list(range(5))
        it.close()
    assert closed == [True] and seen and seen[0]["what"] == "reading corpus parts"
