"""ANCE: NLL over a query's positive and its own hard negatives — docs/METHODS.md §5 (Xiong et al. 2021;
seed 000 appendix), optionally with the in-batch negatives too, and DAR on top (`ance_dar`).

    pairwise:   L = -(1/B) Σ_i log( exp s(q_i, d_i+) / (exp s(q_i, d_i+) + Σ_{j=1..h} exp s(q_i, d_ij-)) )
    in-batch:   the DPR NLL over every document of the (gathered) batch (`in_batch_negatives: true`)

With h = 1 the pairwise form is ANCE's published loss (positive vs one ANN negative).
Layout (the trainer's, `dist.gather_docs`): docs = [G positives, rank-major | G*h hard
negatives, rank-major, h per query]; the global index of local query i on rank r is
g = pos_idx[i], so its own negatives are columns G + g*h ... G + g*h + h - 1.
With no hard negatives in the batch (h = 0: before the first refreshed version when no
initial negatives were given), the loss falls back to the in-batch NLL.
Shapes: q (B, D); docs (G + G*h, D); pos_idx (B,).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import scores
from .configs import ANCEConfig, ANCEDARConfig  # noqa: F401  (the `loss:` blocks, torch-free in losses/configs.py)
from .dar import dar_loss
from .dpr import nll_from_scores


def own_columns(pos_idx: torch.Tensor, n_pos: int, h: int) -> torch.Tensor:
    """(B, 1 + h): each query's positive column, then its own hard-negative columns."""
    hard = n_pos + pos_idx.unsqueeze(1) * h + torch.arange(h, device=pos_idx.device).unsqueeze(0)  # (B, h)
    return torch.cat([pos_idx.unsqueeze(1), hard], 1)


def pairwise_nll(s: torch.Tensor, pos_idx: torch.Tensor, n_pos: int, h: int) -> torch.Tensor:
    """NLL of column 0 among [positive | own h negatives] for every row of the (B, N) scores."""
    cols = own_columns(pos_idx, n_pos, h)
    own = s.gather(1, cols)  # (B, 1 + h)
    return F.cross_entropy(own, torch.zeros(s.shape[0], dtype=torch.long, device=s.device))


def _nll_fn(batch: dict, cfg):
    G, h = batch["n_pos"], batch.get("hard_per_query", 0)
    if cfg.in_batch_negatives or h == 0:
        return lambda s: nll_from_scores(s, batch["pos_idx"])
    return lambda s: pairwise_nll(s, batch["pos_idx"], G, h)


def ance_batch_loss(batch: dict, cfg: ANCEConfig, training: bool = True, generator=None):
    nll = _nll_fn(batch, cfg)(scores(batch["q"], batch["docs"], cfg))
    return nll, {"nll": nll.detach()}


def ance_dar_batch_loss(batch: dict, cfg: ANCEDARConfig, training: bool = True, generator=None):
    """DAR's perturbation and mixup around ANCE's NLL (the mix term uses DAR's own grouping)."""
    return dar_loss(batch["q"], batch["docs"], batch["pos_idx"], cfg, training, generator, n_pos=batch["n_pos"],
                    nll_fn=_nll_fn(batch, cfg))
