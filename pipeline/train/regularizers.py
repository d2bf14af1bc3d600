"""Attention regularizers a training run may add to any tower: attention dropout and DropHead.

The RCL paper (Tan et al. 2022, Tables 1-3) compares its regulators with these two, trained the same way
as its base (eq. 1, no regulator):

* **attention dropout** (`train.attention_dropout: p`): dropout with rate p on the attention
  probabilities of every self-attention layer (the transformer's `attention_probs_dropout_prob`, which
  the model's config.json otherwise decides). Only the training forward draws masks; the saved model's
  config.json keeps the base's value, so the model opens as it did.
* **DropHead** (`train.drophead: p`; Zhou et al. 2020, "Scheduled DropHead"): every example drops each
  attention head of every self-attention layer with probability p, its whole output (the head's context
  vectors) set to 0, and the heads it keeps are scaled by H / kept, H the layer's head count, so the
  layer's output keeps its scale (the common DropHead implementation for BERT; the paper's schedule of p
  over training is not used: RCL's tables give one fixed p). An example that drops every head of a layer
  gets that layer's attention output 0 (never a division by 0).

Both act in training mode only (`module.training`); evaluation and encoding see the model unchanged.
They apply to BERT-like self-attention (BERT, RoBERTa, MiniLM, MPNet-style modules whose forward returns
the heads' concatenated context first); another attention is refused with one error naming it.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError


def self_attention_modules(model: nn.Module) -> list[nn.Module]:
    """Every BERT-like self-attention module of a transformer: it has `num_attention_heads`,
    `attention_head_size` and an `nn.Dropout` named `dropout` (its attention-probability dropout)."""
    return [m for m in model.modules()
            if type(m).__name__.endswith("SelfAttention") and isinstance(getattr(m, "num_attention_heads", None), int)
            and isinstance(getattr(m, "attention_head_size", None), int) and isinstance(getattr(m, "dropout", None),
                                                                                        nn.Dropout)]


def drophead_mask(batch: int, heads: int, p: float, device=None, generator: torch.Generator | None = None
                  ) -> torch.Tensor:
    """[batch, heads] scales of DropHead: 0 for a dropped head, H / kept for a kept one (0 everywhere for an
    example that keeps no head)."""
    keep = (torch.rand(batch, heads, device=device, generator=generator) >= p).float()
    kept = keep.sum(dim=1, keepdim=True)
    return torch.where(kept > 0, keep * heads / kept.clamp(min=1), torch.zeros_like(keep))


def _drophead_hook(p: float):
    def hook(module, args, output):
        if not module.training or p <= 0:
            return output
        context = output[0] if isinstance(output, tuple) else output
        b, t, width = context.shape
        h, d = module.num_attention_heads, module.attention_head_size
        if width != h * d:
            raise ConfigError(f"train.drophead: {type(module).__name__} returns {width} features, not its {h} heads "
                              f"x {d}: not an attention DropHead knows")
        scale = drophead_mask(b, h, p, device=context.device).to(context.dtype)
        dropped = (context.view(b, t, h, d) * scale[:, None, :, None]).view(b, t, width)
        return (dropped, *output[1:]) if isinstance(output, tuple) else dropped
    return hook


def apply_attention_regularizers(towers: list[nn.Module], attention_dropout: float | None,
                                 drophead: float) -> dict:
    """Set attention dropout and register DropHead on every self-attention layer of each tower (a shared
    tower listed twice is changed once). Returns what was done: {"layers": n, "attention_dropout": p or
    None, "drophead": p}. A tower with no self-attention this module knows is refused when either is asked."""
    if attention_dropout is None and not drophead:
        return {"layers": 0, "attention_dropout": None, "drophead": 0.0}
    seen, layers = set(), 0
    for tower in towers:
        if id(tower) in seen:
            continue
        seen.add(id(tower))
        modules = self_attention_modules(tower)
        if not modules:
            what = "train.attention_dropout" if attention_dropout is not None else "train.drophead"
            raise ConfigError(f"{what}: the model ({type(tower).__name__}) has no BERT-like self-attention layer to "
                              "regularize (BERT, RoBERTa, MiniLM); leave the option unset for this model")
        for m in modules:
            if attention_dropout is not None:
                m.dropout.p = float(attention_dropout)
            if drophead:
                m.register_forward_hook(_drophead_hook(float(drophead)))
        layers += len(modules)
    return {"layers": layers, "attention_dropout": attention_dropout, "drophead": float(drophead)}
