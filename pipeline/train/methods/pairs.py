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
from ...losses.configs import DistillKLConfig, MarginMSEConfig
from ...losses.dar import DARConfig, dar_batch_loss
from ...losses.dist import gather_docs
from ...losses.distill import distill_kl_batch_loss, margin_mse_batch_loss
from ...losses.dpr import dpr_batch_loss
from ..batching import pick_negative_positions, pick_negatives
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

    @staticmethod
    def encode(model, queries: list[str], docs: list[str], ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenise and run each tower once: (queries (B, D), documents (N, D))."""
        base = model.module if hasattr(model, "module") else model
        q_tok = {k: v.to(ctx.device) for k, v in base.tokenize(queries, "query").items()}
        d_tok = {k: v.to(ctx.device) for k, v in base.tokenize(docs, "doc").items()}
        return model(q_tok, d_tok)

    def forward(self, model, rows: list[dict], ctx: StepContext) -> dict[str, torch.Tensor]:
        """Tokenise and encode: q (B, D); docs (B + B*h, D) = [positives | hard negatives]."""
        B = len(rows)
        docs = [r["positive"] for r in rows] + [n for r in rows for n in self.negatives_for(r, ctx)]
        q, d = self.encode(model, [r["query"] for r in rows], docs, ctx)
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


class _Distill(PairMethod):
    """Distillation from a teacher's scores (losses/distill.py): each example's positive and `data.hard_negatives`
    of its negatives, drawn as PairMethod draws them, with the teacher's score of each."""

    uses_negatives_provider = False

    def build_examples(self, job, out_dir: Path, progress: bool = True) -> dict:
        return build_examples(job.data, out_dir, progress=progress, needs_teacher=True)

    def forward(self, model, rows: list[dict], ctx: StepContext) -> dict[str, torch.Tensor]:
        from ...errors import PipelineError

        h = ctx.job.data.hard_negatives
        if h < 1:
            raise PipelineError(f"loss.name={self.name} scores each query's positive against its hard negatives: "
                                "set data.hard_negatives (1 or more)")
        docs, t_pos, t_neg = [], [], []
        for r in rows:
            if r.get("teacher_positive") is None:
                raise PipelineError(f"example {r['idx']} (query {r['qid']}) has no teacher score: give "
                                    "data.teacher_scores, or a columns file with a label column")
            at = pick_negative_positions(r, h, ctx.rng)
            docs += [r["negatives"][i] for i in at]
            t_pos.append(float(r["teacher_positive"]))
            t_neg.append([float(r["teacher_negatives"][i]) for i in at])
        B = len(rows)
        q, d = self.encode(model, [r["query"] for r in rows], [r["positive"] for r in rows] + docs, ctx)
        return {"q": q, "pos": d[:B], "hard": d[B:],
                "t_pos": torch.tensor(t_pos, dtype=torch.float32, device=ctx.device),
                "t_neg": torch.tensor(t_neg, dtype=torch.float32, device=ctx.device)}


@register
class MarginMSE(_Distill):
    name = "margin_mse"
    description = "MarginMSE: the student's positive-negative margin against the teacher's (docs/METHODS.md §8)"
    config_cls = MarginMSEConfig
    loss_fn = staticmethod(margin_mse_batch_loss)
    terms = ("mse",)

    def assemble(self, out: dict[str, torch.Tensor], ctx: StepContext) -> dict:
        q, pos, hard = (_fp32(out[k]) for k in ("q", "pos", "hard"))
        B = pos.shape[0]
        return {"q": q, "pos": pos, "neg": hard.view(B, -1, hard.shape[-1]), "t_pos": out["t_pos"],
                "t_neg": out["t_neg"]}


@register
class DistillKL(_Distill):
    name = "distill_kl"
    description = "Listwise KL from the teacher's distribution over a query's documents (docs/METHODS.md §8)"
    config_cls = DistillKLConfig
    loss_fn = staticmethod(distill_kl_batch_loss)
    terms = ("kl",)

    def assemble(self, out: dict[str, torch.Tensor], ctx: StepContext) -> dict:
        from ...losses.dist import world

        q, pos, hard = (_fp32(out[k]) for k in ("q", "pos", "hard"))
        B, h = pos.shape[0], hard.shape[0] // max(pos.shape[0], 1)
        local = torch.arange(B, device=q.device)
        if ctx.job.loss.in_batch_negatives:  # every document of the global batch in the student's distribution
            docs, pos_idx, G = gather_docs(pos, hard)
            rank, _ = world()
            first_hard = G + rank * B * h
        else:
            docs, pos_idx, first_hard = torch.cat([pos, hard], 0), local, B
        negs = first_hard + local[:, None] * h + torch.arange(h, device=q.device)[None, :]
        group = torch.cat([pos_idx[:, None], negs], 1)
        teacher = torch.cat([out["t_pos"][:, None], out["t_neg"]], 1)
        return {"q": q, "docs": docs, "group": group, "teacher": teacher}
