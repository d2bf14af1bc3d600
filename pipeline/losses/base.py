"""Shared pieces of the losses: the common config block and the score function.

Every method's loss block subclasses `LossConfig` (name, similarity, temperature) and adds
its own fields; `pipeline.train.methods` maps `loss.name` to the block's class, so unknown
keys are refused per method.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F

from ..config import PosFloat, Section

DEFAULT_COS_TEMPERATURE = 0.05


@dataclass(frozen=True)
class LossConfig(Section):
    """Loss settings shared by every method.

    `similarity: auto` follows the model (docs/METHODS.md §1): a model that L2-normalises its
    vectors is trained with cos/τ (τ = 0.05 unless given), one that does not with the dot
    product (τ = 1). `temperature: null` means that default for the chosen similarity.
    """

    name: str = "dpr"
    similarity: Literal["auto", "dot", "cos"] = "auto"
    temperature: PosFloat | None = None

    SECTION = "loss"

    def validate(self) -> None:
        """Checks across keys (each key's own range is declared in its annotation)."""

    @property
    def tau(self) -> float:
        if self.temperature is not None:
            return self.temperature
        if self.similarity == "cos":
            return DEFAULT_COS_TEMPERATURE
        if self.similarity == "dot":
            return 1.0
        raise ValueError("loss.similarity=auto must be resolved against the model first (resolve_similarity)")


def resolve_similarity(cfg: LossConfig, model_normalizes: bool) -> LossConfig:
    """`auto` -> cos for normalising models, dot otherwise; the temperature made explicit."""
    sim = cfg.similarity
    if sim == "auto":
        sim = "cos" if model_normalizes else "dot"
    out = replace(cfg, similarity=sim)
    return replace(out, temperature=out.tau)


def scores(q: torch.Tensor, docs: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """(B, D) x (N, D) -> (B, N) score matrix: q·d/τ, or cos(q, d)/τ."""
    if cfg.similarity == "cos":
        return F.normalize(q, dim=-1) @ F.normalize(docs, dim=-1).T / cfg.tau
    if cfg.similarity == "auto":
        raise ValueError("loss.similarity=auto must be resolved against the model first (resolve_similarity)")
    return q @ docs.T / cfg.tau
