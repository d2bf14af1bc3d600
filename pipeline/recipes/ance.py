"""ANCE (docs/METHODS.md §5): the trainer and the index refresher running side by side.

    pipeline train --config jobs/configs/ance.yaml        (loss.name: ance | ance_dar)
    pipeline refresh --run-dir <run> --config …           (the refresher alone, `refresh_command`)

    stage                            runs where                          writes
    1 refresher start                an `IndexRefresher` actor            nothing yet (loads corpus, queries, qrels)
                                     (index/refresher.py), own resources
    2 training                       Ray Train (train/trainer.py) with    <storage>/<name>/step-*/ checkpoints,
                                     a `VersionedNegatives` provider      model/, summary.json (+ refresher record)
    3 refresh, every new checkpoint  the refresher, concurrently:         <versions>/v-NNNNNN/ (negatives + COMPLETE
                                     encode corpus -> FAISS -> top-k ->   marker last), its record (dev metric,
                                     negatives (judged positives out)     seconds) in the version
    4 switch                         rank 0 polls the provider every      the version used, per batch, in the batch
                                     `train.negatives_poll_every` steps   log and every checkpoint

Config keys: the `ance:` section (data/negatives.RefresherConfig: refresh_every, versions_dir,
corpus, queries, qrels, dev_qrels, dev_metric, top_k, negatives, factory, nprobe, batch_size,
precision, keep_versions, poll_seconds, cpus, gpus, max_restarts, refresh_retries, retry_backoff_s,
max_missed_refreshes, on_refresher_failure, heartbeat_timeout_s, start_refresher), plus
`train.*` (checkpoint_every defaults to ance.refresh_every; negatives_poll_every is lowered to the
refresh interval when above it, since a longer one only skips versions), `data.*` and `loss.*`
(losses/ance.py). The trainer and the refresher share only formats: the checkpoint format
(trainer -> refresher) and the version format (refresher -> trainer); `train/` and `index/`
never import each other. ANCE never degrades silently, whether the refresher runs beside training
(`ance.start_refresher: true`) or as its own `pipeline refresh` job (`false`): when it has failed for
good, its heartbeat has stopped for `ance.heartbeat_timeout_s` (a killed job, a lost node), or no
version has come for `ance.max_missed_refreshes` refresh intervals (also when no refresher ever
started), the run fails at its next poll with one line saying which and why, or, with
`ance.on_refresher_failure=continue`, says on every report line that its negatives are stale and
since when. When training ends the refresher is stopped and its per-version record is added to the
run's summary.json; `pipeline refresh` exits when the run's summary.json appears (one written after it
started: a finished run being resumed keeps its old one until it ends again). `train.storage_path`
and `ance.versions_dir` may be storage URIs (s3://, gs://).
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from ..data.negatives import VersionedNegatives
from ..errors import ConfigError, PipelineError, worker_error
from ..io_utils import missing_dirs, remove_empty_dirs, write_json_atomic
from ..storage import RemotePath, is_uri, resolve


def _watch(handle, out: dict, versions) -> None:
    """Wait on the refresher's run(); when it dies for good, say so in the status the trainer's
    provider reads: the run then fails at its next poll (or, with on_refresher_failure=continue,
    says on every report line that its negatives are stale)."""
    import ray

    from ..data.negatives import read_status, write_status

    try:
        out["status"] = ray.get(handle)
    except Exception as e:  # restarts exhausted
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        print(f"[ance] the index refresher stopped for good ({out['error']})", flush=True)
        try:
            write_status(versions, {**read_status(versions), "state": "dead",
                                    "reason": f"its actor died after its restarts: {out['error']}"})
        except OSError:
            pass


def _announce(versions, stop: threading.Event, every: float) -> None:
    """Print each version the refresher publishes, and each refresh that fails, as they happen (the
    trainer's report lines show only the version in use)."""
    from ..data.negatives import list_versions, read_status, version_dir

    seen, errors = set(list_versions(versions)), set()
    while not stop.wait(every):
        try:
            for v in list_versions(versions):
                if v in seen:
                    continue
                seen.add(v)
                meta = json.loads((version_dir(versions, v) / "meta.json").read_text())
                dev = (f", dev {meta['dev_metric_name']} {meta['dev_metric']:.4f}"
                       if meta.get("dev_metric") is not None else "")
                print(f"[ance] negatives v{v} published: checkpoint step {meta.get('checkpoint_step')}, "
                      f"refreshed in {meta.get('seconds', 0):.1f}s{dev}", flush=True)
            err = read_status(versions).get("last_error")
            if err and (err.get("at"), err.get("attempt")) not in errors:
                errors.add((err.get("at"), err.get("attempt")))
                print(f"[ance] WARNING: the refresh of version {err.get('version')} (checkpoint step "
                      f"{err.get('checkpoint_step')}) failed (attempt {err.get('attempt')}): {err.get('error')}; "
                      f"log: {read_status(versions).get('log')}", flush=True)
        except (OSError, ValueError):
            continue  # a version being pruned or written: the next look sees it whole


def check_ance_inputs(job) -> None:
    """What the refresher will read, checked on the driver before Ray, the dev split or any folder
    starts: the corpus, and that every judged dev query (`ance.dev_qrels`) is in `ance.dev_queries`."""
    from ..data.manifest import load_manifest
    from ..index.refresher import dev_queries

    s = job.section("ance")
    corpus = s.corpus or job.data.corpus
    if not corpus:
        raise ConfigError("ANCE needs a corpus to refresh over: data.corpus (data.source=qrels) or ance.corpus")
    load_manifest(corpus)
    dev_queries(s)


def refresh_schedule(job):
    """The job with ANCE's schedule settled: a checkpoint (and so a refresh) every `ance.refresh_every` steps
    unless `train.checkpoint_every` says otherwise, and the trainer looking for a new version at least that
    often. Looking less often than versions can come only skips them (a run shorter than the poll interval
    never switches at all), and a look is a folder listing, cheap beside the checkpoint each interval writes."""
    tc = job.train
    if tc.checkpoint_every == 0:
        tc = replace(tc, checkpoint_every=job.section("ance").refresh_every)
    if tc.negatives_poll_every > tc.checkpoint_every:
        tc = replace(tc, negatives_poll_every=tc.checkpoint_every)
    return job if tc is job.train else replace(job, train=tc)


def run_ance(job, validate_fn: Callable | None = None, progress: bool = True, callbacks: list | None = None) -> dict:
    """Train with concurrently refreshed ANN negatives; returns the training summary (+ refresher record).

    `callbacks` go to the trainer's Ray Train run (a Tune trial passes its report callback)."""
    import ray

    from ..index.refresher import start_refresher
    from ..ray_runtime import check_resources, init_ray
    from ..train.identity import check_resume_early
    from ..train.trainer import resolve_resume, train

    check_ance_inputs(job)
    s = job.section("ance")
    job = refresh_schedule(job)
    tc = job.train
    corpus = s.corpus or job.data.corpus
    if not corpus:
        raise ConfigError("ANCE needs a corpus to refresh over: data.corpus (data.source=qrels) or ance.corpus")
    run_dir = resolve(tc.storage_path) / tc.name
    versions = (resolve(s.versions_dir) if is_uri(s.versions_dir) else Path(s.versions_dir)) if s.versions_dir \
        else run_dir / "negatives"
    s = replace(s, versions_dir=str(versions), corpus=str(Path(corpus).resolve()),
                queries=s.queries or job.data.queries, qrels=s.qrels or job.data.qrels)
    if not s.dev_qrels and job.validation.dev_split and job.validation.qrels:
        # the refresher's per-version dev metric on the run's dev split (held-out training queries)
        s = replace(s, dev_qrels=job.validation.qrels,
                    dev_queries=job.validation.queries or str(Path(corpus) / "queries.tsv"))
    # the same rules in both layouts: a refresher beside training, or `pipeline refresh` as its own job
    provider = VersionedNegatives(versions, corpus, refresh_every=tc.checkpoint_every,
                                  max_missed_refreshes=s.max_missed_refreshes, on_failure=s.on_refresher_failure,
                                  heartbeat_timeout_s=s.heartbeat_timeout_s)
    actor, watch = None, {}
    resume = resolve_resume(job, run_dir)  # a resume refused now, before a refresher writes into the run
    if resume is not None:
        check_resume_early(resume, job)
    if s.start_refresher:
        init_ray(replace(job.ray, dashboard=True))
        # the trainer checks its own workers; the refresher's share comes on top
        check_resources("ANCE (trainer workers + index refresher)",
                        tc.num_workers * tc.cpus_per_worker + s.cpus,
                        (tc.num_workers * tc.gpus_per_worker if tc.use_gpu else 0.0) + s.gpus)
        if isinstance(run_dir, RemotePath) or isinstance(versions, RemotePath) or \
                len([n for n in ray.nodes() if n.get("Alive")]) > 1:
            from ..storage_checks import check_writable_on_nodes

            # before the refresher starts: the driver and every node (the refresher's among them) must
            # reach the run (checkpoints) and the versions folder; a clear error instead of a dead actor
            for loc in {str(run_dir): run_dir, str(versions): versions}.values():
                check_writable_on_nodes(loc)
        created = [] if isinstance(run_dir, RemotePath) else missing_dirs(run_dir)
        had_config = (run_dir / "config.yaml").exists()
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").touch(exist_ok=True)  # the refresher's "is a training run" check
        actor = start_refresher(run_dir, s, s.corpus)
        try:  # constructed: corpus, training and dev queries loaded and checked; errors surface here
            ray.get(actor.status.remote())
        except Exception as e:
            ray.kill(actor)
            if not had_config and not isinstance(run_dir, RemotePath):  # leave no empty run folder behind
                (run_dir / "config.yaml").unlink(missing_ok=True)
                for leftover in (versions / "refresher.json", versions / "refresher.log"):
                    if isinstance(versions, Path):
                        leftover.unlink(missing_ok=True)
                remove_empty_dirs(created)
            raise worker_error(e) or PipelineError(f"the index refresher could not start: {e}") from None
        handle = actor.run.remote()
        thread = threading.Thread(target=_watch, args=(handle, watch, versions), daemon=True)
        thread.start()
        if progress:
            print(f"[ance] index refresher started ({s.cpus:g} CPU, {s.gpus:g} GPU): newest checkpoint every "
                  f"{tc.checkpoint_every} steps -> top {s.top_k}, {s.negatives} negatives/query -> {versions}; "
                  f"the trainer looks for a new version every {tc.negatives_poll_every} step(s)", flush=True)
    stop_announcing = threading.Event()
    if progress:
        threading.Thread(target=_announce, args=(versions, stop_announcing, max(s.poll_seconds, 1.0)),
                         name="ance-announce", daemon=True).start()
    try:
        summary = train(job, validate_fn=validate_fn, negatives_provider=provider, progress=progress,
                        callbacks=callbacks)
    finally:
        stop_announcing.set()
        if actor is not None:
            try:
                ray.get(actor.stop.remote(), timeout=30)
            except Exception:
                pass
            thread.join(timeout=600)
            ray.kill(actor)
    if actor is not None:
        summary["refresher"] = {"settings": asdict(s), **watch}
        if isinstance(run_dir, RemotePath):
            from ..storage import write_json_atomic as write_remote

            write_remote(run_dir / "summary.json", summary)
        else:
            write_json_atomic(run_dir / "summary.json", summary)
        if progress:
            print(refresher_summary_line(watch.get("status") or {}, summary.get("negatives_versions") or [], job),
                  flush=True)
    return summary


def refresher_summary_line(status: dict, used: list[dict], job) -> str:
    """The line printed when an ANCE run ends: what the refresher made, and which versions the trainer
    trained on from which step (or, when none reached it, a WARNING saying what it trained on instead and
    what to change)."""
    vs = status.get("versions", [])
    line = (f"[ance] refresher: {len(vs)} version(s) this run"
            + (f", {sum(v['seconds'] for v in vs) / len(vs):.1f}s each" if vs else "")
            + f", {status.get('skipped_checkpoints', 0)} stale checkpoint(s) skipped; ")
    if used:
        return line + "trainer used " + ", ".join(f"v{v['version']} from step {v['at_step']}" for v in used)
    data = job.data
    in_batch = data.hard_negatives == 0 or (not data.negatives_run and data.source == "qrels")
    why = ("no version came before training ended: give the refresher more CPUs or a GPU, or refresh more often "
           "(ance.refresh_every)" if not vs else "none came before the trainer's last look: refresh more often "
           "(ance.refresh_every) or lower train.negatives_poll_every")
    return ("[ance] WARNING: " + line.removeprefix("[ance] ") + "the trainer used no refreshed version: it trained "
            "on " + ("in-batch negatives only" if in_batch else "the examples' own hard negatives")
            + f" throughout, so this run is not ANCE ({why})")


def refresh_command(run_dir: str | Path, job, once: bool = False, idle_exit_s: float = 600.0) -> list[dict]:
    """`pipeline refresh`: the refresher alone, against a run's checkpoint folder (another job, other GPUs)."""
    from ..index.refresher import run_refresher

    s = job.section("ance")
    corpus = s.corpus or job.data.corpus
    if not corpus:
        raise ConfigError("pipeline refresh needs the corpus: data.corpus or ance.corpus")
    s = replace(s, queries=s.queries or job.data.queries, qrels=s.qrels or job.data.qrels)
    return run_refresher(run_dir, s, corpus, once=once, idle_exit_s=idle_exit_s)

