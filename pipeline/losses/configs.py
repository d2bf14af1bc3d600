"""The `loss:` blocks of every method, apart from the loss functions: frozen dataclasses only.

They import neither torch nor the loss functions, so a training config is parsed and checked,
and `pipeline train --help` lists every key, without importing torch (the CLI answers those in
well under a second). Each loss module re-exports its own block (`losses.dar.DARConfig` is this
`DARConfig`); the math each field switches is in that module's docstring.

Every method's block subclasses `LossConfig` (name, similarity, temperature) and adds its own
fields; `pipeline/train/methods/configs.py` maps `loss.name` to the block's class, so unknown
keys are refused per method.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from ..config import Fraction, NonNegFloat, NonNegInt, OpenFraction, PosFloat, Real, Section

DEFAULT_COS_TEMPERATURE = 0.05


@dataclass(frozen=True)
class LossConfig(Section):
    """Loss settings shared by every method.

    `similarity: auto` follows the model (docs/METHODS.md §1): a model that L2-normalises its
    vectors is trained with cos/τ (τ = 0.05 unless given), one that does not with the dot
    product (τ = 1). `temperature: null` means that default for the chosen similarity.
    """

    name: str = "dpr"
    similarity: Literal["auto", "dot", "cos"] = "auto"
    temperature: PosFloat | None = None

    SECTION = "loss"

    def validate(self) -> None:
        """Checks across keys (each key's own range is declared in its annotation)."""

    @property
    def tau(self) -> float:
        if self.temperature is not None:
            return self.temperature
        if self.similarity == "cos":
            return DEFAULT_COS_TEMPERATURE
        if self.similarity == "dot":
            return 1.0
        raise ValueError("loss.similarity=auto must be resolved against the model first (resolve_similarity)")


def resolve_similarity(cfg: LossConfig, model_normalizes: bool) -> LossConfig:
    """`auto` -> cos for normalising models, dot otherwise; the temperature made explicit."""
    sim = cfg.similarity
    if sim == "auto":
        sim = "cos" if model_normalizes else "dot"
    out = replace(cfg, similarity=sim)
    return replace(out, temperature=out.tau)


# --------------------------------------------------------------------------- DAR (losses/dar.py)

@dataclass(frozen=True)
class DARConfig(LossConfig):
    """The `loss:` block of DAR (defaults = docs/METHODS.md §2)."""

    name: str = "dar"
    n_perturb: NonNegInt = 7
    dropout_p: OpenFraction = 0.1
    mix_weight: Fraction = 0.1
    mix_scale: PosFloat = 10.0
    mix_detach_negatives: bool = False
    mix_grouping: Literal["drop_positive", "shift"] = "drop_positive"
    mix_hard_negatives: bool = True


# --------------------------------------------------------------------------- ANCE (losses/ance.py)

@dataclass(frozen=True)
class ANCEConfig(LossConfig):
    name: str = "ance"
    in_batch_negatives: bool = False


@dataclass(frozen=True)
class ANCEDARConfig(DARConfig):
    name: str = "ance_dar"
    in_batch_negatives: bool = False


# --------------------------------------------------------------------------- distillation (losses/distill.py)

@dataclass(frozen=True)
class MarginMSEConfig(LossConfig):
    """MarginMSE (Hofstätter et al. 2020): the student's margin between a query's positive and each hard negative
    against the teacher's margin (docs/METHODS.md §8). Needs data.hard_negatives >= 1 and teacher scores."""

    name: str = "margin_mse"


@dataclass(frozen=True)
class DistillKLConfig(LossConfig):
    """Listwise KL divergence from the teacher's distribution over a query's scored documents (its positive and
    hard negatives) to the student's (docs/METHODS.md §8). teacher_temperature divides the teacher's scores, the
    student's are divided by loss.temperature (its similarity's τ); in_batch_negatives adds the other queries'
    documents to the student's distribution (the teacher gives them no probability)."""

    name: str = "distill_kl"
    teacher_temperature: PosFloat = 1.0
    in_batch_negatives: bool = False


# --------------------------------------------------------------------------- RCL (losses/rcl.py)

@dataclass(frozen=True)
class RCLConfig(LossConfig):
    """`loss:` block of `loss.name: rcl` (each field a reconstruction switch, docs/METHODS.md §3)."""

    name: str = "rcl"
    entropy_lambda: Real = 0.0          # eq. 2: λ of an entropy model (0 = plain eq. 1)
    regulator_weight: NonNegFloat = 1.0        # eq. 3: w
    regulator_reduce: Literal["sum", "mean"] = "sum"  # eq. 3: Σ_k (paper) or mean over the 2K terms

    def validate(self) -> None:
        from ..errors import ConfigError

        super().validate()
        if self.regulator_reduce not in ("sum", "mean"):
            raise ConfigError(f"loss.regulator_reduce must be sum or mean, got {self.regulator_reduce!r}")


# --------------------------------------------------------------------------- ARR (losses/arr.py)

MLL_HEADS = ("released", "pooled")
SCALINGS = ("normalized", "released_code")


@dataclass(frozen=True)
class SupConConfig(LossConfig):
    """`arr_cl`: supervised contrastive loss, positives = the other texts of the same author."""

    name: str = "arr_cl"
    similarity: Literal["auto", "dot", "cos"] = "cos"
    temperature: PosFloat | None = 0.07


@dataclass(frozen=True)
class MLLConfig(LossConfig):
    """`arr_mll`: cross-entropy of an author classifier.

    `mll_head: released` (default): the released baseline's head on the first token's hidden
    state, logits used as they are (no temperature: `temperature` is not read).
    `mll_head: pooled`: logits = classifier(vector) / temperature (the vector is the model's
    output, L2-normalised when the model normalises, so a temperature makes the softmax sharp
    enough to learn)."""

    name: str = "arr_mll"
    similarity: Literal["auto", "dot", "cos"] = "cos"
    temperature: PosFloat | None = 0.05       # mll_head: pooled only
    mll_head: Literal["released", "pooled"] = "released"

    def validate(self) -> None:
        super().validate()
        from ..errors import ConfigError

        if self.mll_head not in MLL_HEADS:
            raise ConfigError(f"loss.mll_head must be one of {', '.join(MLL_HEADS)}, got {self.mll_head!r}")


@dataclass(frozen=True)
class ARRConfig(LossConfig):
    """`arr`: distillation from the frozen base model G, topic-regularised by TF-IDF (H)."""

    name: str = "arr"
    similarity: Literal["auto", "dot", "cos"] = "cos"
    temperature: PosFloat | None = 0.05       # τ of eq. 1 for G and F
    bias_temperature: PosFloat | None = None  # τ of eq. 1 for H (default: temperature)
    scaling: Literal["normalized", "released_code"] = "normalized"

    def validate(self) -> None:
        super().validate()
        from ..errors import ConfigError

        if self.scaling not in SCALINGS:
            raise ConfigError(f"loss.scaling must be one of {', '.join(SCALINGS)}, got {self.scaling!r}")
