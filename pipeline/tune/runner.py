"""`pipeline tune`: a Ray Tune sweep whose trials are `pipeline train` runs.

Ray 2.60 (docs/RAY.md §4): Train V2 is the default and `Tuner(trainer)` fails, so each trial is a
small driver function (0.1 CPU by default) that applies the trial's values to the base training
config and calls `pipeline.train.trainer.train` -- exactly `pipeline train` with those overrides --
with Tune's `TuneReportCallback` on the Train run. The trainer's workers ask for their own
resources. A one-worker DPR/DAR/ARR trial on one node trains in the trial's own process instead
(tune/drivers.trains_in_process), reporting to Tune from the loop (LocalStepReport): same steps,
checkpoints, resume and reports, without a Train controller and worker process per trial. Each trial trains under `<output>/trials/<trial id>` with `train.resume=auto`, so a
trial restored by `Tuner.restore` continues from its own checkpoints. ASHA's `time_attr` is the
trainer's own `step` (restored trials restart Tune's `training_iteration`, and ASHA's rungs are
not saved by `Tuner.restore`). The dashboard runs (bound to 127.0.0.1): without it, Train runs of
stopped trials never release their CPUs.

`output` goes through the storage layer (tune/output.py): a local path, `file://`, or an
object-store URI (credentials in it refused before anything runs). On a URI, Tune's state and the
trials' runs are written there directly, and the files below that are not Tune's or a trial's are
written in a local staging folder and uploaded.

    <output>/sweep.json      the sweep as resolved (a resume must match it)
    <output>/tune/           Tune's experiment state (Tuner.restore)
    <output>/trials/<id>/    each trial's Train run: checkpoints, model, summary.json
    <output>/events.jsonl    one record per trial event; results.* / best.yaml / plots from it
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from ..config import to_dict
from ..errors import PipelineError
from .output import EXPERIMENT, SweepOutput
from .space import (SweepConfig, check_inputs, grid_space, load_job, metric_mode, set_key, to_tune, validate_sweep)

# Tune's own bookkeeping in every result (the trainer's metrics are everything else)
TUNE_KEYS = {"timestamp", "training_iteration", "time_this_iter_s", "time_total_s", "time_since_restore",
             "iterations_since_restore", "pid", "date", "hostname", "node_ip", "done", "trial_id",
             "experiment_tag", "config", "checkpoint_dir_name", "checkpoint_path", "should_checkpoint"}


def _plain(v):
    """numpy scalars (Tune's samplers) -> Python values the config loader takes."""
    if hasattr(v, "item") and not isinstance(v, (list, dict, str)):
        try:
            return v.item()
        except (TypeError, ValueError):
            return v
    return v


# --------------------------------------------------------------------------- the trial

from ray import tune as _tune  # noqa: E402  (module-level classes: pickled into Ray's processes)
from ray.tune.integration.ray_train import TuneReportCallback as _TuneReportCallback  # noqa: E402


def tune_metrics(metrics: dict, total) -> dict | None:
    """What a run's report sends to Tune: the metrics with the run's total steps, or None for the run's last
    report (its final step, or the step its validation hook stopped it at), which the trial sends itself once
    the run has returned (StepReport, run_trial)."""
    if total is None:
        return metrics
    if metrics.get("stopped_early") or ("step" in metrics and int(metrics["step"]) >= int(total)):
        return None
    return dict(metrics, total_steps=total)


class StepReport(_TuneReportCallback):
    """Tune's report callback, plus the run's total steps (to tell early-stopped from complete).

    The run's last report (its final step, or the step its validation hook stopped it at) is held
    back: the trial reports it itself once the run has returned (`run_trial`), because ASHA stops a
    trial as soon as it reports `max_t`, and a trial stopped there would lose its exported model and
    summary. The same path reports a run that a resumed sweep finds already complete (it trains,
    and so reports, nothing)."""

    def after_report(self, run_context, metrics, checkpoint):
        total = (getattr(run_context, "train_loop_config", None) or {}).get("total_steps")
        if metrics:
            m = tune_metrics(metrics[0], total)
            if m is None:
                return
            metrics = [m, *metrics[1:]]
        super().after_report(run_context, metrics, checkpoint)


class LocalStepReport:
    """StepReport for a trial that trains in its own process (train/session.LocalSession calls it with each
    report): the same metrics, the same held-back last report, sent to Tune from the loop's thread. Tune
    keeps no checkpoint of such a trial: a restored trial resumes from its run folder (train.resume=auto)."""

    def __call__(self, metrics: dict, total_steps: int) -> None:
        from ray import tune

        m = tune_metrics(metrics, total_steps)
        if m is not None:
            tune.report(m)


def final_report(result: dict) -> dict | None:
    """The metrics of a finished run's last checkpoint, as Tune gets them: from a training summary
    (DPR/DAR/ARR, ANCE) or from RCL's record (its final model's stage)."""
    rec = (result.get("stages") or {}).get("final") if "stages" in result else result
    if not rec or not rec.get("final_metrics"):
        return None
    metrics = {k: v for k, v in rec["final_metrics"].items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if rec.get("total_steps") is not None:
        metrics["total_steps"] = rec["total_steps"]
    return metrics


def trial_job(base_data: dict, params: dict, storage: str, name: str):
    data = base_data
    for key, value in params.items():
        data = set_key(data, key, _plain(value))
    data = set_key(data, "train.storage_path", storage)
    data = set_key(data, "train.name", name)
    data = set_key(data, "train.resume", "auto")
    return load_job(data, f"trial {name}")


def run_trial(config: dict, ctx: dict) -> None:
    """The Tune trainable: one `pipeline train` run with the trial's values."""
    from ray import tune

    from ..runtime_env import setup_offline_env
    from .drivers import run_job

    os.chdir(ctx["cwd"])  # relative paths of the training config mean what they mean for the CLI
    setup_offline_env()
    trial_id = tune.get_context().get_trial_id()
    job = trial_job(ctx["base"], config, ctx["storage"], trial_id)
    # as `pipeline train` dispatches it (ANCE, RCL, ARR: drivers.py); a one-worker run in this process
    if ctx.get("in_process"):  # the sweep's choice (trials_in_process), which its placement group holds
        result = run_job(job, [LocalStepReport()], runner="local")
    else:
        result = run_job(job, [StepReport()])
    final = final_report(result or {})
    if final is not None:
        tune.report(final)  # the held-back last report (StepReport), now that the model is exported


# --------------------------------------------------------------------------- progress

class Progress(_tune.Callback):
    """Tune callback: one readable line per trial event, and the event log the results come from."""

    def __init__(self, events: Path, metric: str, keys: list[str], n_trials: int | None, print_fn=print,
                 sync=None):
        self.events, self.metric, self.keys, self.n_trials = events, metric, keys, n_trials
        self.print = print_fn
        self.sync = sync  # called after each trial's start and end (an output on a URI uploads the log)
        self.last: dict[str, dict] = {}
        self.numbers: dict[str, int] = {}
        for ev in _read(events):  # a resumed sweep keeps its trial numbers
            if ev.get("event") == "start" and ev["trial"] not in self.numbers:
                self.numbers[ev["trial"]] = len(self.numbers) + 1

    def _write(self, rec: dict) -> None:
        rec = {"time": time.time(), **rec}
        with open(self.events, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
            f.flush()
        if self.sync is not None and rec["event"] != "result":
            self.sync()

    def _name(self, trial) -> str:
        n = self.numbers.setdefault(trial.trial_id, len(self.numbers) + 1)
        return f"trial {n}{f'/{self.n_trials}' if self.n_trials else ''} ({trial.trial_id})"

    def on_trial_start(self, iteration, trials, trial, **info):
        params = {k: _plain(v) for k, v in trial.config.items()}
        self._write({"event": "start", "trial": trial.trial_id, "params": params})
        self.print(f"[tune] {self._name(trial)} started: " + ", ".join(f"{k}={v!r}" for k, v in params.items()),
                   flush=True)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        keep = {k: _plain(v) for k, v in result.items() if k not in TUNE_KEYS}
        keep = {k: v for k, v in keep.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.last[trial.trial_id] = keep
        self._write({"event": "result", "trial": trial.trial_id, "metrics": keep})
        step, total = keep.get("step"), keep.get("total_steps")
        parts = [f"[tune] {self._name(trial)} step {int(step) if step is not None else '?'}"
                 + (f"/{int(total)}" if total else "")]
        for k in dict.fromkeys((self.metric, "val_metric", "loss")):
            if k in keep:
                parts.append(f"{k} {keep[k]:.4f}")
        self.print("  ".join(parts), flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):
        last = self.last.get(trial.trial_id) or {k: _plain(v) for k, v in (trial.last_result or {}).items()}
        step, total = last.get("step"), last.get("total_steps")
        stopped = step is not None and total is not None and int(step) < int(total)
        event = "early-stopped" if stopped else "complete"
        self._write({"event": event, "trial": trial.trial_id, "step": step, "total_steps": total})
        m = last.get(self.metric)
        how = ("stopped early by its validation hook" if last.get("stopped_early") else "early-stopped (ASHA)") \
            if stopped else "completed"
        self.print(f"[tune] {self._name(trial)} {how} at step "
                   f"{int(step) if step is not None else '?'}{f'/{int(total)}' if total else ''}"
                   + (f", {self.metric} {m:.4f}" if isinstance(m, (int, float)) else ""), flush=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        err = ""
        try:
            if trial.error_file and os.path.exists(trial.error_file):
                lines = [ln for ln in Path(trial.error_file).read_text().splitlines() if ln.strip()]
                err = lines[-1] if lines else ""
        except Exception:  # noqa: BLE001 - the message is best effort, the status is not
            pass
        self._write({"event": "error", "trial": trial.trial_id, "error": err})
        self.print(f"[tune] {self._name(trial)} failed: {err or 'see its error.txt'}", flush=True)


def _read(path: Path) -> list[dict]:
    from .results import read_events

    return read_events(path)


# --------------------------------------------------------------------------- ASHA on resume

def replay_asha(scheduler, events: list[dict], metric: str, mode: str) -> int:
    """Refill ASHA's rungs from the event log; returns how many trials were replayed.

    Ray 2.60's `Tuner.restore` saves the searcher but not the scheduler: a resumed sweep's ASHA
    would start with empty rungs, so the first trial to reach each rung after a resume could never
    be stopped. Each trial's first result at or past each milestone is recorded again, in step
    order, exactly as ASHA recorded it (ASHA keys rungs by trial id and the step is the trainer's).
    """
    from types import SimpleNamespace

    from .results import trial_records

    brackets = getattr(scheduler, "_brackets", None)
    if not brackets:
        return 0
    sign = 1.0 if mode == "max" else -1.0
    n = 0
    for rec in trial_records(events, metric):
        pts = [(h["step"], h[metric]) for h in rec.history if isinstance(h.get(metric), (int, float))]
        if not pts:
            continue
        bracket = scheduler._trial_info.get(rec.trial, brackets[0])
        for step, value in pts:
            bracket.on_result(SimpleNamespace(trial_id=rec.trial), step, sign * value)
        n += 1
    return n


# --------------------------------------------------------------------------- resources

def multi_node_ray() -> bool:
    """The Ray this process is connected to has more than one live node."""
    import ray

    return ray.is_initialized() and len([n for n in ray.nodes() if n.get("Alive")]) > 1


def _candidate_jobs(cfg: SweepConfig, base) -> list:
    """The base job and the base with each candidate value of each searched key."""
    jobs = [base]
    for p in cfg.space:
        for v in p.candidates():
            jobs.append(load_job(set_key(cfg.base_data(), p.key, v), f"space.{p.key}"))
    return jobs


def trials_in_process(cfg: SweepConfig, base, storage: str | None = None, multi_node: bool | None = None) -> bool:
    """Whether the sweep's trials train in their own processes (drivers.trains_in_process): all of them or
    none, as every trial gets the same placement group. Each searched key's candidates are checked with the
    base's other values; the rule is one condition per key, so every combination of them agrees."""
    from .drivers import trains_in_process

    if multi_node is None:
        multi_node = multi_node_ray()
    return all(trains_in_process(j, multi_node, storage) for j in _candidate_jobs(cfg, base))


def trial_demand(cfg: SweepConfig, base, cluster_cpus: float | None = None, storage: str | None = None,
                 multi_node: bool | None = None):
    """The hungriest trial's resources (drivers.Demand): its placement group's bundles (driver,
    plus ANCE's refresher or RCL's regulator tasks, or the worker of a trial that trains in its own
    process) and its Train workers at their peak. `storage`: where the trials train (the sweep's
    `trials/`); `multi_node`: the cluster has several nodes (None: ask the connected Ray)."""
    from .drivers import trial_demand as demand_of

    if cluster_cpus is None:
        from ..ray_runtime import cluster_resources

        cluster_cpus = cluster_resources()["CPU"]
    jobs = _candidate_jobs(cfg, base)
    in_process = trials_in_process(cfg, base, storage, multi_node)
    best = None
    for j in jobs:
        d = demand_of(j, cfg.search.trial_cpus, cluster_cpus, in_process=in_process)
        if best is None or (d.cpus, d.gpus) > (best.cpus, best.gpus):
            best = d
    return best


def plan_concurrency(cfg: SweepConfig, base, n_trials: int | None, resources: dict | None = None,
                     nodes: list | None = None, storage: str | None = None) -> int:
    """How many trials run at once: search.max_concurrent_trials, checked against the cluster,
    or (0) as many as fit. A shape Ray would wait on forever is a ResourceError."""
    from ..ray_runtime import check_resources, cluster_resources, node_resources

    res = resources or cluster_resources()
    d = trial_demand(cfg, base, res["CPU"], storage=storage,
                     multi_node=(len(nodes) > 1) if nodes is not None else (False if resources else None))
    cpu, gpu = d.cpus, d.gpus
    world, cpw, gpw = d.workers, d.cpus_per_worker, d.gpus_per_worker
    keep = 1.0 if base.data.materialize == "never" else 0.0  # streamed examples: Ray Data's read tasks
    n = cfg.search.max_concurrent_trials
    if not n:
        n = math.floor((res["CPU"] - keep + 1e-9) / cpu) if cpu else 1
        if gpu:
            n = min(n, math.floor(res["GPU"] / gpu + 1e-9))
        n = max(1, min(n, n_trials or n))
    side = "".join(f" + {_fmt_bundle(b)} {_side_name(base)}" for b in d.side())
    if d.in_process:
        what = (f"tune: {n} concurrent trial(s) x ({cfg.search.trial_cpus:g} CPU trial driver + {cpw:g} CPU"
                f"{f' + {gpw:g} GPU' if gpw else ''} training in the trial's own process)")
    else:
        what = (f"tune: {n} concurrent trial(s) x ({cfg.search.trial_cpus:g} CPU trial driver{side} + {world} "
                f"worker(s) x {cpw:g} CPU{f' + {gpw:g} GPU' if gpw else ''})")
    nodes_ = nodes if nodes is not None else ([res] if resources else None)
    check_resources(what, n * cpu, n * gpu, keep, nodes=[res] if nodes is None and resources else nodes)
    if world:
        check_resources(what, n * world * cpw, n * world * gpw, count=n * world,
                        nodes=nodes_ if nodes_ is not None else node_resources())
    for b in d.bundles if d.in_process else d.side():  # each trial's own or side bundle must fit on a node too
        check_resources(what, n * b.get("CPU", 0.0), n * b.get("GPU", 0.0), count=n,
                        nodes=nodes_ if nodes_ is not None else node_resources())
    return n


def _fmt_bundle(b: dict) -> str:
    return f"{b.get('CPU', 0.0):g} CPU" + (f" + {b['GPU']:g} GPU" if b.get("GPU") else "")


def _side_name(job) -> str:
    from .drivers import kind_of

    return {"ance": "index refresher", "rcl": "regulator task"}.get(kind_of(job), "side actor")


def count_trials(cfg: SweepConfig) -> int:
    """Trials the sweep runs: grid = every combination (choices included) x num_samples;
    random = its grid keys' combinations x num_samples draws; optuna = num_samples."""
    s = cfg.search
    if s.searcher == "optuna":
        return s.num_samples
    space = grid_space(cfg.space) if s.searcher == "grid" else cfg.space
    return math.prod(len(p.values) for p in space if p.kind == "grid") * s.num_samples


# --------------------------------------------------------------------------- the sweep

def sweep_identity(cfg: SweepConfig) -> dict:
    search = to_dict(cfg.search)
    if search.get("replicate_key") is None:  # unset: the identity of sweeps started before the key existed
        search.pop("replicate_key", None)
    return {"base": cfg.base_data(), "space": [[p.key, p.kind, list(p.values)] for p in cfg.space],
            "search": search}


def build_search(cfg: SweepConfig, metric: str, mode: str, max_t: int):
    """(Tune param_space, searcher or None for Tune's grid/random generator, scheduler)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    s = cfg.search
    param_space = to_tune(grid_space(cfg.space) if s.searcher == "grid" else cfg.space)
    search_alg = None
    if s.searcher == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        search_alg = OptunaSearch(metric=metric, mode=mode, seed=s.seed)  # TPE
    elif s.searcher == "random":
        from ray.tune.search.basic_variant import BasicVariantGenerator

        search_alg = BasicVariantGenerator(random_state=s.seed)
    scheduler = (ASHAScheduler(time_attr="step", max_t=max_t, grace_period=s.grace_period,
                               reduction_factor=s.reduction_factor)
                 if s.scheduler == "asha" else FIFOScheduler())
    return param_space, search_alg, scheduler


def keep_credentials_out_of_runtime_envs() -> list[str]:
    """Ray Tune hands the driver's AWS_* credentials to every trial through the trial's runtime
    environment (ray/tune/execution/class_cache.py), and Ray writes runtime environments into its
    session logs (runtime_env_agent.log, readable by every user of the machine). Credentials never
    travel that way here: a local trial inherits the driver's environment anyway (the local Ray was
    started by this process), and on a cluster each node resolves its own (instance roles, the node's
    environment or credential files). Returns the names taken off Tune's list."""
    try:
        from ray.tune.execution import class_cache
    except ImportError:
        return []
    from ..credentials import is_secret_name

    names = getattr(class_cache, "ENV_VARS_TO_PROPAGATE", None)
    if not names:
        return []
    secret = sorted(n for n in names if is_secret_name(n) or n.upper().startswith(("AWS_", "GOOGLE_", "AZURE_")))
    class_cache.ENV_VARS_TO_PROPAGATE = type(names)(n for n in names if n not in secret)
    return secret


def run_sweep(cfg: SweepConfig, resume: bool = False, print_fn=print) -> dict:
    """Run (or resume) the sweep; writes the table, best config and plots; returns the summary."""
    from ray import tune

    from ..io_utils import write_json_atomic
    from ..ray_runtime import init_ray
    from .results import write_results

    # first of all: a credential in a URI is refused before Ray starts or anything is written
    out = SweepOutput.resolve(cfg.output)
    base = validate_sweep(cfg)
    metric, mode = metric_mode(cfg, base)
    cfg = replace(cfg, output=str(out))
    import ray

    out.check(resume, sweep_identity(cfg), base)
    check_inputs(cfg)
    if not ray.is_initialized():
        init_ray(replace(base.ray, dashboard=True))  # Train inside Tune needs the dashboard (docs/RAY.md §4)
    n_trials = count_trials(cfg)
    conc = plan_concurrency(cfg, base, n_trials, storage=str(out.trials))
    s = cfg.search
    max_t = s.max_t or base.train.max_steps
    local = out.prepare(resume)  # the output itself, or the local staging folder of a URI's
    if not resume:
        write_json_atomic(local / "sweep.json", {"identity": sweep_identity(cfg), "metric": metric, "mode": mode,
                                                 "config": cfg.config_path, "base_source": cfg.base_source})
        out.upload("sweep.json")  # a URI holds the sweep before its first trial
    param_space, search_alg, scheduler = build_search(cfg, metric, mode, max_t)
    keep_credentials_out_of_runtime_envs()
    multi_node = multi_node_ray()
    ctx = {"cwd": os.getcwd(), "base": cfg.base_data(), "storage": out.trials,
           "in_process": trials_in_process(cfg, base, str(out.trials), multi_node)}
    from .drivers import placement

    trainable = tune.with_resources(tune.with_parameters(run_trial, ctx=ctx),
                                    placement(trial_demand(cfg, base, storage=str(out.trials), multi_node=multi_node)))
    events = local / "events.jsonl"
    progress = Progress(events, metric, [p.key for p in cfg.space], n_trials, print_fn,
                        sync=(lambda: out.sync_events(print_fn)) if out.remote else None)
    print_fn(f"[tune] {'resuming ' if resume else ''}{n_trials} trial(s) of {base.loss.name} "
             f"({s.searcher}{', ASHA grace ' + str(s.grace_period) + ' steps, x' + f'{s.reduction_factor:g}' + ', max_t ' + str(max_t) if s.scheduler == 'asha' else ''}), "
             f"{conc} at a time, ranked by {metric} ({mode}) -> {out}", flush=True)
    # Tune's own output off (its legacy engine at verbosity 0 prints nothing; the new one still
    # prints banners): the Progress callback prints one line per trial event instead.
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    # Validation metrics come only every train.eval_every steps: Tune's strict check would fail a
    # trial on its first report without them. The metric was checked against what the trainer
    # reports before any trial started (space.metric_mode), and ASHA skips results without it.
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    import logging

    # ... and its warnings that speak Python to CLI users ("Resume experiment with:
    # Tuner.restore(...)"; "Failed to fetch metrics" of trials that never started)
    logging.getLogger("ray.tune.tune").setLevel(logging.ERROR)
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    storage_path, storage_fs = out.tune_storage()  # a URI: Tune writes its state there through pyarrow
    run_config = tune.RunConfig(name=EXPERIMENT, storage_path=storage_path, storage_filesystem=storage_fs,
                                callbacks=[progress], verbose=0)
    if resume:
        exp_path, exp_fs = out.experiment()
        tuner = tune.Tuner.restore(exp_path, trainable=trainable, resume_errored=True, param_space=param_space,
                                   storage_filesystem=exp_fs)
        # the restored Tuner keeps the saved RunConfig; our progress callback is per process
        tuner._local_tuner._run_config.callbacks = [progress]
        tuner._local_tuner._run_config.verbose = 0
        saved = tuner._local_tuner._tune_config.scheduler
        if s.scheduler == "asha" and saved is not None:
            n = replay_asha(saved, _read(events), metric, mode)
            print_fn(f"[tune] ASHA's rungs refilled from {n} trial(s) of the event log", flush=True)
    else:
        tuner = tune.Tuner(trainable, param_space=param_space, run_config=run_config,
                           tune_config=tune.TuneConfig(metric=metric, mode=mode, search_alg=search_alg,
                                                       scheduler=scheduler, num_samples=s.num_samples,
                                                       max_concurrent_trials=conc, reuse_actors=False))
    t0 = time.time()
    from ray.tune.error import TuneError

    try:
        grid = tuner.fit()
    except TuneError as e:  # Tune's controller itself failed (a trial's own error is a status, below)
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        raise PipelineError(f"Ray Tune stopped: {lines[-1] if lines else e}; the sweep's state is in "
                            f"{out.location / EXPERIMENT} (pipeline tune ... --resume)") from None
    finally:
        out.sync_events(print_fn)  # however it ended, a URI has the event log --resume reads
    summary = write_results(cfg, events, metric, mode, out=local)
    summary["wall_seconds"] = round(time.time() - t0, 1)
    summary["concurrent_trials"] = conc
    saved = json.loads((local / "summary.json").read_text())
    write_json_atomic(local / "summary.json", {**saved, "wall_seconds": summary["wall_seconds"],
                                               "concurrent_trials": conc})
    out.publish()  # a URI: the results uploaded, summary.json last
    st = summary["statuses"]
    print_fn(f"[tune] {summary['trials']} trial(s): " + ", ".join(f"{n} {k}" for k, n in st.items() if n)
             + f" in {summary['wall_seconds']:.0f}s; table {out.location / 'results.md'}"
             + (f"; best {summary['best']['trial']} {metric} {summary['best']['metric']:.4f} -> "
                f"{out.location / 'best.yaml'}" if summary["best"] else ""), flush=True)
    ended = st["terminated"] + st["early-stopped"] + st["error"]
    if ended < n_trials:
        print_fn(f"[tune] interrupted (state saved): {n_trials - ended} of {n_trials} trial(s) not finished; continue with "
                 f"pipeline tune --config {cfg.config_path or '<sweep.yaml>'} --resume", file=sys.stderr, flush=True)
        raise KeyboardInterrupt
    if st["error"]:
        first = next((r.error for r in grid if r.error), None)
        if st["error"] == n_trials:
            raise PipelineError(f"every trial failed; the first: {first}; see {out.location / EXPERIMENT}/*/error.txt")
        print_fn(f"[tune] WARNING: {st['error']} trial(s) failed (see results.md); pipeline tune --resume "
                 "runs them again", file=sys.stderr, flush=True)
    return summary
