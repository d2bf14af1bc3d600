"""Where a figure came from: the machine (CPU and its ISA flags, cores, memory, GPU), the commit and the
library versions. Every result file the reproduction matrix writes records them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ISA_FLAGS = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8", "avx512_fp16"}


def machine() -> dict:
    import platform

    info = {"cpu": platform.processor() or "", "cores": os.cpu_count(), "isa": [], "gpu": None}
    try:
        text = Path("/proc/cpuinfo").read_text()
        info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")),
                           info["cpu"])
        flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))
        info["isa"] = sorted(flags & ISA_FLAGS)
    except OSError:
        pass
    try:
        import psutil

        info["memory_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return info


def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def commit() -> str | None:
    """HEAD of the repository the package runs from, with "+changes" when tracked files differ from it."""
    root = repo_root()
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return (out.stdout.strip() + ("+changes" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def commits_since(sha: str | None) -> int | None:
    """How many commits HEAD is ahead of `sha` (None when unknown: no git, or a commit not in this history)."""
    if not sha:
        return None
    sha = sha.split("+")[0]
    try:
        out = subprocess.run(["git", "rev-list", "--count", f"{sha}..HEAD"], cwd=repo_root(), capture_output=True,
                             text=True, timeout=10)
        return int(out.stdout.strip()) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def changed_since(sha: str | None, paths: list[str]) -> bool | None:
    """Whether any of `paths` (relative to the repository) changed between `sha` and HEAD (None: unknown)."""
    if not sha:
        return None
    try:
        out = subprocess.run(["git", "diff", "--quiet", sha.split("+")[0], "HEAD", "--", *paths], cwd=repo_root(),
                             capture_output=True, timeout=20)
        return {0: False, 1: True}.get(out.returncode)
    except (OSError, subprocess.SubprocessError):
        return None


CODE_DIRS = ("pipeline", "jobs/configs")


def code_digest(root: Path | None = None) -> str:
    """A digest of the code a reproduction runs (every file under pipeline/ and jobs/configs/, by path and
    content, caches left out): equal digests mean the same code, with or without git."""
    import hashlib

    root = Path(root) if root is not None else repo_root()
    h = hashlib.sha256()
    for d in CODE_DIRS:
        for p in sorted((root / d).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
                h.update(str(p.relative_to(root)).encode() + b"\0")
                h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]
