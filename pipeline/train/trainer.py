"""The driver side of training: examples, resources, resume, `TorchTrainer.fit()`, model export.

    run_dir = <train.storage_path>/<train.name>/
        examples/            training examples (Parquet) + examples.json (with their digest)
        step-XXXXXXXX/       Ray Train checkpoints in our format (models/checkpoint.py)
        model/               the final model: HF directory (safetensors), loadable by `pipeline encode`
        config.yaml          resolved config;  summary.json  metrics, timings, batch sizes, versions

`train.storage_path` may be a storage URI (`s3://bucket/prefix?…`, `gs://…`; pipeline/storage.py):
Ray Train then persists checkpoints there through pyarrow.fs, and the driver reads, resumes and
exports through the same filesystem. The driver works on a local staging copy
(`storage.staging_dir`: examples, the exported model) and uploads it: examples parts first and
examples.json last; the model before summary.json, so a summary means a complete model. Before
anything runs, the driver and every Ray node write, read back and delete a probe there.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Callable

from ..config import to_dict
from ..data.examples_store import settle_staged, stage_for_resume, store_digest
from ..errors import ConfigError, PipelineError, worker_error
from ..io_utils import atomic_path, missing_dirs, remove_empty_dirs, write_json_atomic, write_text_atomic
from ..losses.base import resolve_similarity
from ..models.checkpoint import latest_checkpoint, library_versions, read_state
from ..storage import RemotePath, is_uri
from .config import TrainJobConfig, dump_job, job_to_dict
from .identity import check_identity, check_resume_early, run_identity
from .loop import train_loop_per_worker
from .methods import get_method
from .runner_choice import check_device, check_runner, resolve_runner

DATA_TASK_CPUS = 0.1


def _regularizers_text(tc, job=None) -> str:
    """The attention regularizers a run trains with, and its gradient caching, for its first line ('' when
    none)."""
    parts = ([f"attention dropout {tc.attention_dropout:g}"] if tc.attention_dropout is not None else []) \
        + ([f"DropHead {tc.drophead:g}"] if tc.drophead else [])
    if job is not None and tc.grad_cache:
        B, h = tc.num_workers * tc.batch_size, job.data.hard_negatives
        in_batch = job.loss.name in ("dpr", "dar") or getattr(job.loss, "in_batch_negatives", False)
        docs = B * (1 + h) if in_batch else 1 + h
        parts.append(f"gradient caching: an effective batch of {B:,} queries, each scored against {docs:,} "
                     f"documents, the towers run {tc.grad_cache_query_chunk} query / {tc.grad_cache_doc_chunk} "
                     "document rows a chunk")
    return "".join(", " + p for p in parts)


def _datasets(examples_dir, world: int, key: str, digest: str | None = None) -> dict:
    """One streamed dataset per worker: examples with key % world == rank, file order preserved, in
    the texts form (an ids-form batch gets its texts from the store's mapped passages in the task)."""
    import ray.data

    # Workers stream these; Ray Data's cursor-drawing progress bars would garble their logs.
    ray.data.DataContext.get_current().enable_progress_bars = False
    # Light data tasks: the workers hold most CPUs, and Ray Data stalls when its tasks
    # cannot get a whole CPU beside them (docs/RAY.md §5).
    if isinstance(examples_dir, RemotePath):  # workers on every node read the uploaded copy
        base = ray.data.read_parquet(examples_dir.path, filesystem=examples_dir.fs, num_cpus=DATA_TASK_CPUS)
    else:
        base = ray.data.read_parquet(str(examples_dir), num_cpus=DATA_TASK_CPUS)

    def take(rank: int):
        def keep(table):  # Arrow in and out: list columns stay columnar
            import pyarrow as pa

            from ..data.examples_store import open_passages, resolve_examples

            table = table.filter(pa.array(table[key].to_numpy() % world == rank))
            if "positive_row" in table.schema.names:
                table = resolve_examples(table, open_passages(examples_dir, digest))
            return table

        return base.map_batches(keep, batch_format="pyarrow", batch_size=4096, num_cpus=DATA_TASK_CPUS)

    return {f"train_{r}": take(r) for r in range(world)}


APART_BYTES = 64 * 2**20


def _build_apart(data) -> bool:
    """data.build_apart: yes, no, or auto (the example sources pass APART_BYTES)."""
    if data.build_apart != "auto":
        return data.build_apart == "yes"
    total = 0
    for f in (data.path, data.queries, data.qrels, data.negatives_run):
        try:
            total += Path(f).stat().st_size if f and not is_uri(str(f)) else 0
        except OSError:
            pass  # missing: the build itself reports it
    return total > APART_BYTES


def _child_main(task_file: str) -> None:
    """The child's side of `_build_examples_in_child`: read the task, build, write the outcome."""
    import pickle

    from .. import progress as prog
    from ..runtime_env import setup_offline_env

    setup_offline_env()
    task = Path(task_file)
    job, out, progress = pickle.loads(task.read_bytes())
    try:
        with prog.sink(_examples_sink(job.train.name) if progress else None):
            result = ("ok", get_method(job.loss.name).build_examples(job, Path(out), progress=progress))
    except PipelineError as e:
        result = ("error", e)
    except BaseException as e:  # anything else: its traceback, as text
        import traceback

        result = ("crash", "".join(traceback.format_exception(e)))
    task.with_suffix(".out").write_bytes(pickle.dumps(result))


def _build_examples_in_child(job: TrainJobConfig, out: Path, progress: bool,
                             meanwhile: Callable[[], None] | None = None) -> dict:
    """method.build_examples in a fresh Python process: its peak memory ends with it, before
    training starts. Output and progress lines go to this process's terminal; a PipelineError
    raised there is raised here. `meanwhile()` runs here while the child builds (e.g. Ray starts)."""
    import pickle
    import subprocess
    import sys
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=out.parent) as tmp:
        task = Path(tmp) / "task.pkl"
        task.write_bytes(pickle.dumps((job, str(out), progress)))
        root = str(Path(__file__).resolve().parents[2])  # the folder holding the pipeline package
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        code = f"from pipeline.train.trainer import _child_main; _child_main({str(task)!r})"
        child = subprocess.Popen([sys.executable, "-c", code], env=env)
        try:
            if meanwhile is not None:
                meanwhile()
            rc = child.wait()
        finally:
            if child.poll() is None:  # this process is failing or interrupted: the build stops too
                child.kill()
                child.wait()
        done = task.with_suffix(".out")
        if not done.exists():
            raise PipelineError(f"building the training examples in a child process failed (exit {rc}) before it "
                                "reported; see the lines above (data.build_apart=no builds in this process)")
        kind, value = pickle.loads(done.read_bytes())
    if kind == "ok":
        return value
    if kind == "error":
        raise value
    raise PipelineError(f"building the training examples failed in its child process:\n{value}")


def resolve_resume(job: TrainJobConfig, run_dir):
    """The checkpoint to resume from (a path), or None; `never` refuses a used run name."""
    mode = job.train.resume
    if mode == "auto":
        return latest_checkpoint(run_dir)
    latest = latest_checkpoint(run_dir)
    if mode == "never":
        if latest is not None:
            raise PipelineError(f"{run_dir} already has checkpoints (newest {latest.name}); "
                                "use train.resume=auto to continue it, or another train.name")
        return None
    from ..storage import resolve

    path = resolve(mode) if "://" in mode else Path(mode)
    if read_state(path) is None:
        raise PipelineError(f"train.resume={mode}: not a complete checkpoint (no valid state.json)")
    return path


def resolve_init_from(job: TrainJobConfig, progress: bool = True) -> TrainJobConfig:
    """`train.init_from` resolved: the complete checkpoint it names (a run folder: its newest complete one)
    becomes `train.init_from`, and its model the towers' start (`model.name_or_path`; a two-tower checkpoint
    holds both towers). Refused in one line when it names no complete checkpoint, or names this run itself
    (that is a resume: train.resume)."""
    given = job.train.init_from
    if is_uri(given):
        raise ConfigError(f"train.init_from={given}: a local checkpoint or run folder (download a remote one first)")
    path = Path(given).expanduser()
    if read_state(path) is None:
        newest = latest_checkpoint(path) if path.is_dir() else None
        if newest is None:
            raise PipelineError(f"train.init_from={given}: not a complete checkpoint (no valid state.json), nor a "
                                "run folder holding one")
        path = newest
    path = path.resolve()
    own = Path(str(job.train.storage_path)).expanduser() / job.train.name
    if not is_uri(job.train.storage_path) and path.parent == own.resolve():
        raise PipelineError(f"train.init_from={given}: a checkpoint of this run ({job.train.name}); to go on with it, "
                            "resume it (train.resume=auto); to start anew from it, give the new run another train.name")
    if not (path / "model").is_dir():
        raise PipelineError(f"train.init_from={given}: {path} holds no model/ folder")
    step = (read_state(path) or {}).get("step")
    if progress:
        print(f"[train] {job.train.name}: starting from the weights of {path} (step {step} of run "
              f"{path.parent.name}); the optimizer, schedule and data position start fresh", flush=True)
    model = replace(job.model, name_or_path=str(path / "model"), query_name_or_path=None)
    return replace(job, model=model, train=replace(job.train, init_from=str(path)))


def resolve_job(job: TrainJobConfig, progress: bool = True) -> TrainJobConfig:
    """Make the score function follow the model (docs/METHODS.md §1).

    `loss.similarity: auto` becomes cos/τ (τ 0.05) for a model that L2-normalises and the dot
    product (τ 1) otherwise. Cosine training of a model that does not normalise would be
    searched with a raw inner product afterwards; instead the model is set to normalise
    (`model.normalize: true`), so the saved model records it and retrieval matches training.
    """
    from ..models import BiEncoder

    probe = BiEncoder.load(job.model)
    normalizes = bool(probe.normalize)
    del probe
    loss = resolve_similarity(job.loss, normalizes)
    model = job.model
    if loss.similarity == "cos" and not normalizes:
        model = replace(model, normalize=True)
        if progress:
            print("[train] note: cosine training of a model that does not L2-normalise; the model will "
                  "normalise its vectors (model.normalize=true) so retrieval scores what training scored", flush=True)
    elif loss.similarity == "dot" and normalizes and job.loss.similarity == "dot" and progress:
        print(f"[train] note: dot-product training of a normalising model is cosine with τ = {loss.tau:g}; "
              "loss.similarity=auto would use τ = 0.05", flush=True)
    return replace(job, loss=loss, model=model)


def _build_examples(job: TrainJobConfig, method, out: Path, progress: bool, runner: str) -> dict:
    """The run's training examples at `out` (built, or reused when their sources are unchanged)."""
    from .. import progress as prog

    if method.builds_apart and _build_apart(job.data):
        # Ray starts while the child builds (~5 s of start-up off a long build)
        return _build_examples_in_child(job, out, progress,
                                        meanwhile=None if runner == "local" else lambda: _start_ray(job))
    with prog.sink(_examples_sink(job.train.name) if progress else None):
        return method.build_examples(job, out, progress=progress)


def _examples_sink(name: str) -> Callable[[dict], None]:
    """Building examples over a big corpus (passage lookups part by part) shows progress on the terminal;
    a one-part corpus is read in one go: nothing to follow."""
    from .. import progress as prog

    return lambda r: print(f"[train-data] {name}: {prog.line(r)}", flush=True) if r["total"] > 1 else None


def train(job: TrainJobConfig, validate_fn: Callable | None = None, progress: bool = True,
          negatives_provider=None, callbacks: list | None = None, runner: str | None = None) -> dict:
    """Run (or resume) one training run; returns the summary written to <run_dir>/summary.json.

    `validate_fn(model) -> {"val_…": …}` and `negatives_provider` (see data/negatives.py) are
    handed down from above, so `train/` never imports `index/`. `callbacks` are Ray Train
    callbacks for its RunConfig (e.g. Tune's `TuneReportCallback`); with the local runner, callables of
    (metrics, total steps) called with each report (a Tune trial training in its own process). `runner`
    is the caller's choice of where the loop runs (`local`: a Tune trial's own process, tune/drivers.py),
    else `train.runner` decides (runner_choice.resolve_runner). A run whose newest checkpoint
    already reached the last step is not started again: its summary and model are rebuilt (the
    summary keeps the wall time of the call that trained it).
    """
    tc = job.train
    from .. import storage as st

    t_entry = time.time()  # the wall-time split (start-up, training, validation, checkpoints, export) starts here
    # first: a refused runner or device leaves the storage path untouched (nothing written, uploaded or
    # asked of the network); `amp` is what the workers will train in where this machine decides it
    runner = resolve_runner(job) if runner is None else check_runner(job, runner)
    amp = check_device(job, runner)
    method = get_method(job.loss.name)
    if tc.grad_cache:
        from .grad_cache import GRAD_CACHE_METHODS

        if job.loss.name not in GRAD_CACHE_METHODS:
            raise ConfigError(f"train.grad_cache: for the in-batch methods ({', '.join(GRAD_CACHE_METHODS)}), not "
                              f"loss.name={job.loss.name}")
    storage = st.resolve(tc.storage_path)  # a local Path, or a RemotePath for s3://, gs://, … URIs
    run_dir = storage / tc.name
    remote = isinstance(run_dir, RemotePath)
    if tc.init_from is not None:
        job = resolve_init_from(job, progress)
    job = resolve_job(job, progress)  # a model that cannot load is refused before any folder is made
    if remote:
        st.check_writable(run_dir, who="the driver")
        work = st.staging_dir(run_dir)  # local: examples built here, the model exported here, then uploaded
        return _train(job, method, storage, run_dir, work, remote, validate_fn, progress, negatives_provider,
                      callbacks, t_entry, runner, amp)
    created = missing_dirs(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _train(job, method, storage, run_dir, run_dir, remote, validate_fn, progress, negatives_provider,
                      callbacks, t_entry, runner, amp)
    except BaseException:
        remove_empty_dirs(created)  # a run that failed before writing anything leaves no empty folder behind
        raise


def _train(job: TrainJobConfig, method, storage, run_dir, work, remote: bool, validate_fn, progress: bool,
           negatives_provider, callbacks, t_entry: float, runner: str, amp: str | None) -> dict:
    from .. import storage as st

    tc = job.train
    resume = resolve_resume(job, run_dir)
    if resume is not None:  # what the config alone decides is refused before the examples are built
        check_resume_early(resume, job)
    if remote:
        _fetch_examples(run_dir / "examples", work / "examples")
    world, B = tc.num_workers, tc.batch_size
    # a resume builds beside the run's examples: one refused for its examples leaves them as they were
    examples = work / "examples"
    built = stage_for_resume(examples) if resume is not None else examples
    try:
        meta = _build_examples(job, method, built, progress, runner)
        digest = store_digest(built, meta)
        spe = method.steps_per_epoch(meta, world, B)
        if spe == 0:
            raise ConfigError(f"{meta['examples']} examples are too few for {world} worker(s) x batch {B}")
        total = tc.max_steps or tc.epochs * spe
        identity = run_identity(job, meta, digest, world, spe, amp)
        if resume is not None:
            check_identity(resume, identity, job)
    except BaseException:
        settle_staged(built, examples, accepted=False)
        raise
    settle_staged(built, examples, accepted=True)
    if remote:
        _publish_examples(examples, run_dir / "examples", meta)
    resume_state = read_state(resume) if resume is not None else None
    # a run the validation hook stopped early is complete too (`{"stop": True}`, see loop.py)
    complete = resume_state is not None and (resume_state["step"] >= total or bool(resume_state.get("stopped_early")))
    (st.write_text_atomic if remote else write_text_atomic)(run_dir / "config.yaml", dump_job(job))
    if complete:
        if progress:
            print(f"[train] {tc.name}: already complete at {resume.name}"
                  + (" (stopped early by its validation hook)" if resume_state.get("stopped_early") else "")
                  + "; nothing to train", flush=True)
    else:
        _fit(job, method, validate_fn, negatives_provider, run_dir, storage, meta, spe, total, identity, resume,
             progress, callbacks, work=work, runner=runner)
    t_fit_end = time.time()
    final = latest_checkpoint(run_dir)
    if final is None:
        raise PipelineError(f"training finished without a complete checkpoint in {run_dir}")
    state = read_state(final)
    earlier = _earlier_summary(run_dir, final) if complete else None
    if remote:  # downloaded, then uploaded; summary.json (written last) vouches for the model
        with atomic_path(work / "model") as tmp:
            st.download_dir(final / "model", tmp)
        (run_dir / "summary.json").unlink(missing_ok=True)
        st.rmtree(run_dir / "model")
        st.upload_dir(work / "model", run_dir / "model")
    else:
        with atomic_path(run_dir / "model") as tmp:
            shutil.copytree(final / "model", tmp)
    history = json.loads((final / "history.json").read_text())
    summary = {"name": tc.name, "method": method.name, "loss": job.loss.name, "loss_config": to_dict(job.loss),
               "optim": to_dict(job.optim), "seed": tc.seed, "steps": state["step"], "total_steps": total,
               "steps_per_epoch": spe, "world_size": world, "batch_per_worker": B, "global_batch": world * B,
               "examples": meta["examples"], "examples_sha256": digest, "wall_seconds": round(time.time() - t_entry, 1),
               "stopped_early": bool(state.get("stopped_early")), "precision": state.get("precision"),
               "attention": state.get("attention"),
               "final_metrics": state["metrics"], "checkpoint": str(final), "model": str(run_dir / "model"),
               "resumed_from": str(resume) if resume else None, "init_from": tc.init_from,
               "versions": library_versions(),
               "negatives_versions": state.get("negatives_log", []), "history": history}
    m = state["metrics"]
    if not complete and m.get("train_seconds") is not None:  # this call trained: how its wall time split
        loop = float(m["train_seconds"])
        val, ckpt = float(m.get("validation_seconds", 0.0)), float(m.get("checkpoint_seconds", 0.0))
        training = max(loop - val - ckpt, 0.0)
        started = float(m.get("loop_started_at", t_fit_end - loop))
        startup = min(max(started - t_entry, 0.0), t_fit_end - t_entry)
        # the last checkpoint is written after the loop's final report: what fit() took past the loop
        ckpt += max(t_fit_end - t_entry - startup - loop, 0.0)
        summary["time_split"] = {"start-up": round(startup, 1), "training": round(training, 1),
                                 "validation": round(val, 1), "checkpoints": round(ckpt, 1),
                                 "export": round(time.time() - t_fit_end, 1)}
    if earlier:  # a finished run called again trains nothing: its wall time stays the one that trained it
        summary.update({k: earlier[k] for k in ("wall_seconds", "time_split", "resumed_from") if k in earlier})
    if remote:
        summary["model_local"] = str(work / "model")
    (st.write_json_atomic if remote else write_json_atomic)(run_dir / "summary.json", summary)
    if progress:
        m = state["metrics"]
        val = {k: v for k, v in m.items() if k.startswith("val_") and k not in ("val_seconds", "val_metric")}
        print(f"[train] done: {tc.name} ({method.name}) "
              + (f"stopped early at step {state['step']}/{total}" if summary["stopped_early"]
                 else f"step {state['step']}/{total}") + ", "
              + (f"trained in {state['precision']}, " if state.get("precision") else "")
              + f"loss {m.get('loss', float('nan')):.4f}"
              + (f", {', '.join(f'{k} {v:.4f}' for k, v in val.items())}" if val else "")
              + f", {summary['wall_seconds']:.0f}s ({wall_split(summary)}) -> {run_dir / 'model'}", flush=True)
    return summary


def _earlier_summary(run_dir, final) -> dict | None:
    """The summary a finished run wrote when it trained, if it names the same final checkpoint."""
    from .. import storage as st

    try:
        earlier = st.read_json(run_dir / "summary.json")
    except (OSError, ValueError):
        return None
    return earlier if isinstance(earlier, dict) and earlier.get("checkpoint") == str(final) else None


def wall_split(summary: dict) -> str:
    """How the run's wall time split: start-up, training, validation, checkpoints, export."""
    t = summary.get("time_split") or {}
    return ", ".join(f"{k} {t[k]:.0f}s" for k in ("start-up", "training", "validation", "checkpoints", "export")
                     if t.get(k) is not None) or "already complete"


def format_progress(name: str, rec: dict, terms: tuple[str, ...]) -> list[str]:
    """One line per report (step/total, loss and terms, lr, steps/s, ETA), plus one for validation;
    a progress record of a long step inside the run (validation's encoding) is one line too."""
    if rec.get("kind") == "progress":
        from ..progress import line

        return [f"[train] {name} step {int(rec['step'])} {rec.get('stage', 'work')}: {line(rec)}"]
    step, total = int(rec["step"]), int(rec["total"])
    parts = [f"[train] {name} step {step}/{total} ({100 * step / max(total, 1):.0f}%)"]
    if "loss" in rec:
        t = ", ".join(f"{k} {rec[k]:.4f}" for k in terms if k in rec)
        parts.append(f"loss {rec['loss']:.4f}" + (f" ({t})" if t else ""))
    parts.append(f"lr {rec['lr']:.2e}")
    parts.append(f"{rec.get('steps_per_s', 0):.2f} steps/s")
    eta = rec.get("eta_s")
    if eta is not None and step < total:
        parts.append(f"ETA {int(eta) // 60}:{int(eta) % 60:02d}")
    if "negatives_version" in rec:
        parts.append(f"negatives v{int(rec['negatives_version'])}"
                     + (f" (stale {int(rec['negatives_staleness'])})" if "negatives_staleness" in rec else ""))
    if rec.get("negatives_note"):
        parts.append(f"WARNING {rec['negatives_note']}")
    lines = ["  ".join(parts)]
    val = {k: v for k, v in rec.items() if k.startswith("val_") and k not in ("val_metric", "val_seconds")}
    if val:
        how = [f"{rec['val_seconds']:.0f}s"] if "val_seconds" in rec else []
        if rec.get("validation_encoder"):  # the spine's Validator: which encoder ran the passages, how fast, why
            how.append(f"passages at {rec['validation_rate']:.0f}/s by {rec['validation_encoder']}")
        lines.append(f"[train] {name} step {step} validation: " + ", ".join(f"{k[4:]} {v:.4f}" for k, v in val.items())
                     + (f" ({'; '.join(how)})" if how else ""))
    return lines


def _fetch_examples(remote_dir: RemotePath, local_dir: Path) -> None:
    """A resumed run on another machine starts from the examples the run was made with."""
    from .. import storage as st
    from ..data.examples_store import EXAMPLES_META

    if (local_dir / EXAMPLES_META).exists() or not (remote_dir / EXAMPLES_META).exists():
        return
    with atomic_path(local_dir) as tmp:
        st.download_dir(remote_dir, tmp)


def _publish_examples(local_dir: Path, remote_dir: RemotePath, meta: dict) -> None:
    """Upload the examples (parts first, examples.json last) unless the same ones are there."""
    from .. import storage as st
    from ..data.examples_store import EXAMPLES_META

    try:
        if st.read_json(remote_dir / EXAMPLES_META).get("digest") == meta.get("digest"):
            return
    except (OSError, ValueError):
        pass
    st.rmtree(remote_dir)
    st.upload_dir(local_dir, remote_dir, marker=EXAMPLES_META)


def _start_ray(job: TrainJobConfig) -> None:
    """Train V2's controller queries actor state through the dashboard's API: a local Ray for
    training starts it (bound to 127.0.0.1 like everything else). A no-op once Ray runs."""
    from ..ray_runtime import init_ray

    init_ray(replace(job.ray, dashboard=True))


def _fit(job: TrainJobConfig, method, validate_fn, negatives_provider, run_dir, storage, meta: dict,
         spe: int, total: int, identity: dict, resume, progress: bool,
         callbacks: list | None = None, work: Path | None = None, *, runner: str) -> None:
    """Build the TorchTrainer (resources checked first) and run it to `total` steps (`runner` local: the
    loop in this process instead, with no Ray imported)."""
    tc = job.train
    work = work or run_dir
    world, B = tc.num_workers, tc.batch_size
    n_examples = meta["examples"]
    if runner == "local":
        return _fit_local(job, method, validate_fn, negatives_provider, run_dir, meta, spe, total, identity, resume,
                          progress, work, callbacks)
    import ray
    from ray.data import ExecutionOptions
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Empty, Queue

    from .. import storage as st
    from ..ray_runtime import check_resources
    from .process_group import NodeBoundTorchConfig

    _start_ray(job)
    gpus = tc.gpus_per_worker if tc.use_gpu else 0.0
    dc = job.data
    materialize = dc.materialize == "always" or (dc.materialize == "auto" and n_examples <= dc.materialize_max_examples)
    # Streaming: Ray Data's read tasks need a whole CPU beside the workers (measured on Ray 2.60:
    # its budget rounds down to whole CPUs, and 2 x 0.75-CPU workers on 2 cores hang).
    # Materialised: no Ray Data at all, so the workers may take every CPU.
    ray_data = not materialize and dc.streaming == "ray-data"
    check_resources("train", world * tc.cpus_per_worker, world * gpus, keep_free_cpus=1.0 if ray_data else 0.0)
    if isinstance(run_dir, RemotePath) or len([n for n in ray.nodes() if n.get("Alive")]) > 1:
        st.check_writable_on_nodes(run_dir)  # every node writes checkpoints (or the examples' reads) there
    if progress:
        print(f"[train] {tc.name}: {method.name}, {n_examples:,} examples"
              f" ({'held in memory' if materialize else 'streamed by Ray Data' if ray_data else 'read from files'}),"
              f" {world} worker(s) x batch {B} "
              f"(global {world * B}), {spe} steps/epoch, {total} steps, {job.loss.similarity}/τ={job.loss.tau:g}"
              + _regularizers_text(tc, job) + (f", resuming from {resume.name}" if resume else ""), flush=True)
    loop_cfg = {"job": job_to_dict(job), "steps_per_epoch": spe, "total_steps": total, "examples": n_examples,
                "identity": identity, "run_dir": str(run_dir), "validate_fn": validate_fn,
                "negatives_provider": negatives_provider, "resume_from": str(resume) if resume else None}
    datasets, data_config = {}, None
    if materialize:
        from ..data.examples_store import read_examples_table

        loop_cfg["examples_ref"] = ray.put(read_examples_table(work / "examples"))  # texts gathered once, here
    elif not ray_data:  # each worker reads the parts (run_dir/examples) a batch at a time
        loop_cfg["examples_files"] = sorted(p.name for p in (work / "examples").glob("part-*.parquet"))
    else:
        datasets = _datasets(run_dir / "examples", world, method.partition_key, meta.get("digest"))
        data_config = DataConfig(datasets_to_split=[], execution_options=ExecutionOptions(preserve_order=True))
    ray_path, ray_fs = st.ray_storage(storage)
    queue = Queue(actor_options={"num_cpus": 0}) if progress else None
    loop_cfg["progress_queue"] = queue
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_cfg,
        torch_config=NodeBoundTorchConfig(),  # store and gloo bind the node's IP, never every interface
        scaling_config=ScalingConfig(num_workers=world, use_gpu=tc.use_gpu,
                                     resources_per_worker={"CPU": tc.cpus_per_worker, **({"GPU": gpus} if gpus else {})}),
        run_config=RunConfig(name=tc.name, storage_path=ray_path, storage_filesystem=ray_fs,
                             failure_config=FailureConfig(max_failures=tc.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=tc.keep_checkpoints),
                             callbacks=list(callbacks or [])),
        datasets=datasets or None,
        **({"dataset_config": data_config} if data_config is not None else {}),
    )
    box: dict = {}

    def fit():
        try:
            box["result"] = trainer.fit()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=fit, name="train-fit", daemon=True)
    thread.start()
    terms = ("nll",) + tuple(t for t in method.terms if t != "nll")
    try:
        while thread.is_alive() or (queue is not None and not queue.empty()):
            if queue is None:
                thread.join(0.5)
                continue
            try:
                rec = queue.get(timeout=0.5)
            except Empty:
                continue
            for line in format_progress(tc.name, rec, terms):
                print(line, flush=True)
    finally:
        thread.join()
        if queue is not None:
            queue.shutdown()
    if "error" in box:
        raise worker_error(box["error"]) or box["error"]
    if box["result"].error:
        # a worker's PipelineError (e.g. ANCE's refresher failed) is one error line, not Ray's wrapper
        raise worker_error(box["result"].error) or box["result"].error


class _Printer:
    """train.runner=local: the loop's progress records printed as they come (no queue, no thread)."""

    def __init__(self, name: str, terms: tuple[str, ...]):
        self.name, self.terms = name, terms

    def put_nowait(self, rec: dict) -> None:
        for line in format_progress(self.name, rec, self.terms):
            print(line, flush=True)


def _fit_local(job: TrainJobConfig, method, validate_fn, negatives_provider, run_dir, meta: dict, spe: int,
               total: int, identity: dict, resume, progress: bool, work: Path, callbacks: list | None = None) -> None:
    """train.runner=local: the loop in this process (train/session.LocalSession): no Ray, checkpoints written
    in place. A failure is retried up to train.max_failures times, as Ray's would, from the newest checkpoint
    the failed attempts wrote, else from the one the first attempt started from (`resume`, which may be a
    train.resume path outside the run): never from the base model when the run did not start there.
    `callbacks` are called with each report and the run's total steps (a Tune trial's report)."""
    from .session import LocalSession, clean_stale

    tc = job.train
    clean_stale(run_dir)
    dc = job.data
    n = meta["examples"]
    materialize = dc.materialize == "always" or (dc.materialize == "auto" and n <= dc.materialize_max_examples)
    if progress:
        print(f"[train] {tc.name}: {method.name}, {n:,} examples ({'held in memory' if materialize else 'read from files'}), "
              f"1 worker in this process (no Ray Train) x batch {tc.batch_size}, {spe} steps/epoch, "
              f"{total} steps, {job.loss.similarity}/τ={job.loss.tau:g}" + _regularizers_text(tc, job)
              + (f", resuming from {resume.name}" if resume else ""), flush=True)
    for cb in callbacks or []:
        if not callable(cb):
            raise ConfigError(f"{type(cb).__name__} is a Ray Train callback: it needs train.runner=ray")
    session = LocalSession(run_dir, tc.keep_checkpoints, tc.use_gpu,
                           reporters=[partial(cb, total_steps=total) for cb in callbacks or []])
    loop_cfg = {"job": job_to_dict(job), "steps_per_epoch": spe, "total_steps": total, "examples": n,
                "identity": identity, "run_dir": str(run_dir), "validate_fn": validate_fn,
                "negatives_provider": negatives_provider, "resume_from": str(resume) if resume else None,
                "session": session,
                "progress_queue": _Printer(tc.name, ("nll",) + tuple(t for t in method.terms if t != "nll"))
                if progress else None}
    if materialize:
        from ..data.examples_store import read_examples_table

        loop_cfg["examples_ref"] = read_examples_table(work / "examples")
    else:
        loop_cfg["examples_files"] = sorted(p.name for p in (work / "examples").glob("part-*.parquet"))
    for attempt in range(tc.max_failures + 1):
        try:
            train_loop_per_worker(loop_cfg)
            return
        except PipelineError:
            raise  # the run's own verdict (a non-finite loss, the refresher's failure): retrying changes nothing
        except Exception:
            if attempt == tc.max_failures:
                raise
            written = session.last_written
            newest = written if written is not None and read_state(written) is not None else resume
            loop_cfg["resume_from"] = str(newest) if newest is not None else None
            if progress:
                print(f"[train] {tc.name}: the loop failed (attempt {attempt + 1} of {tc.max_failures + 1}); "
                      f"resuming from {newest if newest else 'the start'}", flush=True)

