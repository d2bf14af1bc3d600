"""What every verb shares: --config and key=value overrides, the --batch-size/--fp16/--device
shorthands and their checks.

--batch-size, --fp16 and --device are shorthands for config keys (trailing key=value overrides still win):
  encode   --batch-size -> encode.batch_size   --fp16 -> encode.precision=fp16   --device -> encode.gpus_per_actor
  retrieve --batch-size -> retrieve.batch_size                                    --device -> the query model's device
  train    --batch-size -> train.batch_size    --fp16 -> train.amp=fp16          --device -> train.use_gpu
  index                                                                           --device -> index.use_gpu
  sts      --batch-size                                                           --device -> the model's device
--fp16 means fp16 *compute* (autocast) and needs a GPU; it is refused on CPU. Stored float16 vectors are
encode.fp16=true, a separate choice.
"""

from __future__ import annotations

import argparse

from ..device import on_remote_cluster, resolve_device
from ..errors import PipelineError

DEVICE_HELP = "cpu, cuda or auto (a GPU when one is visible here); cuda without a GPU is an error"


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (see jobs/configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. encode.batch_size=128")


def load_cfg(args, extra: list[str] | None = None):
    """The pipeline config of --config + `extra` + the trailing overrides (these win)."""
    from ..config import load_config

    return load_config(args.config, list(extra or []) + list(args.overrides))


def add_common_flags(p: argparse.ArgumentParser, batch: str | None = None, fp16: str | None = None,
                     device: str | None = None) -> None:
    if batch:
        p.add_argument("--batch-size", type=int, help=batch)
    if fp16:
        p.add_argument("--fp16", action="store_true", help=fp16)
    if device:
        p.add_argument("--device", choices=("cpu", "cuda", "auto"), help=f"{device}: {DEVICE_HELP}")


def device_flag(args, what: str, cluster_ok: bool = False) -> str | None:
    """--device resolved (device.resolve_device); with `cluster_ok`, a run on a Ray cluster we
    connect to may ask for cuda without a GPU here (Ray's resource check verifies the cluster's)."""
    remote = cluster_ok and on_remote_cluster(getattr(args, "overrides", ()))
    return resolve_device(getattr(args, "device", None), what, remote)


def batch_override(args, key: str) -> list[str]:
    b = getattr(args, "batch_size", None)
    if b is None:
        return []
    if b < 1:
        raise PipelineError(f"--batch-size must be a positive integer, got {b}")
    return [f"{key}={b}"]


def fp16_refused(what: str, alt: str) -> PipelineError:
    return PipelineError(f"--fp16 is fp16 compute, which needs a GPU; {what} runs on CPU here ({alt})")
