"""Where the training loop runs (`train.runner`): what `train/loop.py` asks of its surroundings.

    RaySession    a worker of Ray Train's TorchTrainer (any number of workers, GPUs, a cluster, Tune):
                  its rank and world, device, restored checkpoint, DDP wrapping, reports and checkpoints
                  through `ray.train`
    LocalSession  the one worker in the command's own process (train.runner=local, or a one-worker Tune
                  trial: tune/drivers.trains_in_process): no Ray start, no controller, no worker process;
                  checkpoints are written in place (a temporary folder in the run folder renamed to
                  `step-XXXXXXXX`, the `keep_checkpoints` newest kept), so nothing is copied; on 2 cores it
                  trains at a plain loop's speed (Ray's own processes otherwise share the cores:
                  bench/train.py); each report also goes to the session's `reporters` (a Tune trial's)

Both give the loop the same checkpoint format (models/checkpoint.py), the same resume and the same
batches: the runner decides who runs the loop, never what it computes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path


class RaySession:
    """The loop inside a Ray Train worker."""

    local = False

    def __init__(self):
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.device = ray.train.torch.get_device()

    def restored_checkpoint(self, run_loc):
        """Ray's own snapshot of the run (a path on the run's filesystem), or None."""
        import ray.train

        from .. import storage as st

        ckpt = ray.train.get_checkpoint()
        if ckpt is None:
            return None
        if isinstance(run_loc, st.RemotePath):  # Ray's checkpoint lives on the URI's filesystem
            return st.from_filesystem(ckpt.filesystem, ckpt.path, like=run_loc)
        return ckpt.path

    def prepare(self, model):
        import ray.train.torch

        return ray.train.torch.prepare_model(model)

    def get(self, ref):
        import ray

        return ray.get(ref)

    def dataset_shard(self, name: str):
        import ray.train

        return ray.train.get_dataset_shard(name)

    @contextmanager
    def checkpoint_folder(self):
        with tempfile.TemporaryDirectory() as tmp:
            yield Path(tmp)

    def report(self, metrics: dict, folder: Path | None = None, name: str | None = None) -> None:
        import ray.train

        if folder is None:
            ray.train.report(metrics, checkpoint=None)
            return
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(folder)), checkpoint_dir_name=name)


def cpus_here() -> int:
    """The CPUs the loop's threads may use in this process: inside a Ray task or actor (a Tune trial), the CPUs
    Ray assigned it, rounded down as a Ray Train worker's `train.cpus_per_worker` is (at least 1); elsewhere
    the CPUs this process may run on."""
    import sys

    ray_mod = sys.modules.get("ray")
    if ray_mod is not None and ray_mod.is_initialized():
        try:
            assigned = ray_mod.get_runtime_context().get_assigned_resources().get("CPU")
        except Exception:  # noqa: BLE001 - the driver of a Ray: no assignment
            assigned = None
        if assigned:
            return max(1, int(assigned))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class LocalSession:
    """The loop in the command's own process: rank 0 of 1, checkpoints written in place. `last_written` is
    the newest checkpoint this session wrote (None before the first): a retry resumes from it. `reporters`
    (callables of the metrics) get every report once its checkpoint, if any, is in place."""

    local = True

    def __init__(self, run_dir: Path, keep: int, use_gpu: bool = False, reporters: tuple = ()):
        import torch

        from ..errors import PipelineError

        if use_gpu and not torch.cuda.is_available():  # refused up front (runner_choice.check_device), never a CPU run
            raise PipelineError("train.use_gpu=true: no CUDA GPU is visible on this machine")
        self.rank, self.world = 0, 1
        self.device = torch.device("cuda" if use_gpu else "cpu")
        self.run_dir, self.keep = Path(run_dir), keep
        self.last_written: Path | None = None
        self.cpus = cpus_here()
        self.reporters = tuple(reporters)

    def restored_checkpoint(self, run_loc):
        return None  # the driver names the checkpoint to resume from (loop_cfg["resume_from"])

    def prepare(self, model):
        return model.to(self.device)

    def get(self, obj):
        return obj  # the driver hands the examples table itself

    def dataset_shard(self, name: str):
        from ..errors import ConfigError

        raise ConfigError("data.streaming=ray-data needs train.runner=ray")

    @contextmanager
    def checkpoint_folder(self):
        """A folder inside the run folder (same filesystem: renamed into place, never copied)."""
        tmp = self.run_dir / f".tmp-checkpoint-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def report(self, metrics: dict, folder: Path | None = None, name: str | None = None) -> None:
        """A checkpoint becomes `run_dir/name` in one rename (complete: its state.json was written last),
        then the oldest complete ones beyond `keep` go; the newest is never removed; then the reporters."""
        if folder is not None:
            self._place(folder, name)
        for report in self.reporters:
            report(dict(metrics))

    def _place(self, folder: Path, name: str) -> None:
        from ..models.checkpoint import list_checkpoints

        final = self.run_dir / name
        if final.exists():  # the same step written again (a re-run of a failed attempt): the new one wins
            aside = self.run_dir / f".old-{name}-{uuid.uuid4().hex[:8]}"
            os.replace(final, aside)
            shutil.rmtree(aside, ignore_errors=True)
        os.replace(folder, final)
        self.last_written = final
        folder.mkdir()  # (the context manager removes it)
        done = list_checkpoints(self.run_dir)
        for _, old in done[:-self.keep] if self.keep > 0 else []:
            if old != final:
                shutil.rmtree(old, ignore_errors=True)


def clean_stale(run_dir: Path) -> None:
    """What a killed local run left in its run folder: half-written checkpoint folders."""
    for p in Path(run_dir).glob(".tmp-checkpoint-*"):
        shutil.rmtree(p, ignore_errors=True)
