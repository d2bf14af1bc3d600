"""What one trial runs, per method: the run `pipeline train` would start, the metrics it reports
to Tune, and the resources the trial holds while it runs.

    kind       methods             the trial runs (as `pipeline train` does)            reports (Tune)
    train      dpr, dar, ...       trainer.train + index/validate.make_validator        every report of the run
    authorship arr_cl/arr_mll/arr  trainer.train + make_validator (R@8 on the split)    every report of the run
    ance       ance, ance_dar      recipes/ance.run_ance: refresher + trainer           every report of the run
    rcl        rcl                 recipes/rcl.run_rcl: stages 0-3 in the trial         the final model's reports

Where a trial trains (`trains_in_process`): a one-worker DPR/DAR/ARR trial (train.runner auto or
local, local storage, no Ray Data streaming, one node) runs the training loop in the trial's own
process (train/session.LocalSession), its reports going to Tune directly: no Train controller, no
worker process, no second torch import per trial. Its placement group's first bundle then holds the
worker's CPUs (and GPU) beside the driver's. Every other trial (several workers, train.runner=ray,
an object-store output, a multi-node cluster, ANCE, RCL) runs a Ray Train run.

Resources (Ray 2.60): a trial is a placement group, and every task or actor its driver starts
without its own placement group is captured in it (`placement_group_capture_child_tasks`). Ray
Train's workers get their own placement group, so a trial's group holds the driver bundle
(`search.trial_cpus`) plus what the driver starts itself: ANCE's refresher actor (`ance.cpus`,
`ance.gpus`) and RCL's stage-2 regulator tasks (what `rcl.build_regulators` asks per task). A
trial's Train workers are counted at their peak: RCL's stage 1 runs several entropy models at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import ConfigError
from ..storage import is_uri

KINDS = ("train", "authorship", "ance", "rcl")


def kind_of(job) -> str:
    from ..data.authorship import AUTHORSHIP_METHODS

    name = job.loss.name
    if name in ("ance", "ance_dar"):
        return "ance"
    if name == "rcl":
        return "rcl"
    if name in AUTHORSHIP_METHODS:
        return "authorship"
    return "train"


# --------------------------------------------------------------------------- metrics

def _spine_metrics(job) -> list[str]:
    """What the spine's Validator reports (index/validate.py): val_metric and every eval measure."""
    from ..eval.metrics import measure_name, measures_for

    names = ["val_metric"] + [f"val_{m}" for m in measures_for(job.eval)]
    key = f"val_{measure_name(job.validation.metric, job.eval.rel_level)}"
    return names if key in names else names + [key]


def reported_metrics(job) -> tuple[list[str], str]:
    """(the names a trial of this job reports that a sweep can rank by, a hint when validation is off)."""
    from ..train.methods import get_method

    method = get_method(job.loss.name)
    names = ["loss"] + [t for t in method.terms if t != "loss"]
    kind = kind_of(job)
    if kind == "authorship":
        # index.validate.make_validator: R@8 / MRR on the split's val file, unless a validation corpus is given
        if job.section("authorship").split and not job.validation.corpus:
            return names + ["val_metric", "val_R@8", "val_MRR"], ""
        return names, " (ARR's validation, R@8 on the split's val file, needs authorship.split and no validation.corpus)"
    if kind == "rcl":
        # the final model's validation (rcl.stage_validator): STS dev Spearman with rcl.sts_dev (STS
        # setting), else the spine's on the validation split or the dev split rcl.dev_split carves
        s = job.section("rcl")
        best = ["val_best"] if getattr(s, "final_select", "last") == "best" else []
        if getattr(s, "sts_dev", None):
            return names + ["val_metric", "val_spearman", "val_pearson"] + best, ""
        if job.validation.corpus or (s.dev_split and job.data.corpus):
            return names + _spine_metrics(job) + best, ""
        return names, (" (RCL's final model is validated on rcl.sts_dev, validation.corpus or the rcl.dev_split "
                       "dev queries)")
    if job.validation.corpus or (job.validation.dev_split and job.data.corpus):
        return names + _spine_metrics(job), ""
    return names, " (validation metrics need validation.corpus or validation.dev_split in the base config)"


# --------------------------------------------------------------------------- resources

@dataclass(frozen=True)
class Demand:
    """One trial's resources: its placement group's bundles, and at its peak either its Train
    workers or (RCL's stage 2) the encoder actors it starts outside the group."""

    bundles: tuple[dict, ...]      # [driver bundle, side bundles...] ({"CPU": .., "GPU": ..})
    workers: int                   # Train workers at the peak (RCL stage 1: every concurrent run's)
    cpus_per_worker: float
    gpus_per_worker: float
    encoder_cpus: float = 0.0      # RCL stage 2: the spine's Ray Data encoder actors (not in the group)
    in_process: bool = False       # the trial trains in its own process: its worker is in bundle 0, workers=0

    @property
    def cpus(self) -> float:
        return (sum(b.get("CPU", 0.0) for b in self.bundles)
                + max(self.workers * self.cpus_per_worker, self.encoder_cpus))

    @property
    def gpus(self) -> float:
        return sum(b.get("GPU", 0.0) for b in self.bundles) + self.workers * self.gpus_per_worker

    def side(self) -> tuple[dict, ...]:
        return self.bundles[1:]


def _bundle(cpus: float, gpus: float = 0.0) -> dict:
    return {"CPU": float(cpus), **({"GPU": float(gpus)} if gpus else {})}


def regulator_task_cpus(n_models: int, cluster_cpus: float) -> float:
    """CPUs of one stage-2 Ray task (`rcl.write_regulator_table`), as `rcl.build_regulators` asks them."""
    return max(0.25, min(1.0, cluster_cpus / max(1, n_models)))


def rcl_entropy_shape(job, cluster_cpus: float | None = None) -> tuple[int, float]:
    """(entropy runs at once, CPUs per worker) of RCL's stage 1: `rcl.entropy_shape`, the rule
    `run_rcl` itself applies."""
    from ..recipes.rcl import entropy_shape

    conc, cpw, _ = entropy_shape(job, cluster_cpus)
    return conc, cpw


def rcl_encoder_cpus(job) -> float | None:
    """CPUs of RCL's stage-2 encoder (the spine's Ray Data actors: `rcl.encode.num_actors` x
    `cpus_per_actor`, plus the tokenising stage's share); None when stage 2 runs as Ray tasks."""
    enc = getattr(job.section("rcl"), "encode", None)
    if enc is None:
        return None
    if enc.num_actors is None or enc.cpus_per_actor is None:
        return float("nan")  # automatic: the whole cluster (refused for sweeps in check_space)
    from ..index.encode import resolve_tokenize

    reserve = enc.tokenize_cpus if resolve_tokenize(enc) == "stage" else 0.0
    return enc.num_actors * enc.cpus_per_actor + reserve


_FALLBACK: dict[str, bool] = {}


def _rcl_task_fallback(job) -> bool:
    """Stage 2 encodes a model the spine's encoder cannot express (separate towers or heads) in a
    Ray task started by the trial's driver, so inside the trial's group. (Probed once per model.)"""
    key = repr(job.model)
    if key not in _FALLBACK:
        _FALLBACK[key] = _probe_fallback(job)
    return _FALLBACK[key]


def _probe_fallback(job) -> bool:
    try:
        from ..recipes.rcl_regulators import side_model_cfg
    except ImportError:
        return True
    try:
        return side_model_cfg(replace(job.model, query_name_or_path=None), "query") is None
    except Exception:  # noqa: BLE001 - the model cannot be probed here: keep room for the task
        return True


def trains_in_process(job, multi_node: bool, storage: str | None = None) -> bool:
    """Whether a trial of `job` trains in the trial's own process (the module's docstring): one worker of a
    DPR/DAR/ARR run that asks nothing of Ray Train, on a one-node Ray (a trial's run folder on its own node
    is then the driver's). `storage` is where the trials train (the sweep's `trials/`)."""
    tc = job.train
    return (kind_of(job) in ("train", "authorship") and tc.runner != "ray" and tc.num_workers == 1
            and not is_uri(storage if storage is not None else tc.storage_path)
            and job.data.streaming != "ray-data" and not multi_node)


def trial_demand(job, trial_cpus: float, cluster_cpus: float, in_process: bool = False) -> Demand:
    tc = job.train
    gpw = tc.gpus_per_worker if tc.use_gpu else 0.0
    if in_process:  # the worker's CPUs (and GPU) in the trial's own bundle
        return Demand((_bundle(trial_cpus + tc.cpus_per_worker, gpw),), 0, tc.cpus_per_worker, gpw, in_process=True)
    bundles = [_bundle(trial_cpus)]
    workers, cpw, encoder = tc.num_workers, tc.cpus_per_worker, 0.0
    kind = kind_of(job)
    if kind == "ance":
        s = job.section("ance")
        if s.start_refresher and (s.cpus or s.gpus):
            bundles.append(_bundle(s.cpus, s.gpus))
    elif kind == "rcl":
        s = job.section("rcl")
        if s.regulators:
            # the trial runs run_rcl with its own train_fn, so stage 1 keeps its configured shape
            # (rcl_entropy_shape without the cluster): what is planned here is what runs
            conc, ecpw = rcl_entropy_shape(job)
            if conc * tc.num_workers * ecpw > workers * cpw:
                workers, cpw = conc * tc.num_workers, ecpw
            enc = rcl_encoder_cpus(job)
            if enc is not None and not math.isnan(enc):
                encoder = enc
            if enc is None or _rcl_task_fallback(job):
                bundles.append(_bundle(regulator_task_cpus(len(s.entropy_lambdas), cluster_cpus)))
    return Demand(tuple(bundles), workers, cpw, gpw, encoder)


def placement(demand: Demand):
    """The trial's Tune resources: one bundle for the driver, one per side actor / task."""
    from ray import tune

    bundles = [b for i, b in enumerate(demand.bundles) if i == 0 or any(b.values())]
    return tune.PlacementGroupFactory(bundles)


# --------------------------------------------------------------------------- pre-flight checks

def check_space(cfg, base) -> None:
    """Method-specific refusals of a sweep, before any trial starts."""
    kind = kind_of(base)
    keys = {p.key for p in cfg.space}
    if kind == "ance" and "ance.refresh_every" in keys and base.train.checkpoint_every:
        raise ConfigError(f"space.ance.refresh_every: the base sets train.checkpoint_every="
                          f"{base.train.checkpoint_every}, which is the refresh interval when set (recipes/ance.py); "
                          "drop train.checkpoint_every from the base (and its overrides) so each trial checkpoints, "
                          "and refreshes, every ance.refresh_every steps")
    if kind == "ance" and "ance.start_refresher" in keys:
        raise ConfigError("space.ance.start_refresher cannot be searched: each trial runs its own refresher")
    if kind == "rcl":
        if "rcl.regulator_tables" in keys:
            raise ConfigError("space.rcl.regulator_tables: set by RCL's stages themselves; it cannot be searched")
        enc = rcl_encoder_cpus(base)
        if base.section("rcl").regulators and enc is not None and math.isnan(enc):
            raise ConfigError("an RCL sweep needs stage 2's encoder shape in the base: rcl.encode.num_actors and "
                              "rcl.encode.cpus_per_actor (automatic, it asks for the whole cluster while the "
                              "trial's driver holds part of it, and would wait forever)")
    if cfg.search.searcher == "optuna":
        for p in cfg.space:
            if p.kind == "choice" and not all(v is None or isinstance(v, (bool, int, float, str)) for v in p.values):
                raise ConfigError(f"space.{p.key}: Optuna's choices must be numbers, strings or booleans, got "
                                  f"{list(p.values)!r}; use searcher grid or random for lists")


# --------------------------------------------------------------------------- running one trial

def run_job(job, callbacks: list, runner: str | None = None) -> dict:
    """Train `job` as `pipeline train` would (cli/training.cmd_train's dispatch), reporting to Tune through
    `callbacks` (Ray Train callbacks: the runner's StepReport; with `runner="local"`, a DPR/DAR/ARR trial
    training in its own process: callables of each report, the runner's LocalStepReport)."""
    from ..index.validate import make_validator
    from ..train.dev_split import apply_dev_split
    from ..train.trainer import train

    kind = kind_of(job)
    if kind != "rcl":  # validation.dev_split: the trial validates on held-out training queries
        job = apply_dev_split(job)
    if kind == "ance":
        return run_ance_trial(job, make_validator(job), callbacks)
    if kind == "rcl":
        from ..recipes.rcl import run_rcl

        def train_fn(j, validate_fn=None, progress=False):
            # only the final model (stage 3) reports: ASHA's step is the final model's step; the
            # initial and entropy runs of the stages before it report nothing to Tune
            final = j.train.name == "final"
            return train(j, validate_fn=validate_fn, progress=progress, callbacks=list(callbacks) if final else None)

        return run_rcl(job, progress=False, train_fn=train_fn)
    return train(job, validate_fn=make_validator(job), progress=False, callbacks=list(callbacks), runner=runner)


def run_ance_trial(job, validate_fn, callbacks: list) -> dict:
    """recipes/ance.run_ance itself, with Tune's report callback on its trainer. The refresher
    actor it starts is a child of the trial, so it lands in the trial's placement group (its own
    bundle, planned by `trial_demand`)."""
    from ..recipes.ance import run_ance

    return run_ance(job, validate_fn=validate_fn, progress=False, callbacks=list(callbacks))
