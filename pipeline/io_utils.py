"""Atomic writes, output-path checks and hashing: nothing a user has is lost, nothing is half-written.

* `atomic_path(path)` yields a temporary path beside `path` and puts it in place only on
  success. A file is replaced by one `rename`. A directory is replaced by one atomic
  exchange (Linux `renameat2(RENAME_EXCHANGE)`), so the old output stays readable until
  the new one is complete, and there is never a moment without either. Where the
  exchange is not supported it falls back to two renames, undone if the second fails.
* Temporaries carry the writer's pid (`.tmp-<name>-<pid>-<rand>`, `.old-<name>-<pid>-<rand>`).
  The next write of the same path removes those of dead writers; a `.old-*` left with no
  output at the path (a kill between the two fallback renames) is put back first. Either
  is reported on stderr in one line.
* `check_output(path, kind, overwrite)` refuses an output path that holds anything but
  this tool's own output of that kind, and the tool's own output unless `overwrite`.
* A command run again as it was run (`is_rerun`) computes its result beside the output and
  keeps the output when the two are the same (`same_output`, `write_json_rerun`), refusing
  when they differ (`refuse_different`): nothing is replaced without `overwrite`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .errors import PipelineError


class OutputError(PipelineError):
    """An output path that cannot be written without losing or corrupting something."""


# --------------------------------------------------------------------------- atomic writes

_TEMP_RE = re.compile(r"^\.(?P<kind>tmp|old)-(?P<name>.+)-(?P<pid>\d+)-(?P<rand>[0-9a-f]{8})$")
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_exchange_ok: bool | None = None  # None = not tried yet


def _temp_name(kind: str, name: str) -> str:
    return f".{kind}-{name}-{os.getpid()}-{secrets.token_hex(4)}"


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_path(p: Path) -> None:
    """Remove a local file or folder; what is already gone is no error."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def recover_stale(path: str | os.PathLike, report: bool = True) -> list[str]:
    """Clean up after killed writers of `path`: restore a lost output from `.old-*`, drop the rest.

    Only temporaries whose writer pid is dead are touched. Returns what was done
    (one entry per action) and prints it on stderr in one line when `report`.
    """
    path = Path(path)
    parent = path.parent
    try:
        entries = list(os.scandir(parent))
    except (FileNotFoundError, NotADirectoryError):
        return []
    stale: list[tuple[str, Path]] = []
    for e in entries:
        m = _TEMP_RE.match(e.name)
        if m and m["name"] == path.name and not _pid_alive(int(m["pid"])):
            stale.append((m["kind"], Path(e.path)))
    if not stale:
        return []
    actions = []
    if not path.exists() and not path.is_symlink():
        olds = sorted((p for k, p in stale if k == "old"), key=lambda p: p.stat().st_mtime, reverse=True)
        if olds:
            os.replace(olds[0], path)
            actions.append(f"restored the previous output from {olds[0].name}")
            stale = [(k, p) for k, p in stale if p != olds[0]]
    for _, p in stale:
        remove_path(p)
    if stale:
        actions.append(f"removed {len(stale)} stale temporar{'y' if len(stale) == 1 else 'ies'} of a killed run "
                       f"({', '.join(sorted(p.name for _, p in stale))})")
    if report and actions:
        print(f"[cleanup] {path}: {'; '.join(actions)}", file=sys.stderr, flush=True)
    return actions


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap `a` and `b` (both must exist). False when the platform/filesystem can't."""
    global _exchange_ok
    if _exchange_ok is False or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        _exchange_ok = False
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        _exchange_ok = True
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EXDEV, errno.EPERM):
        return False  # this filesystem can't; another might (don't cache)
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(new: Path, path: Path) -> None:
    """Put directory `new` at `path`, where a directory already is; old content removed after."""
    if _exchange(new, path):
        remove_path(new)  # `new` now holds the old content
        return
    old = path.with_name(_temp_name("old", path.name))
    os.replace(path, old)
    try:
        os.replace(new, path)
    except BaseException:
        os.replace(old, path)  # undo: the old output goes back
        raise
    remove_path(old)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; put it at `path` only when the block succeeds.

    Works for files and directories (whatever the block creates at the yielded path).
    The temporary folder starts with '.tmp-', so readers that list a folder can ignore
    it. A file is never replaced by a directory or the other way round.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        recover_stale(path)
        tmp = path.parent / _temp_name("tmp", path.name)
        tmp.mkdir()
    except OSError as e:
        raise OutputError(f"{path}: cannot write here ({e.strerror or e}); nothing was written") from None
    target = tmp / path.name
    try:
        yield target
        if not target.exists() and not target.is_symlink():
            raise OutputError(f"{path}: nothing was written")
        if path.exists() and not path.is_symlink():
            if path.is_dir() != (target.is_dir() and not target.is_symlink()):
                have, new = ("directory", "file") if path.is_dir() else ("file", "directory")
                raise OutputError(f"{path} is a {have}; refusing to replace it by a {new}")
            if path.is_dir():
                replace_dir(target, path)
            else:
                os.replace(target, path)
        else:
            os.replace(target, path)
        _fsync_dir(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


# --------------------------------------------------------------------------- output checks

@dataclass(frozen=True)
class OutputKind:
    """What this tool's own output of one kind looks like on disk.

    A directory kind is recognised by its `marker` file and may hold only `allowed`
    names (glob patterns) besides; a file kind by `is_own(path)`.
    """

    name: str
    is_dir: bool
    what: str
    marker: str = ""
    allowed: tuple[str, ...] = ()
    is_own: Callable[[Path], bool] | None = None
    companions: tuple[str, ...] = field(default=())  # files beside a file output (suffixes)


def _is_own_run(path: Path) -> bool:
    meta = Path(str(path) + ".meta.json")
    if not meta.is_file():
        return False
    try:
        m = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and "n_queries" in m and "top_k" in m


def _is_own_metrics(path: Path) -> bool:
    try:
        if path.stat().st_size > 1 << 30:
            return False
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and "metrics" in m and "queries" in m


OUTPUT_KINDS: dict[str, OutputKind] = {}


def register_output_kind(kind: OutputKind) -> None:
    OUTPUT_KINDS[kind.name] = kind


register_output_kind(OutputKind("index", True, "a FAISS index (pipeline index)", marker="index.json",
                                allowed=("index.faiss", "pids.txt", "index", "docid", "part-[0-9][0-9][0-9]",
                                         "trained.faiss")))
register_output_kind(OutputKind("run", False, "a TREC run (pipeline retrieve)", is_own=_is_own_run,
                                companions=(".meta.json",)))
register_output_kind(OutputKind("metrics", False, "a metrics JSON (pipeline evaluate)", is_own=_is_own_metrics))


def _writable_parent(path: Path) -> None:
    """The nearest existing ancestor must be a directory we can write into."""
    anc = path.parent
    while not anc.exists() and anc != anc.parent:
        if anc.is_symlink():
            raise OutputError(f"{path}: {anc} is a broken symbolic link")
        anc = anc.parent
    if not anc.is_dir():
        raise OutputError(f"{path}: {anc} is not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: cannot write in {anc} (permission denied or read-only filesystem)")
    try:
        if os.statvfs(anc).f_flag & os.ST_RDONLY:
            raise OutputError(f"{path}: {anc} is on a read-only filesystem")
    except (AttributeError, OSError):
        pass


def check_output(path: str | os.PathLike, kind: str, overwrite: bool = False) -> bool:
    """Refuse `path` unless writing there loses nothing; True when it replaces our own output.

    * nothing there (or an empty directory, for a directory kind): fine;
    * this tool's own output of `kind`, holding nothing else: fine with `overwrite`,
      refused without;
    * anything else (a file where a folder goes, a folder where a file goes, a folder
      with other content, a file the tool did not write): refused, whatever `overwrite`.

    Nothing of the user's is written or deleted. What killed writers of `path` left is
    recovered first (`recover_stale`: a lost output restored, temporaries removed, reported),
    so the check sees what the path really holds.
    """
    spec = OUTPUT_KINDS[kind]
    path = Path(path)
    flag = "--overwrite"
    _writable_parent(path)
    try:
        recover_stale(path)
    except OSError:
        pass  # best effort; atomic_path retries it
    if not path.exists() and not path.is_symlink():
        if not spec.is_dir:
            for suffix in spec.companions:
                comp = Path(str(path) + suffix)
                if comp.is_dir():
                    raise OutputError(f"{comp} is a directory; {path} needs that name for its metadata file. "
                                      "Nothing was written.")
        return False
    if path.is_symlink() and not path.exists():
        raise OutputError(f"{path} is a broken symbolic link; remove it or choose another output path. "
                          "Nothing was written.")
    if spec.is_dir:
        if not path.is_dir():
            raise OutputError(f"{path} is a file, not a folder: {spec.what} is written as a folder. "
                              "Choose another output path; nothing was written.")
        try:
            names = sorted(os.listdir(path))
        except OSError as e:
            raise OutputError(f"{path}: cannot list it ({e.strerror})") from None
        names = [n for n in names if not _TEMP_RE.match(n)]
        if not names:
            return False
        if spec.marker not in names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise OutputError(f"{path} already exists and is not {spec.what} (it holds {shown}); "
                              "refusing to replace it. Choose another output path; nothing was written or deleted.")
        import fnmatch

        others = [n for n in names if n != spec.marker and not any(fnmatch.fnmatch(n, a) for a in spec.allowed)]
        if others:
            shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            raise OutputError(f"{path} holds {spec.what} but also {shown}, which replacing it would delete; "
                              "move those away or choose another output path. Nothing was written or deleted.")
        if not overwrite:
            raise OutputError(f"{path} already holds {spec.what}; pass {flag} to replace it "
                              "(nothing was written)")
        return True
    if path.is_dir():
        raise OutputError(f"{path} is a directory: {spec.what} is written as a file. "
                          "Choose a file path; nothing was written.")
    for suffix in spec.companions:
        comp = Path(str(path) + suffix)
        if comp.is_dir():
            raise OutputError(f"{comp} is a directory; {path} needs that name for its metadata file. "
                              "Nothing was written.")
    if spec.is_own is None or not spec.is_own(path):
        raise OutputError(f"{path} already exists and is not {spec.what}; refusing to replace it. "
                          "Choose another output path; nothing was written.")
    if not overwrite:
        raise OutputError(f"{path} already holds {spec.what}; pass {flag} to replace it (nothing was written)")
    return True


# --------------------------------------------------------------------------- re-runs

def is_rerun(path: str | os.PathLike, kind: str, overwrite: bool) -> bool:
    """`check_output`, except that this tool's own output of `kind` at `path` is no error without `overwrite`:
    True then. The caller computes its result beside it (`scratch_beside`) and keeps what is there when the two
    are the same (`same_output`), refusing when they differ (`refuse_different`): a command run again as it
    was run does nothing and says so, as `encode` and `train` keep the work already done."""
    return check_output(path, kind, overwrite=True) and not overwrite


@contextlib.contextmanager
def scratch_beside(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside `path` (`.tmp-<name>-<pid>-<rand>`: what a killed writer leaves is removed by
    the next write of `path`), removed when the block ends."""
    path = Path(path)
    tmp = path.parent / _temp_name("tmp", path.name)
    try:
        yield tmp
    finally:
        remove_path(tmp)


def same_output(a: str | os.PathLike, b: str | os.PathLike, ignore: tuple[str, ...] = ()) -> bool:
    """Whether file or folder `a` holds what `b` holds, byte for byte (a folder: the same files at the same
    places; names in `ignore` are left out of a folder's comparison)."""
    import filecmp

    a, b = Path(a), Path(b)
    if a.is_dir() != b.is_dir():
        return False
    if not a.is_dir():
        return filecmp.cmp(a, b, shallow=False)
    fa = {rel: p for rel, p in tree_files(a) if rel not in ignore}
    fb = {rel: p for rel, p in tree_files(b) if rel not in ignore}
    return fa.keys() == fb.keys() and all(filecmp.cmp(fa[r], fb[r], shallow=False) for r in fa)


def request_differs(recorded: dict, asked: dict) -> str | None:
    """The first of `asked` that an output's recorded metadata holds otherwise, said as "key X there, Y asked
    now" (what a re-run's refusal names); None when every one agrees."""
    for key, value in asked.items():
        if recorded.get(key) != value:
            return f"{key} {recorded.get(key)!r} there, {value!r} asked now"
    return None


def differing_keys(a: dict, b: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """The keys (but `ignore`) whose values differ between two metadata records, sorted."""
    return sorted(k for k in set(a) | set(b) if k not in ignore and a.get(k) != b.get(k))


def refuse_different(path: str | os.PathLike, kind: str, differs: str):
    """The error of a re-run whose result is not what `path` holds: nothing is written or replaced."""
    raise OutputError(f"{path} already holds {OUTPUT_KINDS[kind].what}, a different one ({differs}); pass "
                      "--overwrite to replace it, or choose another output path (nothing was written)")


def write_json_rerun(path: str | os.PathLike, obj, kind: str, rerun: bool) -> bool:
    """Write `obj` as JSON at `path` (atomically); on a re-run (`is_rerun`) keep the file when it holds the same
    values and refuse when it does not. True when written."""
    if rerun:
        new = json.loads(json.dumps(obj, sort_keys=True, default=str))
        try:
            old = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = None
        if old != new:
            refuse_different(path, kind, "other values")
        return False
    write_json_atomic(path, obj)
    return True


# --------------------------------------------------------------------------- arrays

class _ThroughWrite:
    """A file numpy takes for a plain writable object: np.save then writes through `write` (chunks of
    the array) instead of C's fwrite, whose short write on a full disk numpy reports as "65536
    requested and 51168 written" (errno None) where `write` raises ENOSPC, "No space left on device"."""

    def __init__(self, f):
        self.write = f.write


def save_npy(dest, array) -> None:
    """np.save to `dest` (a path, or a file open for binary writing), the same bytes, with the OS's
    error when the disk fills."""
    import numpy as np

    if hasattr(dest, "write"):
        np.save(_ThroughWrite(dest), array)
        return
    with open(dest, "wb") as f:
        np.save(_ThroughWrite(f), array)


# --------------------------------------------------------------------------- hashing

def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_files(paths) -> str:
    """One digest over several files (name + content), order-independent of the caller."""
    h = hashlib.sha256()
    for p in sorted(Path(p) for p in paths):
        h.update(p.name.encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()


def tree_files(folder: str | Path) -> list[tuple[str, Path]]:
    """(path inside `folder`, path) of every file under `folder`. Symlinked files and folders are followed (a
    model folder of links to a cache is the files it links to), each folder once along a path: a link that
    leads back to a folder it is inside (a symlink loop, which `os.walk(followlinks=True)` walks ~40 levels
    deep, reading every file each time) is an InputError naming it, before any file is read. A link to
    nothing is skipped; two links to one folder elsewhere list its files under both names."""
    from .errors import InputError

    folder = Path(folder)
    out: list[tuple[str, Path]] = []

    def walk(path: Path, rel: str, above: tuple[str, ...]) -> None:
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:  # an unreadable folder holds nothing we can read (as os.walk skipped it)
            return
        for entry in entries:
            child, name = Path(entry.path), f"{rel}{entry.name}"
            try:
                os.stat(child)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise InputError(child, None, "a symlink loop (a link that leads back to itself); remove it "
                                                  "or point it at a real file or folder") from None
                continue  # a link to nothing
            if entry.is_dir():
                real = os.path.realpath(child)
                if real in above:
                    raise InputError(child, None, f"a symlink loop: it leads back to {real}, a folder it is "
                                                  "inside; remove the link or point it at a real folder")
                walk(child, f"{name}/", (*above, real))
            elif entry.is_file():
                out.append((name, child))

    walk(folder, "", (os.path.realpath(folder),))
    return out


def sha256_tree(folder: str | Path) -> str:
    """One digest over every file under `folder`: each file's path inside the folder and its content.
    Symlinked files and folders are followed (a model folder of links to a cache is the files it links
    to), a symlink loop is refused (`tree_files`), and a file moved to another subfolder changes the digest."""
    h = hashlib.sha256()
    for rel, path in sorted(tree_files(folder)):
        h.update(rel.encode() + b"\0" + sha256_file(path).encode() + b"\n")
    return h.hexdigest()


def missing_dirs(path: Path) -> list[Path]:
    """`path` and its ancestors that do not exist yet (deepest first): what a mkdir(parents=True) creates."""
    return [p for p in (path, *path.parents) if not p.exists()]


def remove_empty_dirs(created: list[Path]) -> None:
    """Remove the folders a failed step created (`missing_dirs` before it ran) that hold nothing:
    no file anywhere below them. A folder holding a file is kept, and so is everything else."""
    if not created:
        return
    for folder, _, _ in sorted(os.walk(created[-1]), key=lambda w: -len(Path(w[0]).parts)):
        with contextlib.suppress(OSError):
            Path(folder).rmdir()  # fails, and is kept, when it holds a file


WORK_MARKER = ".reproduce-work"


def claim_work_folder(path: Path, own: set[str], made_by: str = "`pipeline reproduce`", marker: str = WORK_MARKER,
                      flag: str = "--work"):
    """A work folder this tool runs in, locked (fcntl) for the caller: new, or one it made before (its `marker`)
    holding only the entries in `own`; `flag` is the option that names the folder. Anything else there is
    refused, never touched. Returns the lock's open file (closing it releases the lock)."""
    import fcntl

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise PipelineError(f"{path}: exists and is not a folder; choose another {flag}")
    if path.exists() and any(path.iterdir()):
        if not (path / marker).is_file():
            raise PipelineError(f"{path}: exists and was not made by {made_by}; refusing to use it "
                                f"(choose another {flag})")
        foreign = sorted(e.name for e in path.iterdir() if e.name not in own | {marker, ".lock"})
        if foreign:
            raise PipelineError(f"{path}: holds {', '.join(foreign[:5])}" + (" ..." if len(foreign) > 5 else "")
                                + f", which {made_by} did not make; nothing was run or removed (move them, or "
                                f"choose another {flag})")
    try:
        path.mkdir(parents=True, exist_ok=True)
        lock = open(path / ".lock", "w")
    except OSError as e:
        raise PipelineError(f"{path}: cannot make or write the work folder ({e.strerror or e})") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise PipelineError(f"{path}: another {made_by} run is using this work folder; wait for it or choose "
                            f"another {flag}") from None
    (path / marker).write_text(f"made by {made_by.strip('`')}\n")
    return lock
