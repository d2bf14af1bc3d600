"""ARR losses (docs/METHODS.md §4): SupCon and the author classifier for the base model G, and
topic-regularised distillation into the target model F. Pure functions of tensors.

Layout under data parallelism: each rank holds `n` local rows; the columns are the global
batch of `N = world * n` texts (gathered, rank-major), and the local rows are columns
`offset .. offset + n - 1`. A row never scores against itself (j != i).

    eq. 1  p_ij = exp(s_ij / τ) / Σ_{k≠i} exp(s_ik / τ)        (s = cosine; the same for G, H, F)
    eq. 2  B = mean of b_ab over same-author pairs a ≠ b         (H = TF-IDF; one scalar per batch)
    eq. 3  S_ij = p_ij^(1−B) / Σ_{k≠i} p_ik^(1−B)               (`scaling: normalized`, the default;
                                                                 rows sum to 1)
           S_ij = p_ij^(1−B) / (Σ_k p_ik)^(1−B)                 (`scaling: released_code`, below)
    eq. 4  L = mean_i −Σ_{j≠i} S_ij log f_ij

`scaling: released_code` computes what the authors' released code computes
(github.com/jitkapat/TopicReg, authorship/ensemble_modules.py, DistanceRegularizedEncoderCL.step):
there the teacher's probabilities keep the self column -- each p_ij, j = i included, is
exp(s_ij / τ) over the sum with k ≠ i -- and the row sum Σ_k p_ik runs over every column, self
included; only afterwards is the self column of S masked out of eq. 4. The normaliser of p cancels
in p_ij / Σ_k p_ik, so S_ij = q_ij^(1−B) with q the softmax of s_i / τ over the whole row, self
included (computed so, in log space: finite where the released code's exp overflows). These S
rows do not sum to 1: the self column (cos = 1, the row's largest score) takes most of q at the
usual τ, so they typically sum to well below 1 -- the released code's loss scale, not a
distribution. B and f are as in eq. 2 and eq. 1 in both modes.

B is defined as 0 when a batch holds no same-author pair (then S = p under `normalized`: plain
distillation), and such batches are counted (`no_pair`).

The MLL base model (`arr_mll`) has two heads (`loss.mll_head`):

    released  (default) the released baseline: the authors' SentenceClassifier is a Hugging Face
              AutoModelForSequenceClassification, i.e. for a BERT tower (MiniLM is one) the
              first token's last hidden state -> dense + tanh (the BERT pooler, trained) ->
              dropout -> linear with bias; plain cross-entropy, no temperature
    pooled    our variant: a bias-free linear head on the model's pooled vector (L2-normalised
              when the model normalises), logits / τ

Either way the saved model retrieves with its mean-pooled vector (the head is not saved).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# the `loss:` blocks, torch-free in losses/configs.py
from .configs import MLL_HEADS, SCALINGS, ARRConfig, MLLConfig, SupConConfig  # noqa: F401


def _self_mask(n: int, N: int, offset: int, device) -> torch.Tensor:
    """(n, N) bool: True at each local row's own column."""
    m = torch.zeros(n, N, dtype=torch.bool, device=device)
    m[torch.arange(n, device=device), torch.arange(n, device=device) + offset] = True
    return m


def inbatch_log_probs(scores: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Eq. 1 in log space: rows = local items, columns = the batch; own column -inf."""
    n, N = scores.shape
    return torch.log_softmax(scores.masked_fill(_self_mask(n, N, offset, scores.device), float("-inf")), dim=-1)


def inbatch_probs(scores: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Eq. 1: p_ij over j != i (own column 0); rows sum to 1."""
    return inbatch_log_probs(scores, offset).exp()


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


def topic_bias(b_probs: torch.Tensor, authors: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Eq. 2 over the whole batch: (N, N) probabilities of H and (N,) author ids -> (B, |M|).

    M = same-author pairs a != b. With no such pair, B = 0 (no regularisation), never NaN."""
    N = b_probs.shape[0]
    same = (authors[:, None] == authors[None, :]) & ~torch.eye(N, dtype=torch.bool, device=b_probs.device)
    count = int(same.sum())
    if count == 0:
        return b_probs.new_zeros(()), 0
    return b_probs[same].mean().detach(), count


def _exponent(B: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    return 1.0 - (B.to(like.device, like.dtype) if isinstance(B, torch.Tensor)
                  else torch.tensor(float(B), device=like.device, dtype=like.dtype))


def scale(p: torch.Tensor, B: torch.Tensor | float, offset: int = 0) -> torch.Tensor:
    """Eq. 3, `scaling: normalized`: S_ij = p_ij^(1−B) / Σ_{k≠i} p_ik^(1−B); own column 0, rows sum to 1."""
    n, N = p.shape
    own = _self_mask(n, N, offset, p.device)
    powered = torch.where(own, torch.zeros_like(p), p.clamp_min(0).pow(_exponent(B, p)))
    return powered / powered.sum(-1, keepdim=True)


def released_code_scale(scores: torch.Tensor, B: torch.Tensor | float, offset: int = 0) -> torch.Tensor:
    """Eq. 3 as the released code computes it, from the teacher's scores s / τ (n, N):
    S_ij = p_ij^(1−B) / (Σ_k p_ik)^(1−B) with the self column kept in p and in the row sum,
    = q_ij^(1−B), q = softmax over the whole row (self included). Own column 0 (eq. 4 skips it)."""
    n, N = scores.shape
    log_q = torch.log_softmax(scores.float(), dim=-1)
    S = (_exponent(B, log_q) * log_q).exp()
    return S.masked_fill(_self_mask(n, N, offset, scores.device), 0.0)


def teacher_targets(scores: torch.Tensor, B: torch.Tensor | float, offset: int = 0,
                    mode: str = "normalized") -> torch.Tensor:
    """S of eq. 3 from the teacher's scores s / τ (n local rows, N columns), per `loss.scaling`."""
    if mode == "normalized":
        return scale(inbatch_probs(scores, offset), B, offset)
    if mode == "released_code":
        return released_code_scale(scores, B, offset)
    raise ValueError(f"unknown scaling {mode!r}; expected one of {', '.join(SCALINGS)}")


def distill_loss(S: torch.Tensor, log_f: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Eq. 4: mean over rows of −Σ_{j≠i} S_ij log f_ij (own column excluded)."""
    n, N = S.shape
    own = _self_mask(n, N, offset, S.device)
    terms = torch.where(own, torch.zeros_like(log_f), S * log_f)
    return -terms.sum(-1).mean()


def supcon_loss(z: torch.Tensor, z_all: torch.Tensor, labels_all: torch.Tensor, offset: int, tau: float
                ) -> tuple[torch.Tensor, int]:
    """SupCon (Khosla et al., L_out): each local anchor i averages −log p_ip over its positives p
    (same label, p != i), p from eq. 1 on cosine / τ. Anchors without a positive are left out.
    -> (loss, number of anchors)."""
    n, N = z.shape[0], z_all.shape[0]
    logp = inbatch_log_probs(cosine(z, z_all) / tau, offset)
    labels = labels_all[offset:offset + n]
    pos = (labels[:, None] == labels_all[None, :]) & ~_self_mask(n, N, offset, z.device)
    npos = pos.sum(-1)
    has = npos > 0
    if not bool(has.any()):
        return (z.sum() * 0.0), 0  # defined, zero gradient
    per = -torch.where(pos, logp, torch.zeros_like(logp)).sum(-1)[has] / npos[has]
    return per.mean(), int(has.sum())


def mll_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The author classifier's cross-entropy (multiclass log loss) of the logits as given."""
    return F.cross_entropy(logits.float(), labels)


def arr_distill(f: torch.Tensor, f_all: torch.Tensor, g_all: torch.Tensor, h_sim: torch.Tensor,
                authors: torch.Tensor, offset: int, tau: float, tau_h: float, scaling: str = "normalized") -> dict:
    """Steps B + C for one batch. f: local student rows (n, D); f_all/g_all (N, D); h_sim (N, N)
    cosine similarities of H; authors (N,). -> {loss, B, pairs, agreement, S, p_g, log_f}."""
    n = f.shape[0]
    with torch.no_grad():
        s_g = cosine(g_all[offset:offset + n], g_all) / tau
        p_g = inbatch_probs(s_g, offset)
        b = inbatch_probs(h_sim.float() / tau_h, 0)
        B, pairs = topic_bias(b, authors)
        S = teacher_targets(s_g, B, offset, scaling)
    log_f = inbatch_log_probs(cosine(f, f_all) / tau, offset)
    loss = distill_loss(S, log_f, offset)
    agreement = (log_f.detach().argmax(-1) == p_g.argmax(-1)).float().mean()
    return {"loss": loss, "B": B, "pairs": pairs, "agreement": agreement, "S": S, "p_g": p_g, "log_f": log_f}


# ---- the batch-dict forms the trainer calls: fn(batch, cfg, training, generator) -> (loss, terms)
def supcon_batch_loss(batch: dict, cfg: SupConConfig, training: bool = True, generator=None):
    loss, anchors = supcon_loss(batch["z"], batch["z_all"], batch["labels_all"], batch["offset"], cfg.tau)
    return loss, {"supcon": loss.detach(), "anchors": torch.tensor(float(anchors))}


def mll_batch_loss(batch: dict, cfg: MLLConfig, training: bool = True, generator=None):
    """batch["logits"]: the head's output. `released`: used as they are; `pooled`: divided by τ."""
    logits = batch["logits"] / cfg.tau if cfg.mll_head == "pooled" else batch["logits"]
    loss = mll_loss(logits, batch["labels"])
    acc = (logits.detach().argmax(-1) == batch["labels"]).float().mean()
    return loss, {"mll": loss.detach(), "train_acc": acc}


def arr_batch_loss(batch: dict, cfg: ARRConfig, training: bool = True, generator=None):
    tau_h = cfg.bias_temperature if cfg.bias_temperature is not None else cfg.tau
    out = arr_distill(batch["f"], batch["f_all"], batch["g_all"], batch["h_sim"], batch["authors"], batch["offset"],
                      cfg.tau, tau_h, cfg.scaling)
    return out["loss"], {"distill": out["loss"].detach(), "B": out["B"], "agreement": out["agreement"],
                         "no_pair": torch.tensor(float(out["pairs"] == 0))}
