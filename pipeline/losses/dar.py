"""DAR: Document Augmentation for dense Retrieval — seed 000 (Jeong et al., ACL 2022), METHODS.md §2.

Augments document *vectors*; the document encoder runs once per step.

Perturbation (released-code form, the default): n dropout masks (Bernoulli p,
1/(1-p) rescaling) on the whole (N, D) document matrix give D^(1..n); D^(0) = D.

    L = 1/(n+1) Σ_{m=0..n} L_total(Q, D^(m)),   L_total = (1-w) L_nll + w L_mix

Interpolation (mixup with soft labels): for local query i with positive d_i and a
negative column k, λ_ik ~ U[0, 1]; since s is linear, scoring the mixed vector
λ d_i + (1-λ) d_k equals mixing the scores:

    z_ik  = (λ_ik s(q_i, d_i) + (1-λ_ik) s(q_i, d_k) - μ_k) / mix_scale
    L_mix = 1/K Σ_k mean_i BCE(σ(z_ik), λ_ik)

with μ_k the mean of the 2B scores involved in column k (B positives, B negatives).
Which column is "the k-th negative of query i" (`mix_grouping`):

- `drop_positive` (default; released code, `BiEncoderMixupNllLoss`): the k-th column of
  query i's score row once its own positive is removed, so column k of most queries is
  the same document and μ_k is centred per negative document. With hard negatives in the
  batch (`mix_hard_negatives=True`, default) the row has N-1 such columns (all in-batch
  and hard negatives) and K = N-1; with `mix_hard_negatives=False` only the G-1 in-batch
  positives of other queries are used (K = G-1).
- `shift`: the k-th cyclic shift over the G global positives (column (pos_i + k) mod G,
  k = 1..G-1; K = G-1); hard negatives are never mixed.

`mix_detach_negatives=True` cuts the gradient through s(q_i, d_k), as the released
code does. Validation (training=False) is deterministic: no copies, no λ, L = L_nll.

Identities: n = 0 and w = 0 gives DPR's L_nll exactly.
Under DDP the NLL sees the all-gathered batch exactly; the mix term, like the released
single-GPU code, uses each worker's own queries (μ_k over its 2B scores, its own λ draws)
against the global documents, so it is a per-worker estimate, averaged by DDP.
Shapes: q (B, D); docs (N, D) = [G global positives | hard negatives]; pos_idx (B,) in [0, G).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from .base import LossConfig, scores
from .dpr import nll_from_scores


@dataclass(frozen=True)
class DARConfig(LossConfig):
    """The `loss:` block of DAR (defaults = METHODS.md §2)."""

    name: str = "dar"
    n_perturb: int = 7
    dropout_p: float = 0.1
    mix_weight: float = 0.1
    mix_scale: float = 10.0
    mix_detach_negatives: bool = False
    mix_grouping: Literal["drop_positive", "shift"] = "drop_positive"
    mix_hard_negatives: bool = True

    def validate(self) -> None:
        from ..errors import ConfigError

        super().validate()
        if self.n_perturb < 0 or not 0 <= self.dropout_p < 1 or not 0 <= self.mix_weight <= 1:
            raise ConfigError("loss: need n_perturb >= 0, 0 <= dropout_p < 1, 0 <= mix_weight <= 1")
        if self.mix_scale <= 0:
            raise ConfigError("loss.mix_scale must be > 0")


def mix_columns(pos_idx: torch.Tensor, n_pos: int, n_cols: int, cfg: DARConfig) -> torch.Tensor:
    """(B, K) column index of each query's k-th mix negative (see the module docstring)."""
    B = pos_idx.shape[0]
    if cfg.mix_grouping == "shift":
        shifts = torch.arange(1, n_pos, device=pos_idx.device)  # (G-1,)
        return (pos_idx.unsqueeze(1) + shifts.unsqueeze(0)) % n_pos
    width = n_cols if cfg.mix_hard_negatives else n_pos
    k = torch.arange(width - 1, device=pos_idx.device).unsqueeze(0).expand(B, -1)  # (B, width-1)
    return k + (k >= pos_idx.unsqueeze(1)).long()  # skip the query's own positive column


def n_mix_columns(n_pos: int, n_cols: int, cfg: DARConfig) -> int:
    """K, the number of mix negatives per query (λ has shape (B, K))."""
    if cfg.mix_grouping == "shift" or not cfg.mix_hard_negatives:
        return max(n_pos - 1, 0)
    return max(n_cols - 1, 0)


def mix_loss(s: torch.Tensor, pos_idx: torch.Tensor, n_pos: int, lam: torch.Tensor, cfg: DARConfig) -> torch.Tensor:
    """L_mix from a (B, N) score matrix; `lam` is (B, K) with λ for each (query, mix column)."""
    B = s.shape[0]
    if n_pos < 2 or lam.shape[1] == 0:
        return s.new_zeros(())
    rows = torch.arange(B, device=s.device)
    pos = s[rows, pos_idx]  # (B,)
    neg_cols = mix_columns(pos_idx, n_pos, s.shape[1], cfg)  # (B, K)
    neg = s.gather(1, neg_cols)  # (B, K)
    if cfg.mix_detach_negatives:
        neg = neg.detach()
    mu = (pos.sum() + neg.sum(0)) / (2 * B)  # (K,): mean of the 2B scores per column
    z = (lam * pos.unsqueeze(1) + (1 - lam) * neg - mu.unsqueeze(0)) / cfg.mix_scale
    bce = F.binary_cross_entropy_with_logits(z, lam, reduction="none")  # (B, K)
    return bce.mean(0).mean()  # mean over i, then 1/K Σ_k


def dar_loss(q: torch.Tensor, docs: torch.Tensor, pos_idx: torch.Tensor, cfg: DARConfig,
             training: bool = True, generator: torch.Generator | None = None, n_pos: int | None = None,
             nll_fn=None):
    """DAR loss. Returns (loss, {"nll", "mix"}) with each term averaged over the n+1 copies.

    `n_pos` (G) is the number of leading columns of `docs` that are in-batch positives
    (`dist.gather_docs` returns it); without it, the unsharded case G = B is assumed.
    `nll_fn(scores) -> scalar` replaces the in-batch NLL (ANCE composes its pairwise NLL
    with DAR this way); default `nll_from_scores(s, pos_idx)`.
    """
    G = n_pos if n_pos is not None else q.shape[0]
    if nll_fn is None:
        def nll_fn(s):
            return nll_from_scores(s, pos_idx)
    if not training:
        nll = nll_fn(scores(q, docs, cfg))
        return nll, {"nll": nll.detach(), "mix": torch.zeros((), device=q.device)}
    copies = [docs]
    for _ in range(cfg.n_perturb):
        keep = (torch.rand(docs.shape, generator=generator, device=docs.device) >= cfg.dropout_p).to(docs.dtype)
        copies.append(docs * keep / (1.0 - cfg.dropout_p))
    w = cfg.mix_weight
    K = n_mix_columns(G, docs.shape[0], cfg)
    total = nll_sum = mix_sum = 0.0
    for d in copies:
        s = scores(q, d, cfg)
        nll = nll_fn(s)
        if w > 0:
            lam = torch.rand((q.shape[0], K), generator=generator, device=q.device, dtype=s.dtype)
            mix = mix_loss(s, pos_idx, G, lam, cfg)
        else:
            mix = s.new_zeros(())
        total = total + (1 - w) * nll + w * mix
        nll_sum = nll_sum + nll.detach()
        mix_sum = mix_sum + mix.detach()
    k = len(copies)
    return total / k, {"nll": nll_sum / k, "mix": mix_sum / k}


def dar_batch_loss(batch: dict, cfg: DARConfig, training: bool = True, generator: torch.Generator | None = None):
    """DAR over the trainer's batch dict (keys of `dpr.dpr_batch_loss`)."""
    return dar_loss(batch["q"], batch["docs"], batch["pos_idx"], cfg, training, generator, n_pos=batch["n_pos"])
