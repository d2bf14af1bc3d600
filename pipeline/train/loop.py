"""`train_loop_per_worker`: the DDP training loop every Ray Train worker runs.

It knows a loss only by its registry key, gets validation as a function from above,
and resumes from `ray.train.get_checkpoint()` at the exact data position.
"""

from __future__ import annotations

import contextlib
import json
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ..config import dump_config, from_dict
from ..losses import get_loss
from ..losses.dist import gather_docs
from ..models import BiEncoder
from ..models.checkpoint import checkpoint_dir_name, finalize_checkpoint
from .batching import buffer_shuffle, epoch_rng, fixed_batches, pick_negatives
from .config import TrainJobConfig
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


def _amp(cfg, device: torch.device):
    """(autocast context factory, GradScaler or None) for the configured precision."""
    mode = cfg.train.amp
    if device.type != "cuda" or mode == "no":
        return contextlib.nullcontext, None
    if mode == "auto":
        mode = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    dtype = torch.bfloat16 if mode == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cuda") if mode == "fp16" else None
    return (lambda: torch.autocast("cuda", dtype=dtype)), scaler


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


def train_loop_per_worker(loop_cfg: dict) -> None:
    import ray.train
    import ray.train.torch

    job: TrainJobConfig = from_dict(TrainJobConfig, loop_cfg["job"])
    tc = job.train
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(tc.torch_threads or max(1, int(tc.cpus_per_worker)))
    random.seed(tc.seed + rank)
    np.random.seed(tc.seed + rank)
    torch.manual_seed(tc.seed + rank)
    spe, total = loop_cfg["steps_per_epoch"], loop_cfg["total_steps"]
    device = ray.train.torch.get_device()

    # ---- model, optimizer, schedule; restored from a checkpoint when resuming
    # A checkpoint from a restart inside this fit() (FailureConfig) wins over the one the
    # driver chose from an earlier, killed run (`train.resume`).
    ckpt = ray.train.get_checkpoint()
    if ckpt is None and loop_cfg.get("resume_from"):
        ckpt = ray.train.Checkpoint(loop_cfg["resume_from"])
    resume_state, train_state, history = None, None, []
    if ckpt is not None:
        with ckpt.as_directory() as d:
            resume_state = json.loads((Path(d) / "state.json").read_text())
            model = BiEncoder.load(replace(job.model, name_or_path=str(Path(d) / "model"), query_name_or_path=None))
            train_state = torch.load(Path(d) / "training_state.pt", map_location="cpu", weights_only=False)
            history = json.loads((Path(d) / "history.json").read_text())
        then = (resume_state["examples"], resume_state["world_size"], resume_state["steps_per_epoch"])
        if then != (loop_cfg["examples"], world, spe):
            raise RuntimeError(
                f"cannot resume: the checkpoint was made with {then[0]} examples, {then[1]} workers and {then[2]} "
                f"steps/epoch, this run has {loop_cfg['examples']}, {world} and {spe} "
                "(same data, workers and batch size are needed for an exact data position)")
    else:
        model = BiEncoder.load(job.model)
    model.to(device)
    ddp = ray.train.torch.prepare_model(model)
    optimizer = build_optimizer(model.named_parameters(), job.optim)
    scheduler = warmup_linear(optimizer, warmup_steps(job.optim, total), total)
    autocast, scaler = _amp(job, device)
    step = 0
    if train_state is not None:
        optimizer.load_state_dict(train_state["optimizer"])
        scheduler.load_state_dict(train_state["scheduler"])
        if scaler is not None and train_state.get("scaler"):
            scaler.load_state_dict(train_state["scaler"])
        _set_rng_state(train_state["rng"][rank])
        step = resume_state["step"]
    loss_fn = get_loss(job.loss.name)
    validate_fn = loop_cfg.get("validate_fn")
    shard = ray.train.get_dataset_shard(f"train_{rank}")
    h = job.data.hard_negatives
    B = tc.batch_size
    batch_log = None
    if tc.log_batches:
        log_dir = Path(loop_cfg["run_dir"]) / "batch_log"
        log_dir.mkdir(parents=True, exist_ok=True)
        batch_log = open(log_dir / f"rank{rank}.jsonl", "a")
    fail_marker = Path(loop_cfg["run_dir"]) / ".simulated_failure_done"

    window: dict[str, float] = {}
    n_window, t_window = 0, time.time()
    t_start, step_start = time.time(), step

    def report(extra: dict | None = None, checkpoint: bool = False):
        nonlocal window, n_window, t_window
        metrics = {k: v / max(n_window, 1) for k, v in window.items()}
        metrics.update({"step": step, "epoch": step / spe, "lr": scheduler.get_last_lr()[0],
                        "steps_per_s": n_window / max(time.time() - t_window, 1e-9)})
        metrics.update(extra or {})
        if rank == 0 and n_window:
            history.append({k: float(v) for k, v in metrics.items()})
        window, n_window, t_window = {}, 0, time.time()
        if not checkpoint:
            ray.train.report(metrics)
            return
        rngs = _all_gather_object(_rng_state(), world)
        if rank != 0:
            ray.train.report(metrics, checkpoint=None)
            return
        with tempfile.TemporaryDirectory() as tmp:
            model.save(Path(tmp) / "model")
            torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "scaler": scaler.state_dict() if scaler is not None else None, "rng": rngs},
                       Path(tmp) / "training_state.pt")
            (Path(tmp) / "config.yaml").write_text(dump_config(job))
            (Path(tmp) / "history.json").write_text(json.dumps(history))
            finalize_checkpoint(tmp, {"step": step, "epoch": step // spe, "step_in_epoch": step % spe,
                                      "steps_per_epoch": spe, "total_steps": total, "world_size": world,
                                      "global_batch": B * world, "batch_per_worker": B,
                                      "examples": loop_cfg["examples"], "metrics": metrics})
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp),
                             checkpoint_dir_name=checkpoint_dir_name(step))

    def validate() -> dict:
        if validate_fn is None:
            return {}
        out: dict = {}
        if rank == 0:
            model.eval()
            out = validate_fn(model)
            model.train()
        _barrier(world)
        return out

    model.train()
    while step < total:
        epoch, skip = step // spe, step % spe
        rows = (r for b in shard.iter_batches(batch_size=1024, batch_format="pandas") for r in b.to_dict("records"))
        erng = epoch_rng(tc.seed, epoch, rank)
        for b_idx, batch in enumerate(fixed_batches(buffer_shuffle(rows, job.data.shuffle_window, erng), B, spe)):
            if b_idx < skip:
                continue  # trained before the checkpoint we resumed from
            if tc.fail_at_step and step + 1 == tc.fail_at_step and not fail_marker.exists():
                if rank == 0:
                    fail_marker.touch()
                raise RuntimeError(f"simulated failure at step {step + 1} (train.fail_at_step)")
            nrng = random.Random(tc.seed * 7919 + step)
            queries = [r["query"] for r in batch]
            docs = [r["positive"] for r in batch] + [n for r in batch for n in pick_negatives(r, h, nrng)]
            q_tok = {k: v.to(device) for k, v in model.tokenize(queries, "query").items()}
            d_tok = {k: v.to(device) for k, v in model.tokenize(docs, "doc").items()}
            with autocast():
                q, d = ddp(q_tok, d_tok)  # each tower runs once per step
            q, d = q.float(), d.float()
            all_docs, pos_idx, G = gather_docs(d[:B], d[B:] if h else None)
            loss, terms = loss_fn(q, all_docs, pos_idx, job.loss, training=True, n_pos=G)
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            if job.optim.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), job.optim.grad_clip)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            step += 1
            if batch_log is not None:
                batch_log.write(json.dumps({"step": step, "idx": [int(r["idx"]) for r in batch]}) + "\n")
                batch_log.flush()
            window["loss"] = window.get("loss", 0.0) + float(loss)
            for k, v in terms.items():
                window[k] = window.get(k, 0.0) + float(v)
            n_window += 1
            last = step >= total
            do_ckpt = last or (tc.checkpoint_every and step % tc.checkpoint_every == 0)
            do_eval = last or (tc.eval_every and step % tc.eval_every == 0)
            if do_ckpt or do_eval or step % max(tc.report_every, 1) == 0:
                extra = validate() if do_eval else {}
                if last:
                    extra["train_seconds"] = time.time() - t_start
                    extra["train_steps_run"] = step - step_start
                report(extra, checkpoint=bool(do_ckpt))
            if last:
                break
    if batch_log is not None:
        batch_log.close()
