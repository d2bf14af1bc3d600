"""DAR: Document Augmentation for dense Retrieval — seed 000 (Jeong et al., ACL 2022), METHODS.md §2.

Augments document *vectors*; the document encoder runs once per step.

Perturbation (released-code form, the default): n dropout masks (Bernoulli p,
1/(1-p) rescaling) on the whole (N, D) document matrix give D^(1..n); D^(0) = D.

    L = 1/(n+1) Σ_{m=0..n} L_total(Q, D^(m)),   L_total = (1-w) L_nll + w L_mix

Interpolation (mixup with soft labels): for local query i with positive d_i and the
k-th in-batch negative d_k (k-th shift over the G global positives, k = 1..G-1),
λ_ik ~ U[0, 1]; since s is linear, scoring the mixed vector λ d_i + (1-λ) d_k equals
mixing the scores:

    z_ik  = (λ_ik s(q_i, d_i) + (1-λ_ik) s(q_i, d_k) - μ_k) / mix_scale
    L_mix = 1/(G-1) Σ_k mean_i BCE(σ(z_ik), λ_ik)

with μ_k the mean of the 2B scores involved for shift k (B positives, B negatives).
`mix_detach_negatives=True` cuts the gradient through s(q_i, d_k), as the released
code does. Validation (training=False) is deterministic: no copies, no λ, L = L_nll.

Identities: n = 0 and w = 0 gives DPR's L_nll exactly.
Under DDP the NLL sees the all-gathered batch exactly; the mix term, like the released
single-GPU code, uses each worker's own queries (μ_k over its 2B scores, its own λ draws)
against the global positives, so it is a per-worker estimate, averaged by DDP.
Shapes: q (B, D); docs (N, D) = [G global positives | hard negatives]; pos_idx (B,) in [0, G).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import LossConfig, scores
from .dpr import nll_from_scores


def mix_loss(s: torch.Tensor, pos_idx: torch.Tensor, n_pos: int, lam: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """L_mix from a (B, N) score matrix; `lam` is (B, G-1) with λ for each (query, shift)."""
    B = s.shape[0]
    if n_pos < 2:
        return s.new_zeros(())
    rows = torch.arange(B, device=s.device)
    pos = s[rows, pos_idx]  # (B,)
    shifts = torch.arange(1, n_pos, device=s.device)  # (G-1,)
    neg_cols = (pos_idx.unsqueeze(1) + shifts.unsqueeze(0)) % n_pos  # (B, G-1)
    neg = s.gather(1, neg_cols)  # (B, G-1)
    if cfg.mix_detach_negatives:
        neg = neg.detach()
    mu = (pos.sum() + neg.sum(0)) / (2 * B)  # (G-1,): mean of the 2B scores per shift
    z = (lam * pos.unsqueeze(1) + (1 - lam) * neg - mu.unsqueeze(0)) / cfg.mix_scale
    bce = F.binary_cross_entropy_with_logits(z, lam, reduction="none")  # (B, G-1)
    return bce.mean(0).mean()  # mean over i, then 1/(G-1) Σ_k


def dar_loss(q: torch.Tensor, docs: torch.Tensor, pos_idx: torch.Tensor, cfg: LossConfig,
             training: bool = True, generator: torch.Generator | None = None, n_pos: int | None = None):
    """DAR loss. Returns (loss, {"nll", "mix"}) with each term averaged over the n+1 copies.

    `n_pos` (G) is the number of leading columns of `docs` that are in-batch positives
    (`dist.gather_docs` returns it); without it, the unsharded case G = B is assumed.
    """
    G = n_pos if n_pos is not None else q.shape[0]
    if not training:
        nll = nll_from_scores(scores(q, docs, cfg), pos_idx)
        return nll, {"nll": nll.detach(), "mix": torch.zeros((), device=q.device)}
    copies = [docs]
    for _ in range(cfg.n_perturb):
        keep = (torch.rand(docs.shape, generator=generator, device=docs.device) >= cfg.dropout_p).to(docs.dtype)
        copies.append(docs * keep / (1.0 - cfg.dropout_p))
    w = cfg.mix_weight
    total = nll_sum = mix_sum = 0.0
    for d in copies:
        s = scores(q, d, cfg)
        nll = nll_from_scores(s, pos_idx)
        if w > 0:
            lam = torch.rand((q.shape[0], max(G - 1, 0)), generator=generator, device=q.device, dtype=s.dtype)
            mix = mix_loss(s, pos_idx, G, lam, cfg)
        else:
            mix = s.new_zeros(())
        total = total + (1 - w) * nll + w * mix
        nll_sum = nll_sum + nll.detach()
        mix_sum = mix_sum + mix.detach()
    k = len(copies)
    return total / k, {"nll": nll_sum / k, "mix": mix_sum / k}
