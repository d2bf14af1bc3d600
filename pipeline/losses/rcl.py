"""RCL — Regularized Contrastive Learning (seed 001), as reconstructed in docs/METHODS.md §3.

The paper's equations were lost in extraction; what follows is the reconstruction from its
prose (sections 3.2-3.3). Every reconstructed choice is a field of `RCLConfig`:

    eq. 1  L_CL(q, x) = -(1/B) Σ_i log( exp s(q_i, x_i) / Σ_j exp s(q_i, x_j) ),  s = cos/τ
           (in-batch negatives, plus hard negatives when the batch has them; τ = 0.05 is our
           assumption, the sentence-transformers convention — `loss.temperature`)
    eq. 2  L = L_CL + λ · mean_i H(p_i),  p_i = softmax_j s(q_i, x_j),  H(p) = -Σ_j p_j log p_j
           (`entropy_lambda`; an *entropy model* is trained with λ ≠ 0; λ > 0 -> more certain)
    eq. 3  L = L_CL(q, x) + w · R_k [ L_CL(q, x̃^k) + L_CL(q̃^k, x) ]
           q̃^k, x̃^k: frozen vectors of entropy model k (precomputed, no gradient);
           R = sum over k (`regulator_reduce: sum`, the paper's Σ_k) or the mean over the 2K
           regulator terms (`mean`); w = `regulator_weight` (1.0).

Shapes (the trainer's batch dict, see train/methods/rcl.py):
    q (B, D), docs (N, D) = [G gathered positives | hard negatives], pos_idx (B,)
    reg_q    (K, B, D) frozen query vectors of the K entropy models (same rows as q)
    reg_docs (K, N, D) frozen document vectors, aligned with docs
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import LossConfig, scores
from .configs import RCLConfig  # noqa: F401  (the `loss:` block, torch-free in losses/configs.py)


def contrastive_loss(q: torch.Tensor, docs: torch.Tensor, pos_idx: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """Eq. 1: mean cross-entropy of each query's positive column over scaled similarities."""
    return F.cross_entropy(scores(q, docs, cfg), pos_idx)


def batch_entropy(s: torch.Tensor) -> torch.Tensor:
    """Mean over rows of H(softmax(row)) for a (B, N) score matrix."""
    logp = F.log_softmax(s, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1).mean()


def rcl_loss(q: torch.Tensor, docs: torch.Tensor, pos_idx: torch.Tensor, cfg: RCLConfig,
             reg_q: torch.Tensor | None = None, reg_docs: torch.Tensor | None = None):
    """Eq. 2 + eq. 3 in one: L_CL + λ·H + w·R_k[L_CL(q, x̃^k) + L_CL(q̃^k, x)].

    Returns (loss, {"cl", "entropy", "regulator"}) — the terms detached, `entropy` the mean
    H(p_i) (before λ) and `regulator` the reduced regulator term (before w)."""
    s = scores(q, docs, cfg)
    cl = F.cross_entropy(s, pos_idx)
    ent = batch_entropy(s)
    loss = cl + cfg.entropy_lambda * ent if cfg.entropy_lambda else cl
    reg = torch.zeros((), dtype=cl.dtype, device=cl.device)
    K = 0 if reg_q is None else int(reg_q.shape[0])
    if K:
        if reg_docs is None or reg_docs.shape[0] != K or reg_docs.shape[1] != docs.shape[0]:
            raise ValueError(f"reg_docs must be (K={K}, N={docs.shape[0]}, D), got "
                             f"{None if reg_docs is None else tuple(reg_docs.shape)}")
        # the regulators are frozen inputs, whatever the caller passed
        reg_q, reg_docs = reg_q.detach().to(q.dtype), reg_docs.detach().to(docs.dtype)
        for k in range(K):
            reg = reg + contrastive_loss(q, reg_docs[k], pos_idx, cfg) + contrastive_loss(reg_q[k], docs, pos_idx, cfg)
        if cfg.regulator_reduce == "mean":
            reg = reg / (2 * K)
        loss = loss + cfg.regulator_weight * reg
    return loss, {"cl": cl.detach(), "entropy": ent.detach(), "regulator": reg.detach()}


def rcl_batch_loss(batch: dict, cfg: RCLConfig, training: bool = True, generator: torch.Generator | None = None):
    """RCL over the trainer's batch dict (`reg_q` / `reg_docs` absent or K = 0: no regulators)."""
    return rcl_loss(batch["q"], batch["docs"], batch["pos_idx"], cfg, batch.get("reg_q"), batch.get("reg_docs"))
