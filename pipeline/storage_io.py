"""Files and folders on either kind of location (a local `Path` or a `RemotePath`): reads, writes that are
complete or absent, folder copies (upload, download, across stores), and the local staging folder that
stands for a remote location.

Writes are "complete or absent": on object stores (S3, GCS) one object appears only when
its upload has finished, so an object is written in place; on filesystems that can
rename, under a temporary name and then moved. Folders get their files first and a
completion marker last (`upload_dir(..., marker=...)`), and readers trust only folders
with the marker (or, for checkpoints, a state.json listing every file's size).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from .remote_path import Location, RemotePath


def read_json(location: Location):
    return json.loads(location.read_text())


def write_bytes_atomic(location: Location, data: bytes) -> None:
    if isinstance(location, RemotePath):
        location.write_bytes(data)
        return
    from .io_utils import atomic_path

    location.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(location) as tmp:
        Path(tmp).write_bytes(data)


def write_text_atomic(location: Location, text: str) -> None:
    write_bytes_atomic(location, text.encode("utf-8"))


def write_json_atomic(location: Location, obj) -> None:
    write_text_atomic(location, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def remove(location: Location) -> None:
    """Remove a file or a folder at either kind of location. What is already gone is no error: a killed
    writer's temporary may vanish while it is removed (its writer, still dying, finishing or cleaning up)."""
    if isinstance(location, RemotePath):
        if location.is_dir():
            location.rmtree()
        else:
            location.unlink(missing_ok=True)
        return
    from .io_utils import remove_path

    remove_path(location)


def rmtree(location: Location) -> None:
    if isinstance(location, RemotePath):
        location.rmtree()
    else:
        shutil.rmtree(location, ignore_errors=True)


def upload_dir(local_dir: str | Path, dest: Location, marker: str | None = None) -> None:
    """Copy a local folder to `dest` (files first, then `marker` if given, written last)."""
    local_dir = Path(local_dir)
    files = sorted(p for p in local_dir.rglob("*") if p.is_file() and (marker is None or p.name != marker))
    if isinstance(dest, Path):
        for p in files:
            (dest / p.relative_to(local_dir)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest / p.relative_to(local_dir))
    else:
        import pyarrow.fs as pafs

        dest.mkdir()
        for p in files:
            pafs.copy_files(str(p), (dest / str(p.relative_to(local_dir))).path,
                            source_filesystem=pafs.LocalFileSystem(), destination_filesystem=dest.fs)
    if marker is not None:
        src = local_dir / marker
        write_bytes_atomic(dest / marker, src.read_bytes() if src.exists() else b"ok\n")


def download_dir(src: Location, local_dir: str | Path) -> Path:
    """Copy a folder (local or remote) into `local_dir` (made if missing); returns `local_dir`."""
    local_dir = Path(local_dir)
    local_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(src, Path):
        shutil.copytree(src, local_dir, dirs_exist_ok=True)
        return local_dir
    import pyarrow.fs as pafs

    for rel in sorted(src.file_sizes()):
        (local_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        pafs.copy_files((src / rel).path, str(local_dir / rel), source_filesystem=src.fs,
                        destination_filesystem=pafs.LocalFileSystem())
    return local_dir


def copy_dir(src: Location, dst: Location) -> None:
    """Folder to folder, across any two locations (remote -> remote copies through this process)."""
    if isinstance(src, Path):
        upload_dir(src, dst)
        return
    if isinstance(dst, Path):
        download_dir(src, dst)
        return
    import pyarrow.fs as pafs

    for rel in sorted(src.file_sizes()):
        pafs.copy_files((src / rel).path, (dst / rel).path, source_filesystem=src.fs, destination_filesystem=dst.fs)


def staging_root() -> Path:
    """Where this machine keeps its local copies of remote locations (a cache: safe to delete):
    $PIPELINE_STAGING_DIR, else <tmp>/pipeline-staging."""
    return Path(os.environ.get("PIPELINE_STAGING_DIR") or Path(tempfile.gettempdir()) / "pipeline-staging")


def staging_dir(location: Location, kind: str = "runs") -> Path:
    """A local working folder that stands for a remote location on this machine (a cache:
    safe to delete), under `staging_root()`."""
    root = staging_root()
    key = hashlib.sha256(str(location).encode()).hexdigest()[:16]
    name = location.name if location.name else "root"
    out = root / kind / f"{name}-{key}"
    out.mkdir(parents=True, exist_ok=True)
    return out

