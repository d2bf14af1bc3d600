"""Optimizers and the warmup + linear-decay schedule."""

from __future__ import annotations

import math

import torch
from torch.optim import Optimizer


class Lamb(Optimizer):
    """LAMB (You et al., 2020, Alg. 2), as used in the ANCE settings: Adam moments, then a
    layer-wise trust ratio ||w|| / ||update|| scaling the step (1 where either norm is 0)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
                m, v, t = state["m"], state["v"], state["step"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                update = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + group["eps"])
                if group["weight_decay"]:
                    update = update + group["weight_decay"] * p
                w_norm, u_norm = p.norm(), update.norm()
                trust = (w_norm / u_norm) if w_norm > 0 and u_norm > 0 else torch.ones((), device=p.device)
                p.add_(update, alpha=-group["lr"] * float(trust))
        return loss


def build_optimizer(params, cfg) -> Optimizer:
    """AdamW or LAMB. `params` may be parameters or (name, parameter) pairs; with names,
    biases and LayerNorm weights are not decayed (the BERT convention)."""
    params = list(params)
    if params and isinstance(params[0], tuple):
        decay = [p for n, p in params if p.requires_grad and not (n.endswith("bias") or "LayerNorm" in n or "layer_norm" in n)]
        no_decay = [p for n, p in params if p.requires_grad and (n.endswith("bias") or "LayerNorm" in n or "layer_norm" in n)]
        groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    else:
        groups = [{"params": [p for p in params if p.requires_grad]}]
    groups = [g for g in groups if g["params"]]
    if cfg.name == "lamb":
        return Lamb(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    kwargs = dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    # torch's fused AdamW (one kernel over all parameters): MiniLM's step 21 ms against 110 ms for the default
    # (foreach) on 2 CPU threads, the same update to ~1e-8; CPUs and GPUs, float parameters on one device type
    devices = {p.device.type for g in groups for p in g["params"]}
    if len(devices) == 1 and devices <= {"cpu", "cuda"} and all(p.is_floating_point() for g in groups for p in g["params"]):
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs)
        except (RuntimeError, TypeError, ValueError):
            pass  # this build has no fused kernel for these parameters
    return torch.optim.AdamW(groups, **kwargs)


def warmup_linear(optimizer: Optimizer, warmup: int, total: int):
    """LR × (step+1)/warmup during warmup (the first step already moves), then linear decay to 0 at `total`."""

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def warmup_steps(cfg, total: int) -> int:
    return cfg.warmup_steps or int(math.ceil(cfg.warmup_ratio * total))
