"""Distillation from a teacher's scores (pure functions; docs/METHODS.md §8).

MarginMSE (Hofstätter et al. 2020, "Improving Efficient Neural Ranking Models with Cross-Architecture Knowledge
Distillation", eq. 1): for query q, its positive d⁺ and each of its hard negatives d⁻_j,

    L = mean over (q, j) of ((s(q, d⁺) - s(q, d⁻_j)) - (t(q, d⁺) - t(q, d⁻_j)))²

with s the student's score (loss.similarity / τ) and t the teacher's.

Listwise KL (sentence-transformers' DistillKLDivLoss, Tevatron's train_distil, FlagEmbedding's kd_loss_type=kl_div):
the teacher's distribution over a query's scored documents G(q) = [d⁺, d⁻_1 .. d⁻_h],
p_t(d) = softmax_{d ∈ G(q)}(t(q, d) / τ_t), and the student's over the documents D it ranks (G(q), or with
in-batch negatives every document of the batch), log p_s(d) = log_softmax_{d ∈ D}(s(q, d)), then

    L = mean over q of Σ_{d ∈ G(q)} p_t(d) (log p_t(d) - log p_s(d))     (KL(p_t || p_s); documents outside G(q)
                                                                         carry no teacher probability)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import scores


def margin_mse(q: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, t_pos: torch.Tensor, t_neg: torch.Tensor,
               cfg) -> torch.Tensor:
    """q (B, D), pos (B, D), neg (B, h, D), teacher t_pos (B,), t_neg (B, h) -> the mean squared margin error."""
    s_pos = _pair_scores(q, pos, cfg)
    s_neg = torch.stack([_pair_scores(q, neg[:, j], cfg) for j in range(neg.shape[1])], dim=1)
    return ((s_pos.unsqueeze(1) - s_neg) - (t_pos.unsqueeze(1) - t_neg)).pow(2).mean()


def _pair_scores(q: torch.Tensor, d: torch.Tensor, cfg) -> torch.Tensor:
    """Row-wise scores s(q_i, d_i) (B,), as `scores` computes them (cos or dot, over τ)."""
    if cfg.similarity == "cos":
        return (F.normalize(q, dim=-1) * F.normalize(d, dim=-1)).sum(-1) / cfg.tau
    if cfg.similarity == "auto":
        raise ValueError("loss.similarity=auto must be resolved against the model first (resolve_similarity)")
    return (q * d).sum(-1) / cfg.tau


def distill_kl(q: torch.Tensor, docs: torch.Tensor, group: torch.Tensor, teacher: torch.Tensor, cfg,
               teacher_temperature: float = 1.0) -> torch.Tensor:
    """q (B, D); docs (N, D), every document the student ranks; group (B, m): the columns of each query's scored
    documents in `docs` (its positive first); teacher (B, m): their teacher scores -> KL(p_t || p_s), mean over
    queries."""
    s = scores(q, docs, cfg)                                   # (B, N)
    log_ps = F.log_softmax(s, dim=1).gather(1, group)         # (B, m): log p_s of each scored document
    log_pt = F.log_softmax(teacher / teacher_temperature, dim=1)
    return (log_pt.exp() * (log_pt - log_ps)).sum(1).mean()


def margin_mse_batch_loss(batch: dict, cfg, training: bool = True, generator=None):
    loss = margin_mse(batch["q"], batch["pos"], batch["neg"], batch["t_pos"], batch["t_neg"], cfg)
    return loss, {"mse": loss.detach()}


def distill_kl_batch_loss(batch: dict, cfg, training: bool = True, generator=None):
    loss = distill_kl(batch["q"], batch["docs"], batch["group"], batch["teacher"], cfg, cfg.teacher_temperature)
    return loss, {"kl": loss.detach()}
