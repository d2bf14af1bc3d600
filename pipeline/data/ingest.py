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
with 8-byte hashes (not a set of strings), held in memory up to 262,144 of them and
beyond that spilled to 256 files in the temporary folder by their first byte,
each checked on its own: the check's memory does not grow with the corpus
(~2 MB; 21M passages put ~170 MB on disk, removed with the temporary
folder). A collision is confirmed on the real ids before failing.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import hashlib
import os
import re
import time
from array import array
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import __version__
from ..errors import InputError, PipelineError
from ..io_utils import sha256_file, write_json_atomic
from . import irds, readers
from .corpus_output import CorpusOutput
from .manifest import (DEFAULT_TITLE_JOIN, DEFAULT_VARIANT, MANIFEST_NAME, check_title_join,
                       check_variant, fingerprint)

CORPUS_SCHEMA = pa.schema([("pid", pa.string()), ("title", pa.string()), ("text", pa.string())])


def _pid_hash(pid: str) -> int:
    return int.from_bytes(hashlib.blake2b(pid.encode(), digest_size=8).digest(), "little")


class _PidHashes:
    """The 8-byte hashes of every pid written, and at the end the ones seen more than once.

    Up to `SPILL_AT` hashes stay in memory; beyond that every full buffer is appended to `BUCKETS`
    files in `folder` by the hash's first byte, and each file is checked on its own, so memory is
    bounded by `SPILL_AT` (and a bucket, 1/256 of the corpus) whatever the corpus size."""

    BUCKETS = 256
    SPILL_AT = 1 << 18  # 2 MB of hashes

    def __init__(self, folder: Path):
        self.folder = folder
        self._buf = array("Q")
        self._spilled = False

    def add(self, h: int) -> None:
        self._buf.append(h)
        if len(self._buf) >= self.SPILL_AT:
            self._spill()

    def _spill(self) -> None:
        arr = np.frombuffer(self._buf, dtype=np.uint64)
        bucket = arr >> np.uint64(56)  # the first byte: BUCKETS = 256 files
        order = np.argsort(bucket, kind="stable")
        arr, bucket = arr[order], bucket[order]
        bounds = np.searchsorted(bucket, np.arange(self.BUCKETS + 1, dtype=np.uint64))
        self.folder.mkdir(exist_ok=True)
        for b in range(self.BUCKETS):
            if bounds[b + 1] > bounds[b]:
                with open(self.folder / f"{b:02x}.u64", "ab") as f:
                    # through `write` (not ndarray.tofile's fwrite): a full disk raises ENOSPC
                    f.write(arr[bounds[b]:bounds[b + 1]].tobytes())
        self._buf = array("Q")
        self._spilled = True

    def repeated(self) -> set[int]:
        if not self._spilled:
            return _repeats(np.frombuffer(self._buf, dtype=np.uint64))
        self._spill()
        found: set[int] = set()
        for p in sorted(self.folder.glob("*.u64")):
            found |= _repeats(np.fromfile(p, dtype=np.uint64))
        return found


def _repeats(arr: np.ndarray) -> set[int]:
    s = np.sort(arr)
    return {int(h) for h in np.unique(s[1:][s[1:] == s[:-1]])}


def _find_duplicate(records_factory, dup_hashes: set[int]):
    first: dict[str, int] = {}
    for r in records_factory():
        if _pid_hash(r["pid"]) in dup_hashes:
            if r["pid"] in first:
                return r["pid"], first[r["pid"]], r["path"], r["line"]
            first[r["pid"]] = f"{r['path']}:{r['line']}"
    return None


class _PartWriter:
    """Writes `part-NNNNN.parquet` files of `part_rows` rows, one row group of at most `ROW_GROUP`
    rows at a time: only that row group is ever held in memory, whatever `part_rows` is."""

    ROW_GROUP = 16_384

    def __init__(self, folder: Path, part_rows: int):
        self.folder = folder
        self.part_rows = part_rows
        self.parts: list[dict] = []
        self._buf: dict[str, list] = {"pid": [], "title": [], "text": []}
        self._writer: pq.ParquetWriter | None = None
        self._in_part = 0  # rows written to the open part

    def add(self, pid: str, title: str, text: str) -> None:
        self._buf["pid"].append(pid)
        self._buf["title"].append(title)
        self._buf["text"].append(text)
        if len(self._buf["pid"]) >= min(self.ROW_GROUP, self.part_rows - self._in_part):
            self._write_group()

    def _write_group(self) -> None:
        n = len(self._buf["pid"])
        if not n:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.folder / f"part-{len(self.parts):05d}.parquet", CORPUS_SCHEMA)
        self._writer.write_table(pa.table(self._buf, schema=CORPUS_SCHEMA), row_group_size=n)
        self._buf = {"pid": [], "title": [], "text": []}
        self._in_part += n
        if self._in_part >= self.part_rows:
            self._close_part()

    def _close_part(self) -> None:
        name = f"part-{len(self.parts):05d}.parquet"
        self._writer.close()
        self._writer = None
        with open(self.folder / name, "rb") as f:
            os.fsync(f.fileno())
        self.parts.append({"file": f"corpus/{name}", "rows": self._in_part})
        self._in_part = 0

    def __enter__(self) -> _PartWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and self._writer is not None:  # the part is abandoned with its folder
            with contextlib.suppress(OSError):  # (a full disk fails the close too; `exc` is what is reported)
                self._writer.close()
            self._writer = None

    def flush(self) -> None:
        """Writes what is buffered and closes the last part."""
        self._write_group()
        if self._writer is not None:
            self._close_part()


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
        if len(inputs) == 1 and not inputs[0].exists() and _link_problem(inputs[0]):
            raise _not_there(inputs[0])  # a symlink loop, or a link to nothing
        if len(inputs) != 1 or not inputs[0].is_dir():
            raise PipelineError("format 'beir' takes one BEIR folder (with corpus.jsonl, queries.jsonl, qrels/)")
        folder = inputs[0]
        inputs = [folder / "corpus.jsonl"]
        if queries is None and (folder / "queries.jsonl").exists():
            queries = folder / "queries.jsonl"
        if not qrels and (folder / "qrels").is_dir():
            qrels = {p.stem: p for p in sorted((folder / "qrels").glob("*.tsv"))}
        if qrels and queries is None:  # judgements of queries whose text the folder does not have
            raise InputError(folder / "queries.jsonl", None, f"missing: the BEIR folder has qrels "
                             f"({', '.join(f'qrels/{s}.tsv' for s in sorted(qrels))}) but no queries to go with them; "
                             "add queries.jsonl (or give --queries FILE)")
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
    with CorpusOutput(out, overwrite, progress, will_write) as stage:
        if not irds_id:  # run again into the corpus it made: the same request, or refused before any reading
            stage.check_request(format=fmt, variant=variant, title_join=title_join,
                                sources=[(str(p.resolve()), _bytes(p)) for p in inputs])
        new = stage.new
        t0 = time.time()
        skipped: list[dict] = []
        n_skipped = n_titled = 0
        hashes = _PidHashes(stage.path / "pid-hashes")
        total = 0
        (new / "corpus").mkdir(parents=True)
        with _PartWriter(new / "corpus", part_rows) as writer:
            for r in records():
                if content is not None:
                    content.update(f"{r['pid']}\0{r['title']}\0{r['text']}\n".encode())
                if integer_pids and not (r["pid"].isascii() and r["pid"].isdigit()):
                    raise InputError(r["path"], r["line"],
                                     f"passage id {r['pid']!r} is not a non-negative integer, as every MS MARCO pid "
                                     f"is (variant {variant}); use --variant custom for other corpora")
                if not r["text"].strip():
                    if on_empty == "error":
                        raise InputError(r["path"], r["line"], f"empty text for passage {r['pid']!r}")
                    n_skipped += 1
                    if len(skipped) < 20:
                        skipped.append({"file": str(r["path"]), "line": r["line"], "pid": r["pid"],
                                        "reason": "empty text"})
                    continue
                hashes.add(_pid_hash(r["pid"]))
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

        repeated = hashes.repeated()
        if repeated:
            dup = _find_duplicate(records, repeated)
            if dup is not None:
                pid, first_at, path, line = dup
                raise InputError(path, line, f"duplicate passage id {pid!r} (first seen at {first_at})")
        del hashes, repeated

        extra: dict = {}
        qids = None  # judgements are checked against the queries when there are queries
        if queries is not None:
            extra["queries"], qids = _write_queries(queries, queries_format, new / "queries.tsv")
        if qrels:
            # the corpus's pids among those the qrels name (not every pid: memory follows the qrels)
            pids = _load_pids(new, {r["docid"] for path in qrels.values() for r in readers.read_qrels(path)})
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
        if stage.unchanged(manifest):
            if progress:
                print(f"[ingest] unchanged: {out} already holds this corpus ({total:,} passages, variant {variant}, "
                      f"fingerprint {manifest['fingerprint']}, the same sources and settings); nothing was written",
                      flush=True)
            return stage.old_manifest
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


def _bytes(p: Path) -> int:
    """An input's size as `_source` records it (a folder: its files together)."""
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


def _source(p: Path) -> dict:
    """Identity of one input: its bytes (a `save_to_disk` folder: every file in it, by relative path)."""
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file())
        h = hashlib.sha256()
        for f in files:
            h.update(str(f.relative_to(p)).encode() + b"\0" + sha256_file(f).encode())
        return {"path": str(p.resolve()), "sha256": h.hexdigest(), "bytes": _bytes(p)}
    return {"path": str(p.resolve()), "sha256": sha256_file(p), "bytes": _bytes(p)}


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


def _link_problem(p: Path) -> str | None:
    """Why the input `p`, which does not exist as a file or folder, is still there as a name: a symlink
    loop (the path, or a folder on it) or a link to nothing; None when nothing is there."""
    try:
        os.stat(p)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return ("a symlink loop (a link that leads back to itself, directly or through other links); point "
                    "the option at a real file or folder")
        if os.path.islink(p):
            return f"a symlink to {os.readlink(p)}, which does not exist"
    return None


def _not_there(p: Path, what: str = "file not found") -> InputError:
    return InputError(p, None, _link_problem(p) or what)


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
            raise _not_there(p, "file not found" + _irds_hint(p))
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
            raise _not_there(p)
        if p.is_dir():
            raise InputError(p, None, "is a folder; expected a file")
        if _file_key(p) in seen:
            raise PipelineError(f"{p} is given both as a corpus file and as queries/qrels")


def _load_pids(folder: Path, among: set[str]) -> set[str]:
    """The pids of the corpus written at `folder` that are in `among`."""
    want = pa.array(sorted(among), pa.string())
    pids: set[str] = set()
    for part in sorted((folder / "corpus").glob("part-*.parquet")):
        col = pq.read_table(part, columns=["pid"]).column("pid")
        pids.update(col.filter(pc.is_in(col, value_set=want)).to_pylist())
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
    if n == 0:  # a split of nothing would evaluate nothing (or train on nothing), silently
        left = (f"; all {dropped + sum(unknown_queries.values()):,} were dropped (--on-unknown-qrels skip): they "
                "name passages or queries these files lack" if dropped or unknown_queries else
                " (only a header, or an empty file)")
        raise InputError(src, None, f"no judgement to ingest{left}; a qrels split needs at least one")
    return {**_origin(src, dest), "judgements": n, "dropped_unknown": dropped,
            "dropped_unknown_queries": sum(unknown_queries.values()),
            "unknown_query_count": len(unknown_queries), "unknown_queries": list(unknown_queries)[:10]}
