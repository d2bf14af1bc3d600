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
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq

from ..config import NonNegFloat, NonNegInt, PosFloat, PosInt, Section, Seed
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


STATUS_FILE = "refresher.json"  # the refresher's health, rewritten after every attempt (and by the driver
                                # when the actor has died for good); the provider reads it


def write_status(root, status: dict) -> None:
    """Replace `<root>/refresher.json` (atomically; one object on a store)."""
    root = _location(root)
    body = json.dumps(status, indent=2, sort_keys=True, default=str) + "\n"
    if isinstance(root, RemotePath):
        (root / STATUS_FILE).write_text(body)
        return
    from ..io_utils import write_text_atomic

    root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(root / STATUS_FILE, body)


def read_status(root) -> dict:
    """The refresher's last status ({} when it has written none)."""
    path = _location(root) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


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
class RefresherConfig(Section):
    """What the index refresher does per version (docs/METHODS.md §5 defaults). Shared by the
    refresher (`index/refresher.py`) and the ANCE method's `ance:` section."""

    versions_dir: str | None = None          # default <run_dir>/negatives
    corpus: str | None = None                # default data.corpus
    queries: str | None = None               # training queries; default <corpus>/queries.tsv
    qrels: str | None = None                 # training qrels; default <corpus>/qrels/train.trec
    dev_queries: str | None = None           # the dev queries' own file (MS MARCO: queries.dev.small.tsv);
    dev_qrels: str | None = None             # with dev_qrels: the per-version dev metric (None: no dev metric)
    dev_metric: str = "RR@10"
    top_k: PosInt = 200                         # retrieved per training query
    negatives: PosInt = 20                      # sampled from the top-k after removing judged positives
    rel_level: NonNegInt = 1
    factory: str = "Flat"                    # FAISS factory string (exact inner product by default)
    nprobe: NonNegInt = 0
    batch_size: PosInt = 64
    precision: str = "auto"                  # the refresher's encoding precision (auto: bf16 where fast)
    keep_versions: PosInt = 2
    seed: Seed = 0
    poll_seconds: PosFloat = 2.0                # how often the refresher looks for a newer checkpoint
    cpus: NonNegFloat = 1.0                        # the refresher actor's resources
    gpus: NonNegFloat = 0.0
    max_restarts: NonNegInt = 3                    # a dead actor is restarted this often (then it has failed for good)
    refresh_retries: NonNegInt = 2                 # a refresh that raises is retried this often, then its checkpoint skipped
    retry_backoff_s: NonNegFloat = 5.0             # first retry after this long, doubling
    # the run fails (exit 2) when no version was published for this many refresh intervals, or
    # the refresher failed for good; 0 = never for lateness. `continue` trains on, saying on
    # every report line that the negatives are stale and since when
    max_missed_refreshes: NonNegInt = 3
    on_refresher_failure: str = "fail"
    # the refresher (in-process actor or a separate `pipeline refresh` job) writes a heartbeat to its
    # status beat by beat (every heartbeat_timeout_s / 4, at most 10 s), also while a refresh runs; a
    # heartbeat that stops for this long means the refresher is gone: the same rule as a dead one
    heartbeat_timeout_s: PosFloat = 120.0

    SECTION = "ance"
    # where and how the refresher runs, not what a training step computes: left out of a run's identity
    # (train/identity.loss_settings), so a run resumes with its refresher moved apart or given other resources
    OPERATIONAL: ClassVar[tuple[str, ...]] = (
        "start_refresher", "poll_seconds", "cpus", "gpus", "max_restarts", "refresh_retries", "retry_backoff_s",
        "max_missed_refreshes", "on_refresher_failure", "heartbeat_timeout_s", "keep_versions")

    def __post_init__(self):
        from ..errors import ConfigError

        super().__post_init__()
        if self.on_refresher_failure not in ("fail", "continue"):
            raise ConfigError(f"ance.on_refresher_failure must be fail or continue, got {self.on_refresher_failure!r}")
        if self.dev_qrels and not self.dev_queries:
            raise ConfigError("ance.dev_qrels needs ance.dev_queries: the dev queries' own file (the training "
                              "queries file is never assumed to hold them; on MS MARCO it does not)")
        if self.negatives > self.top_k:
            raise ConfigError(f"ance.negatives={self.negatives} is more than ance.top_k={self.top_k} retrieved")


@dataclass
class NegativesVersion:
    """One loaded version: qid -> negative passage texts (title-joined as the corpus says), from a
    dict (`texts`) or, as `VersionedNegatives.load` makes it, from a memory-mapped `lookup`."""

    version: int
    meta: dict
    texts: dict[str, list[str]] = field(default_factory=dict)
    lookup: "MappedNegatives | None" = None

    def close(self) -> None:
        """Release the memory-mapped texts and their temporary folder (a no-op for a dict's)."""
        if self.lookup is not None:
            self.lookup.close()

    def __len__(self) -> int:
        """Queries this version has negatives for."""
        return len(self.lookup.pids) if self.lookup is not None else len(self.texts)

    def get(self, qid: str) -> list[str] | None:
        if self.lookup is not None:
            return self.lookup.get(qid)
        return self.texts.get(qid)

    @cached_property
    def _pool(self) -> list[str]:
        return sorted({t for ts in self.texts.values() for t in ts})

    def pool(self):
        """Every negative text of this version (for queries the version has none for): a sequence."""
        return self.lookup.store if self.lookup is not None else self._pool


class MappedNegatives:
    """A version's negatives without a Python string per text: per query the pids (one tab-joined
    string), the texts in a memory-mapped Arrow file in a private temporary folder (removed when
    this object goes)."""

    def __init__(self, rows: dict[str, list[str]], corpus_dir: str | Path):
        import weakref

        from .corpus import PassageStore

        self.pids = {q: "\t".join(ps) for q, ps in rows.items()}
        need = pa.array([p for ps in rows.values() for p in ps], pa.string())
        tmp = tempfile.mkdtemp(prefix="negatives-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, tmp, True)
        self.store = PassageStore(corpus_dir, need, Path(tmp) / "passages.arrow", join=None)
        self.missing = self.store.missing.to_pylist()

    def close(self) -> None:
        """Remove the temporary folder now (a Ray worker that is killed runs no finalizer)."""
        self._cleanup()

    def get(self, qid: str) -> list[str] | None:
        ps = self.pids.get(qid)
        if ps is None:
            return None
        return self.store.get(ps.split("\t")) if ps else []


class VersionedNegatives:
    """Negatives provider over a versions folder; picklable, so it can be handed to Ray workers.

    `latest_version()` is cheap (a directory listing) and is what the trainer polls;
    `load(v)` reads one version and looks its passage texts up in the corpus (the trainer runs
    it in the background); `health(step)` says whether the producer keeps up (see there).
    """

    def __init__(self, root: str | Path, corpus_dir: str | Path, refresh_every: int = 0,
                 max_missed_refreshes: int = 0, on_failure: str = "fail", heartbeat_timeout_s: float = 0.0):
        self.root = str(root) if is_uri(str(root)) else str(Path(root).resolve())
        self.corpus_dir = str(Path(corpus_dir).resolve())
        self.refresh_every, self.max_missed, self.on_failure = refresh_every, max_missed_refreshes, on_failure
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._beat: tuple | None = None  # (the refresher's last beat seen, this process's clock when it changed)

    def latest_version(self) -> int | None:
        versions = list_versions(self.root)
        return versions[-1] if versions else None

    def _silent_for(self, status: dict) -> float | None:
        """Seconds since the refresher's heartbeat last moved, by this process's own clock (no clock is
        compared across machines); None while it beats, or when it has never beaten."""
        import time

        beat = (status.get("pid"), status.get("host"), status.get("beat"))
        if status.get("beat") is None or status.get("state") in ("stopped", "exited"):
            return None  # never beat (an older refresher), or left on purpose (--once, --idle-exit)
        now = time.monotonic()
        if self._beat is None or self._beat[0] != beat:
            self._beat = (beat, now)
            return None
        silent = now - self._beat[1]
        return silent if self.heartbeat_timeout_s and silent > self.heartbeat_timeout_s else None

    def health(self, step: int) -> dict:
        """{} while the producer keeps up. When it has failed for good (the refresher's status says
        `dead`), its heartbeat has stopped for `heartbeat_timeout_s` (a killed `pipeline refresh` job, a
        lost node), or no version has come for `max_missed_refreshes` refresh intervals (the newest
        version is from checkpoint step B and `step >= B + (max_missed + 1) * refresh_every`; B = 0
        before the first; also when no refresher ever started), {"error": why} with on_failure `fail`,
        {"stale": why} with `continue`. The same rules hold for a refresher started beside training and
        for one running as its own job."""
        status = read_status(self.root)
        latest = self.latest_version()
        base, since = 0, "the start"
        if latest is not None:
            try:
                meta = json.loads((version_dir(self.root, latest) / "meta.json").read_text())
            except (OSError, ValueError):
                meta = {}
            base = int(meta.get("checkpoint_step") or 0)
            since = f"v{latest} (from step {base})"
        dead = status.get("state") == "dead"
        silent = None if dead else self._silent_for(status)
        overdue = bool(self.max_missed and self.refresh_every
                       and step >= base + (self.max_missed + 1) * self.refresh_every)
        if not (dead or silent or overdue):
            return {}
        err = status.get("last_error") or {}
        said = (f"; last error at version {err.get('version')} from checkpoint step {err.get('checkpoint_step')}: "
                f"{err.get('error')}" if err else "")
        log = f"; log: {status['log']}" if status.get("log") else ""
        who = (f"pid {status.get('pid')} on {status.get('host')}" if status.get("host") else
               f"pid {status.get('pid')}" if status.get("pid") else "")
        if dead:
            why = f"the index refresher has failed for good ({status.get('reason', 'its actor died')}){said}{log}"
        elif silent:
            why = (f"the index refresher's heartbeat stopped {silent:.0f}s ago (ance.heartbeat_timeout_s="
                   f"{self.heartbeat_timeout_s:g}; {who}, last state {status.get('state', 'unknown')}): its process "
                   f"or node is gone{said}{log}")
        elif not status:
            why = (f"no negatives version for {self.max_missed} refresh intervals of {self.refresh_every} steps "
                   f"(step {step}), and no refresher has written to {self.root} (no {STATUS_FILE}): is "
                   "`pipeline refresh` running for this run?")
        else:
            left = f" ({status['reason']})" if status.get("reason") else ""
            why = (f"no negatives version for {self.max_missed} refresh intervals of {self.refresh_every} steps "
                   f"(step {step}, newest: {since}; refresher state {status.get('state', 'unknown')}{left}, "
                   f"{status.get('failures', 0)} failed refreshes{said}){log}")
        if self.on_failure == "continue":
            return {"stale": f"negatives stale since {since}: {why}"}
        return {"error": f"ANCE: {why}. Training on stale or in-batch negatives is not ANCE; set "
                         "ance.on_refresher_failure=continue to go on anyway (every report line then says so), "
                         "or raise ance.max_missed_refreshes for a slow refresher"}

    def load(self, version: int) -> NegativesVersion:
        folder = version_dir(self.root, version)
        if not (folder / MARKER).exists():
            raise PipelineError(f"{folder}: negatives version {version} is missing or incomplete (no {MARKER} marker)")
        meta = json.loads((folder / "meta.json").read_text())
        if isinstance(folder, RemotePath):
            table = pq.read_table((folder / "negatives.parquet").path, filesystem=folder.fs)
        else:
            table = pq.read_table(folder / "negatives.parquet")
        rows = dict(zip(table["qid"].to_pylist(), table["negatives"].to_pylist()))
        del table
        lookup = MappedNegatives(rows, self.corpus_dir)  # texts memory-mapped, not a dict of strings
        if lookup.missing:
            raise PipelineError(f"{folder}: {len(lookup.missing)} negative pids are not in {self.corpus_dir}, "
                                f"e.g. {sorted(lookup.missing)[:3]} (a version made from another corpus?)")
        return NegativesVersion(version, meta, lookup=lookup)
