"""Every `jobs/*.py` smoke test through `ray job submit` against a Ray head started here, as a user
would run them on a cluster (README "Clusters").

The head runs on 127.0.0.1 with its own ports and temp dir, token auth on with a test token (never the
user's ~/.ray), in its own process group; it is stopped by killing that group and every process whose
command line names its temp dir — never `ray stop`, which would end every Ray on the machine. Nothing
here touches the session Ray fixture. Jobs run one after another (2 cores): one chain job covers
encode_corpus -> build_index -> retrieve -> evaluate, then train, ance and tune.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from subprocs import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


def _pids_naming(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


def stop_head(proc: subprocess.Popen, temp_dir: str) -> None:
    """End this head only: its process group, then any process still naming its temp dir."""
    for _ in range(2):
        try:
            os.killpg(proc.pid, signal.SIGTERM if _ == 0 else signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(1.0)
    for pid in _pids_naming(temp_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def head():
    temp_dir = tempfile.mkdtemp(prefix="rayjobs-", dir="/tmp")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONUNBUFFERED": "1"}
    dash = free_port()
    cmd = [RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={free_port()}",
           "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--num-cpus=2", f"--temp-dir={temp_dir}",
           f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
           f"--dashboard-agent-grpc-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
           f"--metrics-export-port={free_port()}", "--object-store-memory=300000000", "--disable-usage-stats"]
    log = open(Path(temp_dir) / "head.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    head = {"address": address, "env": env, "temp_dir": temp_dir}
    try:
        deadline = time.time() + 90
        while ray_cli(head, "list").returncode != 0:  # the job server answers (with the token)
            assert proc.poll() is None, (Path(temp_dir) / "head.log").read_text()[-3000:]
            if time.time() > deadline:
                pytest.fail("the Ray head's job server did not answer in 90 s")
            time.sleep(1.0)
        yield head
    finally:
        stop_head(proc, temp_dir)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)  # the head's logs and sockets: nothing left in /tmp


def ray_cli(head, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`ray job ...` against the head, as a user would run it (the CLI, in its own process: the token and
    RAY_AUTH_MODE=token are read there, not cached in this test process)."""
    return subprocess.run([RAY, "job", args[0], "--address", head["address"], *args[1:]], env=head["env"], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def submit(head, entrypoint: str, timeout: float = 240) -> str:
    """`ray job submit` as the README shows it: it tails the job's logs until the job ends and exits 1 when the job
    failed; then `ray job status` must say it succeeded. The job's logs (`ray job logs`) are returned. (One CLI
    process for the whole wait: a `ray job status` every 2 s was ~1 s of CPU a poll, a tenth of this module's.)"""
    sid = f"smoke-{uuid.uuid4().hex[:8]}"
    runtime_env = {"env_vars": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                                "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1", "PYTHONUNBUFFERED": "1"}}
    try:
        sub = ray_cli(head, "submit", "--submission-id", sid, "--working-dir", str(REPO),
                      "--runtime-env-json", json.dumps(runtime_env), "--", *shlex.split(entrypoint), timeout=timeout)
    except subprocess.TimeoutExpired:
        ray_cli(head, "stop", sid)
        pytest.fail(f"job {entrypoint!r} not done in {timeout} s:\n{ray_cli(head, 'logs', sid).stdout[-4000:]}")
    res = ray_cli(head, "status", sid)
    status = res.stdout + res.stderr  # the CLI logs the status on stderr
    logs = ray_cli(head, "logs", sid).stdout
    assert sub.returncode == 0 and f"Job '{sid}' succeeded" in status, \
        f"{entrypoint}\n{sub.stdout[-2000:]}\n{sub.stderr[-2000:]}\n{status[-3000:]}\n{logs[-6000:]}"
    return logs


def job(script: str, out: Path, *extra: str) -> str:
    return shlex.join([sys.executable, f"jobs/{script}.py", "--smoke-test", "--out", str(out), *extra])


def test_spine_jobs_chain(head, tmp_path):
    out = tmp_path / "spine"
    chain = " && ".join(job(s, out) for s in ("encode_corpus", "build_index", "retrieve", "evaluate"))
    logs = submit(head, shlex.join(["sh", "-c", chain]))
    emb = json.loads((out / "emb" / "embeddings.json").read_text())
    assert emb["complete"] is True
    assert (out / "index" / "index.faiss").stat().st_size > 0
    run_lines = (out / "run.trec").read_text().splitlines()
    assert len({line.split()[0] for line in run_lines}) == 176  # every FAQ query retrieved
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    assert 0.0 <= metrics["RR@10"] <= 1.0
    for verb in ("encode", "index", "retrieve", "evaluate"):
        assert f"[smoke] {verb}: outputs in {out}" in logs  # each entrypoint ran (ingest/encode not repeated)
    assert logs.count("[encode] done") == 1


def test_train_job(head, tmp_path):
    out = tmp_path / "train"
    submit(head, job("train", out))
    run = out / "train" / "smoke"
    assert (run / "model" / "modules.json").exists()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6


def test_ance_job(head, tmp_path):
    out = tmp_path / "ance"
    submit(head, job("ance", out))
    summary = json.loads((out / "train" / "ance_smoke" / "summary.json").read_text())
    assert summary["steps"] == 12 and "refresher" in summary
    assert list((out / "train" / "ance_smoke" / "negatives").glob("v-*"))  # at least one published version


def test_tune_job(head, tmp_path):
    out = tmp_path / "tune"
    submit(head, job("tune", out), timeout=300)
    assert (out / "tune" / "results.csv").exists() and (out / "tune" / "best.yaml").exists()


def test_the_head_refuses_a_wrong_token(head):
    wrong = {**head, "env": {**head["env"], "RAY_AUTH_TOKEN": "0" * 32}}
    res = ray_cli(wrong, "list")
    assert res.returncode != 0 and "Invalid authentication token" in res.stdout + res.stderr


def test_ance_entrypoint_refuses_a_non_ance_config():
    proc = subprocess.run([sys.executable, "jobs/ance.py", "--config", "jobs/configs/dar.yaml"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "loss.name ance or ance_dar" in proc.stderr and "Traceback" not in proc.stderr
