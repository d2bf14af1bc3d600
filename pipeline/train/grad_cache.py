"""Gradient caching (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup";
Tevatron's `--grad_cache`, sentence-transformers' Cached losses): a step over a batch of any size with the
memory of one chunk of rows.

`train.grad_cache=true`. A step then goes:
1. every tower call of the method's forward runs chunk by chunk without a graph (`torch.no_grad`): a tower's rows
   are split into at most `train.grad_cache_query_chunk` (queries) or `train.grad_cache_doc_chunk` (documents)
   rows a chunk, in the length-sorted groups `train.length_group_rows` encodes them in (each group cut to its own
   longest row), and the random state (CPU and the device's) is kept before each chunk;
2. the representations of the whole batch, as leaves of a graph of their own, go into the method's assemble and
   loss (gathered across workers as without caching), and the loss's backward gives their gradients;
3. each chunk runs again with its random state restored, so dropout draws the masks it drew in 1, with a graph,
   and its gradient is back-propagated from the cached one; the parameters' gradients add up chunk by chunk
   (across workers they are averaged, as DDP averages them).

A cached step is the uncached step when each chunk is one of the length groups the uncached step encodes (a
tower's `rows // train.length_group_rows` groups, e.g. 8 groups of 16 for a batch of 128 and chunks of 16): the
same rows in the same forwards with the same dropout masks, so the same loss and gradients to float rounding.
Chunks that split those groups (or `train.length_group_rows=0`, one padded batch) draw their dropout masks for
other shapes: the same method, with other noise.
"""

from __future__ import annotations

import contextlib
import math

import torch


class ToweredCall:
    """One tower call recorded in pass 1: what to run again, chunk by chunk, and the leaf its output became."""

    def __init__(self, model, batch, head, prompt_length: int, chunks: list, leaf: torch.Tensor):
        self.model, self.batch, self.head, self.prompt_length = model, batch, head, prompt_length
        self.chunks, self.leaf = chunks, leaf  # chunks: [(row index tensor, width, rng states)]


def rng_state(device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if torch.device(device).type == "cuda" else None
    return torch.get_rng_state(), cuda


def set_rng_state(state: tuple, device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class GradCache:
    """The step's recorder (set on the BiEncoder as `grad_cache` while pass 1 runs) and its replay."""

    def __init__(self, query_chunk: int, doc_chunk: int, device):
        self.query_chunk, self.doc_chunk, self.device = query_chunk, doc_chunk, device
        self.calls: list[ToweredCall] = []

    def encode(self, encoder, model, batch: dict, head, prompt_length: int, side: str) -> torch.Tensor:
        """Pass 1 of one tower call: the rows in chunks, no graph, random states kept; a leaf of the whole output."""
        chunk = self.query_chunk if side == "query" else self.doc_chunk
        rows = batch["input_ids"].shape[0]
        mask = batch["attention_mask"]
        lengths = mask.sum(1)
        grouped = encoder.length_group_rows > 0 and encoder._right_padded(model)
        order = torch.argsort(lengths, stable=True) if grouped else torch.arange(rows, device=lengths.device)
        n = max(1, math.ceil(rows / chunk))
        if grouped and rows >= 2 * encoder.length_group_rows:
            n = max(n, rows // encoder.length_group_rows)  # never larger groups than the uncached step's
        chunks, parts = [], []
        with torch.no_grad():
            for idx in torch.tensor_split(order, n):
                width = int(lengths[idx].max()) if grouped else batch["input_ids"].shape[1]
                state = rng_state(self.device)
                parts.append(encoder._forward_one(model, {k: v[idx, :width] for k, v in batch.items()}, head,
                                                  prompt_length))
                chunks.append((idx, width, state))
        out = torch.cat(parts)[torch.argsort(order)]
        leaf = out.detach().requires_grad_(True)
        self.calls.append(ToweredCall(model, batch, head, prompt_length, chunks, leaf))
        return leaf

    def replay(self, encoder, autocast, world: int) -> None:
        """Pass 3: every chunk again with its random state, its graph built and freed, its cached gradient back-
        propagated; then (several workers) the parameters' gradients averaged across them, as DDP does."""
        after = rng_state(self.device)
        for call in self.calls:
            grad = call.leaf.grad
            if grad is None:  # the loss did not use this output
                continue
            for idx, width, state in call.chunks:
                set_rng_state(state, self.device)
                with autocast():
                    out = encoder._forward_one(call.model, {k: v[idx, :width] for k, v in call.batch.items()},
                                               call.head, call.prompt_length)
                out.backward(grad[idx].to(out.dtype))
        set_rng_state(after, self.device)
        self.calls = []
        if world > 1:
            import torch.distributed as dist

            for p in encoder.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad.div_(world)


@contextlib.contextmanager
def recording(encoder, cache: GradCache):
    """The step's pass 1: the encoder's tower calls recorded into `cache` (what an earlier step left is dropped)."""
    cache.calls = []
    encoder.grad_cache = cache
    try:
        yield cache
    finally:
        encoder.grad_cache = None


GRAD_CACHE_METHODS = ("dpr", "dar", "ance", "ance_dar", "margin_mse", "distill_kl")
