"""The corpus folder as ingest's output: what ingest owns there, and its staged, atomic replacement.

    out/.tmp-ingest-<id>/new/     everything new is written here first (the old corpus stays readable)
    out/.tmp-ingest-<id>/plan     the renames, written before the first one (a killed run's plan is
                                  finished by the next ingest into the folder)

`CorpusOutput` (a context manager) checks `out` (new, empty, or a corpus ingested before; a
folder holding anything else is refused), finishes or removes what killed runs left, locks its
own stage and yields it; the stage's `commit(manifest)` moves the old manifest and entries aside
and the new ones in, the manifest last. Only what the old manifest says ingest wrote is
replaced: user files kept in the folder survive. See data/ingest.py for the layout.

Into a corpus ingested before, without --overwrite, an ingest is a re-run (`_Stage.rerun`): a request
its manifest says is another (sources, format, variant, title join) is refused before anything is
read (`check_request`), and the corpus staged from the same one is compared with it (`unchanged`):
the same, it is kept as it is and the stage dropped; different, refused. Nothing there is replaced.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from ..errors import InputError, PipelineError
from ..io_utils import differing_keys, request_differs, same_output, write_json_atomic
from .manifest import MANIFEST_NAME, describe, load_manifest

_STAGE_PREFIX = ".tmp-ingest-"
_PART_NAME = re.compile(r"part-\d{5,}\.parquet")


def _describe(names) -> str:
    names = sorted(names)
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return shown


def _owned(manifest: dict) -> list[str]:
    """Paths (relative to the corpus folder) that ingest wrote, per its manifest; manifest first."""
    owned = [MANIFEST_NAME, "corpus"]
    if manifest.get("queries"):
        owned.append("queries.tsv")
    owned += [f"qrels/{split}.trec" for split in sorted(manifest.get("qrels") or {})]
    return owned


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _try_lock(path: Path):
    """A non-blocking exclusive lock on a folder; None when another process holds it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _apply_plan(out: Path, stage: Path, plan: dict) -> None:
    """Move the old owned entries aside, the new ones in, the manifest last. Idempotent:
    a plan interrupted anywhere is finished by running it again."""
    old, new = stage / "old", stage / "new"
    for rel in plan["remove"]:
        src, dst = out / rel, old / rel
        if (src.exists() or src.is_symlink()) and not (dst.exists() or dst.is_symlink()):
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
    _fsync_dir(out)
    for rel in plan["install"]:
        src, dst = new / rel, out / rel
        if src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
    _fsync_dir(out)
    qrels_dir = out / "qrels"
    if qrels_dir.is_dir() and not any(qrels_dir.iterdir()):
        qrels_dir.rmdir()


def _conflicts(out: Path, install: list[str], remove: list[str]) -> None:
    """An entry the new corpus writes must not be a user's file."""
    for rel in install:
        if rel not in remove and ((out / rel).exists() or (out / rel).is_symlink()):
            raise PipelineError(f"{out / rel} exists but was not written by ingest; move it away or choose "
                                "another --out. Nothing was changed")


def _differs(out: Path, old: dict, what: str) -> PipelineError:
    return PipelineError(f"{out} already holds an ingested corpus ({describe(old)}), a different one ({what}); pass "
                         "--overwrite to replace it (only the corpus parts, manifest.json, queries.tsv and the qrels "
                         "ingest wrote are replaced; other files there are kept), or choose another --out")


# manifest fields that say when and by which release, not what: the same corpus ingested again after an upgrade
# is kept (a release that writes it otherwise differs in the files, which are compared)
_VOLATILE = ("created_at", "tool_version")


class _Stage:
    def __init__(self, out: Path, path: Path, old_manifest: dict | None, progress: bool, rerun: bool = False):
        self.out, self.path, self.new = out, path, path / "new"
        self.old_manifest = old_manifest
        self.progress = progress
        self.swapping = False
        self.rerun = rerun

    def check_request(self, **asked) -> None:
        """On a re-run: each of `asked` (format, variant, title_join, sources as [(path, bytes)]) as the manifest
        there records it, or refused now."""
        if not self.rerun:
            return
        old = self.old_manifest
        recorded = {**old, "sources": [(s.get("path"), s.get("bytes")) for s in old.get("sources") or []]}
        differs = request_differs(recorded, asked)
        if differs:
            raise _differs(self.out, old, differs)

    def unchanged(self, manifest: dict) -> bool:
        """On a re-run: True when `manifest` (the staged corpus's) describes the corpus there, which is kept as it
        is; another corpus is refused. False when this is no re-run."""
        if not self.rerun:
            return False
        old = self.old_manifest
        diff = differing_keys(old, manifest, ignore=_VOLATILE)
        if diff:
            raise _differs(self.out, old, f"its {', '.join(diff)} differ")
        changed = [rel for rel in _owned(manifest)[1:]
                   if not (self.out / rel).exists() or not same_output(self.new / rel, self.out / rel)]
        if changed:  # the manifest is this corpus's, but its files are not what ingest wrote
            raise _differs(self.out, old, f"{', '.join(changed)} changed or gone since it was ingested")
        return True

    def commit(self, manifest: dict) -> None:
        remove = _owned(self.old_manifest) if self.old_manifest else []
        install = [r for r in _owned(manifest) if r != MANIFEST_NAME] + [MANIFEST_NAME]
        _conflicts(self.out, install, remove)
        write_json_atomic(self.path / "plan.json", {"remove": remove, "install": install})
        self.swapping = True  # from here on, an interrupted run is finished by the next one
        _apply_plan(self.out, self.path, {"remove": remove, "install": install})
        self.swapping = False
        if self.old_manifest and self.progress:
            kept = sorted(n for n in os.listdir(self.out)
                          if not n.startswith(_STAGE_PREFIX) and n not in (MANIFEST_NAME, "corpus", "queries.tsv", "qrels"))
            if kept:
                print(f"[ingest] replaced the corpus in {self.out}; kept what ingest does not own: {_describe(kept)} "
                      "(outputs made from the old corpus may not match the new one)", flush=True)


class CorpusOutput:
    """Context manager: checks `out`, cleans or finishes stale stages, yields a locked stage."""

    def __init__(self, out: Path, overwrite: bool, progress: bool, will_write: list[str]):
        self.out, self.overwrite, self.progress = out, overwrite, progress
        self.will_write = will_write
        self.created: list[Path] = []
        self.stage: Path | None = None
        self.handle: _Stage | None = None
        self.lock = None
        self.rerun = False

    def _say(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def __enter__(self) -> _Stage:
        out = self.out
        if out.is_symlink() and not out.exists():
            raise PipelineError(f"{out} is a dangling symbolic link; choose another --out")
        if out.exists() and not out.is_dir():
            raise PipelineError(f"{out} exists and is a file, not a folder; ingest writes a corpus folder "
                                "(choose another --out)")
        for p in [out, *out.parents]:
            if p.exists():
                if not p.is_dir():
                    raise PipelineError(f"cannot create {out}: {p} is a file, not a folder")
                break
        self._report_legacy_temporaries()
        try:
            missing = [p for p in [out, *out.parents] if not p.exists()]
            for p in reversed(missing):
                p.mkdir()
                self.created.append(p)
            self._recover()
            old_manifest = self._check_existing()
            self.stage = Path(tempfile.mkdtemp(prefix=_STAGE_PREFIX, dir=out))
        except OSError as e:
            self._cleanup()
            raise PipelineError(f"cannot write to {out}: {e.strerror or e}") from None
        except BaseException:
            self._cleanup()
            raise
        self.lock = _try_lock(self.stage)
        live = [p for p in out.glob(_STAGE_PREFIX + "*") if p != self.stage and p.is_dir()]
        for p in live:  # another ingest started between our check and our stage: let it win
            fd = _try_lock(p)
            if fd is None:
                self._cleanup()
                raise PipelineError(f"another ingest is writing to {out} ({p.name}); wait for it to finish")
            os.close(fd)
        self.handle = _Stage(out, self.stage, old_manifest, self.progress, self.rerun)
        return self.handle

    def __exit__(self, exc_type, exc, tb):
        swapping = exc is not None and self.handle is not None and self.handle.swapping
        if swapping:
            # Interrupted between renames: keep the stage (it holds the old and the new entries);
            # the next ingest into this folder finishes the swap from its plan.
            stage, self.stage = self.stage, None
            self._cleanup()
            self._say(f"error while swapping the new corpus into {self.out}; {stage} holds the old and the new "
                      "files, and the next `pipeline ingest` into this folder finishes the swap")
        else:
            self._cleanup()
        if isinstance(exc, OSError):
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            after = ("; run the ingest again to finish replacing the corpus" if swapping
                     else "; nothing of this run was kept")
            raise PipelineError(f"ingest into {self.out} failed: {where}{exc.strerror or exc}{after}") from None
        return False

    def _cleanup(self) -> None:
        if self.stage is not None:
            shutil.rmtree(self.stage, ignore_errors=True)
            self.stage = None
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None
        for p in reversed(self.created):  # folders this run created, if nothing else was put there
            try:
                p.rmdir()
            except OSError:
                break
        self.created = []

    def _report_legacy_temporaries(self) -> None:
        parent = self.out.parent
        if not parent.is_dir():
            return
        name = self.out.name
        left = [p.name for p in parent.iterdir()
                if p.name.startswith((f".tmp-{name}-", f".old-{name}-"))]
        if left:
            self._say(f"WARNING: {parent} holds {_describe(left)}, left by an interrupted run of an older "
                      f"version (a '.old-' folder may hold the only copy of an earlier {name}); "
                      "inspect and remove them by hand")

    def _recover(self) -> None:
        """Finish an interrupted swap, or remove the temporary folder of a run killed earlier."""
        out = self.out
        for stage in sorted(out.glob(_STAGE_PREFIX + "*")):
            if not stage.is_dir():
                continue
            fd = _try_lock(stage)
            if fd is None:
                raise PipelineError(f"another ingest is writing to {out} ({stage.name}); wait for it to finish")
            try:
                plan_path = stage / "plan.json"
                if not (out / MANIFEST_NAME).exists() and (stage / "new" / MANIFEST_NAME).exists() \
                        and plan_path.exists():
                    plan = json.loads(plan_path.read_text(encoding="utf-8"))
                    _apply_plan(out, stage, plan)
                    self._say(f"[ingest] finished replacing the corpus in {out}: a previous ingest was "
                              f"interrupted while swapping it in ({stage.name})")
                else:
                    self._say(f"[ingest] removed {stage}, the temporary folder of an interrupted ingest")
                shutil.rmtree(stage, ignore_errors=True)
            finally:
                os.close(fd)

    def _check_existing(self) -> dict | None:
        out = self.out
        entries = [n for n in os.listdir(out) if not n.startswith(_STAGE_PREFIX)]
        if not entries:
            return None
        if MANIFEST_NAME not in entries:
            raise PipelineError(f"{out} exists and is not an ingested corpus (it holds {_describe(entries)}); "
                                "ingest writes into a new or empty folder, or replaces a corpus it wrote "
                                "(--overwrite). Nothing was changed: choose another --out")
        try:
            manifest = load_manifest(out)
        except InputError as e:
            raise PipelineError(f"{out} holds a manifest.json that is not a readable ingest manifest ({e.reason}); "
                                "nothing was changed: choose another --out") from None
        if not self.overwrite:
            self.rerun = True  # staged and compared; nothing there is replaced (`_Stage.unchanged`)
            return manifest
        corpus = out / "corpus"
        if corpus.is_symlink() or (corpus.exists() and not corpus.is_dir()):
            raise PipelineError(f"{corpus} is not the folder ingest wrote; nothing was changed")
        foreign = [n for n in os.listdir(corpus) if not _PART_NAME.fullmatch(n)] if corpus.is_dir() else []
        if foreign:
            raise PipelineError(f"{corpus} holds files ingest did not write ({_describe(foreign)}); --overwrite "
                                "replaces that whole folder, so move them elsewhere first. Nothing was changed")
        _conflicts(out, self.will_write, _owned(manifest))
        return manifest
