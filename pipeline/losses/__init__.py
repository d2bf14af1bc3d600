"""Losses as pure functions of embeddings; one file per method, chosen by registry key.

Every loss has the signature

    loss_fn(q, docs, pos_idx, cfg, training=True, generator=None, n_pos=None) -> (loss, {term: tensor})

with `q` (B, D) local query vectors, `docs` (N, D) document vectors laid out as
[the G positives of the global batch, in query order | hard negatives], and
`pos_idx` (B,) the column of each local query's positive in `docs`, and `n_pos` = G.
"""

from __future__ import annotations

from .base import LossConfig, scores  # noqa: F401
from .dar import dar_loss
from .dpr import dpr_loss

LOSSES = {"dpr": dpr_loss, "dar": dar_loss}


def get_loss(name: str):
    if name not in LOSSES:
        raise KeyError(f"unknown loss {name!r}; registered: {', '.join(sorted(LOSSES))}")
    return LOSSES[name]
