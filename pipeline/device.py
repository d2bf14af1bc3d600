"""Where the model runs: `--device cpu|cuda|auto` resolved against this machine (or a cluster).

Used by the CLI's verbs and the ARR evaluation; it imports nothing of the pipeline but its errors.
"""

from __future__ import annotations

import os

from .errors import PipelineError


def gpu_here() -> bool:
    """A CUDA GPU is visible to this process."""
    import torch

    return torch.cuda.is_available()


def on_remote_cluster(overrides=()) -> bool:
    """True when the work runs on a Ray cluster we connect to (RAY_ADDRESS or a `ray.address=`
    override): its GPUs are checked by Ray's resources, not by this machine."""
    if os.environ.get("RAY_ADDRESS", "local") != "local":
        return True
    return any(o.startswith("ray.address=") and o.split("=", 1)[1] not in ("", "null", "local") for o in overrides)


def resolve_device(device: str | None, what: str, remote: bool = False) -> str | None:
    """'cpu' | 'cuda' | 'auto' (a remote cluster decides) | None (not given). cuda without a visible
    GPU is a PipelineError, unless the work runs on a cluster we connect to (`remote`)."""
    if device is None:
        return None
    if device == "auto":
        return "cuda" if gpu_here() else ("auto" if remote else "cpu")
    if device == "cuda" and not remote and not gpu_here():
        raise PipelineError(f"--device cuda: no CUDA GPU is visible here (torch.cuda.is_available() is false), so "
                            f"{what} cannot run on one; use --device cpu (or auto)")
    return device
