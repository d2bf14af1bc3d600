"""The method interface: what a training method brings to the method-agnostic loop.

The loop (`train/loop.py`) owns DDP, precision, clipping, checkpoints with exact resume,
validation and reporting. A method owns everything that differs between DPR, DAR, RCL,
ARR and ANCE:

    config_cls      its `loss:` block (a `LossConfig` subclass; unknown keys refused)
    sections        extra top-level config sections it owns ({"rcl": RCLSettings}; `job.section("rcl")`)
    loss_fn         a pure function  (batch dict of tensors, cfg, training, generator) -> (loss, {term: tensor})
    terms           the loss terms it reports (besides `loss`)
    build_examples  how its examples are read and written (Parquet + examples.json with a digest)
    partition_key   the integer column that assigns an example to a worker (value % world)
    steps_per_epoch / batches   its batch sampler (deterministic given seed, epoch, rank)
    side_inputs     frozen models and tables it needs, loaded once per worker (eval mode, no grad)
    heads           extra trainable modules (e.g. a classifier), trained with the encoder and
                    kept in checkpoints (`training_state.pt`), but not part of the saved model
    forward         tokenise + run the towers for one batch of rows (inside autocast)
    assemble        cross-worker gathering and layout: model outputs -> the loss's batch dict

A new method is one subclass in `train/methods/`, one loss file in `losses/` (its `loss:` block in
losses/configs.py), one registry line (`@register`), its line in `methods/configs.py` (what it reads
from a config, without torch; `register` checks it), one config file in `jobs/configs/`, and its tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from typing import TYPE_CHECKING

from ...losses.configs import LossConfig
from ..batching import buffer_shuffle, epoch_rng, fixed_batches

if TYPE_CHECKING:  # torch is imported where a step runs: the interface loads without it (config checks, --help)
    import torch
    from torch import nn


@dataclass
class StepContext:
    """What `forward`/`assemble` may use at one step. `negatives` is the loaded version of
    the negatives provider (or None); `rng` is seeded by (seed, step) so a resumed run draws
    the same samples."""

    job: Any
    device: torch.device
    rank: int
    world: int
    step: int
    rng: random.Random
    side: dict = field(default_factory=dict)
    negatives: Any = None
    stats: dict = field(default_factory=dict)  # counters the method wants reported (summed per window)


def freeze(module: nn.Module) -> nn.Module:
    """A frozen side model: eval mode, no parameter requires grad."""
    module.eval()
    module.requires_grad_(False)
    return module


def check_frozen(side: dict) -> None:
    """The loop's guard: every module among the side inputs is in eval mode without gradients."""
    from torch import nn

    for name, obj in side.items():
        if isinstance(obj, nn.Module):
            if obj.training or any(p.requires_grad for p in obj.parameters()):
                raise RuntimeError(f"side input {name!r} must be frozen (eval mode, requires_grad False): "
                                   "use methods.base.freeze()")


class Method:
    """Base class; the DPR-family defaults live in `pairs.PairMethod`."""

    name: str = ""
    description: str = ""
    config_cls: type[LossConfig] = LossConfig
    loss_fn: Callable = None  # type: ignore[assignment]
    terms: tuple[str, ...] = ()
    partition_key: str = "idx"
    # extra top-level config sections of this method: {"rcl": RCLSettings} -> job.section("rcl")
    sections: dict = {}
    # whether the loop may swap in versioned negatives from a provider (ANCE-style)
    uses_negatives_provider: bool = False
    # build_examples depends on (job, out_dir) only and writes everything it makes to out_dir, so
    # the trainer may run it in a child process (data.build_apart) whose memory is gone before training
    builds_apart: bool = False

    # ---- examples -----------------------------------------------------------------
    def build_examples(self, job, out_dir: Path, progress: bool = True) -> dict:
        raise NotImplementedError

    # ---- sampler ------------------------------------------------------------------
    def steps_per_epoch(self, meta: dict, world: int, batch_size: int) -> int:
        """Every rank takes the same number of steps: the smallest rank share, in whole batches."""
        return (meta["examples"] // world) // batch_size

    def batches(self, rows: Iterable[dict], job, epoch: int, rank: int, spe: int) -> Iterator[list[dict]]:
        """Default sampler: seeded buffer shuffle, then fixed-size batches (exact resume)."""
        rng = epoch_rng(job.train.seed, epoch, rank)
        return fixed_batches(buffer_shuffle(rows, job.data.shuffle_window, rng), job.train.batch_size, spe)

    # ---- side inputs and the step ---------------------------------------------------
    def side_inputs(self, job, device: torch.device) -> dict:
        return {}

    def heads(self, job, model) -> dict[str, nn.Module]:
        """Extra trainable modules, attached as `model.heads[name]` before DDP wraps the model
        (reach them as `model.module.heads` inside `forward`); their state is checkpointed."""
        return {}

    def forward(self, model, rows: list[dict], ctx: StepContext) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def assemble(self, out: dict[str, torch.Tensor], ctx: StepContext) -> dict:
        return out

    def loss(self, batch: dict, cfg: LossConfig, training: bool = True, generator=None):
        return type(self).loss_fn(batch, cfg, training, generator)
