"""What every verb shares: --config and key=value overrides, the --batch-size/--fp16/--device
shorthands and their checks.

--batch-size, --fp16 and --device are shorthands for config keys (trailing key=value overrides still win):
  encode   --batch-size -> encode.batch_size   --fp16 -> encode.precision=fp16   --device -> encode.gpus_per_actor
  retrieve --batch-size -> retrieve.batch_size                                    --device -> the query model's device
  train    --batch-size -> train.batch_size    --fp16 -> train.amp=fp16          --device -> train.use_gpu
  index                                                                           --device -> index.use_gpu
  sts      --batch-size                                                           --device -> the model's device
--fp16 is *compute* precision (autocast) and needs a GPU; it is refused on CPU. encode.fp16=true is *storage*
precision (the vectors written as float16), a separate choice.

Verbs whose positionals are files (evaluate QRELS RUN, compare RUN ...) take the trailing overrides among
them (`FilesAndOverrides`): a dotted `section.key=value` that names no existing file is an override.

Nothing here imports more than the config system: `--help`, `--version` and a config error never load
torch, transformers or Ray (each verb imports its library after its config has loaded).
"""

from __future__ import annotations

import argparse
import os
import re

from ..device import on_remote_cluster, resolve_device
from ..errors import PipelineError

OVERRIDE = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)+=")


def is_override(word: str) -> bool:
    """`section.key=value` (a dotted key, then `=`) that is not the name of an existing file."""
    return bool(OVERRIDE.match(word)) and not os.path.exists(word)


class VerbParser(argparse.ArgumentParser):
    """A verb's parser: `section.key=value` overrides are taken wherever they stand, also after options that
    follow the verb's positionals (`compare a.trec b.trec --qrels q eval.rel_level=2`), which plain argparse
    reports as unrecognized (it reads one positional list once)."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and isinstance(getattr(namespace, "overrides", None), list):
            namespace.overrides = namespace.overrides + [e for e in extras if is_override(e)]
            extras = [e for e in extras if not is_override(e)]
        return namespace, extras


class FilesAndOverrides(argparse.Action):
    """A positional list of files that also takes the verb's trailing `section.key=value` overrides (one
    positional list: argparse cannot tell two apart). The files go to `dest`, the overrides to
    `args.overrides`, after any given before (compare's --set)."""

    def __call__(self, parser, namespace, values, option_string=None):
        values = list(values or [])
        setattr(namespace, self.dest, [v for v in values if not is_override(v)])
        setattr(namespace, "overrides", list(getattr(namespace, "overrides", None) or [])
                + [v for v in values if is_override(v)])

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
