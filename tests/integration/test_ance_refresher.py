"""ANCE on local Ray: the refresher publishes versions while training runs, the trainer switches
to them, a killed refresher is restarted (training never stops), and every version is complete;
training and dev queries live in files of their own. A refresher whose every refresh fails ends
the run with its error, or (on_refresher_failure: continue) every report line says so."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from listening import ListenWatch
from subprocs import IDLE_LIMIT_S


pytestmark = pytest.mark.integration



def _split_queries(faq, tmp_path):
    """The FAQ's training queries and dev (here: its test) queries, each in a file of its own."""
    from pipeline.data.readers import load_qrels, load_queries

    texts = load_queries(faq / "queries.tsv")
    out = []
    for name, split in (("train_queries.tsv", "train"), ("dev_queries.tsv", "test")):
        qids = sorted(load_qrels(faq / "qrels" / f"{split}.trec"))
        (tmp_path / name).write_text("".join(f"{q}\t{texts[q]}\n" for q in qids))
        out.append(tmp_path / name)
    return out


def test_refresher_runs_beside_training_and_survives_a_kill(ray_session, tiny_model_dir, faq, tmp_path, monkeypatch):
    """Nothing here races the clock (on 2 loaded cores a refresh takes many times longer than training
    steps): the refresher is killed once its first version is out, and the trainer, at its validation
    steps, waits on the refresher's events themselves (a version, the kill and restart, a version after
    it), each for at most IDLE_LIMIT_S; so the run switches versions, and to one published after the
    kill, within its 40 steps whatever the load."""
    import ray

    import pipeline.index.refresher as refresher_mod
    from pipeline.recipes.ance import run_ance
    from pipeline.data.negatives import MARKER, list_versions, read_status
    from pipeline.data.readers import load_qrels
    from pipeline.io_utils import write_json_atomic
    from pipeline.train.config import load_train_config

    handles = []
    real_start = refresher_mod.start_refresher

    def spy(*a, **kw):
        h = real_start(*a, **kw)
        handles.append(h)
        return h

    monkeypatch.setattr(refresher_mod, "start_refresher", spy)
    versions = tmp_path / "ance" / "negatives"
    killed = {}
    kill_record = tmp_path / "killed.json"  # written once the killed refresher is back: the trainer waits for it

    training_over = threading.Event()

    def kill_after_first_version():  # waits on the events as long as training runs, never a fixed time
        while not training_over.is_set() and not list_versions(versions):
            time.sleep(0.1)
        if not (handles and list_versions(versions)):
            return
        at_version, old_pid = list_versions(versions)[-1], read_status(versions).get("pid")
        ray.kill(handles[0], no_restart=False)  # a crash: Ray restarts the actor
        killed["at_version"] = at_version
        # the restarted refresher's constructor writes its status, with its own pid
        while not training_over.is_set() and read_status(versions).get("pid") in (None, old_pid):
            time.sleep(0.1)
        write_json_atomic(kill_record, killed)

    validations = []  # (in the training worker) how many validations have run

    def wait_for_the_refresher(model):
        """ANCE's trainer, at its validation steps (train.eval_every=8), waits on events, not time: at
        step 8 (checkpoint 4 on disk, 8 not yet) until a version is out and the refresher has been killed
        and restarted; from step 16 on (checkpoints 8 and 12 on disk) until the restarted refresher has
        published a version newer than the one it was killed at. After IDLE_LIMIT_S without the event
        the run fails, naming it."""
        import json as json_
        import time as time_

        from pipeline.data.negatives import list_versions as versions_of

        validations.append(1)
        t0 = time_.monotonic()
        while True:
            try:
                at = json_.loads(kill_record.read_text())["at_version"]
            except (OSError, ValueError, KeyError):
                at = None
            if at is not None and (len(validations) == 1 or any(v > at for v in versions_of(versions))):
                return {}
            if time_.monotonic() - t0 > IDLE_LIMIT_S:
                raise RuntimeError(f"validation {len(validations)}: " + (
                    f"no refresher killed and restarted after a first version in {versions} within {IDLE_LIMIT_S:g} s"
                    if at is None else f"no version newer than v{at} (the one the refresher was killed at) in "
                                       f"{versions} within {IDLE_LIMIT_S:g} s"))
            time_.sleep(0.2)

    threading.Thread(target=kill_after_first_version, daemon=True).start()
    train_q, dev_q = _split_queries(faq, tmp_path)
    job = load_train_config(None, [
        f"model.name_or_path={tiny_model_dir}", "model.pooling=mean", "model.normalize=true",
        "model.query_max_length=32", "model.doc_max_length=64", f"data.corpus={faq}", "data.hard_negatives=1",
        f"data.queries={train_q}", f"ance.dev_queries={dev_q}",
        "ance.max_missed_refreshes=0",  # kills and restarts here: lateness is not what this test is about
        f"ance.heartbeat_timeout_s={IDLE_LIMIT_S:g}",  # nor is a heartbeat thread starved by the load
        "loss.name=ance", "loss.in_batch_negatives=true", "train.num_workers=1", "train.cpus_per_worker=1",
        "train.batch_size=8", "train.max_steps=40", "train.report_every=4", "train.negatives_poll_every=2",
        "train.eval_every=8",
        f"train.storage_path={tmp_path}", "train.name=ance", "train.keep_checkpoints=2", "optim.lr=1e-4",
        "ance.refresh_every=4", "ance.top_k=30", "ance.negatives=5", "ance.cpus=1", "ance.poll_seconds=0.2",
        "ance.precision=fp32", f"ance.dev_qrels={faq / 'qrels' / 'test.trec'}", "ance.keep_versions=2"])
    with ListenWatch(os.getpid()) as watch:  # trainer, refresher and all they start: loopback only
        try:
            summary = run_ance(job, validate_fn=wait_for_the_refresher, progress=False)
        finally:
            training_over.set()
    print(f"\n[loopback] ANCE run: {watch.summary()}")
    watch.assert_loopback_only("RayTrainWorker", "IndexRefresher")

    assert summary["steps"] == 40  # training never stopped
    used = summary["negatives_versions"]
    print(json.dumps({"used": used, "refresher": summary.get("refresher"), "wall": summary["wall_seconds"]},
                     default=str)[:3000])
    assert len(used) >= 2 and used[0]["at_step"] >= 0 and used[-1]["at_step"] > 0  # switched while training
    assert [u["version"] for u in used] == sorted({u["version"] for u in used})  # only ever newer
    assert all(u["checkpoint_step"] <= u["at_step"] for u in used)  # staleness >= 0
    assert summary["final_metrics"]["negatives_staleness"] >= 0
    assert "at_version" in killed, "the refresher published no negatives version while training ran, so it was " \
                                   f"never killed (versions: {list_versions(versions)})"
    assert used[-1]["version"] > killed["at_version"]  # the restarted refresher went on
    # whenever a marker exists the version is complete; positives never negatives
    import pyarrow.parquet as pq

    judged = load_qrels(faq / "qrels" / "train.trec")
    for v in list_versions(versions):
        folder = versions / f"v-{v:06d}"
        assert (folder / MARKER).exists() and (folder / "meta.json").exists()
        for row in pq.read_table(folder / "negatives.parquet").to_pylist():
            assert not set(row["negatives"]) & set(judged[row["qid"]])
        meta = json.loads((folder / "meta.json").read_text())
        assert 0.0 <= meta["dev_metric"] <= 1.0
    assert len(list_versions(versions)) <= 2  # keep_versions


def _failing_job(tiny_model_dir, faq, tmp_path, name, *extra):
    from pipeline.train.config import load_train_config

    # IVF with 4096 lists cannot be trained on the FAQ's 176 passages: every refresh raises
    return load_train_config(None, [
        f"model.name_or_path={tiny_model_dir}", "model.pooling=mean", "model.normalize=true",
        "model.query_max_length=32", "model.doc_max_length=64", f"data.corpus={faq}", "data.hard_negatives=1",
        "loss.name=ance", "train.num_workers=1", "train.cpus_per_worker=1", "train.batch_size=8",
        "train.max_steps=16", "train.report_every=2", "train.negatives_poll_every=2", f"train.storage_path={tmp_path}",
        f"train.name={name}", "optim.lr=1e-4", "ance.refresh_every=4", "ance.top_k=30", "ance.negatives=5",
        "ance.cpus=1", "ance.poll_seconds=0.2", "ance.precision=fp32", "ance.factory=IVF4096,Flat",
        "ance.refresh_retries=1", "ance.retry_backoff_s=0", "ance.max_missed_refreshes=2",
        # the trainer in this process beside the refresher actor: what these tests assert is the loop's
        # reading of the refresher's state (its polls, the missed-refresh count, the report lines), the same
        # for both runners; test_refresher_runs_beside_training_and_survives_a_kill trains on Ray Train
        "train.runner=local", *extra])


def test_a_refresher_that_always_fails_ends_the_run_with_its_error(ray_session, tiny_model_dir, faq, tmp_path):
    """No version ever comes, so the run fails at the first poll at or after step (2 + 1) x 4 = 12,
    whatever the timing, naming the refresher's last error and its log (exit 2 through the CLI)."""
    from pipeline.errors import PipelineError
    from pipeline.recipes.ance import run_ance

    with pytest.raises(PipelineError) as err:
        run_ance(_failing_job(tiny_model_dir, faq, tmp_path, "fails"), progress=False)
    msg = str(err.value)
    assert "no negatives version for 2 refresh intervals of 4 steps" in msg, msg
    assert "refresher.log" in msg and "on_refresher_failure=continue" in msg
    assert "Traceback" not in msg and len(msg.splitlines()) == 1


def test_with_continue_every_report_line_says_the_negatives_are_stale(ray_session, tiny_model_dir, faq, tmp_path,
                                                                      capsys):
    from pipeline.recipes.ance import run_ance

    summary = run_ance(_failing_job(tiny_model_dir, faq, tmp_path, "goes_on", "ance.on_refresher_failure=continue"))
    assert summary["steps"] == 16 and summary["negatives_versions"] == []
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[train] goes_on step ")]
    steps = {int(ln.split()[3].split("/")[0]): ln for ln in lines if "validation" not in ln}
    late = [s for s in steps if s >= 14]  # the poll at step 12 saw it; reports from 14 on carry the note
    assert late and all("WARNING negatives stale since the start: no negatives version" in steps[s] for s in late)



def test_an_external_refresher_killed_mid_run_ends_the_run_with_one_line(ray_session, tiny_model_dir, faq, tmp_path):
    """ance.start_refresher=false: the refresher is its own `pipeline refresh` job. Killed (SIGKILL)
    once it has published a version, its heartbeat stops, and the training run fails at a poll after
    ance.heartbeat_timeout_s, naming it, instead of training on to the end on stale negatives."""
    import signal
    import subprocess
    import sys

    from pipeline.data.negatives import list_versions, read_status
    from pipeline.errors import PipelineError
    from pipeline.recipes.ance import run_ance
    from pipeline.train.config import dump_job, load_train_config

    job = load_train_config(None, [
        f"model.name_or_path={tiny_model_dir}", "model.pooling=mean", "model.normalize=true",
        "model.query_max_length=32", "model.doc_max_length=64", f"data.corpus={faq}", "data.hard_negatives=1",
        "loss.name=ance", "train.num_workers=1", "train.cpus_per_worker=1", "train.batch_size=8",
        "train.max_steps=2000", "train.report_every=2", "train.negatives_poll_every=2", "train.step_sleep_s=0.1",
        f"train.storage_path={tmp_path}", "train.name=ext", "optim.lr=1e-4", "ance.refresh_every=4",
        "ance.top_k=30", "ance.negatives=5", "ance.precision=fp32", "ance.poll_seconds=0.2",
        "ance.start_refresher=false", "ance.max_missed_refreshes=1000", "ance.heartbeat_timeout_s=4",
        "train.runner=local"])  # the heartbeat is read by the loop, whichever runner runs it
    config = tmp_path / "ext.yaml"
    config.write_text(dump_job(job))
    run_dir, versions = tmp_path / "ext", tmp_path / "ext" / "negatives"
    box: dict = {}

    def training():
        try:
            box["summary"] = run_ance(job, progress=False)
        except BaseException as e:  # the outcome under test
            box["error"] = e

    t = threading.Thread(target=training, daemon=True)
    t.start()
    deadline = time.time() + 300
    while not (run_dir / "config.yaml").exists() and t.is_alive() and time.time() < deadline:
        time.sleep(0.2)
    refresher = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "refresh", "--run-dir", str(run_dir),
                                  "--config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while not list_versions(versions) and t.is_alive() and time.time() < deadline:
            time.sleep(0.2)
        assert list_versions(versions), "the external refresher published no version"
        assert read_status(versions).get("beat", 0) >= 1 and read_status(versions)["pid"] == refresher.pid
        refresher.send_signal(signal.SIGKILL)
    finally:
        if refresher.poll() is None:
            refresher.kill()
        refresher.wait()
    t.join(timeout=300)
    assert not t.is_alive()
    err = box.get("error")
    assert isinstance(err, PipelineError), box
    msg = str(err)
    assert "heartbeat stopped" in msg and f"pid {refresher.pid}" in msg and len(msg.splitlines()) == 1, msg
    assert not (run_dir / "summary.json").exists()


def test_ance_dar_with_a_dev_split_killed_and_resumed_through_the_cli(ray_session, tiny_model_dir, faq, tmp_path,
                                                                    capsys):
    """ANCE + DAR (the composition the paper's ANCE rows use) as a user runs it: `pipeline train` with the
    refresher beside it and a dev split of the training queries (the refresher's dev metric on it too),
    killed right after its step-4 checkpoint, then run again: it resumes from that checkpoint with the
    negatives version it recorded, trains the rest once, and exports a model that loads."""
    from pipeline.cli import main
    from pipeline.models import BiEncoder
    from pipeline.config import ModelConfig

    args = ["train", "--config", "jobs/configs/ance_dar.yaml", f"model.name_or_path={tiny_model_dir}",
            "model.pooling=mean", "model.normalize=true", "model.query_max_length=32", "model.doc_max_length=64",
            f"data.corpus={faq}", "validation.dev_split=0.2", "train.num_workers=1", "train.cpus_per_worker=1",
            "train.batch_size=8", "train.max_steps=8", "train.report_every=2", "train.negatives_poll_every=2",
            f"train.storage_path={tmp_path}", "train.name=ad", "ance.refresh_every=4", "ance.cpus=1",
            "ance.poll_seconds=0.2", "ance.precision=fp32", "ance.max_missed_refreshes=0", "loss.n_perturb=2",
            # the trainer in this process (what is asserted is the recipe's resume, the same for both runners);
            # ANCE on Ray Train's workers: test_refresher_runs_beside_training_and_survives_a_kill, test_jobs'
            # ANCE job, and a Ray Train run killed right after a checkpoint: test_train
            "train.runner=local"]
    with pytest.raises(Exception, match="simulated failure right after the checkpoint of step 4"):
        main(args + ["train.fail_after_checkpoint=4"])  # (a test-only knob: not a PipelineError)
    run = tmp_path / "ad"
    assert (run / "split" / "dev.trec").exists() and (run / "step-00000004" / "state.json").exists()
    assert main(args + ["train.fail_after_checkpoint=4"]) == 0  # the marker says it failed once already
    summary = json.loads((run / "summary.json").read_text())
    assert summary["method"] == "ance_dar" and summary["steps"] == 8
    assert summary["resumed_from"].endswith("step-00000004") and summary["final_metrics"]["train_steps_run"] == 4
    assert "val_RR@10" in summary["final_metrics"]  # validated on the dev split
    assert summary["refresher"]["settings"]["dev_qrels"].endswith("split/dev.trec")
    assert BiEncoder.load(ModelConfig(name_or_path=str(run / "model"))).embed(["a query"], "query").shape == (1, 32)
