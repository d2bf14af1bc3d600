"""`pipeline ingest`: stream a raw corpus into Parquet parts plus a manifest.

Output layout (the manifest is installed last and marks the folder complete):

    out/corpus/part-00000.parquet ...   pid, title, text   (`part_rows` rows each)
    out/queries.tsv                     qid \\t text        (if queries were given)
    out/qrels/<split>.trec              TREC qrels          (if qrels were given)
    out/manifest.json

What ingest owns in `out` is exactly those entries; anything else a user keeps
there (`emb/`, `index/`, `run.trec`, notes) is never touched:

* `out` must be new, empty, or a corpus ingested before. A folder holding
  anything else is refused, with or without `--overwrite`.
* Replacing a corpus needs `--overwrite` and replaces only what the old
  manifest says ingest wrote (its parts, manifest, queries.tsv, qrels files).
* Everything new is written to `out/.tmp-ingest-<id>/new/` first; the old
  corpus stays readable until that is complete. Then the old manifest is
  moved aside (the folder is no longer a trusted corpus), the old entries are
  moved aside, the new ones moved in, and the new manifest moved in last. The
  plan of these renames is written first, so a run killed in the middle is
  finished by the next ingest into the same folder; a temporary folder left by
  a run killed earlier is removed (and reported). Each run holds a lock on its
  temporary folder, so a live run's folder is never mistaken for a stale one.

Corpus parts are also the unit of resumable encoding. Duplicate ids are found
with 8-byte hashes (not a set of strings), so ingest of 21M passages needs
~170 MB for the check; a collision is confirmed on the real ids before failing.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from array import array
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import __version__
from ..errors import InputError, PipelineError
from ..io_utils import sha256_file, write_json_atomic
from . import irds, readers
from .manifest import (DEFAULT_TITLE_JOIN, DEFAULT_VARIANT, MANIFEST_NAME, check_title_join,
                       check_variant, describe, fingerprint, load_manifest)

CORPUS_SCHEMA = pa.schema([("pid", pa.string()), ("title", pa.string()), ("text", pa.string())])


def _pid_hash(pid: str) -> int:
    return int.from_bytes(hashlib.blake2b(pid.encode(), digest_size=8).digest(), "little")


def _find_duplicate(records_factory, dup_hashes: set[int]):
    first: dict[str, int] = {}
    for r in records_factory():
        if _pid_hash(r["pid"]) in dup_hashes:
            if r["pid"] in first:
                return r["pid"], first[r["pid"]], r["path"], r["line"]
            first[r["pid"]] = f"{r['path']}:{r['line']}"
    return None


class _PartWriter:
    """Buffers rows and writes `part-NNNNN.parquet` files of `part_rows` rows."""

    def __init__(self, folder: Path, part_rows: int):
        self.folder = folder
        self.part_rows = part_rows
        self.parts: list[dict] = []
        self._buf: dict[str, list] = {"pid": [], "title": [], "text": []}

    def add(self, pid: str, title: str, text: str) -> None:
        self._buf["pid"].append(pid)
        self._buf["title"].append(title)
        self._buf["text"].append(text)
        if len(self._buf["pid"]) >= self.part_rows:
            self.flush()

    def flush(self) -> None:
        n = len(self._buf["pid"])
        if not n:
            return
        name = f"part-{len(self.parts):05d}.parquet"
        table = pa.table(self._buf, schema=CORPUS_SCHEMA)
        pq.write_table(table, self.folder / name, row_group_size=min(n, 16_384))
        with open(self.folder / name, "rb") as f:
            os.fsync(f.fileno())
        self.parts.append({"file": f"corpus/{name}", "rows": n})
        self._buf = {"pid": [], "title": [], "text": []}


def ingest(
    inputs: list[str | Path],
    fmt: str,
    out: str | Path,
    *,
    variant: str | None = None,
    title_join: str | None = None,
    part_rows: int = 100_000,
    on_empty: str = "skip",
    queries: str | Path | None = None,
    queries_format: str = "auto",
    qrels: dict[str, str | Path] | None = None,
    on_unknown_qrels: str = "error",
    overwrite: bool = False,
    hf_fields: dict | None = None,
    progress: bool = True,
) -> dict:
    """Ingest corpus files into `out`. Returns the manifest.

    `fmt` is one of readers.CORPUS_FORMATS. For `beir`, `inputs` is the BEIR
    folder: corpus.jsonl, queries.jsonl and qrels/*.tsv are all taken from it.
    Empty passages are skipped and counted (`on_empty='skip'`) or fail
    (`'error'`); qrels naming unknown passages fail (or are counted and dropped
    with `on_unknown_qrels='skip'`). See the module docstring for what happens
    to an existing `out`.
    """
    if isinstance(out, str) and "://" in out:
        from ..storage import is_uri, redact, resolve

        if is_uri(out):
            raise PipelineError(f"--out {redact(out)}: ingest writes a corpus folder on a local or shared filesystem "
                                "(a path, or file:///mnt/shared/corpus); the encoder reads its Parquet parts from "
                                "there. Embeddings, indexes and training runs can go to a storage URI.")
        out = resolve(out)  # file:// -> the path
    out = Path(out)
    # ---- arguments: every check that needs no reading happens before anything is written
    if isinstance(part_rows, bool) or not isinstance(part_rows, int) or part_rows < 1:
        raise PipelineError(f"--part-rows must be a positive number of passages per part, got {part_rows!r}")
    if on_empty not in ("skip", "error") or on_unknown_qrels not in ("skip", "error"):
        raise PipelineError("on_empty / on_unknown_qrels must be 'skip' or 'error'")
    if fmt not in readers.CORPUS_FORMATS:
        raise PipelineError(f"unknown corpus format {fmt!r}; choose from {', '.join(readers.CORPUS_FORMATS)}")
    if hf_fields and fmt != "hf":
        raise PipelineError(f"{', '.join('--' + k.replace('_', '-') for k in sorted(hf_fields))} only apply to "
                            f"--format hf (the {fmt} format has fixed columns)")
    if not inputs:
        raise PipelineError("no input files given")
    queries = irds.resolve(queries) if queries is not None else None
    qrels = {split: irds.resolve(p) for split, p in (qrels or {}).items()}
    irds_id = None
    if fmt == "irds":
        # an ir_datasets identifier: its docs (and its queries and qrels unless given), from local files only
        if len(inputs) != 1:
            raise PipelineError("format 'irds' takes one ir_datasets identifier (e.g. beir/scifact/test)")
        ref = irds.resolve(str(inputs[0]))
        if not isinstance(ref, irds.IrdsRef):
            raise PipelineError(f"{inputs[0]} is a path, not an ir_datasets identifier (a path that exists always "
                                "wins); give its --format instead of irds")
        irds_id = ref.id
        if not irds.has(irds_id, "docs"):
            raise PipelineError(f"ir_datasets dataset {irds_id!r} has no documents to ingest")
        if queries is None and irds.has(irds_id, "queries"):
            queries = ref
        if not qrels and irds.has(irds_id, "qrels"):
            qrels = {irds.split_name(irds_id): ref}
        variant = variant or irds.variant_for(irds_id)
        inputs = [irds_id]
    else:
        inputs = [Path(p) for p in inputs]
    if fmt == "beir":
        if len(inputs) != 1 or not inputs[0].is_dir():
            raise PipelineError("format 'beir' takes one BEIR folder (with corpus.jsonl, queries.jsonl, qrels/)")
        folder = inputs[0]
        inputs = [folder / "corpus.jsonl"]
        if queries is None and (folder / "queries.jsonl").exists():
            queries = folder / "queries.jsonl"
        if not qrels and (folder / "qrels").is_dir():
            qrels = {p.stem: p for p in sorted((folder / "qrels").glob("*.tsv"))}
        variant = variant or f"beir-{folder.name.lower()}"
    variant = check_variant(variant or DEFAULT_VARIANT.get(fmt, "custom"))
    _check_variant_fits(variant, fmt, hf_fields)
    title_join = check_title_join(title_join or DEFAULT_TITLE_JOIN.get(variant, "{title} {text}"))
    for split in qrels:
        if not _SPLIT_NAME.fullmatch(str(split)):
            raise PipelineError(f"qrels split name {split!r} must be letters, digits, '.', '_' or '-' "
                                "(it names the file qrels/<split>.trec)")
    _check_inputs(inputs, fmt, queries, qrels)
    integer_pids = variant in ("msmarco-official", "msmarco-titled")

    content = hashlib.sha256() if irds_id else None  # the identity of an ir_datasets corpus: what was read

    def records():
        for p in inputs:
            for r in readers.corpus_reader(fmt, p, **(hf_fields or {})):
                r["path"] = p
                yield r

    # ---- the output folder: new, empty, or a corpus ingested before (then --overwrite)
    will_write = [MANIFEST_NAME, "corpus"] + (["queries.tsv"] if queries is not None else []) \
        + [f"qrels/{split}.trec" for split in sorted(qrels)]
    with _Output(out, overwrite, progress, will_write) as stage:
        new = stage.new
        t0 = time.time()
        skipped: list[dict] = []
        n_skipped = n_titled = 0
        hashes = array("Q")
        total = 0
        (new / "corpus").mkdir(parents=True)
        writer = _PartWriter(new / "corpus", part_rows)
        for r in records():
            if content is not None:
                content.update(f"{r['pid']}\0{r['title']}\0{r['text']}\n".encode())
            if integer_pids and not (r["pid"].isascii() and r["pid"].isdigit()):
                raise InputError(r["path"], r["line"], f"passage id {r['pid']!r} is not a non-negative integer, as "
                                 f"every MS MARCO pid is (variant {variant}); use --variant custom for other corpora")
            if not r["text"].strip():
                if on_empty == "error":
                    raise InputError(r["path"], r["line"], f"empty text for passage {r['pid']!r}")
                n_skipped += 1
                if len(skipped) < 20:
                    skipped.append({"file": str(r["path"]), "line": r["line"], "pid": r["pid"], "reason": "empty text"})
                continue
            hashes.append(_pid_hash(r["pid"]))
            writer.add(r["pid"], r["title"], r["text"])
            n_titled += bool(r["title"].strip())
            total += 1
            if progress and total % 500_000 == 0:
                rate = total / max(time.time() - t0, 1e-9)
                print(f"[ingest] {total:,} passages ({rate:,.0f}/s)", flush=True)
        writer.flush()
        if total == 0:
            raise InputError(inputs[0], None, "no passages found")
        if variant == "msmarco-titled" and n_titled == 0:
            raise PipelineError(f"variant msmarco-titled, but no passage of {', '.join(map(str, inputs))} has a "
                                "title: this is the official (untitled) collection; use --variant msmarco-official")

        arr = np.frombuffer(hashes, dtype=np.uint64)
        uniq, counts = np.unique(arr, return_counts=True)
        if (counts > 1).any():
            dup = _find_duplicate(records, set(int(h) for h in uniq[counts > 1]))
            if dup is not None:
                pid, first_at, path, line = dup
                raise InputError(path, line, f"duplicate passage id {pid!r} (first seen at {first_at})")
        del hashes, arr, uniq, counts

        extra: dict = {}
        qids = None  # judgements are checked against the queries when there are queries
        if queries is not None:
            extra["queries"], qids = _write_queries(queries, queries_format, new / "queries.tsv")
        if qrels:
            pids = _load_pids(new)
            extra["qrels"] = {
                split: _write_qrels(path, new / "qrels" / f"{split}.trec", pids, qids, on_unknown_qrels)
                for split, path in sorted(qrels.items())
            }
        manifest = {
            "variant": variant,
            "format": fmt,
            "sources": [_irds_source(irds_id, content) if irds_id else _source(p) for p in inputs],
            "rows": total,
            "title_join": title_join,
            "parts": writer.parts,
            "skipped": {"count": n_skipped, "examples": skipped},
            "training_query_filter": None,
            "negative_source": None,
            "tool_version": __version__,
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **extra,
        }
        if irds_id:
            manifest["ir_datasets"] = irds_id
        manifest["fingerprint"] = fingerprint(manifest)
        write_json_atomic(new / MANIFEST_NAME, manifest)
        stage.commit(manifest)
    if progress:
        skip_note = f", {n_skipped} skipped (empty text; see manifest)" if n_skipped else ""
        for split, q in sorted((manifest.get("qrels") or {}).items()):
            if q.get("dropped_unknown"):
                print(f"[ingest] qrels {split}: {q['dropped_unknown']:,} judgements name passages not in the corpus; "
                      "dropped (--on-unknown-qrels skip)", flush=True)
            if q.get("dropped_unknown_queries"):
                more = ", …" if q["unknown_query_count"] > len(q["unknown_queries"]) else ""
                print(f"[ingest] qrels {split}: {q['dropped_unknown_queries']:,} judgements name "
                      f"{q['unknown_query_count']:,} unknown queries: "
                      f"{', '.join(q['unknown_queries'])}{more}; dropped (--on-unknown-qrels skip)", flush=True)
        print(f"[ingest] done: {total:,} passages in {len(writer.parts)} parts{skip_note}, "
              f"variant {variant}, title join {title_join!r}, {time.time() - t0:.1f}s -> {out}", flush=True)
    return manifest


def _irds_source(identifier: str, content) -> dict:
    """An ir_datasets corpus: its identifier and a sha256 of the records read (pid, title, text), which
    does not depend on the form of its local files (archive or ir_datasets' extracted copy)."""
    import ir_datasets

    return {"ir_datasets": identifier, "ir_datasets_version": ir_datasets.__version__, "home": str(irds.home()),
            "sha256": content.hexdigest(), "sha256_of": "records as read: pid NUL title NUL text LF"}


def _source(p: Path) -> dict:
    """Identity of one input: its bytes (a `save_to_disk` folder: every file in it, by relative path)."""
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file())
        h = hashlib.sha256()
        for f in files:
            h.update(str(f.relative_to(p)).encode() + b"\0" + sha256_file(f).encode())
        return {"path": str(p.resolve()), "sha256": h.hexdigest(), "bytes": sum(f.stat().st_size for f in files)}
    return {"path": str(p.resolve()), "sha256": sha256_file(p), "bytes": p.stat().st_size}


# --------------------------------------------------------------------------- argument checks

_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

# Which formats can carry which labelled variant (custom: any). The label decides which
# numbers are comparable, so a label the data cannot have is refused.
_VARIANT_FORMATS = {
    "wiki-dpr": ("dpr-wiki", "hf", "irds"),
    "msmarco-official": ("msmarco", "beir", "hf", "irds"),
    "msmarco-titled": ("msmarco-titled", "hf"),
}


def _check_variant_fits(variant: str, fmt: str, hf_fields: dict | None) -> None:
    allowed = _VARIANT_FORMATS.get(variant) or (("beir", "hf", "irds") if variant.startswith("beir-") else None)
    if allowed is not None and fmt not in allowed:
        why = {"msmarco-titled": " (the titled variant has three columns pid, title, text: use --format msmarco-titled)",
               "msmarco-official": " (pid \\t text: use --format msmarco)"}.get(variant, "")
        raise PipelineError(f"--variant {variant} does not fit --format {fmt}{why}; "
                            f"{variant} comes as {' or '.join(allowed)}")
    if variant == "msmarco-titled" and fmt == "hf" and not (hf_fields or {}).get("title_field", "title"):
        raise PipelineError("--variant msmarco-titled needs a title column (--title-field)")


def _irds_hint(p) -> str:
    return (" (it is an ir_datasets identifier: omit --format, or use --format irds)"
            if irds.is_identifier(str(p)) else "")


def _file_key(p: Path):
    try:
        st = p.stat()
        return (st.st_dev, st.st_ino)
    except OSError:
        return str(p.resolve())


def _check_inputs(inputs: list[Path], fmt: str, queries, qrels: dict) -> None:
    seen: dict = {}
    for p in inputs if fmt != "irds" else []:
        if not p.exists():
            raise InputError(p, None, "file not found" + _irds_hint(p))
        if p.is_dir() and fmt != "hf":
            raise InputError(p, None, f"is a folder; --format {fmt} reads a file")
        key = _file_key(p)
        if key in seen:
            same = "given twice" if str(seen[key]) == str(p) else f"the same file as {seen[key]}"
            raise PipelineError(f"input {p} is {same}; give each corpus file once")
        seen[key] = p
    if fmt == "irds":
        irds.check_local(str(inputs[0]), ("docs",))  # every file named now, before anything is written
    for kind, p in [("queries", queries), *[("qrels", q) for q in qrels.values()]]:
        if p is None:
            continue
        if isinstance(p, irds.IrdsRef):
            irds.check_local(p.id, (kind,))
            continue
        p = Path(p)
        if not p.exists():
            raise InputError(p, None, "file not found")
        if p.is_dir():
            raise InputError(p, None, "is a folder; expected a file")
        if _file_key(p) in seen:
            raise PipelineError(f"{p} is given both as a corpus file and as queries/qrels")


# --------------------------------------------------------------------------- the output folder

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


class _Stage:
    def __init__(self, out: Path, path: Path, old_manifest: dict | None, progress: bool):
        self.out, self.path, self.new = out, path, path / "new"
        self.old_manifest = old_manifest
        self.progress = progress
        self.swapping = False

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


class _Output:
    """Context manager: checks `out`, cleans or finishes stale stages, yields a locked stage."""

    def __init__(self, out: Path, overwrite: bool, progress: bool, will_write: list[str]):
        self.out, self.overwrite, self.progress = out, overwrite, progress
        self.will_write = will_write
        self.created: list[Path] = []
        self.stage: Path | None = None
        self.handle: _Stage | None = None
        self.lock = None

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
        self.handle = _Stage(out, self.stage, old_manifest, self.progress)
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
            raise PipelineError(f"{out} already holds an ingested corpus ({describe(manifest)}); pass --overwrite "
                                "to replace it (only the corpus parts, manifest.json, queries.tsv and the qrels "
                                "ingest wrote are replaced; other files there are kept)")
        corpus = out / "corpus"
        if corpus.is_symlink() or (corpus.exists() and not corpus.is_dir()):
            raise PipelineError(f"{corpus} is not the folder ingest wrote; nothing was changed")
        foreign = [n for n in os.listdir(corpus) if not _PART_NAME.fullmatch(n)] if corpus.is_dir() else []
        if foreign:
            raise PipelineError(f"{corpus} holds files ingest did not write ({_describe(foreign)}); --overwrite "
                                "replaces that whole folder, so move them elsewhere first. Nothing was changed")
        _conflicts(out, self.will_write, _owned(manifest))
        return manifest


def _load_pids(folder: Path) -> set[str]:
    pids: set[str] = set()
    for part in sorted((folder / "corpus").glob("part-*.parquet")):
        pids.update(pq.read_table(part, columns=["pid"]).column("pid").to_pylist())
    return pids


def _origin(src, dest: Path) -> dict:
    """Where queries/qrels came from: a file (path + sha256) or an ir_datasets identifier."""
    if isinstance(src, irds.IrdsRef):
        return {"source": src.id, "ir_datasets": src.id, "sha256": sha256_file(dest)}
    return {"source": str(Path(src).resolve()), "sha256": sha256_file(src)}


def _write_queries(src, fmt: str, dest: Path) -> tuple[dict, set[str]]:
    n = 0
    seen: set[str] = set()
    with open(dest, "w", encoding="utf-8") as f:
        for q in readers.read_queries(src, fmt):
            if q["qid"] in seen:
                raise InputError(src, q["line"], f"duplicate query id {q['qid']!r}")
            seen.add(q["qid"])
            text = " ".join(q["text"].split())
            f.write(f"{q['qid']}\t{text}\n")
            n += 1
    return {**_origin(src, dest), "count": n}, seen


def _write_qrels(src: Path, dest: Path, pids: set[str], qids: set[str] | None, on_unknown: str) -> dict:
    """Copy one qrels file as TREC qrels. A judgement naming a passage the corpus lacks, or a
    query the queries file lacks (when queries were given), stops the ingest (`on_unknown='error'`)
    or is dropped, counted in the manifest and named in the summary (`'skip'`)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    n = dropped = 0
    unknown_queries: dict[str, int] = {}  # qid -> judgements dropped for it (first seen first)
    seen: set[tuple[str, str]] = set()
    with open(dest, "w", encoding="utf-8") as f:
        for r in readers.read_qrels(src):
            if qids is not None and r["qid"] not in qids:
                if on_unknown == "error":
                    raise InputError(src, r["line"], f"qrels name query {r['qid']!r}, which is not in the queries "
                                                     "file; fix the files, or pass --on-unknown-qrels skip to drop "
                                                     "such judgements (counted and reported)")
                unknown_queries[r["qid"]] = unknown_queries.get(r["qid"], 0) + 1
                continue
            if r["docid"] not in pids:
                if on_unknown == "error":
                    raise InputError(src, r["line"], f"qrels name passage {r['docid']!r}, which is not in the corpus"
                                                     "; pass --on-unknown-qrels skip to drop such judgements "
                                                     "(counted and reported)")
                dropped += 1
                continue
            key = (r["qid"], r["docid"])
            if key in seen:
                raise InputError(src, r["line"], f"duplicate judgement for query {r['qid']!r}, doc {r['docid']!r}")
            seen.add(key)
            f.write(f"{r['qid']} 0 {r['docid']} {r['rel']}\n")
            n += 1
    return {**_origin(src, dest), "judgements": n, "dropped_unknown": dropped,
            "dropped_unknown_queries": sum(unknown_queries.values()),
            "unknown_query_count": len(unknown_queries), "unknown_queries": list(unknown_queries)[:10]}
