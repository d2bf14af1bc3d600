"""The CPU a benchmark ran on, printed first by every benchmark (figures depend on its ISA: bf16 is a
real lever with AMX or AVX512-BF16 and emulated, slow, with AVX2 only)."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

# what caps the kernels below the CPU's ISA: oneDNN's (torch's and OpenVINO's), MKL's and ATen's own; an
# AVX512 CPU run under all three at AVX2 stands in for an AVX2-only one (ONNX Runtime's MLAS has no such cap)
CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")
ISA = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"), ("avx512_vnni", "AVX512-VNNI"),
       ("avx512f", "AVX512F"), ("avx2", "AVX2"))


def cpu_line() -> str:
    """`CPU: AMD EPYC (family 26), 2 cores; ISA: AVX512-BF16, AVX512-VNNI, AVX512F, AVX2 (no AMX-BF16)`."""
    model, family, flags = "unknown CPU", None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key == "cpu family" and family is None:
                family = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    have = [name for flag, name in ISA if flag in flags]
    missing = [name for flag, name in ISA if flag not in flags]
    fam = f" (family {family})" if family else ""
    caps = [f"{var}={os.environ[var]}" for var in CAPS if os.environ.get(var)]
    return (f"CPU: {model}{fam}, {os.cpu_count()} cores; ISA: {', '.join(have) or 'none of the listed'}"
            + (f" (no {', '.join(missing)})" if missing else "")
            + (f"; kernels capped: {' '.join(caps)}" if caps else ""))


def print_cpu() -> None:
    print(cpu_line(), flush=True)


def scratch(prefix: str) -> Path:
    """A temporary folder for a benchmark's models, corpora and indexes, removed when it exits
    (BENCH_KEEP=1 keeps it, to look at)."""
    import atexit
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    if not os.environ.get("BENCH_KEEP"):
        atexit.register(shutil.rmtree, folder, True)
    return folder


def parse_size(text: str) -> int:
    """A count as benchmarks take it: `100k`, `1m`, `2.5m`, `250000`."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 100k, 1m, 3m, 250000)")
    return int(float(m.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000}[m.group(2).lower()])
