"""The attention a training forward computes with (`train.attention`).

In training, BERT-like towers drop attention probabilities with rate p (`attention_probs_dropout_prob`,
0.1 for BERT and MiniLM). torch's fused CPU attention (SDPA's flash kernel) has no dropout, so with p > 0
SDPA falls back to its math path and draws the mask with one Bernoulli draw per probability: about 6 ns an
element on a 2-core EPYC, 25M probabilities a layer at batch 32 x 256 tokens, as much as the rest of the
layer's attention together.

`threshold-dropout` computes the same attention with a cheaper draw of the same mask: 64-bit random words
(torch's generator, so `torch.manual_seed` and a checkpoint's saved RNG state govern it as they govern
torch's dropout) cut into four 16-bit lanes, one per probability; a probability is kept when its lane is
below K = round((1 - p) * 65536), so with probability K / 65536 (1 - p to within 1 / 131072), and the kept
ones are scaled by 65536 / K, so every probability keeps its expectation exactly. Scores, softmax and the
product with the values are computed in float32 as SDPA's math path computes them on CPU (it upcasts
bf16 and fp16 inputs), and handed back in the values' dtype. Outside training, or with p = 0, it is
SDPA itself (the fused kernel): evaluation, validation and encoding compute what they always did. The
saved model's config.json names no attention, so a model opens as it did (sentence-transformers,
transformers' default).

`train.attention` (train/config.py): auto = threshold-dropout on CPU workers for a tower whose own
attention is SDPA (on a GPU, torch's fused SDPA kernels draw dropout inside, so the tower keeps its own);
sdpa / eager = transformers' own; threshold-dropout = this one wherever asked. The implementation in use is
part of a run's identity: `auto` resuming a checkpoint takes the one that checkpoint trained with (the
tower's own for a checkpoint that records none: it trained so), so a resumed run computes what the
uninterrupted one would have.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError

THRESHOLD_DROPOUT = "threshold-dropout"
CHOICES = ("auto", "sdpa", "eager", THRESHOLD_DROPOUT)
_LANES = 65536  # 16-bit lanes


def keep_threshold(p: float) -> int:
    """K of a dropout rate p: a lane in [0, 65536) below K keeps its probability (K >= 1)."""
    return max(1, min(_LANES, int(round((1.0 - float(p)) * _LANES))))


def dropout_lanes(n: int, device=None) -> torch.Tensor:
    """n uniform 16-bit lanes (int16, -32768..32767) from ceil(n / 4) draws of torch's 64-bit generator."""
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2 ** 63), None)
    return words.view(torch.int16)[:n]


def threshold_dropout_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                attention_mask: torch.Tensor | None, scaling: float | None = None,
                                dropout: float = 0.0, **kwargs):
    """transformers' attention interface: (output [batch, tokens, heads, head dim], None). query, key,
    value: [batch, heads, tokens, head dim]; attention_mask: None, bool (True = attend) or additive float,
    broadcastable to [batch, heads, queries, keys]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    causal = kwargs.get("is_causal") or getattr(module, "is_causal", False)
    if not module.training or not dropout or causal or key.shape[1] != query.shape[1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    dtype = value.dtype
    q, k, v = query.float(), key.float(), value.float()
    scale = q.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(q * scale, k.transpose(-1, -2))
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(attention_mask.logical_not(), torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask.float()
    probs = torch.softmax(scores, dim=-1)
    keep = keep_threshold(dropout)
    lanes = dropout_lanes(probs.numel(), device=probs.device).view(probs.shape)
    probs = probs.masked_fill(lanes >= keep - _LANES // 2, 0.0)
    out = torch.matmul(probs, v) * (_LANES / keep)
    return out.transpose(1, 2).contiguous().to(dtype), None


_registered = False


def register() -> None:
    """Make `threshold-dropout` a name transformers' models accept (its attention and its mask: SDPA's)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(THRESHOLD_DROPOUT, threshold_dropout_attention)
    AttentionMaskInterface.register(THRESHOLD_DROPOUT, sdpa_mask)
    _registered = True


def resolve_attention(mode: str, device, checkpoint: str | None = None, resuming: bool = False) -> str | None:
    """`train.attention` -> the implementation to set, or None (keep each tower's own).
    auto: when resuming, the checkpoint's (None where it records none: it trained with the towers' own);
    else threshold-dropout on a CPU, the towers' own elsewhere."""
    if mode not in CHOICES:
        raise ConfigError(f"train.attention={mode!r}: expected one of {', '.join(CHOICES)}")
    if mode != "auto":
        return mode
    if resuming:
        return checkpoint
    return THRESHOLD_DROPOUT if torch.device(device).type == "cpu" else None


def use_attention(towers: list, implementation: str | None, asked: str = "auto") -> str:
    """Set `implementation` on each tower (a shared tower listed twice is set once); returns the name in use
    (the first tower's: towers of one run train with one attention). Under auto, threshold-dropout goes only
    to towers whose own attention is SDPA and that accept another; an explicit value a tower refuses is one
    ConfigError naming it."""
    seen, used = set(), []
    for tower in towers:
        if id(tower) in seen:
            continue
        seen.add(id(tower))
        own = getattr(getattr(tower, "config", None), "_attn_implementation", None)
        name = implementation
        if name == THRESHOLD_DROPOUT:
            register()
            if asked == "auto" and own != "sdpa":
                name = None
        if name is not None and name != own:
            try:
                tower.set_attn_implementation(name)
            except (ValueError, AttributeError, ImportError) as e:
                if asked == "auto":
                    name = None
                else:
                    raise ConfigError(f"train.attention={asked}: the model ({type(tower).__name__}) does not take "
                                      f"it ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                                      "train.attention=auto keeps the model's own") from None
        used.append(getattr(getattr(tower, "config", None), "_attn_implementation", None) or "the model's own")
    return used[0] if used else "the model's own"
