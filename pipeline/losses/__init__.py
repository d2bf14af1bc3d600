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

# Names are imported when first used (PEP 562), so `pipeline.losses.configs` (the config blocks) loads
# without torch: a config is checked and `pipeline train --help` printed without importing it.


def __getattr__(name: str):
    if name in ("LossConfig", "DARConfig", "resolve_similarity"):
        from . import configs as module
    elif name == "scores":
        from . import base as module
    elif name in ("dar_batch_loss", "dar_loss"):
        from . import dar as module
    elif name in ("dpr_batch_loss", "dpr_loss"):
        from . import dpr as module
    elif name == "LOSSES":
        from .dar import dar_loss
        from .dpr import dpr_loss

        return {"dpr": dpr_loss, "dar": dar_loss}
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)


def get_loss(name: str):
    losses = __getattr__("LOSSES")
    if name not in losses:
        raise KeyError(f"unknown loss {name!r}; registered: {', '.join(sorted(losses))}")
    return losses[name]
