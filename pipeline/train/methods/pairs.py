"""DPR and DAR: (query, positive[, hard negatives]) pairs with in-batch negatives.

Examples come from DPR training JSON or qrels + corpus (+ a run for hard negatives);
see `data/training.py`. The document tower runs once per step on [positives | hard
negatives]; documents are all-gathered with gradients (`losses/dist.py`) so every query
sees the global batch. With a negatives provider (ANCE-style refreshed negatives), each
example's hard negatives come from the newest version for its query id instead of the
examples file.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...data.training import build_examples
from ...losses.dar import DARConfig, dar_batch_loss
from ...losses.dist import gather_docs
from ...losses.dpr import dpr_batch_loss
from ..batching import pick_negatives
from .registry import register
from .base import Method, StepContext


def _fp32(t: torch.Tensor) -> torch.Tensor:
    """Autocast outputs (bf16/fp16) are scored in fp32; fp32/fp64 pass through unchanged."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


class PairMethod(Method):
    """Shared by every pair method: examples, tokenisation, the gathered layout."""

    terms = ("nll",)
    uses_negatives_provider = True
    builds_apart = True

    def build_examples(self, job, out_dir: Path, progress: bool = True) -> dict:
        return build_examples(job.data, out_dir, progress=progress)

    def negatives_for(self, row: dict, ctx: StepContext) -> list[str]:
        """The example's hard negatives: from the provider's version for its query id when there
        is one, else `initial_negatives` (no version yet) or `fallback_negatives` (not in it)."""
        h = ctx.job.data.hard_negatives
        if h == 0:
            return []
        if ctx.negatives is None:
            return self.initial_negatives(row, ctx, h)
        fresh = ctx.negatives.get(str(row["qid"]))
        if fresh:
            ctx.stats["negatives_from_version"] = ctx.stats.get("negatives_from_version", 0) + 1
            return pick_negatives({"idx": row["idx"], "negatives": fresh}, h, ctx.rng)
        ctx.stats["negatives_fallback"] = ctx.stats.get("negatives_fallback", 0) + 1
        return self.fallback_negatives(row, ctx, h)

    def initial_negatives(self, row: dict, ctx: StepContext, h: int) -> list[str]:
        return pick_negatives(row, h, ctx.rng)

    def fallback_negatives(self, row: dict, ctx: StepContext, h: int) -> list[str]:
        return pick_negatives(row, h, ctx.rng)

    def forward(self, model, rows: list[dict], ctx: StepContext) -> dict[str, torch.Tensor]:
        """Tokenise and encode: q (B, D); docs (B + B*h, D) = [positives | hard negatives]."""
        B = len(rows)
        queries = [r["query"] for r in rows]
        docs = [r["positive"] for r in rows] + [n for r in rows for n in self.negatives_for(r, ctx)]
        base = model.module if hasattr(model, "module") else model
        q_tok = {k: v.to(ctx.device) for k, v in base.tokenize(queries, "query").items()}
        d_tok = {k: v.to(ctx.device) for k, v in base.tokenize(docs, "doc").items()}
        q, d = model(q_tok, d_tok)  # each tower runs once per step
        return {"q": q, "pos": d[:B], "hard": d[B:]}

    def assemble(self, out: dict[str, torch.Tensor], ctx: StepContext) -> dict:
        """Gather documents across workers: docs = [G positives, rank-major | hard negatives]."""
        q, pos, hard = (_fp32(out[k]) for k in ("q", "pos", "hard"))
        docs, pos_idx, G = gather_docs(pos, hard if hard.numel() else None)
        return {"q": q, "docs": docs, "pos_idx": pos_idx, "n_pos": G,
                "hard_per_query": hard.shape[0] // max(pos.shape[0], 1)}


@register
class DPR(PairMethod):
    name = "dpr"
    description = "DPR: NLL over in-batch (+ hard) negatives (docs/METHODS.md §1)"
    loss_fn = staticmethod(dpr_batch_loss)


@register
class DAR(PairMethod):
    name = "dar"
    description = "DAR: DPR + dropout perturbation and mixup of document vectors (docs/METHODS.md §2)"
    config_cls = DARConfig
    loss_fn = staticmethod(dar_batch_loss)
    terms = ("nll", "mix")
