"""Deterministic batches for data-parallel training: exact resume without lost or repeated data.

Each worker r streams its own Ray Data dataset (examples with idx % world == r, order
preserved), shuffles it through a buffer seeded by (seed, epoch, rank), and cuts fixed-size
batches. Given the same inputs, the b-th batch of an epoch is always the same, so a resumed
run skips exactly the batches it already trained on (without tokenising them).
"""

from __future__ import annotations

import random
from typing import Iterable, Iterator


def epoch_rng(seed: int, epoch: int, rank: int) -> random.Random:
    return random.Random(seed * 1_000_003 + epoch * 10_007 + rank)


def buffer_shuffle(rows: Iterable[dict], window: int, rng: random.Random) -> Iterator[dict]:
    """Seeded streaming shuffle through a buffer of `window` rows (window <= 1: no shuffle)."""
    if window <= 1:
        yield from rows
        return
    buf: list[dict] = []
    for row in rows:
        if len(buf) < window:
            buf.append(row)
            continue
        i = rng.randrange(len(buf))
        buf[i], row = row, buf[i]
        yield row
    rng.shuffle(buf)
    yield from buf


def fixed_batches(rows: Iterable[dict], batch_size: int, max_batches: int) -> Iterator[list[dict]]:
    """Cut `rows` into `max_batches` batches of exactly `batch_size` (the rest is dropped)."""
    if max_batches <= 0:
        return
    batch: list[dict] = []
    n = 0
    for row in rows:
        batch.append(row)
        if len(batch) == batch_size:
            yield batch
            n += 1
            batch = []
            if n == max_batches:
                return


def pick_negative_positions(row: dict, k: int, rng: random.Random) -> list[int]:
    """The positions in the example's negatives of its k hard negatives: a seeded sample, cycling when fewer than
    k exist (the draw `pick_negatives` makes: the same positions for the same rng state)."""
    n = len(row["negatives"])
    if k == 0:
        return []
    if not n:
        raise ValueError(f"example {row['idx']} has no negatives but {k} are asked for")
    if n >= k:
        return rng.sample(range(n), k)
    order = list(range(n))
    rng.shuffle(order)
    return [order[i % n] for i in range(k)]


def pick_negatives(row: dict, k: int, rng: random.Random) -> list[str]:
    """k hard negatives for one example: a seeded sample, cycling when fewer than k exist."""
    negs = list(row["negatives"])
    return [negs[i] for i in pick_negative_positions(row, k, rng)]


def steps_per_epoch(n_examples: int, world: int, batch_size: int) -> int:
    """Every rank must take the same number of steps: the smallest rank share, in whole batches."""
    return (n_examples // world) // batch_size


def m_per_class_batches(rows: Iterable[dict], key: str, m: int, batch_size: int, max_batches: int,
                        rng: random.Random) -> Iterator[list[dict]]:
    """Batches of batch_size/m classes x m rows each, no class twice in a batch (SupCon-style sampling).

    Rows are grouped by `rows[key]`; each class contributes disjoint groups of m rows (its
    rows shuffled, a remainder under m dropped), groups are shuffled, and each batch takes
    the next batch_size/m groups of distinct classes. Deterministic given `rng`. Under
    several workers, partition by class (method.partition_key) so classes are disjoint
    across workers; a method's steps_per_epoch can count this sampler's batches per rank
    on the driver (it is deterministic) and take the smallest.
    """
    if batch_size % m:
        raise ValueError(f"batch size {batch_size} is not a multiple of m={m}")
    per_batch = batch_size // m
    by_class: dict = {}
    for row in rows:
        by_class.setdefault(row[key], []).append(row)
    groups = []
    for cls in sorted(by_class, key=str):
        members = by_class[cls]
        rng.shuffle(members)
        groups += [(cls, members[i:i + m]) for i in range(0, len(members) - m + 1, m)]
    rng.shuffle(groups)
    n = 0
    pending = list(groups)
    while n < max_batches and len({c for c, _ in pending}) >= per_batch:
        batch, used, rest = [], set(), []
        for cls, grp in pending:
            if len(used) < per_batch and cls not in used:
                used.add(cls)
                batch.extend(grp)
            else:
                rest.append((cls, grp))
        if len(used) < per_batch:
            return
        yield batch
        n += 1
        pending = rest

