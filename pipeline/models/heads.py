"""The heads after a transformer: sentence-transformers' pooling modes, Dense layers and Normalize,
reproduced exactly (`Head`), and written back as sentence-transformers modules."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .loading import read_json, write_json

# sentence-transformers' pooling modes (its names), all reproduced by `pool`.


POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


# ---------------------------------------------------------------------------- pooling and heads
# sentence-transformers' (pre-5.4, still read by 6.x) Pooling config keys; 6.x's "pooling_mode" is read too.


LEGACY_POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                        "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                        "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, L, D) hidden states -> (B, D), computed as sentence-transformers' Pooling computes `pooling`."""
    acc = torch.float32 if hidden.dtype in (torch.float16, torch.bfloat16) else hidden.dtype
    if pooling == "cls":  # the first unmasked token (position 0 with right padding)
        first = attention_mask.to(torch.int).argmax(dim=1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]
    if pooling in ("mean", "mean_sqrt_len_tokens"):
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
        total = (hidden * mask).sum(1, dtype=acc)
        count = mask.sum(1, dtype=acc).clamp(min=1e-9)
        return (total / (count if pooling == "mean" else count.sqrt())).to(hidden.dtype)
    if pooling == "max":
        return hidden.masked_fill(attention_mask.unsqueeze(-1) == 0, float("-inf")).max(dim=1).values
    if pooling == "weightedmean":  # position weights 1, 2, ... from the first unpadded token
        mask = attention_mask.unsqueeze(-1).to(acc)
        weights = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=acc).view(1, -1, 1)
        weights = weights - attention_mask.to(torch.int32).argmax(dim=1).view(-1, 1, 1)
        weighted = mask * weights
        return ((hidden * weighted).sum(1) / weighted.sum(1).clamp(min=1e-9)).to(hidden.dtype)
    if pooling == "lasttoken":
        seq_len = hidden.shape[1]
        values, idx = attention_mask.flip(1).max(1)
        idx = torch.where(values == 0, seq_len - 1, idx)
        last = seq_len - idx - 1
        masked = hidden * attention_mask.unsqueeze(-1).to(hidden.dtype)
        return masked[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ConfigError(f"pooling {pooling!r} is not one of {', '.join(POOLING_MODES)}")


def _exclude_prompt(attention_mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """The pooling mask without the prompt's tokens (sentence-transformers' include_prompt=False)."""
    mask = attention_mask.clone()
    pad = mask.to(torch.int32).argmax(dim=1)
    if pad.sum() == 0:
        mask[:, :prompt_length] = 0
    else:  # left padding
        pos = torch.arange(mask.size(1), device=mask.device).unsqueeze(0)
        mask[pos < (pad + prompt_length).unsqueeze(1)] = 0
    return mask


def _activation(name: str | None, where: str) -> nn.Module:
    """A torch.nn activation from its dotted class path (what sentence-transformers' Dense saves)."""
    if name is None:
        return nn.Tanh()  # Dense's default
    module_name, _, cls_name = name.rpartition(".")
    cls = None
    if name.startswith("torch."):
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
        except (ImportError, AttributeError):
            cls = None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ConfigError(f"{where}: Dense activation_function {name!r} is not a torch.nn module class; "
                          "this model cannot be reproduced without its own code")
    return cls()


def _fullname(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class DenseLayer(nn.Module):
    """sentence-transformers' Dense: activation(Linear(x)) [+ residual], on token or sentence embeddings."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: nn.Module | None = None,
                 on_tokens: bool = False, use_residual: bool = False):
        super().__init__()
        self.in_features, self.out_features, self.bias = in_features, out_features, bias
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation_function = nn.Tanh() if activation is None else activation
        self.on_tokens = on_tokens
        self.use_residual = use_residual
        if use_residual and in_features != out_features:
            self.residual = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation_function(self.linear(x))
        if self.use_residual:
            out = out + (x if self.in_features == self.out_features else self.residual(x))
        return out

    @classmethod
    def load(cls, folder: Path, where: str) -> "DenseLayer":
        cfg = read_json(folder / "config.json") or {}
        name = cfg.get("module_input_name", "sentence_embedding")
        out_name = cfg.get("module_output_name") or name
        if name not in ("sentence_embedding", "token_embeddings") or out_name != name:
            raise ConfigError(f"{where}: Dense from {name!r} to {out_name!r} is not supported "
                              "(only token_embeddings -> token_embeddings or sentence_embedding -> sentence_embedding)")
        known = {"in_features", "out_features", "bias", "activation_function", "module_input_name",
                 "module_output_name", "use_residual"}
        if set(cfg) - known:
            raise ConfigError(f"{where}: Dense options {sorted(set(cfg) - known)} are not supported")
        layer = cls(int(cfg["in_features"]), int(cfg["out_features"]), bool(cfg.get("bias", True)),
                    _activation(cfg.get("activation_function", "torch.nn.modules.activation.Tanh"), where),
                    on_tokens=name == "token_embeddings", use_residual=bool(cfg.get("use_residual", False)))
        if (folder / "model.safetensors").exists():
            from safetensors.torch import load_file

            state = load_file(str(folder / "model.safetensors"))
        elif (folder / "pytorch_model.bin").exists():
            state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        else:
            raise ConfigError(f"{where}: Dense weights missing (no model.safetensors or pytorch_model.bin in {folder})")
        missing, unexpected = layer.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ConfigError(f"{where}: Dense weights do not match its config (missing {missing}, unexpected {unexpected})")
        return layer

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        cfg = {"in_features": self.in_features, "out_features": self.out_features, "bias": self.bias,
               "activation_function": _fullname(self.activation_function)}
        if self.on_tokens:
            cfg["module_input_name"] = "token_embeddings"
        if self.use_residual:
            cfg["use_residual"] = True
        write_json(folder / "config.json", cfg)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()},
                  str(folder / "model.safetensors"))


class Head(nn.Module):
    """What runs after a transformer tower, in sentence-transformers' order:
    Dense on token embeddings*, Pooling, Dense on the sentence embedding*, Normalize?"""

    def __init__(self, pooling: str, normalize: bool, include_prompt: bool = True,
                 token_dense: list[DenseLayer] | None = None, sentence_dense: list[DenseLayer] | None = None):
        super().__init__()
        if pooling not in POOLING_MODES:
            raise ConfigError(f"pooling {pooling!r} is not one of {', '.join(POOLING_MODES)}")
        self.pooling, self.normalize, self.include_prompt = pooling, bool(normalize), include_prompt
        self.token_dense = nn.ModuleList(token_dense or [])
        self.sentence_dense = nn.ModuleList(sentence_dense or [])

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int = 0) -> torch.Tensor:
        for layer in self.token_dense:
            hidden = layer(hidden)
        if prompt_length and not self.include_prompt:
            attention_mask = _exclude_prompt(attention_mask, prompt_length)
        vec = pool(hidden, attention_mask, self.pooling)
        for layer in self.sentence_dense:
            vec = layer(vec)
        return F.normalize(vec, dim=-1) if self.normalize else vec

    def dim(self, hidden_size: int) -> int:
        if len(self.sentence_dense):
            return self.sentence_dense[-1].out_features
        return self.token_dense[-1].out_features if len(self.token_dense) else hidden_size

    def st_modules(self, hidden_size: int) -> list[tuple[str, str, callable]]:
        """(kind, sentence-transformers type, writer(folder)) for each module after the transformer."""
        out = [("Dense", "sentence_transformers.models.Dense", d.save) for d in self.token_dense]
        pool_dim = self.token_dense[-1].out_features if len(self.token_dense) else hidden_size
        pool_cfg = {"word_embedding_dimension": pool_dim,
                    **{key: self.pooling == mode for key, mode in LEGACY_POOLING_KEYS.items()},
                    "include_prompt": self.include_prompt}
        out.append(("Pooling", "sentence_transformers.models.Pooling",
                    lambda folder: write_json(folder / "config.json", pool_cfg)))
        out += [("Dense", "sentence_transformers.models.Dense", d.save) for d in self.sentence_dense]
        if self.normalize:
            out.append(("Normalize", "sentence_transformers.models.Normalize",
                        lambda folder: write_json(folder / "config.json", {})))
        return out
