"""DPR negative log-likelihood with in-batch (+ hard) negatives — seed 000, eq. 2.

    L_nll = -(1/B) Σ_i log( exp s(q_i, d_i) / Σ_{j ∈ docs} exp s(q_i, d_j) )

Shapes: q (B, D); docs (N, D) = [G global positives | hard negatives]; pos_idx (B,).
Under data parallelism `docs` is the all-gathered global set (see dist.py), so each
query sees every document of the global batch as a negative.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import LossConfig, scores


def nll_from_scores(s: torch.Tensor, pos_idx: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each row's positive column: (B, N), (B,) -> scalar."""
    return F.cross_entropy(s, pos_idx)


def dpr_loss(q: torch.Tensor, docs: torch.Tensor, pos_idx: torch.Tensor, cfg: LossConfig,
             training: bool = True, generator: torch.Generator | None = None, n_pos: int | None = None):
    """DPR NLL. Returns (loss, {"nll": loss})."""
    loss = nll_from_scores(scores(q, docs, cfg), pos_idx)
    return loss, {"nll": loss.detach()}


def dpr_batch_loss(batch: dict, cfg: LossConfig, training: bool = True, generator: torch.Generator | None = None):
    """DPR NLL over the trainer's batch dict: `q` (B, D), `docs` (N, D), `pos_idx` (B,), `n_pos` G."""
    return dpr_loss(batch["q"], batch["docs"], batch["pos_idx"], cfg, training, generator, n_pos=batch["n_pos"])
