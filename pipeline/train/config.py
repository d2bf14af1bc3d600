"""Configuration of a training run (`pipeline train --config jobs/configs/dpr.yaml`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from ..config import (EvalConfig, Fraction, IndexConfig, ModelConfig, NonNegFloat, NonNegInt, OpenFraction, PosFloat,
                      PosInt, RayConfig, Section, Seed, from_dict, merge_overrides, read_yaml)
from ..errors import ConfigError
from ..losses.configs import LossConfig  # torch-free: a config is checked without importing torch


@dataclass(frozen=True)
class TrainDataConfig(Section):
    """Where training examples come from (see pipeline/data/training.py)."""

    # qrels: an ingested corpus + queries + qrels; dpr-json: DPR's training JSON; the field's training files
    # (data/training_files.py, all with data.path): tevatron (Tevatron's JSONL), msmarco-triples (MS MARCO's
    # query<TAB>positive<TAB>negative texts), columns (sentence-transformers' anchor/positive/negative[_1..n]
    # columns as Parquet, JSONL or a datasets folder)
    # msmarco-id-triples: MS MARCO's qid<TAB>pid_pos<TAB>pid_neg, with data.corpus and data.queries
    source: Literal["qrels", "dpr-json", "tevatron", "msmarco-triples", "msmarco-id-triples", "columns"] = "qrels"
    path: str | None = None                 # dpr-json, tevatron, msmarco-triples, columns: the training file
    # A teacher's scores for distillation (loss.name=margin_mse / distill_kl): trec = a TREC run with scores (a
    # reranker's, `pipeline rerank`), hofstaetter = score_pos<TAB>score_neg<TAB>qid<TAB>pid_pos<TAB>pid_neg;
    # joined by (query id, document id) with data.source=tevatron or msmarco-id-triples (a columns file carries
    # its own `label` column instead). Pickles are never read.
    teacher_scores: str | None = None
    teacher_format: Literal["trec", "hofstaetter"] = "trec"
    title_join: str = "{title} [SEP] {text}"  # dpr-json, tevatron: how a passage's title joins its text
    negatives: Literal["hard", "random", "both"] = "hard"  # dpr-json: which ctx lists are negatives
    corpus: str | None = None               # qrels: ingested corpus folder
    queries: str | None = None              # qrels: default <corpus>/queries.tsv
    qrels: str | None = None                # qrels: default <corpus>/qrels/train.trec
    negatives_run: str | None = None        # qrels: TREC run to mine hard negatives from
    negatives_depth: PosInt = 100
    # qrels + hard_negatives: a query the run names no unjudged passage for (BM25 matched none of its words, or
    # judged all it found): skip = left out of training (counted in the [train-data] line); random = unjudged
    # passages drawn at random from the corpus (DPR's "random" negatives, seeded by positives_seed and the
    # query id), so that a run with hard negatives trains on the same queries as one without
    missing_negatives: Literal["skip", "random"] = "skip"
    rel_level: NonNegInt = 1                # qrels: the lowest grade that makes a judged passage a positive
    # qrels: how many positives each query keeps (one example each): 0 = every judged passage at rel_level or
    # above; n = the n of highest grade, ties drawn with positives_seed (a BEIR training split judges ~43
    # passages per NFCorpus query, all of grade 1: one example per judgement would make 110k pairs)
    positives_per_query: NonNegInt = 0
    positives_seed: Seed = 0                # which positives are drawn, apart from train.seed: every method and
                                            # seed of an experiment trains on the same pairs
    hard_negatives: NonNegInt = 0                 # hard negatives per query per step
    shuffle_window: PosInt = 10_000            # seeded per-epoch shuffle buffer (examples)
    # Hold the examples in the object store once per run instead of streaming them with
    # Ray Data every epoch: auto = when there are at most `materialize_max_examples`.
    materialize: Literal["auto", "always", "never"] = "auto"
    materialize_max_examples: NonNegInt = 200_000
    # Examples not held in memory reach the workers as: files = each worker reads the examples'
    # Parquet parts itself, a batch at a time, keeping its own rows (no Ray Data, no copy in the
    # object store; the parts must be where every worker can read them, as checkpoints must);
    # ray-data = Ray Data streams them (needs a whole CPU beside the workers).
    streaming: Literal["files", "ray-data"] = "files"
    # Build the examples in a child process, so that what the build holds (the queries, their
    # judgements and negatives, the run being read) is returned to the system before training
    # starts: auto = when the sources (data.path, queries, qrels, negatives_run) pass 64 MB.
    build_apart: Literal["auto", "yes", "no"] = "auto"

    SECTION = "data"


@dataclass(frozen=True)
class OptimConfig(Section):
    name: Literal["adamw", "lamb"] = "adamw"
    lr: PosFloat = 2e-5
    weight_decay: NonNegFloat = 0.0
    betas: tuple[OpenFraction, ...] = (0.9, 0.999)
    eps: PosFloat = 1e-8
    warmup_steps: NonNegInt = 0
    warmup_ratio: Fraction = 0.1            # docs/METHODS.md §1: warmup, then linear decay
    grad_clip: NonNegFloat = 2.0            # max gradient norm; 0 = no clipping

    SECTION = "optim"

    def __post_init__(self):
        super().__post_init__()
        if len(self.betas) != 2:
            raise ConfigError(f"optim.betas: two values (beta1, beta2), got {list(self.betas)}")


@dataclass(frozen=True)
class TrainConfig(Section):
    name: str = "dpr"
    storage_path: str = "runs/train"
    # auto: continue from the newest complete checkpoint of this run if there is one;
    # never: refuse to reuse a run name that has checkpoints; or a checkpoint path.
    resume: str = "auto"
    # Start a NEW run from another run's weights: a checkpoint folder (step-XXXXXXXX), or a run folder (its
    # newest complete checkpoint). The towers start from that checkpoint's model; the optimizer, the schedule,
    # the step and the data position start fresh, under this run's settings (any optim.*, lengths, total
    # steps). The checkpoint it resolves to is recorded (config.yaml, summary.json) and is part of the run's
    # identity. This, not a resume, is how a run goes on with other settings: a resume refuses them.
    init_from: str | None = None
    epochs: PosInt = 1
    max_steps: NonNegInt = 0                # 0 = epochs x steps per epoch
    batch_size: PosInt = 32                 # per worker
    num_workers: PosInt = 1
    use_gpu: bool = False                   # refused where no GPU is visible (this machine, or the Ray it runs in)
    cpus_per_worker: PosFloat = 1.0
    gpus_per_worker: NonNegFloat = 1.0      # used when use_gpu
    # compute precision (mixed precision; weights, checkpoints and the saved model stay float32; --fp16 sets
    # fp16): auto = bf16 on GPUs with bf16 (else fp16 + gradient scaler) and on CPUs with native
    # bf16 (AMX / AVX512-BF16; fp32 on other CPUs); bf16 on a CPU without it, and fp16 on a CPU, are refused.
    # The precision it resolves to is part of the run's identity: a resume that would train in another is refused
    amp: Literal["auto", "no", "bf16", "fp16"] = "auto"
    seed: Seed = 0
    checkpoint_every: NonNegInt = 0         # steps; 0 = only at the end
    keep_checkpoints: PosInt = 2
    eval_every: NonNegInt = 0               # steps; 0 = only at the end
    report_every: PosInt = 10
    max_failures: NonNegInt = 0
    torch_threads: NonNegInt = 0            # 0 = max(1, floor(cpus_per_worker))
    # Each tower's batch of a step is encoded in length-sorted groups of at least this many rows, each
    # padded to its own longest text instead of the whole batch's, without computing padding (40 % of a
    # batch of 32 FAQ answers at length 256 is padding). Without dropout (model.eval(), or dropout 0) the
    # vectors are the one-batch ones to float rounding; in training dropout draws its masks per group, so
    # a step's vectors and loss differ from the one-batch ones: the value is part of the run's identity (a
    # resume with another value is refused). 0 = one padded batch per tower (the plain way)
    length_group_rows: NonNegInt = 16
    # Gradient caching (train/grad_cache.py): a step over the whole batch with the memory of one chunk of rows:
    # the towers run chunk by chunk without a graph, the loss sees every representation (gathered across
    # workers), and each chunk runs again with its dropout masks replayed to back-propagate its cached gradient.
    # With chunks that are train.length_group_rows's groups (e.g. 16 and 16), a step equals the uncached one.
    # DPR, DAR, ANCE, ANCE+DAR, MarginMSE and listwise KL. Part of the run's identity.
    grad_cache: bool = False
    grad_cache_query_chunk: PosInt = 16     # query rows per forward chunk
    grad_cache_doc_chunk: PosInt = 16       # document rows per forward chunk
    log_batches: bool = False               # write every step's example ids (resume audits)
    # Attention regularizers of the RCL paper's Tables 1-3 (train/regularizers.py), training mode only:
    # attention_dropout = the rate of dropout on every self-attention layer's attention probabilities
    # (None: the model's config.json decides, 0.1 for BERT and MiniLM); drophead = the probability that an
    # example drops a whole attention head of a layer (the kept heads scaled by heads / kept). Both are part
    # of the run's identity.
    attention_dropout: OpenFraction | None = None
    drophead: OpenFraction = 0.0
    # The attention the training forward computes with (models/attention.py): threshold-dropout = the
    # towers' attention with its dropout mask drawn from 16-bit lanes of 64-bit random words (4 per draw)
    # instead of torch's per-element Bernoulli draw, which sends CPU SDPA off its fused kernel and costs as
    # much as the rest of attention (same keep probability to 1/131072, same expectation, float32 scores as
    # SDPA's math path; evaluation and encoding unchanged); sdpa / eager = transformers' own; auto =
    # threshold-dropout on CPU workers for towers whose own attention is SDPA, the towers' own on GPUs.
    # Part of the run's identity (auto resuming a checkpoint takes the one it trained with)
    attention: Literal["auto", "sdpa", "eager", "threshold-dropout"] = "auto"
    # Negatives provider (ANCE-style versions): rank 0 polls for a newer version every N steps (ANCE lowers
    # it to the refresh interval when above it).
    negatives_poll_every: PosInt = 100
    fail_at_step: NonNegInt = 0                   # testing: raise in the worker at this step
    fail_after_checkpoint: NonNegInt = 0          # testing: raise right after the checkpoint of this step
    # Who runs the loop: ray = Ray Train's TorchTrainer (any number of workers, GPUs, a cluster, Tune);
    # local = the one worker in this process, no Ray (start-up seconds shorter, checkpoints written in
    # place, a plain loop's speed on a small machine); auto = local for one worker when nothing asks for
    # Ray (no ray.address / RAY_ADDRESS, Ray not running in this process, a local storage_path), else ray;
    # a one-worker DPR/DAR/ARR Tune trial on one node trains in the trial's own process unless this is ray
    runner: Literal["auto", "ray", "local"] = "auto"
    step_sleep_s: NonNegFloat = 0.0               # testing: pause after each step (a slower trainer, for ANCE tests)

    SECTION = "train"


@dataclass(frozen=True)
class ValidationConfig(Section):
    """Held-out retrieval evaluation through encode -> index -> retrieve -> evaluate."""

    corpus: str | None = None
    queries: str | None = None              # default <corpus>/queries.tsv
    qrels: str | None = None                # default <corpus>/qrels/test.trec
    metric: str = "MRR@10"                  # the one reported as `val_metric` (for Tune)
    top_k: PosInt = 100
    batch_size: PosInt = 64                 # rows per batch; on a CPU also <= 4,096 padded tokens (2,048 on one thread), as encode
    # > 0: a seeded share of the training queries, held out of training, is the dev split the run
    # validates (and a sweep selects) on, instead of `qrels` (train/dev_split.py)
    dev_split: OpenFraction = 0.0
    # the split's seed, apart from train.seed: every trial of a sweep (whatever its seed) and every
    # method validates on the same held-out queries
    dev_seed: Seed = 0
    # How validation encodes (index/validate.py): as `pipeline encode` would on this machine, at the lengths
    # the exported model declares, so the figure is the one the spine gives the exported model.
    # precision: of the passages (queries are fp32, as retrieve encodes them); auto = bf16 where the
    # CPU or GPU computes it natively, else fp32 (the rule pipeline encode follows); fp16 needs GPU workers
    # (train.use_gpu=true) and is refused on CPU ones, as train.amp=fp16 is
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    # backend: torch, or openvino (converted once, or its architecture's graph read from the export cache,
    # the step's weights written in at every validation; the weights are never cached); auto = openvino on
    # a CPU with OpenVINO installed from 250 passages per worker in bf16 (1,000 in fp32), or from 64 (250
    # in fp32) where the architecture's graph is cached (`pipeline encode` and earlier runs keep it), where
    # the faster encoder pays for what it costs. With several workers each encodes its share of the passages
    backend: Literal["auto", "torch", "openvino"] = "auto"

    SECTION = "validation"


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


def job_from_dict(data: dict) -> TrainJobConfig:
    """Build the job config; the `loss:` block is parsed with its method's own config class,
    so each method's keys are checked (a DAR key under `loss.name: dpr` is refused). The method's
    config comes from methods/configs.py, which imports no torch."""
    from .methods.registry import method_config

    data = dict(data)
    loss = data.get("loss") or {}
    if not isinstance(loss, dict) and not isinstance(loss, LossConfig):
        raise ConfigError(f"loss: expected a mapping, got {loss!r}")
    name = loss.get("name", LossConfig.name) if isinstance(loss, dict) else loss.name
    method = method_config(str(name))
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
