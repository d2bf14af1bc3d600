"""Configuration of a training run (`pipeline train --config jobs/configs/dpr.yaml`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from ..config import EvalConfig, IndexConfig, ModelConfig, RayConfig, from_dict, merge_overrides, read_yaml
from ..errors import ConfigError
from ..losses.base import LossConfig


@dataclass(frozen=True)
class TrainDataConfig:
    """Where training examples come from (see pipeline/data/training.py)."""

    source: Literal["qrels", "dpr-json"] = "qrels"
    path: str | None = None                 # dpr-json: the DPR training JSON
    title_join: str = "{title} [SEP] {text}"  # dpr-json: how ctx titles join the text
    negatives: Literal["hard", "random", "both"] = "hard"  # dpr-json: which ctx lists are negatives
    corpus: str | None = None               # qrels: ingested corpus folder
    queries: str | None = None              # qrels: default <corpus>/queries.tsv
    qrels: str | None = None                # qrels: default <corpus>/qrels/train.trec
    negatives_run: str | None = None        # qrels: TREC run to mine hard negatives from
    negatives_depth: int = 100
    rel_level: int = 1
    hard_negatives: int = 0                 # hard negatives per query per step
    shuffle_window: int = 10_000            # seeded per-epoch shuffle buffer (examples)
    # Hold the examples in the object store once per run instead of streaming them with
    # Ray Data every epoch: auto = when there are at most `materialize_max_examples`.
    materialize: Literal["auto", "always", "never"] = "auto"
    materialize_max_examples: int = 200_000
    # Examples not held in memory reach the workers as: files = each worker reads the examples'
    # Parquet parts itself, a batch at a time, keeping its own rows (no Ray Data, no copy in the
    # object store; the parts must be where every worker can read them, as checkpoints must);
    # ray-data = Ray Data streams them (needs a whole CPU beside the workers).
    streaming: Literal["files", "ray-data"] = "files"
    # Build the examples in a child process, so that what the build holds (the queries, their
    # judgements and negatives, the run being read) is returned to the system before training
    # starts: auto = when the sources (data.path, queries, qrels, negatives_run) pass 64 MB.
    build_apart: Literal["auto", "yes", "no"] = "auto"


@dataclass(frozen=True)
class OptimConfig:
    name: Literal["adamw", "lamb"] = "adamw"
    lr: float = 2e-5
    weight_decay: float = 0.0
    betas: tuple[float, ...] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    warmup_ratio: float = 0.1               # METHODS.md §1: warmup, then linear decay
    grad_clip: float = 2.0


@dataclass(frozen=True)
class TrainConfig:
    name: str = "dpr"
    storage_path: str = "runs/train"
    # auto: continue from the newest complete checkpoint of this run if there is one;
    # never: refuse to reuse a run name that has checkpoints; or a checkpoint path.
    resume: str = "auto"
    epochs: int = 1
    max_steps: int = 0                      # 0 = epochs x steps per epoch
    batch_size: int = 32                    # per worker
    num_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 1.0            # used when use_gpu
    amp: Literal["auto", "no", "bf16", "fp16"] = "auto"
    seed: int = 0
    checkpoint_every: int = 0               # steps; 0 = only at the end
    keep_checkpoints: int = 2
    eval_every: int = 0                     # steps; 0 = only at the end
    report_every: int = 10
    max_failures: int = 0
    torch_threads: int = 0                  # 0 = max(1, floor(cpus_per_worker))
    log_batches: bool = False               # write every step's example ids (resume audits)
    # Negatives provider (ANCE-style versions): rank 0 polls for a newer version every N steps.
    negatives_poll_every: int = 100
    fail_at_step: int = 0                   # testing: raise in the worker at this step
    fail_after_checkpoint: int = 0          # testing: raise right after the checkpoint of this step
    step_sleep_s: float = 0.0               # testing: pause after each step (a slower trainer, for ANCE tests)


@dataclass(frozen=True)
class ValidationConfig:
    """Held-out retrieval evaluation through encode -> index -> retrieve -> evaluate."""

    corpus: str | None = None
    queries: str | None = None              # default <corpus>/queries.tsv
    qrels: str | None = None                # default <corpus>/qrels/test.trec
    metric: str = "MRR@10"                  # the one reported as `val_metric` (for Tune)
    top_k: int = 100
    batch_size: int = 64
    # > 0: a seeded share of the training queries, held out of training, is the dev split the run
    # validates (and a sweep selects) on, instead of `qrels` (train/dev_split.py)
    dev_split: float = 0.0
    # the split's seed, apart from train.seed: every trial of a sweep (whatever its seed) and every
    # method validates on the same held-out queries
    dev_seed: int = 0

    def __post_init__(self):
        if not 0 <= self.dev_split < 1:
            raise ConfigError(f"validation.dev_split must be in [0, 1), got {self.dev_split}")


@dataclass(frozen=True)
class TrainJobConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: TrainDataConfig = field(default_factory=TrainDataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    # Top-level sections a method declares (`Method.sections`, e.g. `rcl:`), typed by the
    # method's own dataclasses; reach one with `job.section("rcl")`.
    sections: dict = field(default_factory=dict)

    def section(self, name: str):
        if name not in self.sections:
            raise ConfigError(f"method {self.loss.name!r} has no {name!r} section")
        return self.sections[name]


    def validate(self) -> None:
        tc = self.train
        for key, value in (("train.batch_size", tc.batch_size), ("train.num_workers", tc.num_workers),
                           ("train.epochs", tc.epochs), ("train.report_every", tc.report_every),
                           ("train.negatives_poll_every", tc.negatives_poll_every),
                           ("train.keep_checkpoints", tc.keep_checkpoints)):
            if value < 1:
                raise ConfigError(f"{key} must be >= 1, got {value}")
        for key, value in (("train.max_steps", tc.max_steps), ("train.checkpoint_every", tc.checkpoint_every),
                           ("train.eval_every", tc.eval_every), ("data.hard_negatives", self.data.hard_negatives)):
            if value < 0:
                raise ConfigError(f"{key} must be >= 0, got {value}")
        if tc.cpus_per_worker <= 0:
            raise ConfigError(f"train.cpus_per_worker must be > 0, got {tc.cpus_per_worker}")
        if self.optim.lr <= 0:
            raise ConfigError(f"optim.lr must be > 0, got {self.optim.lr}")


def job_from_dict(data: dict) -> TrainJobConfig:
    """Build the job config; the `loss:` block is parsed with its method's own config class,
    so each method's keys are checked (a DAR key under `loss.name: dpr` is refused)."""
    from .methods import get_method

    data = dict(data)
    loss = data.get("loss") or {}
    if not isinstance(loss, dict) and not isinstance(loss, LossConfig):
        raise ConfigError(f"loss: expected a mapping, got {loss!r}")
    name = loss.get("name", LossConfig.name) if isinstance(loss, dict) else loss.name
    method = get_method(str(name))
    if isinstance(loss, dict):
        data["loss"] = from_dict(method.config_cls, {**loss, "name": str(name)}, prefix="loss.")
    given = dict(data.pop("sections", None) or {})
    sections = {}
    for sec, cls in method.sections.items():
        raw = data.pop(sec, None) if sec in data else given.pop(sec, None)
        sections[sec] = raw if isinstance(raw, cls) else from_dict(cls, raw or {}, prefix=sec + ".")
    if given:
        raise ConfigError(f"unknown section(s) for method {name!r}: {', '.join(sorted(given))}")
    data["sections"] = sections
    return from_dict(TrainJobConfig, data)


def job_to_dict(job: TrainJobConfig) -> dict:
    """The job as plain data, method sections at the top level (as they are written in YAML)."""
    from ..config import to_dict

    out = to_dict(replace(job, sections={}))
    out.pop("sections", None)
    for name, sec in job.sections.items():
        out[name] = to_dict(sec)
    return out


def dump_job(job: TrainJobConfig) -> str:
    import yaml

    return yaml.safe_dump(job_to_dict(job), sort_keys=False)


def load_train_config(path=None, overrides=None) -> TrainJobConfig:
    """YAML (optional) + `a.b=c` overrides -> a validated TrainJobConfig."""
    return job_from_dict(merge_overrides(read_yaml(path), list(overrides or [])))
