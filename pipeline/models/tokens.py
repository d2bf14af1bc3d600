"""Tokens as flat numpy arrays: tokenise once, length-sort, pad each batch to its own longest row
(what a CPU tokenising stage hands the encoder through Ray's object store)."""

from __future__ import annotations

import numpy as np


def length_order(lengths) -> "np.ndarray":
    """Indices that sort rows longest first (stable: equal lengths keep input order)."""
    return np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")


def tokenize_sorted(tok, texts, prefix: str = "", max_len: int = 256, sort_by_length: bool = True) -> dict:
    """Texts -> flat token arrays in batch order (longest first when sorting): `ids` (int32,
    every text's ids back to back), `types` (int8 token type ids, or None), `lengths` (int32)
    and `order` (int64: the input position of each row). Plain numpy, so a CPU stage can make
    them and hand them to the encoder through Ray's object store."""
    texts = [prefix + t for t in texts] if prefix else list(texts)
    enc = tok(texts, padding=False, truncation=True, max_length=max_len)
    ids, types = enc["input_ids"], enc.get("token_type_ids")
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    order = length_order(lengths) if sort_by_length else np.arange(len(ids), dtype=np.int64)
    flat = np.fromiter((t for r in order for t in ids[r]), dtype=np.int32, count=int(lengths.sum()))
    flat_types = (np.fromiter((t for r in order for t in types[r]), dtype=np.int8, count=int(lengths.sum()))
                  if types is not None else None)
    return {"ids": flat, "types": flat_types, "lengths": lengths[order].astype(np.int32), "order": order}


# On a CPU a batch also stops at this many padded tokens (rows x its longest row): a batch much larger
# than the caches runs slower per token, and a wide one on a small or varied corpus pads the most.
# MiniLM, bf16, 2 threads, AVX512-BF16 EPYC (bench/batching.py), against 64-row batches: the FAQ's 176
# passages (7-256 tokens) torch 1.25x, OpenVINO 1.18x; 1,500 FAQ-like passages 1.05x / 0.94x; 3,000
# short passages 0.97x / 1.12x (the last two within the machine's run-to-run noise). GPUs batch by rows.
# On one thread (a worker of a 2-worker training run validating, say) half of it is faster: 2,048 against
# 4,096 gave torch 1.07x / 1.03x / 1.03x and OpenVINO 1.07x / 1.04x / 1.03x on the FAQ, 400 FAQ-like and
# 600 short passages (`python bench/batching.py --threads 1 --caps 1024,4096 --sizes 400,600`); on 2
# threads 2,048 was within the noise of 4,096 and behind it on short passages (0.98x / 0.89x).
CPU_BATCH_TOKENS = 4096
CPU_BATCH_TOKENS_ONE_THREAD = 2048


def cpu_batch_tokens(threads: int) -> int:
    """The padded-token cap of a CPU batch for an encoder running on `threads` threads."""
    return CPU_BATCH_TOKENS_ONE_THREAD if threads <= 1 else CPU_BATCH_TOKENS


def batch_bounds(lengths, batch_size: int, max_tokens: int = 0) -> list[tuple[int, int]]:
    """[s, e) row ranges of consecutive batches: at most `batch_size` rows each and, with `max_tokens`,
    at most that many padded tokens (rows x the batch's longest row; one row always fits)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n, rows = len(lengths), max(1, int(batch_size))
    if not max_tokens:
        return [(s, min(n, s + rows)) for s in range(0, n, rows)]
    bounds, s = [], 0
    while s < n:
        e, width = s + 1, int(lengths[s])
        while e < n and e - s < rows:
            w = max(width, int(lengths[e]))
            if (e - s + 1) * w > max_tokens:
                break
            e, width = e + 1, w
        bounds.append((s, e))
        s = e
    return bounds


def padded_batch(tokens: dict, offsets, s: int, e: int, pad_id: int, left: bool = False) -> dict:
    """Rows [s, e) of `tokenize_sorted`'s arrays as int64 (B, W) input_ids / attention_mask
    (/ token_type_ids), W the batch's own longest row."""
    lengths = tokens["lengths"][s:e].astype(np.int64)
    width = int(lengths.max()) if len(lengths) else 0
    cols = np.arange(width)
    mask = cols[None, :] >= (width - lengths)[:, None] if left else cols[None, :] < lengths[:, None]
    seg = slice(int(offsets[s]), int(offsets[e]))
    input_ids = np.full((len(lengths), width), pad_id, dtype=np.int64)
    input_ids[mask] = tokens["ids"][seg]  # row-major: each row's ids land in its unmasked cells
    batch = {"input_ids": input_ids, "attention_mask": mask.astype(np.int64)}
    if tokens.get("types") is not None:
        tt = np.zeros((len(lengths), width), dtype=np.int64)
        tt[mask] = tokens["types"][seg]
        batch["token_type_ids"] = tt
    return batch
