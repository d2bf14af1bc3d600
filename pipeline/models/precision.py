"""Compute precision: `auto` resolved to what the hardware does natively (bf16 on AMX/AVX512-BF16
CPUs and bf16 GPUs, else fp32)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import ConfigError


PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU has native bf16 matmuls (AMX-BF16 or AVX512-BF16 in /proc/cpuinfo flags)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[-1].split())
            return bool(flags & {"amx_bf16", "avx512_bf16"})
    return False


def resolve_precision(precision: str, device: str | torch.device = "cpu", cpuinfo: str | None = None) -> str:
    """`auto` -> `bf16` where the hardware computes it natively (CUDA with bf16, or a CPU with
    AMX/AVX512-BF16), else `fp32`; an explicit `fp32`/`bf16`/`fp16` is returned as is."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r}: expected one of {list(PRECISIONS)}")
    if precision != "auto":
        return precision
    device = torch.device(device)
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu":
        return "bf16" if cpu_has_bf16(cpuinfo) else "fp32"
    return "fp32"
