"""Shared pieces of the losses: their config and the score function."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LossConfig:
    """Loss settings; unused fields are ignored by losses that don't need them."""

    name: Literal["dpr", "dar"] = "dpr"
    # s(q, d): dot product (DPR) or cosine / temperature.
    similarity: Literal["dot", "cos"] = "dot"
    temperature: float = 1.0
    # DAR (METHODS.md §2)
    n_perturb: int = 7
    dropout_p: float = 0.1
    mix_weight: float = 0.1
    mix_scale: float = 10.0
    mix_detach_negatives: bool = False

    def validate(self) -> None:
        from ..errors import ConfigError

        if self.temperature <= 0:
            raise ConfigError("loss.temperature must be > 0")
        if self.n_perturb < 0 or not 0 <= self.dropout_p < 1 or not 0 <= self.mix_weight <= 1:
            raise ConfigError("loss: need n_perturb >= 0, 0 <= dropout_p < 1, 0 <= mix_weight <= 1")


def scores(q: torch.Tensor, docs: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """(B, D) x (N, D) -> (B, N) score matrix: q·d, or cos(q, d)/τ."""
    if cfg.similarity == "cos":
        return F.normalize(q, dim=-1) @ F.normalize(docs, dim=-1).T / cfg.temperature
    return q @ docs.T / cfg.temperature
