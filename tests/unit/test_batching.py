"""pipeline.train.batching: the seeded shuffle, fixed-size batches, negatives, steps per epoch."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pipeline.train.batching import buffer_shuffle, epoch_rng, fixed_batches, pick_negatives, steps_per_epoch


def _rows(n):
    return [{"idx": i} for i in range(n)]


def _order(n, window, seed=0, epoch=0, rank=0):
    return [r["idx"] for r in buffer_shuffle(iter(_rows(n)), window, epoch_rng(seed, epoch, rank))]


@pytest.mark.parametrize("n,window", [(100, 10), (100, 1000), (7, 3), (0, 5), (1, 2)])
def test_buffer_shuffle_is_a_permutation(n, window):
    out = _order(n, window)
    assert len(out) == n and sorted(out) == list(range(n))  # nothing lost, nothing repeated


def test_buffer_shuffle_deterministic_and_varies_by_epoch_seed_rank():
    a = _order(200, 16, seed=3, epoch=1, rank=0)
    assert a == _order(200, 16, seed=3, epoch=1, rank=0)
    assert a != list(range(200))  # it does shuffle
    assert a != _order(200, 16, seed=3, epoch=2, rank=0)
    assert a != _order(200, 16, seed=4, epoch=1, rank=0)
    assert a != _order(200, 16, seed=3, epoch=1, rank=1)


def test_buffer_shuffle_window_one_keeps_order():
    assert _order(20, 1) == list(range(20))
    assert _order(20, 0) == list(range(20))


def test_buffer_shuffle_streams():
    """A window of w holds at most w rows: the first output comes after w+1 inputs, not at the end."""
    pulled = []

    def source():
        for i in range(1000):
            pulled.append(i)
            yield {"idx": i}

    it = buffer_shuffle(source(), 10, random.Random(0))
    next(it)
    assert len(pulled) == 11


def test_fixed_batches_exact_count_and_size():
    rows = _rows(23)
    batches = list(fixed_batches(iter(rows), 4, 5))
    assert len(batches) == 5 and all(len(b) == 4 for b in batches)
    assert [r["idx"] for b in batches for r in b] == list(range(20))
    # fewer rows than asked: only full batches, the partial tail is dropped
    short = list(fixed_batches(iter(rows), 4, 100))
    assert [len(b) for b in short] == [4] * 5
    assert list(fixed_batches(iter(rows), 4, 0)) == []
    # it stops pulling once max_batches are out
    it = iter(rows)
    list(fixed_batches(it, 4, 2))
    assert next(it)["idx"] == 8


def test_same_inputs_give_the_same_batches():
    """The resume property: the b-th batch of an epoch is a function of (seed, epoch, rank)."""
    def batches(epoch):
        return [[r["idx"] for r in b] for b in
                fixed_batches(buffer_shuffle(iter(_rows(64)), 8, epoch_rng(7, epoch, 0)), 4, 10)]

    assert batches(0) == batches(0)
    assert batches(0) != batches(1)


def test_pick_negatives_sample():
    row = {"idx": 1, "negatives": [f"n{i}" for i in range(10)]}
    a = pick_negatives(row, 4, random.Random(5))
    assert len(a) == 4 and len(set(a)) == 4 and set(a) <= set(row["negatives"])
    assert a == pick_negatives(row, 4, random.Random(5))
    assert row["negatives"] == [f"n{i}" for i in range(10)]  # input untouched
    assert sorted(pick_negatives(row, 10, random.Random(1))) == sorted(row["negatives"])


def test_pick_negatives_cycles_when_too_few():
    row = {"idx": 2, "negatives": ["a", "b", "c"]}
    out = pick_negatives(row, 7, random.Random(0))
    counts = Counter(out)
    assert len(out) == 7 and set(counts) == {"a", "b", "c"}
    assert max(counts.values()) - min(counts.values()) <= 1  # round robin: 3, 2, 2
    assert out[:3] == out[3:6] and out[6] == out[0]
    assert row["negatives"] == ["a", "b", "c"]


def test_pick_negatives_empty():
    assert pick_negatives({"idx": 3, "negatives": []}, 0, random.Random(0)) == []
    assert pick_negatives({"idx": 3, "negatives": ["x"]}, 0, random.Random(0)) == []
    with pytest.raises(ValueError, match="example 3"):
        pick_negatives({"idx": 3, "negatives": []}, 2, random.Random(0))


@pytest.mark.parametrize("n,world,batch", [(10, 1, 3), (11, 2, 2), (7, 3, 2), (3, 4, 1), (100, 4, 8), (0, 2, 1)])
def test_steps_per_epoch_is_the_smallest_rank_share(n, world, batch):
    shares = [len(range(r, n, world)) for r in range(world)]  # rank r streams idx % world == r
    assert steps_per_epoch(n, world, batch) == min(shares) // batch


def test_steps_per_epoch_by_hand():
    assert steps_per_epoch(10, 1, 3) == 3
    assert steps_per_epoch(11, 2, 2) == 2   # shares 6 and 5
    assert steps_per_epoch(3, 4, 1) == 0    # one rank has nothing
