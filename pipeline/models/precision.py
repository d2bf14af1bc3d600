"""Compute precision: `auto` resolved to what the hardware does natively (bf16 on AMX/AVX512-BF16
CPUs and bf16 GPUs, else fp32)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    import torch


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


# oneDNN's instruction-set levels, lowest first, as ONEDNN_MAX_CPU_ISA names them: the cap torch's and
# OpenVINO's oneDNN kernels honour (an AVX512-BF16 CPU capped at AVX2 runs no bf16 kernel; OpenVINO then
# refuses a bf16 graph)
ONEDNN_ISA = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
              "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX", "AVX10_1_512_AMX",
              "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2")


def onednn_isa_cap() -> str | None:
    """ONEDNN_MAX_CPU_ISA (or its older name DNNL_MAX_CPU_ISA) when it caps the kernels at a known level;
    None when unset, ALL/DEFAULT or a name oneDNN does not use."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    return cap if cap in ONEDNN_ISA else None


def _allowed(level: str) -> bool:
    cap = onednn_isa_cap()
    return cap is None or ONEDNN_ISA.index(cap) >= ONEDNN_ISA.index(level)


def cpu_has_vnni(cpuinfo: str | None = None) -> bool:
    """True when the CPU has int8 dot-product instructions (AVX512-VNNI, AVX-VNNI or AMX-INT8) and oneDNN's
    cap lets them run; without them int8 matmuls go through AVX2's 16-bit saturating path: no faster than
    fp32, and less exact."""
    flags = _cpu_flags(cpuinfo)
    return bool((_allowed("AVX512_CORE_VNNI") and flags & {"avx512_vnni", "amx_int8"})
                or (_allowed("AVX2_VNNI") and "avx_vnni" in flags))


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU has native bf16 matmuls (AMX-BF16 or AVX512-BF16 in /proc/cpuinfo flags) and oneDNN's
    cap (ONEDNN_MAX_CPU_ISA) lets them run."""
    return _allowed("AVX512_CORE_BF16") and bool(_cpu_flags(cpuinfo) & {"amx_bf16", "avx512_bf16"})


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
    import torch  # here, not at the top: `pipeline index` reads this module's constants without torch

    device = torch.device(device)
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu":
        return "bf16" if cpu_has_bf16(cpuinfo) else "fp32"
    return "fp32"
