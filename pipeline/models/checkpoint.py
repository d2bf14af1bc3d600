"""The training checkpoint format: read by the trainer (resume) and by refreshers/evaluation.

    <checkpoint>/model/               BiEncoder.save(): HF model dir(s), safetensors
    <checkpoint>/training_state.pt    optimizer, scheduler, scaler, RNG states of every rank
    <checkpoint>/config.yaml          the resolved run config
    <checkpoint>/history.json         per-report training metrics so far
    <checkpoint>/state.json           step, epoch, data position, and every file's size; written LAST

A checkpoint is complete when state.json parses and every file it lists exists
with the listed size, so a reader never trusts a half-copied checkpoint (Ray's
upload order is not ours), and tolerates checkpoints that vanish (rotation).
Readers take a local path or a storage URI (`pipeline/storage.py`: s3://, gs://, …).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

STATE_FILE = "state.json"
CHECKPOINT_RE = re.compile(r"^step-(\d+)$")


def checkpoint_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def finalize_checkpoint(folder: str | Path, state: dict) -> None:
    """Write state.json listing every file (relative path -> bytes) of `folder`."""
    folder = Path(folder)
    files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != STATE_FILE}
    tmp = folder / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps({**state, "files": files}, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, folder / STATE_FILE)


def _location(folder):
    """A local Path, or a storage.RemotePath for URIs (their listings go through pyarrow.fs)."""
    from ..storage import RemotePath, is_uri, resolve

    if isinstance(folder, RemotePath):
        return folder
    return resolve(folder) if is_uri(str(folder)) else Path(folder)


def read_state(folder) -> dict | None:
    """state.json of a complete checkpoint, or None if it is incomplete or gone."""
    folder = _location(folder)
    try:
        state = json.loads((folder / STATE_FILE).read_text())
        if isinstance(folder, Path):
            for rel, size in state["files"].items():
                if (folder / rel).stat().st_size != size:
                    return None
        else:  # one listing instead of a request per file
            sizes = folder.file_sizes()
            if any(sizes.get(rel) != size for rel, size in state["files"].items()):
                return None
    except (OSError, ValueError, KeyError):
        return None
    return state


def list_checkpoints(run_dir) -> list[tuple[int, Path]]:
    """Complete checkpoints under a run folder (a path or a storage URI), oldest first."""
    run_dir = _location(run_dir)
    if not run_dir.is_dir():
        return []
    found = []
    for child in run_dir.iterdir():
        m = CHECKPOINT_RE.match(child.name)
        if m and read_state(child) is not None:
            found.append((int(m.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def library_versions() -> dict:
    """Versions that decide whether a run can be reproduced: recorded in checkpoints and summaries."""
    import platform
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("pipeline", "torch", "transformers", "ray", "faiss-cpu", "faiss-gpu", "numpy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return out
