"""`train_loop_per_worker`: the method-agnostic DDP loop every Ray Train worker runs.

It knows a method only through the interface in `train/methods/base.py`: examples come
from the method's sampler, the method's `forward` runs the towers, `assemble` gathers
across workers, and the method's pure loss function scores the batch dict. The loop owns
DDP, precision, clipping, the optimizer and schedule, checkpoints with exact resume, the
validation hook (it may return `{"stop": True}`: every rank ends at that step, and the
checkpoint written there, marked `stopped_early`, counts as complete), the negatives provider (polled every `train.negatives_poll_every` steps,
the version in use recorded in every checkpoint) and reporting (terms reduced across
workers; rank 0 sends one progress record per report to the driver).
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from .. import progress
from .. import storage as st
from ..errors import NonFiniteError, PipelineError
from ..models import BiEncoder
from ..models.attention import resolve_attention, use_attention
from ..models.checkpoint import checkpoint_dir_name, finalize_checkpoint, library_versions, read_state
from .config import dump_job, job_from_dict
from .identity import describe_diff, identity_diff, named_settings, stored_identity
from .methods import StepContext, check_frozen, get_method
from .optim import build_optimizer, warmup_linear, warmup_steps


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def resolve_amp(mode: str, device: torch.device | str, cpuinfo: str | None = None) -> str:
    """`train.amp` on this device -> "bf16", "fp16" or "fp32" (what the run trains in).

    CUDA: auto = bf16 where the GPU has it, else fp16 (with a gradient scaler). CPU: auto = bf16 where
    the CPU computes it natively (AMX / AVX512-BF16: the detection encode uses), else fp32; an explicit
    bf16 on a CPU without it is refused (emulated, it would be slower than fp32), and fp16 on a CPU too.
    """
    from ..models.precision import cpu_has_bf16

    device = torch.device(device)
    if mode == "no":
        return "fp32"
    if device.type == "cuda":
        if mode == "auto":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return mode
    native = cpu_has_bf16(cpuinfo)
    if mode == "auto":
        return "bf16" if native else "fp32"
    if mode == "fp16":
        raise PipelineError("train.amp=fp16 needs GPU workers (train.use_gpu=true); on a CPU, train.amp=auto trains "
                            "in bf16 where the CPU has it natively")
    if not native:
        raise PipelineError("train.amp=bf16: this CPU has no native bf16 (AMX or AVX512-BF16), so bf16 would be "
                            "emulated and slower than fp32; train.amp=auto (fp32 here) or no")
    return "bf16"


def _amp(cfg, device: torch.device):
    """(autocast context factory, GradScaler or None, the precision trained in) for `train.amp`."""
    used = resolve_amp(cfg.train.amp, device)
    if used == "fp32":
        return contextlib.nullcontext, None, used
    dtype = torch.bfloat16 if used == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cuda") if used == "fp16" else None
    return (lambda: torch.autocast(device.type, dtype=dtype)), scaler, used


def check_finite_loss(loss: torch.Tensor, terms: dict, step: int, note) -> None:
    """Stop the run at the first step whose loss (or one of its terms) is NaN or inf, naming the step
    and the terms that went non-finite, before it reaches a gradient. `note()` says what is kept."""
    values = {"loss": float(loss.detach()), **{k: float(v) for k, v in terms.items()}}
    bad = [k for k, v in values.items() if not np.isfinite(v)]
    if not bad:
        return
    named = [k for k in bad if k != "loss"] or ["loss"]
    others = ", ".join(f"{k} {v:.6g}" for k, v in values.items() if k not in named and k != "loss")
    raise NonFiniteError(f"training stopped at step {step}: the loss went non-finite in "
                         + ", ".join(f"{k} ({values[k]})" for k in named) + (f" ({others})" if others else "")
                         + f"; nothing of this step was applied. {note()}")


def _stop_note(run_loc) -> str:
    """What a run stopped by a non-finite value keeps: its last checkpoint (all of them finite)."""
    from ..models.checkpoint import latest_checkpoint

    last = latest_checkpoint(run_loc)
    return (f"The last checkpoint, {last}, is kept (its weights are finite); lower optim.lr or check the data"
            if last is not None else "No checkpoint was written yet; lower optim.lr or check the data")


def _all_gather_object(obj, world: int):
    if world == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def choose_checkpoint(ray_ckpt_path: str | None, driver_path: str | None) -> str | None:
    """The newest of Ray's restored checkpoint and the one the driver announced.

    Ray Train restores from its own snapshot, which can lag the newest complete checkpoint
    on disk (a kill right after a checkpoint was written); a restart inside one fit()
    (FailureConfig) can be newer than the driver's choice. Taking the newer by step means
    the checkpoint the driver announces is the one used, and no batch is trained twice.
    """
    best, best_step = None, -1
    for path in (ray_ckpt_path, driver_path):
        if not path:
            continue
        state = read_state(path)
        if state is not None and state["step"] > best_step:
            best, best_step = path, state["step"]
    return best


def reduce_window(windows: list[dict], counts: list[int], stat_keys: set[str]) -> dict:
    """Per-rank sums over a report window -> loss terms averaged over steps and workers,
    counters (`stat_keys`) summed."""
    keys = sorted({k for w in windows for k in w})
    out = {}
    for k in keys:
        if k in stat_keys:
            out[k] = float(sum(w.get(k, 0.0) for w in windows))
        else:
            vals = [w[k] / n for w, n in zip(windows, counts) if k in w and n]
            if vals:
                out[k] = float(sum(vals) / len(vals))
    return out


class _Rows:
    """The worker's examples (key % world == rank), in file order: materialised once (object store),
    read from the examples' Parquet parts a batch at a time, or streamed (Ray Data). Examples in the
    ids form get their texts from the store's memory-mapped passages here, a batch at a time."""

    def __init__(self, loop_cfg: dict, method, rank: int, world: int, session=None):
        self.rows = None
        self.shard = None
        self.files = None
        self.key, self.rank, self.world = method.partition_key, rank, world
        ref = loop_cfg.get("examples_ref")
        if ref is not None:
            import pyarrow as pa

            table = session.get(ref)  # Ray's object store, or the table itself (train.runner=local)
            key = table[method.partition_key].to_numpy()
            self.rows = table.filter(pa.array(key % world == rank)).to_pylist()
        elif loop_cfg.get("examples_files") is not None:
            run_dir = loop_cfg["run_dir"]
            base = st.resolve(run_dir) if st.is_uri(run_dir) else Path(run_dir)
            self.examples_dir = base / "examples"
            self.files = [self.examples_dir / name for name in loop_cfg["examples_files"]]
            from ..data.examples_store import check_store

            check_store(self.examples_dir)  # an altered store is refused by name, before a batch is read
        else:
            self.shard = session.dataset_shard(f"train_{rank}")

    def _read_files(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        from ..data.examples_store import open_passages, resolve_examples

        texts = None
        for path in self.files:
            if isinstance(path, st.RemotePath):
                f = pq.ParquetFile(path.fs.open_input_file(path.path))
            else:
                f = pq.ParquetFile(str(path), memory_map=True)
            for batch in f.iter_batches(batch_size=1024):
                keep = batch.column(self.key).to_numpy() % self.world == self.rank
                batch = batch.filter(pa.array(keep))
                if texts is None and "positive_row" in batch.schema.names:
                    texts = open_passages(self.examples_dir)
                yield from resolve_examples(batch, texts).to_pylist()

    def __iter__(self):
        if self.rows is not None:
            return iter(self.rows)
        if self.files is not None:
            return self._read_files()
        return (r for b in self.shard.iter_batches(batch_size=1024, batch_format="pyarrow") for r in b.to_pylist())


def train_loop_per_worker(loop_cfg: dict) -> None:
    """The loop of one worker: inside Ray Train (`RaySession`), or in the command's own process
    (`loop_cfg["session"]`, a `LocalSession`: train.runner=local)."""
    from ..runtime_env import setup_offline_env
    from .session import RaySession

    setup_offline_env()  # quiet HF logs and no progress bars inside the workers too
    session = loop_cfg.get("session") or RaySession()
    job = job_from_dict(loop_cfg["job"])
    tc = job.train
    method = get_method(job.loss.name)
    rank, world = session.rank, session.world
    # threads: train.torch_threads, else the worker's CPUs (Ray) or every CPU of this machine (local)
    torch.set_num_threads(tc.torch_threads or (session.cpus if session.local else max(1, int(tc.cpus_per_worker))))
    random.seed(tc.seed + rank)
    np.random.seed(tc.seed + rank)
    torch.manual_seed(tc.seed + rank)
    spe, total = loop_cfg["steps_per_epoch"], loop_cfg["total_steps"]
    device = session.device
    autocast, scaler, amp_used = _amp(job, device)
    # what a checkpoint must match to be resumed (train/identity.py), with the precision trained in here
    identity = {**loop_cfg["identity"], "amp": amp_used}

    # ---- model, optimizer, schedule; restored from a checkpoint when resuming
    run_loc = st.resolve(loop_cfg["run_dir"]) if st.is_uri(loop_cfg["run_dir"]) else Path(loop_cfg["run_dir"])
    remote = isinstance(run_loc, st.RemotePath)
    ray_path = session.restored_checkpoint(run_loc)
    ckpt_path = choose_checkpoint(ray_path, loop_cfg.get("resume_from"))
    resume_state, train_state, history = None, None, []
    staged = None
    try:
        if ckpt_path is not None and st.is_uri(str(ckpt_path)):  # read a local copy of a remote checkpoint
            staged = tempfile.mkdtemp(prefix="ckpt-")
            source, ckpt_path = str(ckpt_path), str(st.download_dir(st.resolve(str(ckpt_path)), staged))
            if read_state(ckpt_path) is None:
                raise RuntimeError(f"checkpoint {source} changed or vanished while it was downloaded")
        if ckpt_path is not None:
            d = Path(ckpt_path)
            resume_state = json.loads((d / "state.json").read_text())
            if resume_state.get("stopped_early"):
                return  # the validation hook ended this run: a restart inside fit() trains no further
            model = BiEncoder.load(replace(job.model, name_or_path=str(d / "model"), query_name_or_path=None))
            train_state = torch.load(d / "training_state.pt", map_location="cpu", weights_only=False)
            history = json.loads((d / "history.json").read_text())
            then = stored_identity(d, resume_state) or {}
            identity["attention"] = use_attention(
                [model.doc_encoder, model.query_encoder],
                resolve_attention(tc.attention, device, checkpoint=then.get("attention"), resuming=True), tc.attention)
            mismatch = identity_diff(then, identity)
            if mismatch:  # the run's verdict (a retry changes nothing): one error line, no retry
                raise PipelineError(f"cannot resume from {d.name}: it was made with a different "
                                    + describe_diff(mismatch, named_settings(then, job)))
        else:
            model = BiEncoder.load(job.model)
            identity["attention"] = use_attention([model.doc_encoder, model.query_encoder],
                                                  resolve_attention(tc.attention, device), tc.attention)
    finally:  # the local copy of a remote checkpoint goes, whatever happened
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
    heads = method.heads(job, model)
    if heads:
        model.heads = torch.nn.ModuleDict(heads)
        if train_state is not None and train_state.get("heads") is not None:
            model.heads.load_state_dict(train_state["heads"])
    model.length_group_rows = tc.length_group_rows
    from .regularizers import apply_attention_regularizers

    apply_attention_regularizers([model.doc_encoder, model.query_encoder], tc.attention_dropout, tc.drophead)
    model.to(device)
    ddp = session.prepare(model)
    optimizer = build_optimizer(model.named_parameters(), job.optim)
    scheduler = warmup_linear(optimizer, warmup_steps(job.optim, total), total)
    step = 0
    if train_state is not None:
        optimizer.load_state_dict(train_state["optimizer"])
        scheduler.load_state_dict(train_state["scheduler"])
        if scaler is not None and train_state.get("scaler"):
            scaler.load_state_dict(train_state["scaler"])
        _set_rng_state(train_state["rng"][rank])
        step = resume_state["step"]
    side = method.side_inputs(job, device)
    check_frozen(side)
    validate_fn = loop_cfg.get("validate_fn")
    provider = loop_cfg.get("negatives_provider") if method.uses_negatives_provider else None
    progress_queue = loop_cfg.get("progress_queue")
    rows = _Rows(loop_cfg, method, rank, world, session)
    B = tc.batch_size
    batch_log, log_remote, log_local = None, None, None
    if tc.log_batches and remote:
        # no appends on object stores: a local file, uploaded whole at every checkpoint and at the end;
        # a resumed worker continues the uploaded log up to the step it resumes from
        log_remote = run_loc / "batch_log" / f"rank{rank}.jsonl"
        log_local = Path(tempfile.mkdtemp(prefix="batch-log-")) / log_remote.name
        with contextlib.suppress(FileNotFoundError):
            log_local.write_text("".join(line + "\n" for line in log_remote.read_text().splitlines()
                                         if json.loads(line)["step"] <= step))
        batch_log = open(log_local, "a")
    elif tc.log_batches:
        log_dir = Path(loop_cfg["run_dir"]) / "batch_log"
        log_dir.mkdir(parents=True, exist_ok=True)
        batch_log = open(log_dir / f"rank{rank}.jsonl", "a")

    def upload_batch_log() -> None:
        if log_remote is not None:
            batch_log.flush()
            log_remote.write_bytes(log_local.read_bytes())

    fail_marker = run_loc / ".simulated_failure_done"

    # ---- negatives provider: the version in use is part of the checkpointed state
    negatives = None
    negatives_log: list[dict] = list(train_state.get("negatives_log", [])) if train_state else []
    if provider is not None and resume_state and resume_state.get("negatives_version") is not None:
        try:
            negatives = provider.load(resume_state["negatives_version"])
        except Exception as e:  # pruned meanwhile: continue with the newest one, loudly
            print(f"[train] WARNING: negatives version {resume_state['negatives_version']} of the checkpoint "
                  f"cannot be loaded ({e}); polling for the newest", flush=True)

    # A newer version is loaded (read + its passage texts looked up) in a background thread while
    # the steps go on, and swapped in at the next poll: the same step on every rank, fixed by the poll
    # schedule (so a resumed run replays it exactly). A step waits only if a load takes longer than
    # a whole poll interval, and then only for the rest of it.
    loader: dict = {}  # {"version", "future", "t0"} of the version loading on this rank
    load_pool = None
    negatives_note: str | None = None  # set while the provider says its negatives are stale (and why)

    def poll_negatives() -> None:
        nonlocal negatives, negatives_note, load_pool
        if provider is None:
            return
        health = provider.health(step) if rank == 0 and hasattr(provider, "health") else {}
        newest = provider.latest_version() if rank == 0 else None
        health, newest = _all_gather_object((health, newest), world)[0]
        if health.get("error"):
            raise PipelineError(health["error"])  # the run fails with the producer's last error, never silently
        negatives_note = health.get("stale")
        if loader:
            t_wait = time.time()
            try:
                loaded, problem = loader["future"].result(), None
            except Exception as e:  # e.g. pruned meanwhile: say so, take the newest at this poll
                loaded, problem = None, f"{type(e).__name__}: {e}"
            problems = [p for p in _all_gather_object(problem, world) if p]
            if problems:
                if rank == 0:
                    print(f"[train] WARNING: negatives version {loader['version']} could not be loaded "
                          f"({problems[0]}); polling for the newest", flush=True)
            else:
                negatives = loaded
                negatives_log.append({"version": negatives.version, "at_step": step,
                                      "checkpoint_step": negatives.meta.get("checkpoint_step"),
                                      "dev_metric": negatives.meta.get("dev_metric"),
                                      "load_seconds": round(t_wait - loader["t0"], 3),
                                      "waited_seconds": round(time.time() - t_wait, 3)})
            loader.clear()
        if newest is not None and (negatives is None or newest > negatives.version):
            if load_pool is None:
                from concurrent.futures import ThreadPoolExecutor

                load_pool = ThreadPoolExecutor(1, thread_name_prefix="negatives-load")
            loader.update(version=newest, future=load_pool.submit(provider.load, newest), t0=time.time())

    stat_keys: set[str] = set()
    window: dict[str, float] = {}
    n_window, t_window = 0, time.time()
    t_start, step_start = time.time(), step
    # seconds spent validating and checkpointing: not training, so never in a steps/s (a window's
    # share in win_excluded, the run's in excluded)
    excluded = {"validation": 0.0, "checkpoint": 0.0}
    win_excluded = 0.0

    def report(extra: dict | None = None, checkpoint: bool = False, stopped_early: bool = False):
        nonlocal window, n_window, t_window, win_excluded
        gathered = _all_gather_object((window, n_window, sorted(stat_keys)), world)
        metrics = reduce_window([g[0] for g in gathered], [g[1] for g in gathered],
                                {k for g in gathered for k in g[2]})
        elapsed = time.time() - t_start - excluded["validation"] - excluded["checkpoint"]
        rate = (step - step_start) / max(elapsed, 1e-9)
        metrics.update({"step": step, "epoch": step / spe, "lr": scheduler.get_last_lr()[0], "amp": amp_used,
                        "steps_per_s": n_window / max(time.time() - t_window - win_excluded, 1e-9)})
        if negatives is not None:
            metrics["negatives_version"] = negatives.version
            if negatives.meta.get("checkpoint_step") is not None:
                metrics["negatives_staleness"] = step - int(negatives.meta["checkpoint_step"])
            if negatives.meta.get("dev_metric") is not None:
                metrics["refresher_dev_metric"] = float(negatives.meta["dev_metric"])
        if negatives_note:
            metrics["negatives_note"] = negatives_note
        metrics.update(extra or {})
        if rank == 0 and n_window:
            history.append({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
        if rank == 0 and progress_queue is not None:
            with contextlib.suppress(Exception):
                progress_queue.put_nowait({**metrics, "total": total, "eta_s": (total - step) / rate if rate else None})
        window, n_window, t_window, win_excluded = {}, 0, time.time(), 0.0
        if not checkpoint:
            session.report(metrics)
            return
        t_ckpt = time.time()
        try:
            _save_checkpoint(metrics, stopped_early)
        finally:
            spent = time.time() - t_ckpt
            excluded["checkpoint"] += spent
            win_excluded += spent

    def _save_checkpoint(metrics: dict, stopped_early: bool) -> None:
        if not all(torch.isfinite(p).all() for p in model.parameters()):  # same weights on every rank
            raise NonFiniteError(f"training stopped at step {step}: the model's weights hold NaN or inf "
                                 f"(optim.lr {job.optim.lr:g}), so no checkpoint is written. " + _stop_note(run_loc))
        rngs = _all_gather_object(_rng_state(), world)
        upload_batch_log()
        if rank != 0:
            session.report(metrics)
            return
        with session.checkpoint_folder() as tmp:
            model.save(Path(tmp) / "model")
            torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "scaler": scaler.state_dict() if scaler is not None else None, "rng": rngs,
                        "negatives_log": negatives_log,
                        "heads": model.heads.state_dict() if hasattr(model, "heads") else None},
                       Path(tmp) / "training_state.pt")
            (Path(tmp) / "config.yaml").write_text(dump_job(job))
            (Path(tmp) / "history.json").write_text(json.dumps(history))
            finalize_checkpoint(tmp, {"step": step, "epoch": step // spe, "step_in_epoch": step % spe,
                                      "steps_per_epoch": spe, "total_steps": total, "world_size": world,
                                      "global_batch": B * world, "batch_per_worker": B,
                                      "examples": loop_cfg["examples"], "identity": identity,
                                      "method": method.name, "loss": loop_cfg["job"]["loss"],
                                      "negatives_version": negatives.version if negatives is not None else None,
                                      "negatives_log": negatives_log, "versions": library_versions(),
                                      "precision": amp_used, "attention": identity["attention"],
                                      "stopped_early": stopped_early, "metrics": metrics})
            session.report(metrics, Path(tmp), checkpoint_dir_name(step))

    def validate() -> dict:
        nonlocal win_excluded
        if validate_fn is None:
            return {}
        t0 = time.time()
        out: dict = {}
        # a validator that splits its work (the spine's: each rank encodes its share of the passages) runs
        # on every rank; any other on rank 0 while the others wait
        split = world > 1 and getattr(validate_fn, "splits_across_ranks", False)
        if rank == 0 or split:
            model.eval()
            # the validator's progress (e.g. "encoding 2,048/5,183 passages") reaches the driver's terminal
            def forward(rec: dict) -> None:
                if progress_queue is not None:
                    progress_queue.put_nowait({"kind": "progress", "step": step, "stage": "validation", **rec})
            with progress.sink(forward if rank == 0 else None):
                if split:
                    out = validate_fn(model, part=(rank, world, lambda obj: _all_gather_object(obj, world)))
                else:
                    out = validate_fn(model)
            model.train()
        _barrier(world)
        spent = time.time() - t0
        excluded["validation"] += spent
        win_excluded += spent
        return out

    def stop_requested(extra: dict) -> bool:
        """The validation hook's `{"stop": True}` (rank 0), the same decision on every rank."""
        flag = bool(extra.pop("stop", False))
        return bool(_all_gather_object(flag, world)[0])

    from .grad_cache import GradCache, recording

    # train.grad_cache: the step's towers chunk by chunk, replayed for the gradient (train/grad_cache.py)
    cache = GradCache(tc.grad_cache_query_chunk, tc.grad_cache_doc_chunk, device) if tc.grad_cache else None
    stopped = False
    model.train()
    try:
        poll_negatives()
        while step < total and not stopped:
            epoch, skip = step // spe, step % spe
            for b_idx, batch in enumerate(method.batches(iter(rows), job, epoch, rank, spe)):
                if b_idx < skip:
                    continue  # trained before the checkpoint we resumed from
                if tc.fail_at_step and step + 1 == tc.fail_at_step and not fail_marker.exists():
                    # a failure between steps: every rank's last report is done (rank 0's checkpoint upload
                    # too) before any rank raises, else a fast rank kills the group mid-upload
                    _barrier(world)
                    if rank == 0:
                        fail_marker.touch()
                    raise RuntimeError(f"simulated failure at step {step + 1} (train.fail_at_step)")
                if step > step_start and step % tc.negatives_poll_every == 0:
                    poll_negatives()
                sctx = StepContext(job=job, device=device, rank=rank, world=world, step=step,
                                   rng=random.Random(tc.seed * 7919 + step), side=side, negatives=negatives)
                if cache is not None:  # train.grad_cache: the towers chunk by chunk, without a graph
                    with recording(model, cache), autocast():
                        out = method.forward(model, batch, sctx)
                else:
                    with autocast():
                        out = method.forward(ddp, batch, sctx)
                loss, terms = method.loss(method.assemble(out, sctx), job.loss, training=True)
                check_finite_loss(loss, terms, step + 1, lambda: _stop_note(run_loc))
                optimizer.zero_grad(set_to_none=True)
                if scaler is not None:
                    scaler.scale(loss).backward()
                    if cache is not None:
                        cache.replay(model, autocast, world)
                    scaler.unscale_(optimizer)
                else:
                    loss.backward()
                    if cache is not None:  # each chunk again, its cached gradient back-propagated
                        cache.replay(model, autocast, world)
                # the global gradient norm (the same on every rank after DDP's all-reduce), clipped when
                # optim.grad_clip is set; a non-finite one stops the run before the update is applied (with
                # fp16's GradScaler an overflow is expected: the scaler skips that step itself)
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), job.optim.grad_clip or float("inf"))
                if scaler is None and not torch.isfinite(norm):
                    raise NonFiniteError(f"training stopped at step {step + 1}: the gradient norm is {float(norm)} "
                                         f"(loss {float(loss.detach()):.6g}"
                                         + "".join(f", {k} {float(v):.6g}" for k, v in terms.items())
                                         + f"; optim.lr {job.optim.lr:g}); nothing of this step was applied. "
                                         + _stop_note(run_loc))
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                scheduler.step()
                step += 1
                if tc.step_sleep_s:
                    time.sleep(tc.step_sleep_s)
                if batch_log is not None:
                    batch_log.write(json.dumps({"step": step, "idx": [int(r["idx"]) for r in batch],
                                                "negatives_version": negatives.version if negatives else None}) + "\n")
                    batch_log.flush()
                window["loss"] = window.get("loss", 0.0) + float(loss.detach())
                for k, v in terms.items():
                    window[k] = window.get(k, 0.0) + float(v)
                for k, v in sctx.stats.items():
                    stat_keys.add(k)
                    window[k] = window.get(k, 0.0) + float(v)
                n_window += 1
                last = step >= total
                do_ckpt = last or (tc.checkpoint_every and step % tc.checkpoint_every == 0)
                do_eval = last or (tc.eval_every and step % tc.eval_every == 0)
                if do_ckpt or do_eval or step % tc.report_every == 0:
                    extra = validate() if do_eval else {}
                    if do_eval and validate_fn is not None and stop_requested(extra) and not last:
                        stopped, do_ckpt = True, True  # ends here on every rank; the checkpoint says so
                        extra["stopped_early"] = 1.0
                    if last or stopped:
                        extra["train_seconds"] = time.time() - t_start  # the loop's wall time, all of it
                        extra["loop_started_at"] = t_start  # wall clock: the driver splits its own time with it
                        extra["validation_seconds"] = excluded["validation"]
                        extra["checkpoint_seconds"] = excluded["checkpoint"]  # the last one not yet in it
                        extra["train_steps_run"] = step - step_start
                    report(extra, checkpoint=bool(do_ckpt), stopped_early=stopped)
                    if do_ckpt and tc.fail_after_checkpoint == step and not fail_marker.exists():
                        _barrier(world)
                        if rank == 0:
                            fail_marker.touch()
                        raise RuntimeError(f"simulated failure right after the checkpoint of step {step} "
                                           "(train.fail_after_checkpoint)")
                if last or stopped:
                    break
        if batch_log is not None:
            upload_batch_log()
    finally:
        # a worker that returns or raises leaves nothing in the machine's temporary folder
        if loader:  # a version still loading is released when its load ends
            loader["future"].add_done_callback(
                lambda f: f.cancelled() or f.exception() is not None or getattr(f.result(), "close", bool)())
        if load_pool is not None:
            load_pool.shutdown(wait=False, cancel_futures=True)
        if negatives is not None and hasattr(negatives, "close"):
            negatives.close()
        if batch_log is not None:
            batch_log.close()
        if log_local is not None:
            shutil.rmtree(log_local.parent, ignore_errors=True)
