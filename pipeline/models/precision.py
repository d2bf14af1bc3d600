"""Compute precision: `auto` resolved to what the hardware does natively (bf16 on AMX/AVX512-BF16
CPUs and bf16 GPUs, else fp32)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import ConfigError


PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def _cpu_flags(cpuinfo: str | None = None) -> set[str]:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[-1].split())
    return set()


def cpu_has_vnni(cpuinfo: str | None = None) -> bool:
    """True when the CPU has int8 dot-product instructions (AVX512-VNNI, AVX-VNNI or AMX-INT8); without
    them int8 matmuls go through AVX2's 16-bit saturating path: no faster than fp32, and less exact."""
    return bool(_cpu_flags(cpuinfo) & {"avx512_vnni", "avx_vnni", "amx_int8"})


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


QUERY_PRECISION = "fp32"


def query_precision() -> str:
    """The one precision every query is encoded in, by torch, whatever its index holds (documents in
    fp32, bf16, fp16 or int8), for every caller: `pipeline retrieve`, `Searcher`, `QueryEncoder` and
    the validation inside training.

    Why fp32 and not the documents' precision: (1) a query's vector must not depend on the batch it is
    in; under bf16/fp16 autocast it does (the padding of the batch changes the rounding), in fp32 it
    holds to ~1e-6; (2) it is what sentence-transformers and pyserini compute, so their encoders on our
    index rank as `retrieve` does; (3) queries are short and few next to a corpus, so fp32 costs little
    (the FAQ's 176 queries: well under a second); (4) for an int8 index, the int8 tower on the query too
    would add its error on both sides (FAQ, MiniLM: test nDCG@10 0.8812 with fp32 queries vs 0.8813
    for all-fp32)."""
    return QUERY_PRECISION


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
