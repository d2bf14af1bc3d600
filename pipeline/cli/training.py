"""`pipeline train`, `refresh`, `tune` and `demo`: the trainers, ANCE's refresher alone, sweeps, the demo."""

from __future__ import annotations

from pathlib import Path

from ..errors import PipelineError
from .common import add_common_flags, add_config_args, batch_override, device_flag, fp16_refused, load_cfg

def cmd_train(args) -> None:
    from ..train.config import load_train_config  # torch-free: a config error is reported before torch loads

    extra = batch_override(args, "train.batch_size")
    device = device_flag(args, "training", cluster_ok=True)
    if device in ("cpu", "cuda"):
        extra.append(f"train.use_gpu={'true' if device == 'cuda' else 'false'}")
    job = load_train_config(args.config, extra + list(args.overrides))
    if args.fp16:
        if not job.train.use_gpu:
            raise fp16_refused("training", "--device cuda or train.use_gpu=true trains on GPUs; on CPU, train.amp=auto "
                               "trains in bf16 where the CPU has it natively")
        job = load_train_config(args.config, extra + ["train.amp=fp16"] + list(args.overrides))
    from ..index.validate import make_validator
    from ..train.dev_split import apply_dev_split
    from ..train.trainer import train

    if job.loss.name != "rcl":  # RCL splits its own dev share (rcl.dev_split)
        from ..models import BiEncoder
        from ..train.runner_choice import check_device, resolve_runner

        # the runner and device refusals first (train() makes them again): a refused run writes no split/
        check_device(job, resolve_runner(job))
        BiEncoder.load(job.model)  # a model that cannot load is refused before the split is written
        if job.loss.name in ("ance", "ance_dar"):
            from ..recipes.ance import check_ance_inputs

            check_ance_inputs(job)  # the refresher's inputs too: one line, before Ray or the split start
        job = apply_dev_split(job)  # validation.dev_split: held-out training queries, before the validator
    if job.loss.name in ("ance", "ance_dar"):
        from ..recipes.ance import run_ance

        run_ance(job, validate_fn=make_validator(job))
        return
    if job.loss.name == "rcl":  # RCL's stages (initial, entropy models, regulators, final): recipes/rcl.py
        from ..recipes.rcl import run_rcl

        run_rcl(job)
        return
    train(job, validate_fn=make_validator(job))


def cmd_refresh(args) -> None:
    from ..train.config import load_train_config

    job = load_train_config(args.config, list(args.overrides))
    from ..recipes.ance import refresh_command  # after the config: a config error never loads Ray or torch

    refresh_command(args.run_dir, job, once=args.once, idle_exit_s=args.idle_exit)


def cmd_tune(args) -> None:
    from ..tune.space import load_sweep_config

    if not args.config:
        raise PipelineError("tune needs --config SWEEP.yaml (see jobs/configs/tune_dar.yaml)")
    sweep = load_sweep_config(args.config, list(args.overrides))
    from ..tune.runner import run_sweep  # after the sweep file is checked: it imports Ray

    run_sweep(sweep, resume=args.resume)


def cmd_demo(args) -> None:
    cfg = load_cfg(args)
    from ..recipes.demo import run_demo  # after the config: a config error never loads torch

    run_demo(Path(args.out), cfg, fresh=args.fresh, train=not args.no_train)


def add_parsers(sub) -> None:
    """The train, refresh, tune, demo verbs."""
    p = sub.add_parser("train", help="train with Ray Train: any registered method (loss.name: dpr, dar, ance, ance_dar, ...)")
    add_common_flags(p, batch="examples per worker per step (= train.batch_size)",
                     fp16="compute precision: fp16 mixed precision with a gradient scaler (= train.amp=fp16); "
                          "needs GPU workers, refused on CPU (bf16 is train.amp=bf16). Not storage: weights, "
                          "checkpoints and the saved model stay float32",
                     device="train on CPUs or GPUs (= train.use_gpu)")
    add_config_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("refresh", help="ANCE index refresher alone, against a training run's checkpoints")
    p.add_argument("--run-dir", required=True, help="<train.storage_path>/<train.name> of the run to follow")
    p.add_argument("--once", action="store_true", help="refresh from the newest checkpoint once and exit")
    p.add_argument("--idle-exit", type=float, default=600.0, help="exit after this many seconds without a new checkpoint")
    add_config_args(p)
    p.set_defaults(func=cmd_refresh)

    p = sub.add_parser("tune", help="Ray Tune sweep over a trainer's config (ASHA, grid/random/optuna)")
    add_config_args(p)
    p.add_argument("--resume", action="store_true", help="continue the interrupted sweep in the config's output")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("demo", help="the whole flow on the bundled Python FAQ corpus")
    p.add_argument("--out", default="runs/demo", help="demo folder (default runs/demo); a re-run reuses finished steps")
    p.add_argument("--fresh", action="store_true", help="recompute every step")
    p.add_argument("--no-train", action="store_true", help="zero-shot only (skip the DPR/DAR fine-tuning)")
    add_config_args(p)
    p.set_defaults(func=cmd_demo)
