"""Losses as pure functions of embeddings; one file per method.

Pair losses (DPR family) have the positional form

    loss_fn(q, docs, pos_idx, cfg, training=True, generator=None, n_pos=None) -> (loss, {term: tensor})

with `q` (B, D) local query vectors, `docs` (N, D) document vectors laid out as
[the G positives of the global batch, in query order | hard negatives], and
`pos_idx` (B,) the column of each local query's positive in `docs`, and `n_pos` = G.
The trainer calls every loss in its batch-dict form, `fn(batch, cfg, training, generator)`
(`dpr_batch_loss`, `dar_batch_loss`, ...); `pipeline.train.methods` says which method uses which.
"""

from __future__ import annotations

from .base import LossConfig, resolve_similarity, scores  # noqa: F401
from .dar import DARConfig, dar_batch_loss, dar_loss  # noqa: F401
from .dpr import dpr_batch_loss, dpr_loss  # noqa: F401

LOSSES = {"dpr": dpr_loss, "dar": dar_loss}


def get_loss(name: str):
    if name not in LOSSES:
        raise KeyError(f"unknown loss {name!r}; registered: {', '.join(sorted(LOSSES))}")
    return LOSSES[name]
