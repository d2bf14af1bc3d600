"""What each method reads from a training config, without the method itself: `loss.name` -> its `loss:`
block class and the extra top-level sections it owns, and those sections' dataclasses.

Nothing here imports torch (nor the loss functions, nor the method modules), so a training config is
parsed and checked (train/config.py), `pipeline train --help` lists every method's keys (confdoc.py) and
a config error is reported, without importing torch (`registry.method_config` reads this table).
`registry.register` refuses a method whose `config_cls` or `sections` differ from its line in
`METHOD_CONFIGS`, so the two cannot drift: a built-in method adds its line here (its loss block in
losses/configs.py, its sections below). A method registered by other code without a line here is
read from its class, once registered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from annotated_types import Ge

from ...config import EncodeConfig, NonNegFloat, NonNegInt, OpenFraction, PosInt, Real, Section
from ...data.negatives import RefresherConfig
from ...errors import ConfigError
from ...losses.configs import (ANCEConfig, ANCEDARConfig, ARRConfig, DARConfig, DistillKLConfig, LossConfig,  # noqa: E501
                               MarginMSEConfig, MLLConfig, RCLConfig,
                               SupConConfig)


# --------------------------------------------------------------------------- ANCE (methods/ance.py)

@dataclass(frozen=True)
class ANCESettings(RefresherConfig):
    """The `ance:` section: the refresher's settings plus how the trainer uses its versions."""

    # checkpoints (and so refreshes) every this many steps; sets train.checkpoint_every when that is 0
    refresh_every: PosInt = 100
    # run the refresher beside training (pipeline train); false = versions come from elsewhere
    # (`pipeline refresh` as a separate job) and the trainer only polls `versions_dir`
    start_refresher: bool = True


# --------------------------------------------------------------------------- RCL (methods/rcl.py)

@dataclass(frozen=True)
class RCLSettings(Section):
    """The `rcl:` section: the stages of `pipeline train` with `loss.name: rcl` (pipeline/rcl.py)."""

    # how the stages are scheduled, not what they compute: left out of a run's identity (train/identity.py)
    OPERATIONAL: ClassVar[tuple[str, ...]] = ("concurrent", "max_concurrent", "entropy_cpus_per_worker")

    # stage 1: one entropy model per λ (paper: 0.01..0.04; 4 models = 8 regulators was best)
    entropy_lambdas: tuple[Real, ...] = (0.01, 0.02, 0.03, 0.04)
    # STS setting: entropy models start from the base; FAQ setting: from the initial model
    # (stage 0: the base fine-tuned with eq. 1, selected on dev MAP)
    entropy_init: Literal["base", "initial"] = "base"
    patience: PosInt = 3                     # early stop: evaluations without a lower dev loss
    eval_every: NonNegInt = 0                # steps between early-stop / selection evaluations (0 = train.eval_every)
    entropy_max_steps: NonNegInt = 0         # budget of one entropy model (0 = train.max_steps / epochs)
    initial_max_steps: NonNegInt = 0         # budget of the initial model (0 = train.max_steps / epochs)
    initial_metric: str = "AP@100"           # stage 0 selection measure on the validation split (MAP)
    concurrent: bool = True                  # stage 1 runs as concurrent Ray Train runs
    max_concurrent: NonNegInt = 0            # 0 = as many as the cluster's CPUs allow
    entropy_cpus_per_worker: NonNegFloat = 0.0  # 0 = train.cpus_per_worker / number of concurrent runs
    regulators: bool = True                  # False: stage 3 is plain eq. 1 (the ablation)
    dev_batches: PosInt = 4                  # dev batches of train.batch_size for the early-stop loss
    # > 0: hold this fraction of the training queries (or of `rcl.pairs`) out as the dev split
    # (seeded by validation.dev_seed, as validation.dev_split: every replicate over train.seed sees the same
    # dev queries) for early stopping and selection, in place of the `validation:` split
    dev_split: OpenFraction = 0.0
    # STS setting: a sentence-pairs file (anchor, positive[, hard negative]: JSONL, CSV with a
    # header such as SimCSE's nli_for_simcse.csv, or TSV; data/sentence_pairs.py) as the training
    # data of every stage, in place of `data:` (the paper trains its STS models on NLI pairs)
    pairs: str | None = None
    # an STS dev file (STS-benchmark CSV/TSV, SICK, s1<TAB>s2<TAB>score; eval/sts.py): the final
    # (and initial) model's validation hook reports its Spearman as `val_metric`
    sts_dev: str | None = None
    # the final model: `last` checkpoint, or `best` validation metric (dev Spearman / dev MAP)
    final_select: Literal["last", "best"] = "last"
    # anisotropy (mean pairwise cosine) of base, entropy and final models on this many random
    # training sentences, in rcl.json (0 = skip)
    anisotropy_sentences: NonNegInt = 200
    # stage 2: the spine's Ray Data encoding of the training sentences by each frozen entropy
    # model (`encode:` keys: actors, CPUs, batch size, precision, shard_rows; auto = the cluster)
    encode: EncodeConfig = field(default_factory=EncodeConfig)
    # set by the orchestrator for the final model: stage 2 regulator tables (folders)
    regulator_tables: tuple[str, ...] = field(default_factory=tuple)

    SECTION = "rcl"

    def __post_init__(self):
        super().__post_init__()
        if not self.entropy_lambdas and self.regulators:
            raise ConfigError("rcl.entropy_lambdas is empty: give at least one λ, or rcl.regulators=false")
        if self.final_select not in ("last", "best"):
            raise ConfigError(f"rcl.final_select must be last or best, got {self.final_select!r}")
        if self.entropy_init not in ("base", "initial"):
            raise ConfigError(f"rcl.entropy_init must be base or initial, got {self.entropy_init!r}")
        if len(set(self.entropy_lambdas)) != len(self.entropy_lambdas):
            raise ConfigError(f"rcl.entropy_lambdas has duplicates: {list(self.entropy_lambdas)}")


# --------------------------------------------------------------------------- ARR (methods/arr.py)

@dataclass(frozen=True)
class AuthorshipSettings(Section):
    """`authorship:` section of the ARR methods. Paths are made absolute where the config is
    first read (the driver), so workers in another directory find the same files."""

    split: str | None = None        # folder written by `pipeline authorship split`
    m: Annotated[int, Ge(2)] = 2    # texts per author in a batch (a text needs a same-author partner)
    teacher: str | None = None      # arr: the base model G (a model folder, e.g. <arr_cl run>/model)

    SECTION = "authorship"

    def __post_init__(self):
        super().__post_init__()
        for key in ("split", "teacher"):
            v = getattr(self, key)
            if v and v != "minilm" and not Path(v).is_absolute():
                object.__setattr__(self, key, str(Path(v).expanduser().resolve()))


# --------------------------------------------------------------------------- loss.name -> config


@dataclass(frozen=True)
class MethodConfig:
    """A method's share of the training config: its `loss:` block and its own top-level sections."""

    config_cls: type[LossConfig]
    sections: dict = field(default_factory=dict)


_AUTHORSHIP = {"authorship": AuthorshipSettings}

METHOD_CONFIGS: dict[str, MethodConfig] = {
    "dpr": MethodConfig(LossConfig),
    "dar": MethodConfig(DARConfig),
    "ance": MethodConfig(ANCEConfig, {"ance": ANCESettings}),
    "margin_mse": MethodConfig(MarginMSEConfig),
    "distill_kl": MethodConfig(DistillKLConfig),
    "ance_dar": MethodConfig(ANCEDARConfig, {"ance": ANCESettings}),
    "rcl": MethodConfig(RCLConfig, {"rcl": RCLSettings}),
    "arr_cl": MethodConfig(SupConConfig, _AUTHORSHIP),
    "arr_mll": MethodConfig(MLLConfig, _AUTHORSHIP),
    "arr": MethodConfig(ARRConfig, _AUTHORSHIP),
}

