"""Shared pieces of the losses: the score function, and the common config block (`LossConfig`,
defined in losses/configs.py without torch, re-exported here).

Every method's loss block subclasses `LossConfig` (name, similarity, temperature) and adds
its own fields; `pipeline.train.methods` maps `loss.name` to the block's class, so unknown
keys are refused per method.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# the config block lives apart from the torch code (losses/configs.py), re-exported here
from .configs import DEFAULT_COS_TEMPERATURE, LossConfig, resolve_similarity  # noqa: F401


def scores(q: torch.Tensor, docs: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """(B, D) x (N, D) -> (B, N) score matrix: q·d/τ, or cos(q, d)/τ."""
    if cfg.similarity == "cos":
        return F.normalize(q, dim=-1) @ F.normalize(docs, dim=-1).T / cfg.tau
    if cfg.similarity == "auto":
        raise ValueError("loss.similarity=auto must be resolved against the model first (resolve_similarity)")
    return q @ docs.T / cfg.tau
