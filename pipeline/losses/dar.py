"""DAR: Document Augmentation for dense Retrieval — seed 000 (Jeong et al., ACL 2022), docs/METHODS.md §2.

Augments document *vectors*; the document encoder runs once per step.

Perturbation (released-code form, the default): n dropout masks (Bernoulli p,
1/(1-p) rescaling) on the whole (N, D) document matrix give D^(1..n); D^(0) = D.

    L = 1/(n+1) Σ_{m=0..n} L_total(Q, D^(m)),   L_total = (1-w) L_nll + w L_mix

The 1/(1-p) rescaling of inverted dropout matters only for `similarity: dot` (it keeps the
expected dot product). Under `similarity: cos` every document vector, and every mixed vector
below, is L2-normalised before it is scored, so the factor cancels: a copy is scored exactly as
the unscaled masked vector `d * mask` would be (tested). The same code serves both.

Interpolation (mixup with soft labels): for local query i with positive d_i and a
negative column k, λ_ik ~ U[0, 1], the mixed document d̃_ik = λ_ik d_i + (1-λ_ik) d_k
(both from the same copy D^(m)) is scored against q_i:

    z_ik  = (s(q_i, d̃_ik) - μ_k) / mix_scale
    L_mix = 1/K Σ_k mean_i BCE(σ(z_ik), λ_ik)

with μ_k the mean of the 2B scores involved in column k (B scores s(q_i, d_i), B scores
s(q_i, d_k)). How s(q_i, d̃_ik) is computed depends on the score function:

- `dot`: s is linear in d, so s(q, λ d_i + (1-λ) d_k) = λ s(q, d_i) + (1-λ) s(q, d_k): the
  scores are mixed (the released code's form; the numbers are those of the score matrix).
- `cos`: cos(q, ·) is not linear in d (the mixed vector has its own norm), so mixing the
  scores would be a different quantity. The VECTORS are mixed and the mix is scored:
  s(q_i, d̃_ik) = cos(q_i, d̃_ik) / τ = (q̂_i · d̃_ik) / (‖d̃_ik‖ τ), ‖d̃_ik‖ floored at 1e-12 as
  F.normalize does. It is computed from the dot products q̂·d and d·d (`mixed_cos_scores`),
  never materialising the (B, K, D) mixes.

Which column is "the k-th negative of query i" (`mix_grouping`):

- `drop_positive` (default; released code, `BiEncoderMixupNllLoss`): the k-th column of
  query i's score row once its own positive is removed, so column k of most queries is
  the same document and μ_k is centred per negative document. With hard negatives in the
  batch (`mix_hard_negatives=True`, default) the row has N-1 such columns (all in-batch
  and hard negatives) and K = N-1; with `mix_hard_negatives=False` only the G-1 in-batch
  positives of other queries are used (K = G-1).
- `shift`: the k-th cyclic shift over the G global positives (column (pos_i + k) mod G,
  k = 1..G-1; K = G-1); hard negatives are never mixed.

`mix_detach_negatives=True` cuts the gradient through the negative, as the released code
does: under `dot` s(q_i, d_k) is a constant (the released code's detached tensor); under
`cos` the negative's part of the mixed score, q̂_i·d_k, and d_k itself (in ‖d̃_ik‖) are
constants, so the gradient reaches q_i and d_i only, as under `dot`. In both, the negatives'
scores in μ_k are constants too. Validation (training=False) is deterministic: no copies,
no λ, L = L_nll.

Identities: n = 0 and w = 0 gives DPR's L_nll exactly.
Under DDP the NLL sees the all-gathered batch exactly; the mix term, like the released
single-GPU code, uses each worker's own queries (μ_k over its 2B scores, its own λ draws)
against the global documents, so it is a per-worker estimate, averaged by DDP.
Shapes: q (B, D); docs (N, D) = [G global positives | hard negatives]; pos_idx (B,) in [0, G).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import scores
from .configs import DARConfig  # noqa: F401  (the `loss:` block, torch-free in losses/configs.py)
from .dpr import nll_from_scores


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


NORM_EPS = 1e-12  # F.normalize's floor on a vector's norm


def mixed_cos_scores(q: torch.Tensor, docs: torch.Tensor, pos_idx: torch.Tensor, neg_cols: torch.Tensor,
                     lam: torch.Tensor, cfg: DARConfig) -> torch.Tensor:
    """(B, K) cos(q_i, λ_ik d_{pos_i} + (1-λ_ik) d_{neg_ik}) / τ, the mixed VECTOR scored.

    Uses q̂·m = λ q̂·d_i + (1-λ) q̂·d_k and ‖m‖² = λ² d_i·d_i + 2λ(1-λ) d_i·d_k + (1-λ)² d_k·d_k,
    so only (B, N) products are formed. With `mix_detach_negatives`, q̂·d_k and d_k are constants.
    """
    qn = F.normalize(q, dim=-1)                                        # (B, D)
    d_pos = docs[pos_idx]                                              # (B, D)
    d_neg = docs.detach() if cfg.mix_detach_negatives else docs        # (N, D)
    q_pos = (qn * d_pos).sum(-1, keepdim=True)                         # (B, 1)
    q_neg = (qn @ d_neg.T).gather(1, neg_cols)                         # (B, K)
    if cfg.mix_detach_negatives:
        q_neg = q_neg.detach()
    pp = (d_pos * d_pos).sum(-1, keepdim=True)                         # (B, 1)
    pk = (d_pos @ d_neg.T).gather(1, neg_cols)                         # (B, K)
    kk = (d_neg * d_neg).sum(-1)[neg_cols]                             # (B, K)
    num = lam * q_pos + (1 - lam) * q_neg
    sq = lam * lam * pp + 2 * lam * (1 - lam) * pk + (1 - lam) * (1 - lam) * kk
    norm = sq.clamp_min(NORM_EPS * NORM_EPS).sqrt()                    # max(‖m‖, eps), as F.normalize
    return num / norm / cfg.tau


def mix_loss(s: torch.Tensor, pos_idx: torch.Tensor, n_pos: int, lam: torch.Tensor, cfg: DARConfig,
             q: torch.Tensor | None = None, docs: torch.Tensor | None = None) -> torch.Tensor:
    """L_mix from a (B, N) score matrix; `lam` is (B, K) with λ for each (query, mix column).

    Under `similarity: cos` the mixed vectors are scored (module docstring), so `q` (B, D) and
    `docs` (N, D), the vectors `s` was computed from, are required; under `dot` the scores are
    mixed and `q`/`docs` are not used.
    """
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
    if cfg.similarity == "cos":
        if q is None or docs is None:
            raise ValueError("mix_loss under similarity=cos scores the mixed vectors: pass q and docs")
        mixed = mixed_cos_scores(q, docs, pos_idx, neg_cols, lam, cfg)
    else:  # dot: s is linear in d, so the mixed vector's score is the mix of the scores
        mixed = lam * pos.unsqueeze(1) + (1 - lam) * neg
    z = (mixed - mu.unsqueeze(0)) / cfg.mix_scale
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
            mix = mix_loss(s, pos_idx, G, lam, cfg, q=q, docs=d)
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
