"""The driver side of training: examples, resources, resume, `TorchTrainer.fit()`, model export.

    run_dir = <train.storage_path>/<train.name>/
        examples/            training examples (Parquet) + examples.json
        step-XXXXXXXX/       Ray Train checkpoints in our format (models/checkpoint.py)
        model/               the final model: HF directory (safetensors), loadable by `pipeline encode`
        config.yaml          resolved config;  summary.json  metrics, timings, batch sizes
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ..config import save_config, to_dict
from ..data.training import build_examples
from ..errors import ConfigError, PipelineError
from ..io_utils import atomic_path, write_json_atomic
from ..models.checkpoint import latest_checkpoint, read_state
from .batching import steps_per_epoch
from .config import TrainJobConfig
from .loop import train_loop_per_worker


DATA_TASK_CPUS = 0.1


def _datasets(examples_dir: Path, world: int) -> dict:
    """One dataset per worker: examples with idx % world == rank, file order preserved."""
    import ray.data

    # Workers stream these; Ray Data's cursor-drawing progress bars would garble their logs.
    ray.data.DataContext.get_current().enable_progress_bars = False
    # Light data tasks: the workers hold most CPUs, and Ray Data stalls when its tasks
    # cannot get a whole CPU beside them (STACK.md §5).
    base = ray.data.read_parquet(str(examples_dir), num_cpus=DATA_TASK_CPUS)

    def take(rank: int):
        def keep(table):  # Arrow in and out: the list<string> negatives column stays columnar
            import pyarrow as pa

            return table.filter(pa.array(table["idx"].to_numpy() % world == rank))

        return base.map_batches(keep, batch_format="pyarrow", batch_size=4096, num_cpus=DATA_TASK_CPUS)

    return {f"train_{r}": take(r) for r in range(world)}


def resolve_resume(job: TrainJobConfig, run_dir: Path):
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
    path = Path(mode)
    if read_state(path) is None:
        raise PipelineError(f"train.resume={mode}: not a complete checkpoint (no valid state.json)")
    return path


def train(job: TrainJobConfig, validate_fn: Callable | None = None, progress: bool = True) -> dict:
    """Run (or resume) one training run; returns the summary written to <run_dir>/summary.json.

    A run whose newest checkpoint already reached the last step is not started again:
    its summary and model are rebuilt from that checkpoint.
    """
    tc = job.train
    if "://" in tc.storage_path:
        raise ConfigError(f"train.storage_path={tc.storage_path}: URI storage is not supported yet (resume and the "
                          "final model export read checkpoints from a filesystem path); use a local or shared "
                          "filesystem path (e.g. NFS) that every node mounts")
    storage = Path(tc.storage_path).expanduser().resolve()
    run_dir = storage / tc.name
    run_dir.mkdir(parents=True, exist_ok=True)
    examples = build_examples(job.data, run_dir / "examples", progress=progress)
    world, B = tc.num_workers, tc.batch_size
    spe = steps_per_epoch(examples["examples"], world, B)
    if spe == 0:
        raise ConfigError(f"{examples['examples']} examples are too few for {world} worker(s) x batch {B}")
    total = tc.max_steps or tc.epochs * spe
    resume = resolve_resume(job, run_dir)
    complete = resume is not None and read_state(resume)["step"] >= total
    save_config(job, run_dir / "config.yaml")
    t0 = time.time()
    if complete:
        if progress:
            print(f"[train] {tc.name}: already complete at {resume.name}; nothing to train", flush=True)
    else:
        _fit(job, validate_fn, run_dir, storage, examples["examples"], spe, total, resume, progress)
    final = latest_checkpoint(run_dir)
    if final is None:
        raise PipelineError(f"training finished without a complete checkpoint in {run_dir}")
    state = read_state(final)
    with atomic_path(run_dir / "model") as tmp:
        shutil.copytree(final / "model", tmp)
    history = json.loads((final / "history.json").read_text())
    summary = {"name": tc.name, "loss": job.loss.name, "steps": state["step"], "total_steps": total,
               "steps_per_epoch": spe, "world_size": world, "batch_per_worker": B, "global_batch": world * B,
               "examples": examples["examples"], "wall_seconds": round(time.time() - t0, 1),
               "final_metrics": state["metrics"], "checkpoint": str(final), "model": str(run_dir / "model"),
               "resumed_from": str(resume) if resume else None, "history": history}
    write_json_atomic(run_dir / "summary.json", summary)
    if progress:
        m = state["metrics"]
        val = {k: v for k, v in m.items() if k.startswith("val_")}
        print(f"[train] done: {tc.name} step {state['step']}/{total}, loss {m.get('loss', float('nan')):.4f}"
              + (f", {', '.join(f'{k} {v:.4f}' for k, v in val.items())}" if val else "")
              + f", {summary['wall_seconds']:.0f}s -> {run_dir / 'model'}", flush=True)
    return summary


def _fit(job: TrainJobConfig, validate_fn, run_dir: Path, storage: Path, n_examples: int, spe: int, total: int,
         resume: Path | None, progress: bool) -> None:
    """Build the TorchTrainer (resources checked first) and run it to `total` steps."""
    from ray.data import ExecutionOptions
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ..ray_runtime import check_resources, init_ray

    tc = job.train
    world, B = tc.num_workers, tc.batch_size
    # Train V2's controller queries actor state through the dashboard's API: a local Ray for
    # training starts it (bound to 127.0.0.1 like everything else).
    init_ray(replace(job.ray, dashboard=True))
    gpus = tc.gpus_per_worker if tc.use_gpu else 0.0
    # Ray Data's read tasks need a slice of CPU beside the workers (STACK.md §5).
    # Measured on Ray 2.60: Ray Data's budget beside Train workers rounds down to whole CPUs,
    # so less than one free CPU stalls the example stream forever (2 x 0.75 on 2 cores hangs).
    check_resources("train", world * tc.cpus_per_worker, world * gpus, keep_free_cpus=1.0)
    if progress:
        print(f"[train] {tc.name}: loss {job.loss.name}, {n_examples:,} examples, {world} worker(s) x "
              f"batch {B} (global {world * B}), {spe} steps/epoch, {total} steps"
              + (f", resuming from {resume.name}" if resume else ""), flush=True)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"job": to_dict(job), "steps_per_epoch": spe, "total_steps": total,
                           "examples": n_examples, "run_dir": str(run_dir), "validate_fn": validate_fn,
                           "resume_from": str(resume) if resume else None},
        scaling_config=ScalingConfig(num_workers=world, use_gpu=tc.use_gpu,
                                     resources_per_worker={"CPU": tc.cpus_per_worker, **({"GPU": gpus} if gpus else {})}),
        run_config=RunConfig(name=tc.name, storage_path=str(storage),
                             failure_config=FailureConfig(max_failures=tc.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=tc.keep_checkpoints)),
        datasets=_datasets(run_dir / "examples", world),
        dataset_config=DataConfig(datasets_to_split=[], execution_options=ExecutionOptions(preserve_order=True)),
    )
    result = trainer.fit()
    if result.error:
        raise result.error
