"""`pipeline tune` end to end on local Ray: a tiny DAR sweep (tiny BERT, 3 trials, 4 steps,
2 trials at a time on 2 CPUs) is interrupted (SIGINT) after its first trial ends, resumed with
`--resume`, and must: not run the ended trial again, continue the unfinished ones from their own
checkpoints, early-stop the bad trial with ASHA (whose rungs `Tuner.restore` loses and the sweep
refills from its event log), and write the table, the best config and the plots.

Every wait is on the event itself (a trial's end in the event log, the sweep's exit, the end of every
process of the interrupted sweep's Ray) and fails only when the sweep shows no progress for 10 min
(subprocs.Watched): the sweep holds on a loaded machine (load 35 on 2 cores), however slow it gets.

Tune needs the dashboard, which the session Ray fixture does not start: the sweep runs in a
`pipeline tune` subprocess that starts its own local Ray (loopback, dashboard on).
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fixtures import short_temp_dir
from listening import ListenWatch
from subprocs import RAY_START_WINDOWS, Watched

from pipeline.train.config import load_train_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PLANTED = {"AWS_ACCESS_KEY_ID": "AKIAPLANTEDKEYID0001", "AWS_SECRET_ACCESS_KEY": "planted-secret-0f9e8d7c6b5a",
           "AWS_SESSION_TOKEN": "planted-session-token-1a2b3c"}



def _events(out: Path) -> list[dict]:
    path = out / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip().endswith("}")]


def _env(env: dict | None = None) -> dict:
    # credentials planted in the sweep's environment: no file the sweep or Ray leaves may hold them
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
            "PYTHONUNBUFFERED": "1", **RAY_START_WINDOWS, **PLANTED, **(env or {})}


def _argv(sweep: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", "tune", "--config", str(sweep), *extra]


def _cli(sweep: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(_argv(sweep, *extra), cwd=REPO, env=_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _watched(sweep: Path, out: Path, *extra: str) -> Watched:
    """The sweep, its progress watched: its output lines and the files of its output folder."""
    return Watched(_argv(sweep, *extra), watch=out, merge_stderr=True, cwd=REPO, env=_env())


def _sweep(tiny_model_dir, faq, out: Path) -> dict:
    # τ = 0.02 with dot scores on a random tiny BERT gives a loss ~40x the others' from step 1:
    # ASHA (metric loss, min) must stop it at its first rung (step 2), whenever it gets there.
    return {
        "base": {
            "model": {"name_or_path": str(tiny_model_dir), "pooling": "cls", "query_max_length": 32,
                      "doc_max_length": 64},
            "data": {"corpus": str(faq)},
            "loss": {"name": "dar", "n_perturb": 2, "similarity": "dot"},
            "optim": {"lr": 1e-4, "warmup_ratio": 0.0},
            "train": {"name": "tiny", "max_steps": 4, "batch_size": 8, "num_workers": 1, "cpus_per_worker": 0.4,
                      "report_every": 1, "eval_every": 2, "checkpoint_every": 2, "seed": 3},
            "validation": {"dev_split": 0.1, "metric": "RR@10"},  # held-out training queries, never test
            "ray": {"num_cpus": 2, "temp_dir": str(short_temp_dir("ray-"))},
        },
        "space": {"loss.temperature": {"grid": [1.0, 0.9, 0.02]}},
        "search": {"searcher": "grid", "metric": "loss", "scheduler": "asha", "grace_period": 2,
                   "reduction_factor": 2, "max_concurrent_trials": 2},
        "output": str(out),
    }


def _ended(out: Path) -> list[str]:
    return [e["trial"] for e in _events(out) if e["event"] in ("complete", "early-stopped")]


def _interrupt_after_a_trial_ends(sweep: Path, out: Path, runs: list[Watched]):
    """Start the sweep, Ctrl-C it as soon as one trial has ended (the event log says so), and wait
    until it and every process of its Ray have ended; (its events, the ended trials' files, the ended
    trials, each trial's last step)."""
    proc = _watched(sweep, out)
    runs.append(proc)
    proc.until(lambda: _ended(out), what="the first trial's end")
    proc.proc.send_signal(signal.SIGINT)
    rc = proc.wait(what="the interrupted sweep")
    log1 = proc.output
    assert rc == 130, log1
    assert "--resume" in log1 and "Configuration for experiment" not in log1  # our lines, not Tune's tables
    assert "Tuner.restore(" not in log1 and "Failed to fetch metrics" not in log1
    # the CLI bounds Ray's shutdown (30 s) and its watchdog ends what is left after it exits: on a loaded
    # machine a stopped trial's Train workers can outlive the CLI. The ended trials' files are read (and
    # the sweep resumed, on the same Ray temp folder) once every process of that sweep has ended.
    proc.wait_session_gone(what="the interrupted sweep")
    first = _events(out)
    done_before = {e["trial"] for e in first if e["event"] in ("complete", "early-stopped")}
    steps_before: dict[str, int] = {}
    for e in first:
        if e["event"] == "result":
            steps_before[e["trial"]] = max(steps_before.get(e["trial"], 0), e["metrics"]["step"])
    snapshot = {t: sorted((p.name, p.stat().st_mtime_ns) for p in (out / "trials" / t).rglob("*"))
                for t in done_before}
    return first, snapshot, done_before, steps_before


def test_sweep_interrupted_resumed_early_stops_and_writes_outputs(tiny_model_dir, faq, tmp_path):
    out = tmp_path / "sweep"
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(_sweep(tiny_model_dir, faq, out)))

    runs: list[Watched] = []
    try:
        # 1. start, and interrupt (Ctrl-C) as soon as one trial has ended
        first, snapshot, done_before, steps_before = _interrupt_after_a_trial_ends(sweep, out, runs)

        # 2. resume: ended trials are not run again, unfinished ones continue from their own checkpoints
        resumed = _watched(sweep, out, "--resume")
        runs.append(resumed)
        with ListenWatch(resumed.pid) as watch:  # the sweep's Ray, trials and their workers: loopback only
            rc = resumed.wait(what="the resumed sweep")
        log2 = resumed.output
        assert rc == 0, log2
        resumed.wait_session_gone(what="the resumed sweep")  # its Ray's logs are read below
    finally:
        for run in runs:
            run.end()
    print(f"\n[loopback] tune sweep: {watch.summary()}")
    watch.assert_loopback_only("gcs_server", "ImplicitFunc")  # the trials train in their own processes
    assert "ASHA's rungs refilled" in log2
    events = _events(out)
    later = events[len(first):]
    assert not [e for e in later if e["trial"] in done_before], "an ended trial ran again"
    for t in done_before:
        assert sorted((p.name, p.stat().st_mtime_ns) for p in (out / "trials" / t).rglob("*")) == snapshot[t]
    for t, step in steps_before.items():
        if t in done_before or not 2 <= step < 4:
            continue  # (a trial that trained its 4 steps before the interrupt ends without training again)
        resumed_steps = [e["metrics"]["step"] for e in later if e["trial"] == t and e["event"] == "result"]
        if not resumed_steps:  # it had trained all 4 steps before the interrupt (its last report was not seen)
            assert (out / "trials" / t / "step-00000004" / "state.json").exists(), f"{t}: no results after resume"
        else:
            assert resumed_steps[0] > 2, f"{t} restarted from scratch: {resumed_steps}"  # from its step-2 checkpoint

    starts = {e["trial"]: e["params"]["loss.temperature"] for e in events if e["event"] == "start"}
    final = {}
    for e in events:
        if e["event"] in ("complete", "early-stopped", "error"):
            final[e["trial"]] = e
    assert len(starts) == 3 and set(final) == set(starts)
    bad = next(t for t, tau in starts.items() if tau == 0.02)
    assert final[bad]["event"] == "early-stopped" and final[bad]["step"] == 2

    # 3. outputs: table (CSV + Markdown), best config, plots
    rows = {r["trial"]: r for r in csv.DictReader((out / "results.csv").open())}
    assert set(rows) == set(starts)
    assert rows[bad]["status"] == "early-stopped" and rows[bad]["steps"] == "2" and rows[bad]["total_steps"] == "4"
    assert any(r["status"] == "terminated" and r["steps"] == "4" for r in rows.values())
    for r in rows.values():
        assert float(r["loss"]) > 0 and float(r["wall_s"]) > 0
        assert r["status"] != "terminated" or 0 <= float(r["val_RR@10"]) <= 1  # validated at its last step
    for t, r in rows.items():  # ASHA's stop at max_t comes after the export: every complete trial has its model
        if r["status"] == "terminated":
            trained = json.loads((out / "trials" / t / "summary.json").read_text())
            assert trained["steps"] == 4 and (out / "trials" / t / "model" / "modules.json").exists()
    md = (out / "results.md").read_text()
    assert md.startswith("| trial | status | loss.temperature | loss | steps |") and "early-stopped" in md
    assert (out / "plots" / "metric_vs_loss.temperature.png").stat().st_size > 5000
    assert (out / "plots" / "learning_curves.png").stat().st_size > 5000
    summary = json.loads((out / "summary.json").read_text())
    best_id = summary["best"]["trial"]
    assert rows[best_id]["status"] == "terminated" and starts[best_id] in (1.0, 0.9)
    best = load_train_config(out / "best.yaml")  # what `pipeline train --config best.yaml` loads
    assert best.loss.name == "dar" and best.loss.temperature == starts[best_id] and best.loss.n_perturb == 2
    assert best.train.max_steps == 4 and best.train.name == "tiny-best" and best.model.name_or_path == str(tiny_model_dir)
    assert float(rows[best_id]["loss"]) == min(float(r["loss"]) for r in rows.values() if r["status"] == "terminated")

    # 4. the credentials in the sweep's environment are in no file it or its Ray left (Tune hands AWS_*
    # to trials through their runtime environment, which Ray writes into runtime_env_agent.log)
    from fixtures import files_holding

    ray_dir = Path(yaml.safe_load(sweep.read_text())["base"]["ray"]["temp_dir"])
    assert list(ray_dir.rglob("runtime_env_agent.log")), "the scan must cover Ray's session logs"
    assert files_holding([out, ray_dir], PLANTED.values()) == []


def test_more_concurrent_trials_than_the_cluster_holds_is_refused_before_any_trial(tiny_model_dir, faq, tmp_path):
    """3 concurrent trials x (0.1 CPU driver + 0.6 CPU training in the trial's process) = 2.1 CPUs on a 2-CPU
    Ray: exit 2, nothing run."""
    out = tmp_path / "sweep"
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(_sweep(tiny_model_dir, faq, out)))
    proc = _cli(sweep, "search.max_concurrent_trials=3", "train.cpus_per_worker=0.6")
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, log
    assert "error: tune: 3 concurrent trial(s) x (0.1 CPU trial driver + 0.6 CPU training in the trial's own process)" \
        in log
    assert "2.1 CPUs asked, the cluster has 2" in log and "Traceback" not in log
    assert not (out / "events.jsonl").exists() and not (out / "tune").exists()


def test_a_sweep_whose_output_is_an_object_store_uri(tiny_model_dir, faq, tmp_path):
    """output=s3://… (moto's S3 server on 127.0.0.1, reached with the credentials planted in the
    sweep's environment): 2 trials of 2 steps side by side, no validation. Tune's state and the trials' runs are on the URI, the
    sweep's own files are written in the staging folder and uploaded (summary.json with them), nothing
    lands under the working directory; a second start is refused (the URI holds a sweep), `--resume`
    of the ended sweep runs no trial again; no file left anywhere holds a planted credential."""
    import s3_emulator

    from pipeline import storage

    output = s3_emulator.uri(s3_emulator.make_bucket(), "sweeps/dar")
    doc = _sweep(tiny_model_dir, faq, tmp_path / "unused")
    # no validation: what this test asserts is where the sweep's files go, not what its trials measure
    doc["base"]["train"].update(max_steps=2, eval_every=0, checkpoint_every=2)
    doc["base"].pop("validation")
    doc.update(output=output, space={"loss.temperature": {"grid": [1.0, 0.9]}},
               search={"searcher": "grid", "metric": "loss", "scheduler": "none", "max_concurrent_trials": 2})
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(doc))
    staging = tmp_path / "staging"
    env = {"PIPELINE_STAGING_DIR": str(staging)}

    proc = _cli(sweep, env=env)
    log, _ = proc.communicate(timeout=480)
    assert proc.returncode == 0, log
    assert f"-> {output}" in log and "Traceback" not in log
    root = storage.resolve(output)
    files = root.file_sizes()
    for name in ("sweep.json", "events.jsonl", "results.csv", "results.md", "best.yaml", "summary.json",
                 "plots/learning_curves.png", "plots/metric_vs_loss.temperature.png"):
        assert files.get(name), (name, sorted(files))
    assert any(f.startswith("tune/") and "experiment_state" in f for f in files), sorted(files)
    summary = storage.read_json(root / "summary.json")
    assert summary["statuses"]["terminated"] == 2 and summary["trials"] == 2
    trials = [t["trial"] for t in summary["trials_detail"]]
    for t in trials:  # each trial's Train run: on the URI, complete (its summary vouches for its model)
        assert storage.read_json(root / "trials" / t / "summary.json")["steps"] == 2
        assert (root / "trials" / t / "model" / "modules.json").is_file()
    events = [json.loads(x) for x in (root / "events.jsonl").read_text().splitlines() if x.strip()]
    assert sorted(e["trial"] for e in events if e["event"] == "complete") == sorted(trials)
    best = load_train_config(storage.download_dir(root, tmp_path / "copy") / "best.yaml")
    assert best.loss.name == "dar" and best.train.name == "tiny-best" and best.loss.temperature in (1.0, 0.9)
    assert not (REPO / "s3:").exists()  # not ./s3:/bucket/… under the working directory

    again = _cli(sweep, env=env)
    log2, _ = again.communicate(timeout=120)
    assert again.returncode == 2 and f"error: output {output} already holds a sweep" in log2, log2

    resumed = _cli(sweep, "--resume", env=env)
    log3, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, log3
    later = [json.loads(x) for x in (root / "events.jsonl").read_text().splitlines() if x.strip()]
    assert later[:len(events)] == events and not [e for e in later[len(events):] if e["event"] == "start"]
    assert storage.read_json(root / "summary.json")["statuses"]["terminated"] == 2

    from fixtures import files_holding

    ray_dir = Path(doc["base"]["ray"]["temp_dir"])
    assert files_holding([staging, ray_dir, storage.download_dir(root, tmp_path / "copy2")], PLANTED.values()) == []
