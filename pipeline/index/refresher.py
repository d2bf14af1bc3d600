"""ANCE's index refresher (docs/METHODS.md §5): newest checkpoint -> re-encode -> FAISS -> hard negatives.

`IndexRefresher` is a long-lived Ray actor with its own resources (a second GPU where there
is one; a CPU share otherwise). It watches a training run's checkpoints and always takes the
**newest** complete one (latest wins: a backlog is skipped, never worked through), pins it
with hard links so checkpoint rotation cannot delete it mid-read, and for it:

1. loads the checkpoint's model and re-encodes the corpus and the training queries on its
   device, batched and length-sorted (`BiEncoder.embed`, the spine's encoder);
2. builds a FAISS index (exact inner product by default, any factory string by config);
3. retrieves the top `top_k` (200) per training query, drops every judged positive, and
   samples `negatives` (20) with a per-version seed, kept in rank order;
4. computes a dev metric for that checkpoint when dev qrels are given;
5. publishes version v (data/negatives.py: data first, `COMPLETE` marker last) and keeps
   only the newest `keep_versions`. Embeddings live only in the actor's memory: nothing of a
   refresh but its negatives (a few MB) reaches the disk.

A refresh that raises (a bad checkpoint, an encode error, an empty dev run) is logged with its
version and checkpoint (`<versions>/refresher.log`), retried `ance.refresh_retries` times with a
doubling backoff, then its checkpoint is given up and the next one taken; every attempt rewrites
`<versions>/refresher.json`, the status the trainer's provider reads (data/negatives.py: the run
fails, or says on every report line that its negatives are stale, when no version comes for
`ance.max_missed_refreshes` refresh intervals). A restarted actor (`max_restarts`) resumes after
its last published version and first removes the checkpoint pins a crashed one left. Dev queries
come from `ance.dev_queries`, never from the training queries. `run_refresher` is the same loop
without Ray (`pipeline refresh`, a separate job on other GPUs).

The run folder and the versions folder may be storage URIs (s3://, gs://; pipeline/storage.py):
a remote checkpoint is "pinned" by downloading it to a local temporary folder (and checked
complete there), and versions are published with their marker last.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
import uuid
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from ..config import EvalConfig, ModelConfig
from ..data.manifest import join_title, load_manifest
from ..data.negatives import RefresherConfig, list_versions, publish_version, version_dir, write_status
from ..data.readers import load_qrels, load_queries
from ..errors import PipelineError
from ..models.checkpoint import list_checkpoints, read_state
from ..storage import RemotePath, download_dir, is_uri, resolve

PIN_DIR = ".pins"


def _location(p):
    return p if isinstance(p, RemotePath) else resolve(p) if is_uri(str(p)) else Path(p)


def check_run_dir(run_dir, corpus_dir: str | Path) -> dict:
    """Refuse a folder that is not a training run, or a corpus other than the one it trains on."""
    run_dir = _location(run_dir)
    if not _is_run(run_dir):
        raise PipelineError(f"{run_dir}: not a training run (no config.yaml and no complete step-* checkpoint); "
                            "point the refresher at <train.storage_path>/<train.name>")
    manifest = load_manifest(corpus_dir)
    ex = run_dir / "examples" / "examples.json"
    if ex.exists():
        trained_on = json.loads(ex.read_text()).get("corpus_fingerprint")
        if trained_on and trained_on != manifest["fingerprint"]:
            raise PipelineError(f"{corpus_dir}: corpus fingerprint {manifest['fingerprint']} differs from the one the "
                                f"run at {run_dir} trains on ({trained_on}); negatives from another corpus are refused")
    return manifest


def pin_checkpoint(ckpt, pin_root: Path) -> Path | None:
    """Hard-link a complete checkpoint's files into a private folder (rotation cannot delete
    them under us; a remote one is downloaded); None when it vanished or changed while pinning."""
    pin = Path(pin_root) / f"{ckpt.name}-{uuid.uuid4().hex[:8]}"
    try:
        if isinstance(ckpt, RemotePath):
            download_dir(ckpt, pin)
        else:
            state = read_state(ckpt)
            if state is None:
                return None
            for rel in list(state["files"]) + ["state.json"]:
                dst = pin / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(ckpt / rel, dst)
                except FileNotFoundError:
                    raise
                except OSError:
                    shutil.copy2(ckpt / rel, dst)  # another filesystem: copy
    except OSError as e:
        shutil.rmtree(pin, ignore_errors=True)
        if isinstance(ckpt, RemotePath) or isinstance(e, FileNotFoundError):
            return None  # rotated away (or a failed download) while pinning: the next poll retries
        raise
    if read_state(pin) is None:  # incomplete or changed while pinning
        shutil.rmtree(pin, ignore_errors=True)
        return None
    return pin


def dev_queries(cfg: RefresherConfig):
    """(dev qrels, {qid: text}) for the refresher's per-version dev metric, or None without
    `ance.dev_qrels`; every judged dev query must be in `ance.dev_queries` (checked by the driver
    before Ray or any folder starts, and by the refresher itself)."""
    if not cfg.dev_qrels:
        return None
    dev = load_qrels(cfg.dev_qrels)
    dev_texts = load_queries(cfg.dev_queries)
    lost = [q for q in dev if q not in dev_texts]
    if lost:
        raise PipelineError(f"ance.dev_qrels {cfg.dev_qrels}: {len(lost)} of its {len(dev)} queries are not in "
                            f"ance.dev_queries {cfg.dev_queries}, e.g. {sorted(lost)[:3]}")
    return dev, {q: dev_texts[q] for q in dev}


def _rng_for(seed: int, version: int) -> random.Random:
    return random.Random(seed * 1_000_003 + version)


def sample_negatives(ranked: list[str], judged: set[str], n: int, rng: random.Random) -> list[str]:
    """n of the ranked candidates that are not judged positives, sampled, kept in rank order."""
    cands = [p for p in ranked if p not in judged]
    if len(cands) <= n:
        return cands
    keep = sorted(rng.sample(range(len(cands)), n))
    return [cands[i] for i in keep]


class Refresh:
    """One refresher's state: the corpus texts, training queries and judgements, loaded once."""

    def __init__(self, run_dir: str | Path, cfg: RefresherConfig, corpus_dir: str | Path, device: str | None = None):
        import torch

        self.run_dir = _location(run_dir)
        self.cfg = cfg
        self.corpus_dir = Path(corpus_dir)
        self.manifest = check_run_dir(self.run_dir, corpus_dir)
        self.root = _location(cfg.versions_dir) if cfg.versions_dir else self.run_dir / "negatives"
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        qrels_path = cfg.qrels or self.corpus_dir / "qrels" / "train.trec"
        queries_path = cfg.queries or self.corpus_dir / "queries.tsv"
        qrels = load_qrels(qrels_path)
        self.judged = {q: {d for d, r in docs.items() if r >= cfg.rel_level} for q, docs in qrels.items()}
        queries = load_queries(queries_path)
        missing = [q for q in self.judged if q not in queries]
        if missing:
            raise PipelineError(f"{qrels_path}: {len(missing)} judged queries are not in {queries_path}, e.g. {missing[:3]}")
        self.qids = sorted(q for q in self.judged if self.judged[q])
        self.qtexts = [queries[q] for q in self.qids]
        self.dev = dev_queries(cfg)  # the dev queries come from their own file, never from the training queries
        # the corpus's pids as one Arrow array (no Python string per passage); the texts are read part
        # by part at each refresh, never held
        from ..data.corpus import corpus_pids

        self.pids = corpus_pids(self.corpus_dir)
        if cfg.top_k > len(self.pids):
            raise PipelineError(f"ance.top_k={cfg.top_k} is more than the corpus's {len(self.pids)} passages")
        versions = list_versions(self.root)
        self.version = versions[-1] if versions else 0
        self.last_step = -1
        if versions:
            self.last_step = int(json.loads((version_dir(self.root, versions[-1]) / "meta.json").read_text())
                                 .get("checkpoint_step", -1))
        self.history: list[dict] = []
        self.skipped = 0
        self.failures = 0            # refreshes that raised (each retry counts)
        self.tries: dict[int, int] = {}  # checkpoint step -> failed attempts
        self.retry_at = 0.0
        self.last_error: dict | None = None
        self.attempt: dict | None = None  # the version and checkpoint being refreshed now
        local = not isinstance(self.root, RemotePath) and not isinstance(self.run_dir, RemotePath)
        import hashlib
        import tempfile

        tag = hashlib.sha1(str(self.root).encode()).hexdigest()[:12]
        self.pin_root = self.root / PIN_DIR if local else Path(tempfile.gettempdir()) / f"pipeline-refresher-pins-{tag}"
        # a restarted refresher owns no pin any more: each pinned a full checkpoint (optimizer state
        # included), so what a crashed one left goes now and disk stays bounded after crashes too
        shutil.rmtree(self.pin_root, ignore_errors=True)
        self.log_path = (self.root / "refresher.log" if not isinstance(self.root, RemotePath)
                         else Path(tempfile.gettempdir()) / f"pipeline-refresher-{tag}.log")
        import socket

        # the status the trainer's provider reads; `beat` moves every heartbeat (see start_heartbeat)
        self.status = {"state": "starting", "latest_version": self.version, "failures": 0, "last_error": None,
                       "log": str(self.log_path), "pid": os.getpid(), "host": socket.gethostname(), "beat": 0,
                       "updated": time.time()}
        self._status_lock = threading.Lock()
        self._beating = threading.Event()
        try:  # the first write is the publish probe: a versions folder it cannot write is refused now
            write_status(self.root, self.status)
        except OSError as e:
            raise PipelineError(f"ance.versions_dir {self.root}: the refresher cannot write there "
                                f"({e.strerror or e}), so it could publish no negatives version") from None

    def start_heartbeat(self) -> None:
        """Move `beat` in the status every heartbeat_timeout_s / 4 (at most 10 s), from a thread, so
        a refresh that runs for hours still shows the refresher alive, and a killed one goes silent."""
        every = min(10.0, self.cfg.heartbeat_timeout_s / 4)

        def beat() -> None:
            while not self._beating.wait(every):
                self._write_status()

        threading.Thread(target=beat, name="refresher-heartbeat", daemon=True).start()

    def stop_heartbeat(self, state: str, reason: str) -> None:
        """The refresher is leaving: say so (and why) before the heartbeat stops."""
        self._beating.set()
        self._write_status(state=state, reason=reason)

    def _write_status(self, **changes) -> None:
        with self._status_lock:
            self.status.update(changes)
            self.status["beat"] = int(self.status.get("beat", 0)) + 1
            self.status["updated"] = time.time()
            try:
                write_status(self.root, self.status)
            except OSError as e:  # the status is advisory; the versions themselves are what counts
                self._log(f"cannot write the status: {e}")

    def newest(self) -> tuple[int, Path] | None:
        found = list_checkpoints(self.run_dir)
        return found[-1] if found else None

    def step_once(self) -> dict | None:
        """Refresh from the newest complete checkpoint if it is newer than the last one used."""
        newest = self.newest()
        if newest is None or newest[0] <= self.last_step:
            return None
        step, ckpt = newest
        self.skipped += sum(1 for s, _ in list_checkpoints(self.run_dir) if self.last_step < s < step)
        pin = pin_checkpoint(ckpt, self.pin_root)
        if pin is None:
            return None  # rotated away while pinning: the next poll takes the newer one
        self.attempt = {"version": self.version + 1, "checkpoint_step": step, "checkpoint": str(ckpt)}
        try:
            meta = self.refresh(pin / "model", step, str(ckpt))
        finally:
            shutil.rmtree(pin, ignore_errors=True)
        self.last_step = step
        return meta

    def step_safely(self) -> dict | None:
        """`step_once`, surviving an exception inside one refresh (a bad checkpoint, an encode error,
        an empty dev run): the error is logged with its version and checkpoint, the refresh retried
        `refresh_retries` times with a doubling backoff, then that checkpoint is given up and the
        next one taken. A failure before any checkpoint is pinned (the run folder unreadable, say) has
        the same retries and backoff, and then ends the refresher (PipelineError; its status says
        `dead`, and why). Every attempt rewrites the status the trainer's provider reads."""
        if time.time() < self.retry_at:
            return None
        self.attempt = None
        try:
            rec = self.step_once()
        except Exception as e:  # noqa: BLE001 — one refresh failing must not end the refresher
            import traceback

            where = self.attempt or {"version": self.version + 1, "checkpoint_step": None, "checkpoint": None}
            step = where["checkpoint_step"]
            self.failures += 1
            tries = self.tries[step] = self.tries.get(step, 0) + 1
            self.last_error = {**where, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:500]}",
                               "attempt": tries, "at": time.time()}
            give_up = tries > self.cfg.refresh_retries
            if give_up and step is not None:
                self.last_step = max(self.last_step, step)  # go on with the next checkpoint
            wait = 0.0 if give_up else self.cfg.retry_backoff_s * 2 ** (tries - 1)
            self.retry_at = time.time() + wait
            what = ("giving this checkpoint up" if give_up and step is not None else
                    "giving up: the refresher stops" if give_up else f"retrying in {wait:g}s")
            where_txt = (f"version {where['version']} from checkpoint step {step} ({where['checkpoint']})"
                         if step is not None else f"looking for a checkpoint in {self.run_dir}")
            line = (f"[refresh] {where_txt} failed (attempt {tries} of {self.cfg.refresh_retries + 1}): "
                    f"{self.last_error['error']}; {what}")
            print(line, flush=True)
            self._log(line + "\n" + traceback.format_exc())
            if give_up and step is None:
                reason = f"{where_txt} failed {tries} times: {self.last_error['error']}"
                self._status("dead", reason=reason)
                raise PipelineError(f"the index refresher stops: {reason} (log: {self.log_path})") from None
            self._status("retrying" if not give_up else "skipped-checkpoint")
            return None
        self.tries.pop(None, None)  # looking for a checkpoint worked
        if rec is not None:
            self.tries.pop(rec["checkpoint_step"], None)
            self._status("ok")
        return rec

    def _log(self, text: str) -> None:
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(time.strftime("%Y-%m-%d %H:%M:%S ") + text.rstrip() + "\n")
        except OSError:
            pass

    def _status(self, state: str, **extra) -> None:
        self._write_status(state=state, latest_version=self.version, failures=self.failures,
                           last_error=self.last_error, **extra)

    def _encode_corpus(self, model):
        """The corpus's document vectors, a part at a time (texts of one part in memory)."""
        import pyarrow.parquet as pq

        for part in self.manifest["parts"]:
            t = pq.read_table(self.corpus_dir / part["file"], columns=["title", "text"])
            texts = [join_title(a, b, self.manifest["title_join"])
                     for a, b in zip(t["title"].to_pylist(), t["text"].to_pylist())]
            del t
            yield model.embed(texts, "doc", batch_size=self.cfg.batch_size, device=self.device,
                              precision=self.cfg.precision)

    def refresh(self, model_dir: Path, step: int, source: str) -> dict:
        import faiss
        import pyarrow as pa

        from ..eval.metrics import evaluate_run, measure_name
        from ..models import BiEncoder
        from .faiss_index import new_index

        cfg = self.cfg
        t0 = time.time()
        model = BiEncoder.load(ModelConfig(name_or_path=str(model_dir))).to(self.device)
        queries = model.embed(self.qtexts, "query", batch_size=cfg.batch_size, device=self.device,
                              precision=cfg.precision)
        dev_vectors = None
        if self.dev is not None:
            dq = sorted(self.dev[1])
            dev_vectors = model.embed([self.dev[1][q] for q in dq], "query", batch_size=cfg.batch_size,
                                      device=self.device, precision=cfg.precision)
        dev_k = min(100, len(self.pids))
        index = new_index(queries.shape[1], cfg.factory, faiss.METRIC_INNER_PRODUCT)
        parts_searched = None
        if index.is_trained:
            # Flat: the version's index in parts, one corpus part each, searched as it is made and let go: the
            # refresher holds one part's vectors and every query's running top k, never the whole corpus's
            # vectors (index/sharded.order merges them by the tie rule every search follows)
            from .sharded import order, search_ordered

            allq = queries if dev_vectors is None else np.vstack([queries, dev_vectors])
            k_all = max(cfg.top_k, dev_k if dev_vectors is not None else 0)
            best_s = best_i = None
            offset, parts_searched = 0, 0
            for docs in self._encode_corpus(model):
                part = faiss.index_factory(queries.shape[1], cfg.factory, faiss.METRIC_INNER_PRODUCT)
                part.add(np.ascontiguousarray(docs, dtype=np.float32))
                sc, ix = search_ordered(part, allq, k_all, "ip")
                ix = np.where(ix >= 0, ix + offset, -1)
                offset += part.ntotal
                del part, docs
                best_s, best_i = (sc, ix) if best_s is None else order(np.hstack([best_s, sc]),
                                                                      np.hstack([best_i, ix]), k_all)
                parts_searched += 1
            t_enc = time.time() - t0
            ids = best_i[:len(queries), :cfg.top_k]
            dev_hits = None if dev_vectors is None else (best_s[len(queries):, :dev_k], best_i[len(queries):, :dev_k])
        else:  # an index that needs training sees every vector first
            held = [docs for docs in self._encode_corpus(model)]
            docs = np.concatenate(held)
            del held
            index.train(docs)
            index.add(docs)
            del docs
            t_enc = time.time() - t0
            if cfg.nprobe and hasattr(index, "nprobe"):
                index.nprobe = cfg.nprobe
            _, ids = index.search(np.ascontiguousarray(queries), cfg.top_k)
            dev_hits = None if dev_vectors is None else index.search(np.ascontiguousarray(dev_vectors), dev_k)
        version = self.version + 1
        rng = _rng_for(cfg.seed, version)
        negs = {}
        for qi, qid in enumerate(self.qids):
            row = ids[qi]
            ranked = self.pids.take(pa.array(row[row >= 0])).to_pylist()
            negs[qid] = sample_negatives(ranked, self.judged[qid], cfg.negatives, rng)
        dev_value = None
        if self.dev is not None:
            dev_qrels, dev_q = self.dev
            dq = sorted(dev_q)
            sc, di = dev_hits
            run = {q: dict(zip(self.pids.take(pa.array(di[i][di[i] >= 0])).to_pylist(), sc[i][di[i] >= 0].tolist()))
                   for i, q in enumerate(dq)}
            name = measure_name(cfg.dev_metric)
            dev_value = evaluate_run(run, dev_qrels, EvalConfig(), measures=[name])["metrics"][name]
        seconds = time.time() - t0
        meta = {"checkpoint": source, "checkpoint_step": step, "dev_metric": dev_value,
                "dev_metric_name": cfg.dev_metric if dev_value is not None else None,
                "corpus_fingerprint": self.manifest["fingerprint"], "passages": len(self.pids),
                "training_queries": len(self.qids), "seconds": round(seconds, 3), "encode_seconds": round(t_enc, 3),
                "seconds_per_1000_passages": round(1000 * seconds / max(len(self.pids), 1), 3),
                "skipped_checkpoints": self.skipped, "device": self.device, "settings": asdict(cfg),
                "index_parts": parts_searched}
        publish_version(self.root, version, negs, meta, keep=cfg.keep_versions)
        self.version = version
        rec = {"version": version, "checkpoint_step": step, "dev_metric": dev_value, "seconds": meta["seconds"]}
        self.history.append(rec)
        return rec


class IndexRefresher:
    """The Ray actor (threaded, so `stop`/`status` answer while `run` works)."""

    def __init__(self, run_dir: str, cfg: dict, corpus_dir: str):
        import torch

        from ..runtime_env import setup_offline_env

        setup_offline_env()
        cfg = RefresherConfig(**cfg)
        torch.set_num_threads(max(1, int(cfg.cpus)))
        self.state = Refresh(run_dir, cfg, corpus_dir)
        self.state.start_heartbeat()
        self._stop = threading.Event()
        self.started = time.time()

    def run(self, idle_exit_s: float | None = None) -> dict:
        """Refresh until `stop()` (or `idle_exit_s` without a new checkpoint)."""
        last = time.time()
        try:
            while not self._stop.is_set():
                if self.state.step_safely() is not None:
                    last = time.time()
                elif idle_exit_s is not None and time.time() - last > idle_exit_s:
                    break
                self._stop.wait(self.state.cfg.poll_seconds)
        except BaseException as e:
            self.state.stop_heartbeat("dead", f"{type(e).__name__}: {e}")
            raise
        self.state.stop_heartbeat("stopped", "stopped by the training run" if self._stop.is_set() else
                                  f"no new checkpoint for {idle_exit_s:g}s")
        return self.status()

    def stop(self) -> None:
        self._stop.set()

    def status(self) -> dict:
        return {"versions": list(self.state.history), "latest_version": self.state.version,
                "last_checkpoint_step": self.state.last_step, "skipped_checkpoints": self.state.skipped,
                "failed_refreshes": self.state.failures, "last_error": self.state.last_error,
                "log": str(self.state.log_path), "pid": os.getpid()}


def start_refresher(run_dir: str | Path, cfg: RefresherConfig, corpus_dir: str | Path):
    """Start the actor with its own resources; restarts resume after the last published version."""
    import ray

    actor_cls = ray.remote(IndexRefresher).options(
        num_cpus=cfg.cpus, num_gpus=cfg.gpus, max_restarts=cfg.max_restarts, max_task_retries=-1,
        max_concurrency=2, name=None)
    base = {f.name: getattr(cfg, f.name) for f in fields(RefresherConfig)}  # a subclass (ANCE's section) may add keys
    return actor_cls.remote(str(run_dir), base, str(corpus_dir))


def run_refresher(run_dir: str | Path, cfg: RefresherConfig, corpus_dir: str | Path, once: bool = False,
                  idle_exit_s: float = 600.0, progress: bool = True) -> list[dict]:
    """The refresher loop without Ray (`pipeline refresh`): until idle for `idle_exit_s`, or one refresh. Started
    before its trainer has written the run folder, it waits for it as long as for a checkpoint (not with --once)."""
    if not once:
        wait_for_run(run_dir, idle_exit_s, cfg.poll_seconds, progress)
    state = Refresh(run_dir, cfg, corpus_dir)
    state.start_heartbeat()
    try:
        done = _refresh_loop(state, run_dir, cfg, once, idle_exit_s, progress)
    except BaseException as e:  # the trainer's provider reads why the refresher left
        state.stop_heartbeat("dead", f"{type(e).__name__}: {e}" if not isinstance(e, KeyboardInterrupt)
                             else "interrupted (Ctrl-C)")
        raise
    return done


def _is_run(run_dir) -> bool:
    run_dir = _location(run_dir)
    return run_dir.is_dir() and ((run_dir / "config.yaml").exists() or bool(list_checkpoints(run_dir)))


def wait_for_run(run_dir, wait_s: float, poll_s: float, progress: bool = True) -> None:
    """Wait until `run_dir` is a training run (the trainer writes its config.yaml once its examples are
    built), saying so once; after `wait_s` seconds without it, `check_run_dir` refuses it as before."""
    t0 = time.time()
    said = False
    while not _is_run(run_dir) and time.time() - t0 < wait_s:
        if progress and not said:
            print(f"[refresh] waiting for {run_dir} to become a training run (its config.yaml, written when the "
                  f"trainer has built its examples); up to {wait_s:.0f}s (--idle-exit)", flush=True)
            said = True
        time.sleep(min(poll_s, max(0.0, wait_s - (time.time() - t0))) or 0.01)
    if said and progress and _is_run(run_dir):
        print(f"[refresh] {run_dir} is a training run after {time.time() - t0:.0f}s; following its checkpoints",
              flush=True)


def _summary(run_dir) -> bytes | None:
    """The run's summary.json as it is now (None: none), written last when a training run ends."""
    try:
        return (_location(run_dir) / "summary.json").read_bytes()
    except OSError:  # none yet, or unreadable: not finished (the idle exit still applies)
        return None


def _run_finished(run_dir, found: bytes | None = None) -> bool:
    """The training run this refresher follows has ended: a summary.json other than `found`, the one that was
    there when the refresher started (a finished run resumed to train further keeps its old summary until
    it ends again)."""
    now = _summary(run_dir)
    return now is not None and now != found


def _refresh_loop(state: "Refresh", run_dir, cfg: RefresherConfig, once: bool, idle_exit_s: float,
                  progress: bool) -> list[dict]:
    done, last = [], time.time()
    found = None if once else _summary(run_dir)
    if found is not None and progress:
        print(f"[refresh] {run_dir} holds the summary.json of a run that finished; following it in case it is "
              f"resumed (until it finishes again, or --idle-exit {idle_exit_s:g}s without a new checkpoint)",
              flush=True)
    while True:
        rec = state.step_safely()
        if rec is not None:
            done.append(rec)
            last = time.time()
            if progress:
                dev = f", dev {rec['dev_metric']:.4f}" if rec["dev_metric"] is not None else ""
                print(f"[refresh] version {rec['version']} from step {rec['checkpoint_step']} in {rec['seconds']:.1f}s"
                      f"{dev} -> {state.root}", flush=True)
            if once:
                state.stop_heartbeat("stopped", f"--once: version {rec['version']} published")
                return done
        elif once:
            newest = state.newest()
            if newest is None:
                raise PipelineError(f"{run_dir}: no complete checkpoint to refresh from")
            if state.last_error and state.last_step >= newest[0]:  # tried and given up
                raise PipelineError(f"the refresh from checkpoint step {state.last_error['checkpoint_step']} failed "
                                    f"{state.last_error['attempt']} time(s): {state.last_error['error']} "
                                    f"(log: {state.log_path})")
            if not state.last_error:
                state.stop_heartbeat("stopped", "--once: the newest checkpoint has its version")
                return done  # the newest checkpoint already has its version
            # else: a failed attempt waits for its retry
        elif _run_finished(run_dir, found):
            state.stop_heartbeat("stopped", "the training run has finished")
            if progress:
                print(f"[refresh] the training run at {run_dir} has finished; {len(done)} version(s) this time",
                      flush=True)
            return done
        elif time.time() - last > idle_exit_s:
            state.stop_heartbeat("exited", f"no new checkpoint for {idle_exit_s:g}s (pipeline refresh --idle-exit)")
            if progress:
                print(f"[refresh] no new checkpoint for {idle_exit_s:g}s: exiting (the training run, if it goes on, "
                      "will stop for want of negatives)", flush=True)
            return done
        time.sleep(cfg.poll_seconds)
