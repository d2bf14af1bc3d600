"""Versioned hard negatives: the file format between a negatives producer (ANCE's index
refresher, a mining job) and the trainer, which reads it through a provider.

    <dir>/v-000001/negatives.parquet   qid (string), negatives (list<string> of pids, best first)
    <dir>/v-000001/meta.json           version, checkpoint_step, dev metric, corpus fingerprint, counts
    <dir>/v-000001/COMPLETE            written LAST: a version without it is never read

A version is published data first, marker last, into a temporary folder renamed into
place, so readers see a complete version or none. `<dir>` may be a storage URI (s3://, gs://;
pipeline/storage.py): there the files are written in place (each object appears whole) and
the marker, written last, is what makes the version exist; pruning deletes the marker first. `VersionedNegatives` is the provider the
trainer polls (`latest_version`, `load`); it lives here, below both `train/` and `index/`,
so neither imports the other.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import PipelineError
from ..storage import RemotePath, is_uri, resolve

MARKER = "COMPLETE"
VERSION_RE = re.compile(r"^v-(\d{6,})$")
SCHEMA = pa.schema([("qid", pa.string()), ("negatives", pa.list_(pa.string()))])


def _location(root):
    return root if isinstance(root, RemotePath) else resolve(root) if is_uri(str(root)) else Path(root)


def version_dir(root, version: int):
    return _location(root) / f"v-{version:06d}"


def list_versions(root) -> list[int]:
    """Complete versions under `root` (a path or URI), oldest first (folders without the marker are ignored)."""
    root = _location(root)
    if not root.is_dir():
        return []
    out = []
    for child in root.iterdir():
        m = VERSION_RE.match(child.name)
        if m and (child / MARKER).exists():
            out.append(int(m.group(1)))
    return sorted(out)


def publish_version(root: str | Path, version: int, negatives: dict[str, list[str]], meta: dict,
                    keep: int = 0) -> Path:
    """Write version `version` (data, meta, then the marker) and keep only the newest `keep` (0 = all)."""
    root = _location(root)
    if isinstance(root, RemotePath):
        return _publish_remote(root, version, negatives, meta, keep)
    root.mkdir(parents=True, exist_ok=True)
    final = version_dir(root, version)
    if final.exists():
        raise PipelineError(f"{final}: version {version} already exists (versions are never overwritten)")
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
    try:
        qids = sorted(negatives)
        table = pa.Table.from_pydict({"qid": qids, "negatives": [list(negatives[q]) for q in qids]}, schema=SCHEMA)
        pq.write_table(table, tmp / "negatives.parquet")
        body = {**meta, "version": version, "queries": len(qids)}
        (tmp / "meta.json").write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
        with open(tmp / MARKER, "w") as f:
            f.write("ok\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if keep > 0:
        for old in list_versions(root)[:-keep]:
            shutil.rmtree(version_dir(root, old), ignore_errors=True)
    return final


def _table(negatives: dict[str, list[str]]) -> pa.Table:
    qids = sorted(negatives)
    return pa.Table.from_pydict({"qid": qids, "negatives": [list(negatives[q]) for q in qids]}, schema=SCHEMA)


def _publish_remote(root: RemotePath, version: int, negatives: dict[str, list[str]], meta: dict,
                    keep: int) -> RemotePath:
    final = version_dir(root, version)
    if (final / MARKER).exists():
        raise PipelineError(f"{final}: version {version} already exists (versions are never overwritten)")
    final.rmtree()  # what a killed publisher left (no marker: never read)
    table = _table(negatives)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    (final / "negatives.parquet").write_bytes(sink.getvalue().to_pybytes())
    body = {**meta, "version": version, "queries": table.num_rows}
    (final / "meta.json").write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    (final / MARKER).write_text("ok\n")
    if keep > 0:
        for old in list_versions(root)[:-keep]:
            (version_dir(root, old) / MARKER).unlink(missing_ok=True)  # unreadable first, then gone
            version_dir(root, old).rmtree()
    return final


@dataclass(frozen=True)
class RefresherConfig:
    """What the index refresher does per version (METHODS.md §5 defaults). Shared by the
    refresher (`index/refresher.py`) and the ANCE method's `ance:` section."""

    versions_dir: str | None = None          # default <run_dir>/negatives
    corpus: str | None = None                # default data.corpus
    queries: str | None = None               # training queries; default <corpus>/queries.tsv
    qrels: str | None = None                 # training qrels; default <corpus>/qrels/train.trec
    dev_qrels: str | None = None             # for the per-version dev metric (None: no dev metric)
    dev_metric: str = "RR@10"
    top_k: int = 200                         # retrieved per training query
    negatives: int = 20                      # sampled from the top-k after removing judged positives
    rel_level: int = 1
    factory: str = "Flat"                    # FAISS factory string (exact inner product by default)
    nprobe: int = 0
    batch_size: int = 64
    precision: str = "auto"                  # the refresher's encoding precision (auto: bf16 where fast)
    keep_versions: int = 2
    seed: int = 0
    poll_seconds: float = 2.0                # how often the refresher looks for a newer checkpoint
    cpus: float = 1.0                        # the refresher actor's resources
    gpus: float = 0.0
    max_restarts: int = 3

    def __post_init__(self):
        from ..errors import ConfigError

        for key in ("top_k", "negatives", "keep_versions", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"ance.{key} must be >= 1, got {getattr(self, key)}")
        if self.negatives > self.top_k:
            raise ConfigError(f"ance.negatives={self.negatives} is more than ance.top_k={self.top_k} retrieved")
        if self.cpus < 0 or self.gpus < 0 or self.poll_seconds <= 0:
            raise ConfigError("ance.cpus/gpus must be >= 0 and ance.poll_seconds > 0")


@dataclass
class NegativesVersion:
    """One loaded version: qid -> negative passage texts (title-joined as the corpus says)."""

    version: int
    meta: dict
    texts: dict[str, list[str]] = field(default_factory=dict)

    def get(self, qid: str) -> list[str] | None:
        return self.texts.get(qid)

    @cached_property
    def _pool(self) -> list[str]:
        return sorted({t for ts in self.texts.values() for t in ts})

    def pool(self) -> list[str]:
        """Every negative text of this version (for queries the version has none for)."""
        return self._pool


class VersionedNegatives:
    """Negatives provider over a versions folder; picklable, so it can be handed to Ray workers.

    `latest_version()` is cheap (a directory listing) and is what the trainer polls;
    `load(v)` reads one version and looks its passage texts up in the corpus.
    """

    def __init__(self, root: str | Path, corpus_dir: str | Path):
        self.root = str(root) if is_uri(str(root)) else str(Path(root).resolve())
        self.corpus_dir = str(Path(corpus_dir).resolve())

    def latest_version(self) -> int | None:
        versions = list_versions(self.root)
        return versions[-1] if versions else None

    def load(self, version: int) -> NegativesVersion:
        from .corpus import fetch_passages

        folder = version_dir(self.root, version)
        if not (folder / MARKER).exists():
            raise PipelineError(f"{folder}: negatives version {version} is missing or incomplete (no {MARKER} marker)")
        meta = json.loads((folder / "meta.json").read_text())
        if isinstance(folder, RemotePath):
            table = pq.read_table((folder / "negatives.parquet").path, filesystem=folder.fs)
        else:
            table = pq.read_table(folder / "negatives.parquet")
        rows = dict(zip(table["qid"].to_pylist(), table["negatives"].to_pylist()))
        need = {p for pids in rows.values() for p in pids}
        passages = fetch_passages(self.corpus_dir, need, join=None)
        missing = need - set(passages)
        if missing:
            raise PipelineError(f"{folder}: {len(missing)} negative pids are not in {self.corpus_dir}, "
                                f"e.g. {sorted(missing)[:3]} (a version made from another corpus?)")
        return NegativesVersion(version, meta, {q: [passages[p] for p in pids] for q, pids in rows.items()})
