"""Cross-worker gathering for in-batch negatives, in one place.

`gather_docs` all-gathers positives and hard negatives with gradients
(torch.distributed.nn.functional.all_gather backpropagates to the owner), so every
query sees the global batch and DDP's gradient averaging yields the gradient of the
global mean loss. Layout: [G positives (rank-major) | all hard negatives].
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_with_grad(t: torch.Tensor) -> torch.Tensor:
    """(n, D) on each rank -> (world * n, D), differentiable; identity without a process group."""
    rank, size = world()
    if size == 1:
        return t
    import warnings

    from torch.distributed.nn.functional import all_gather

    # torch 2.13 marks this autograd-aware all_gather deprecated; it is still correct (the
    # 2-process gloo test checks values and gradients) and its suggested replacement does
    # not backpropagate to the owner, so the warning is silenced here, once, on purpose.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.cat(all_gather(t.contiguous()), dim=0)


def gather_docs(pos: torch.Tensor, hard: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Local positives (B, D) and hard negatives (B*h, D) -> (docs, pos_idx, G).

    Every rank must hold the same B and h (the trainer uses fixed-size batches).
    """
    rank, _ = world()
    B = pos.shape[0]
    all_pos = gather_with_grad(pos)
    parts = [all_pos]
    if hard is not None and hard.numel():
        parts.append(gather_with_grad(hard))
    pos_idx = torch.arange(B, device=pos.device) + rank * B
    return torch.cat(parts, 0), pos_idx, all_pos.shape[0]
