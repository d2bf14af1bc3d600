"""`pipeline ingest`: stream a raw corpus into Parquet parts plus a manifest.

Output layout (the manifest is written last and marks the folder complete):

    out/corpus/part-00000.parquet ...   pid, title, text   (`part_rows` rows each)
    out/queries.tsv                     qid \\t text        (if queries were given)
    out/qrels/<split>.trec              TREC qrels          (if qrels were given)
    out/manifest.json

Corpus parts are also the unit of resumable encoding. Duplicate ids are found
with 8-byte hashes (not a set of strings), so ingest of 21M passages needs
~170 MB for the check; a collision is confirmed on the real ids before failing.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import time
from array import array
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import __version__
from ..errors import InputError, PipelineError
from ..io_utils import atomic_path, sha256_file, write_json_atomic
from . import readers
from .manifest import (DEFAULT_TITLE_JOIN, DEFAULT_VARIANT, MANIFEST_NAME, check_title_join,
                       check_variant, fingerprint)

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
    with `on_unknown_qrels='skip'`).
    """
    out = Path(out)
    if (out / MANIFEST_NAME).exists() and not overwrite:
        raise PipelineError(f"{out} already holds an ingested corpus; pass --overwrite to replace it")
    if on_empty not in ("skip", "error") or on_unknown_qrels not in ("skip", "error"):
        raise PipelineError("on_empty / on_unknown_qrels must be 'skip' or 'error'")
    inputs = [Path(p) for p in inputs]
    qrels = dict(qrels or {})
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
    title_join = check_title_join(title_join or DEFAULT_TITLE_JOIN.get(variant, "{title} {text}"))
    for p in inputs:
        if not p.exists():
            raise InputError(p, None, "file not found")

    def records():
        for p in inputs:
            for r in readers.corpus_reader(fmt, p, **(hf_fields or {})):
                r["path"] = p
                yield r

    t0 = time.time()
    skipped: list[dict] = []
    n_skipped = 0
    hashes = array("Q")
    total = 0
    with atomic_path(out) as tmp:
        (tmp / "corpus").mkdir(parents=True)
        writer = _PartWriter(tmp / "corpus", part_rows)
        for r in records():
            if not r["text"].strip():
                if on_empty == "error":
                    raise InputError(r["path"], r["line"], f"empty text for passage {r['pid']!r}")
                n_skipped += 1
                if len(skipped) < 20:
                    skipped.append({"file": str(r["path"]), "line": r["line"], "pid": r["pid"], "reason": "empty text"})
                continue
            hashes.append(_pid_hash(r["pid"]))
            writer.add(r["pid"], r["title"], r["text"])
            total += 1
            if progress and total % 500_000 == 0:
                rate = total / max(time.time() - t0, 1e-9)
                print(f"[ingest] {total:,} passages ({rate:,.0f}/s)", flush=True)
        writer.flush()
        if total == 0:
            raise InputError(inputs[0], None, "no passages found")

        arr = np.frombuffer(hashes, dtype=np.uint64)
        uniq, counts = np.unique(arr, return_counts=True)
        if (counts > 1).any():
            dup = _find_duplicate(records, set(int(h) for h in uniq[counts > 1]))
            if dup is not None:
                pid, first_at, path, line = dup
                raise InputError(path, line, f"duplicate passage id {pid!r} (first seen at {first_at})")
        del hashes, arr, uniq, counts

        extra: dict = {}
        if queries is not None:
            extra["queries"] = _write_queries(Path(queries), queries_format, tmp / "queries.tsv")
        if qrels:
            pids = _load_pids(tmp)
            extra["qrels"] = {
                split: _write_qrels(Path(path), tmp / "qrels" / f"{split}.trec", pids, on_unknown_qrels)
                for split, path in sorted(qrels.items())
            }
        manifest = {
            "variant": variant,
            "format": fmt,
            "sources": [{"path": str(p.resolve()), "sha256": sha256_file(p), "bytes": p.stat().st_size} for p in inputs],
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
        manifest["fingerprint"] = fingerprint(manifest)
        write_json_atomic(tmp / MANIFEST_NAME, manifest)
    if progress:
        skip_note = f", {n_skipped} skipped (empty text; see manifest)" if n_skipped else ""
        print(f"[ingest] done: {total:,} passages in {len(writer.parts)} parts{skip_note}, "
              f"variant {variant}, title join {title_join!r}, {time.time() - t0:.1f}s -> {out}", flush=True)
    return manifest


def _load_pids(folder: Path) -> set[str]:
    pids: set[str] = set()
    for part in sorted((folder / "corpus").glob("part-*.parquet")):
        pids.update(pq.read_table(part, columns=["pid"]).column("pid").to_pylist())
    return pids


def _write_queries(src: Path, fmt: str, dest: Path) -> dict:
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
    return {"source": str(src.resolve()), "sha256": sha256_file(src), "count": n}


def _write_qrels(src: Path, dest: Path, pids: set[str], on_unknown: str) -> dict:
    dest.parent.mkdir(parents=True, exist_ok=True)
    n = dropped = 0
    seen: set[tuple[str, str]] = set()
    with open(dest, "w", encoding="utf-8") as f:
        for r in readers.read_qrels(src):
            if r["docid"] not in pids:
                if on_unknown == "error":
                    raise InputError(src, r["line"], f"qrels name passage {r['docid']!r}, which is not in the corpus")
                dropped += 1
                continue
            key = (r["qid"], r["docid"])
            if key in seen:
                raise InputError(src, r["line"], f"duplicate judgement for query {r['qid']!r}, doc {r['docid']!r}")
            seen.add(key)
            f.write(f"{r['qid']} 0 {r['docid']} {r['rel']}\n")
            n += 1
    return {"source": str(src.resolve()), "sha256": sha256_file(src), "judgements": n, "dropped_unknown": dropped}
