"""The output folder of `pipeline encode`: what may already be in it, and the lock one run holds on it.

`check_embeddings_output` refuses, before any work, a folder holding anything but embeddings this
tool wrote (a file, a corpus, an index, other files). `output_lock` then holds `<out>/.encode.lock`
(fcntl.flock) while the run writes a local folder, so a second encode into it is refused with one
line, having written nothing. `encode.py` re-exports both (and `LOCK_NAME`).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from ..errors import PipelineError
from ..io_utils import remove_empty_dirs
from .shards import META_NAME

_OWN_NAME = re.compile(r"^(embeddings\.json|shard-[\w-]+\.(npy|pids\.txt|done)|\.encode\.lock|\.tmp-.*|"
                       r"\.write-probe-.*|\.shared-probe-.*)$")
_OTHER_OUTPUTS = {"manifest.json": "an ingested corpus (pipeline ingest)", "index.json": "a FAISS index (pipeline index)",
                  "summary.json": "a training run (pipeline train)"}


def check_embeddings_output(out_dir) -> None:
    """`encode --out` follows the output rules of `ingest` and `index`: a new or empty folder, or
    one holding embeddings this tool wrote (continued or resumed there), and nothing else. A
    file, a corpus, an index or a folder of other files is refused, and nothing is written."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise PipelineError(f"{out_dir} is a file; give a folder for the embeddings (nothing was written)")
    names = sorted(p.name for p in out_dir.iterdir())
    for marker, what in _OTHER_OUTPUTS.items():
        if marker in names and META_NAME not in names:
            raise PipelineError(f"{out_dir} holds {what}; encode writes embeddings into a folder of their own. "
                                "Choose another --out; nothing was written or deleted.")
    others = [n for n in names if not _OWN_NAME.match(n)]
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        held = "embeddings, but also" if META_NAME in names else "no embeddings but"
        raise PipelineError(f"{out_dir} holds {held} {shown}; encode writes embeddings into a folder of their own. "
                            "Choose another --out (or move those away); nothing was written or deleted.")


LOCK_NAME = ".encode.lock"


@contextlib.contextmanager
def output_lock(out_dir, created: list[Path]):
    """An exclusive lock (fcntl.flock on `<out>/.encode.lock`) held while one encode writes a local folder
    (a path or a file:// shared filesystem); a second encode into it is refused with one line, having
    written nothing. Object-store outputs take no lock (nothing to flock there). The lock file goes when the
    run ends, and a failed run that made the folder leaves no empty folder behind (`created`)."""
    if not isinstance(out_dir, Path):
        yield
        return
    fd = _take_lock(out_dir, created)
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(out_dir / LOCK_NAME)  # while held: a run that opened this file sees it is gone and retries
        os.close(fd)
        if failed:
            remove_empty_dirs(created)


def _take_lock(out_dir: Path, created: list[Path]) -> int:
    import fcntl

    path = out_dir / LOCK_NAME
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PipelineError(f"{out_dir}: cannot create the output folder ({e.strerror or e})") from None
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            remove_empty_dirs(created)
            raise PipelineError(f"{out_dir}: cannot write the output folder ({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise PipelineError(f"{out_dir}: another pipeline encode is writing into this folder (it holds "
                                f"{LOCK_NAME}); wait for it to finish, or give another --out. Nothing was "
                                "written.") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the run that held it finished and removed the file in between: take the new one
