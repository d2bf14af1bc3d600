"""ANCE (and ANCE + DAR): pair training whose hard negatives are refreshed while training runs.

The negatives come from a provider handed to the trainer (`data/negatives.VersionedNegatives`,
fed by the concurrent `index/refresher.IndexRefresher`; `recipes/ance.py` wires them).
Before the first version, the examples file's own negatives are used when the run was given
some (`data.negatives_run`, e.g. BM25), else training is in-batch only — on every rank at
once, so the gathered layout stays the same across workers.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ...data.training import build_examples
from ...losses.ance import ANCEConfig, ANCEDARConfig, ance_batch_loss, ance_dar_batch_loss
from ..batching import pick_negatives
from .registry import register
from .base import StepContext
from .configs import ANCESettings  # noqa: F401  (the `ance:` section, torch-free in configs.py)
from .pairs import PairMethod


class _ANCEBase(PairMethod):
    sections = {"ance": ANCESettings}

    def build_examples(self, job, out_dir: Path, progress: bool = True) -> dict:
        data = job.data
        if not data.negatives_run and data.source == "qrels":
            data = replace(data, hard_negatives=0)  # in-batch only until the first version: keep every example
        return build_examples(data, out_dir, progress=progress)

    def initial_negatives(self, row: dict, ctx: StepContext, h: int) -> list[str]:
        if not ctx.job.data.negatives_run and ctx.job.data.source == "qrels":
            return []  # before the first version, every rank trains in-batch only
        return pick_negatives(row, h, ctx.rng)

    def fallback_negatives(self, row: dict, ctx: StepContext, h: int) -> list[str]:
        if len(row.get("negatives") or []):
            return pick_negatives(row, h, ctx.rng)
        pool = ctx.negatives.pool()  # a query the version has nothing for: negatives of other queries
        return [pool[ctx.rng.randrange(len(pool))] for _ in range(h)]


@register
class ANCE(_ANCEBase):
    name = "ance"
    description = "ANCE: NLL over positive vs refreshed ANN hard negatives (docs/METHODS.md §5)"
    config_cls = ANCEConfig
    loss_fn = staticmethod(ance_batch_loss)


@register
class ANCEDAR(_ANCEBase):
    name = "ance_dar"
    description = "ANCE negatives with DAR's perturbation and mixup on top"
    config_cls = ANCEDARConfig
    loss_fn = staticmethod(ance_dar_batch_loss)
    terms = ("nll", "mix")
