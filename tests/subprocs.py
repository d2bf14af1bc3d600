"""Scripts run in a session of their own (the simulated clusters, the CLI's sweeps), and free loopback ports.

A simulated cluster (`ray.cluster_utils.Cluster`) runs in a subprocess so it never meets the
session's local Ray (a process is connected to one Ray at a time); killing the processes of its
session ends every Ray process it started, whatever happened.

Waiting on such a run never assumes a fast machine (on 2 loaded cores everything takes many times
longer): `Watched` waits on the event itself and calls a run stuck only when it has shown no progress
(no output line, no change of the files it writes) for `IDLE_LIMIT_S`; `RAY_START_WINDOWS` widens the
start-up windows Ray itself gives its processes. One window cannot be widened: a node's own wait for its raylet
to register with the GCS (30 s, fixed in Ray's `Node`); `run_cluster_script` starts such a script once more, in a
new folder with its session's processes gone, when that window and nothing else ended it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest


def terminal_signals() -> None:
    """preexec_fn: the child gets SIGINT and SIGHUP as a terminal's foreground process does. A test
    run started in the background (`make test &`, nohup, a CI runner) has them ignored, children
    inherit that, and the CLI rightly keeps an ignored signal ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, and never one this process was handed before: the OS may
    give a just-closed port again, and a Ray head given the same port for two of its components refuses
    to start (it happened: gcs and dashboard_agent_http both got 55891)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


# A run that shows no progress (no output line, no file it writes changing) for this long is stuck,
# however loaded the machine: the ceiling of every wait below, never the expected duration.
IDLE_LIMIT_S = 600.0

# Ray's own start-up windows, for the processes of a Ray a test's subprocess starts: each is a fixed
# deadline that a loaded machine misses while nothing is wrong (a GCS port file written after 30 s, a
# dashboard up after 60 s, a worker process registered after 60 s, an agent after its window); then
# Ray fails the start, or kills the worker and starts another, which loads the machine further.
RAY_START_WINDOWS = {
    "RAY_gcs_server_port_wait_time_s": "600",  # the GCS's port file, and the attempts to reach it
    "RAY_DASHBOARD_STARTUP_TIMEOUT_S": "600",
    "RAY_worker_register_timeout_seconds": "600",  # else the raylet kills a slow-starting worker at 60 s
    "RAY_agent_register_timeout_ms": "600000",  # the runtime-env and dashboard agents
}


def session_processes(sid: int) -> list:
    """The live processes (zombies left out) of session `sid`: a subprocess started with
    `start_new_session=True` and everything it started (Ray's processes stay in it; its clean-up
    watchdog does not, and only ends processes)."""
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def kill_session(sid: int) -> None:
    """SIGKILL every live process of session `sid`."""
    import psutil

    for p in session_processes(sid):
        try:
            p.kill()
        except psutil.Error:
            pass


def tree_state(root) -> tuple[int, int]:
    """(files, bytes) under `root`: what changes while a run writes its checkpoints, events, versions."""
    n = size = 0
    # os.walk skips a folder that is gone by the time it is listed (a temporary version folder renamed
    # into place, an old checkpoint removed); Path.rglob raises FileNotFoundError there on Python 3.11
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                size += os.stat(os.path.join(folder, name), follow_symlinks=False).st_size
                n += 1
            except OSError:
                continue  # removed meanwhile (an old checkpoint, a temporary file)
    return n, size


class Watched:
    """`argv` run in a session of its own, its output read as it comes (a full pipe never blocks it),
    with a clock of its progress: a new output line, or a change of the files under `watch`.

    The waits (`until`, `wait`, `wait_session_gone`) wait on the event itself; they fail the test
    (the output tails in the message, every process of the session killed) only when the run has
    shown no progress for `idle` seconds, or when an event cannot come any more (the run exited)."""

    def __init__(self, argv: list[str], *, watch=None, merge_stderr: bool = False, **popen):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                                     text=True, start_new_session=True, **popen)
        self.watch = watch
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True)]
        if not merge_stderr:
            self._readers.append(threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True))
        for t in self._readers:
            t.start()
        self._seen: tuple = ()
        self._moved = time.monotonic()
        self._tree: tuple | None = None
        self._scanned = 0.0

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def output(self) -> str:
        return "".join(self.out)

    @property
    def errors(self) -> str:
        return "".join(self.err)

    def idle_for(self) -> float:
        """Seconds since the run last showed progress."""
        if self.watch is not None and time.monotonic() - self._scanned > 2.0:  # a scan every 2 s is plenty
            self._tree, self._scanned = tree_state(self.watch), time.monotonic()
        seen = (len(self.out), len(self.err), self._tree)
        if seen != self._seen:
            self._seen, self._moved = seen, time.monotonic()
        return time.monotonic() - self._moved

    def fail(self, why: str):
        kill_session(self.proc.pid)
        self.proc.wait()
        for t in self._readers:
            t.join(10)
        pytest.fail(f"{why}:\n{self.output[-3000:]}\n{self.errors[-6000:]}")

    def until(self, event, *, what: str, idle: float = IDLE_LIMIT_S, every: float = 0.2):
        """Poll `event()` until it returns something true, and return that. Fails when the run exits
        first, or shows no progress for `idle` seconds."""
        while True:
            found = event()
            if found:
                return found
            if self.proc.poll() is not None:
                self.fail(f"{what}: the run exited (exit {self.proc.returncode}) before it happened")
            if self.idle_for() > idle:
                self.fail(f"{what}: no progress for {idle:g} s")
            time.sleep(every)

    def wait(self, *, what: str, idle: float = IDLE_LIMIT_S, timeout: float | None = None) -> int:
        """Its exit status, once it has exited and its output is read. Fails when it shows no progress
        for `idle` seconds, or (with `timeout`) has not exited within `timeout` seconds."""
        t0 = time.monotonic()
        while self.proc.poll() is None:
            if self.idle_for() > idle:
                self.fail(f"{what} did not finish: no progress for {idle:g} s")
            if timeout is not None and time.monotonic() - t0 > timeout:
                self.fail(f"{what} did not finish in {timeout:g} s")
            time.sleep(0.2)
        self._drain(what)
        return self.proc.returncode

    def _drain(self, what: str) -> None:
        """Read its output to the end: a process it left may hold the pipe open until it ends too."""
        t0 = time.monotonic()
        for t in self._readers:
            while t.is_alive():
                t.join(0.5)
                if time.monotonic() - t0 > IDLE_LIMIT_S:
                    self.fail(f"{what}: its output still open {IDLE_LIMIT_S:g} s after it exited")

    def wait_session_gone(self, *, what: str, within: float = IDLE_LIMIT_S) -> None:
        """Wait until every process of its session has ended (its local Ray included: the CLI bounds
        Ray's shutdown at 30 s and exits, and its watchdog ends what is left after it; on a loaded
        machine they outlive the CLI). Fails, killing them, when some are left after `within` s."""
        t0 = time.monotonic()
        while True:
            left = session_processes(self.proc.pid)
            if not left:
                return
            if time.monotonic() - t0 > within:
                names = sorted({p.name() for p in left if p.is_running()})
                self.fail(f"{what}: {len(left)} of its processes still run {within:g} s after it exited: {names}")
            time.sleep(0.5)

    def end(self) -> None:
        """Kill whatever of its session still runs (a test that failed half-way leaves nothing behind)."""
        kill_session(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_result_script(script: str, *args: str, timeout: float, what: str, idle: float | None = None,
                      watch=None, env: dict | None = None) -> dict:
    """Run `python -c script args...` in a session of its own; the JSON it printed after `RESULT `.

    Fails the test (with the script's output tails) when it does not finish within `timeout`
    seconds or (with `idle`) shows no progress (an output line, a change of the files under `watch`)
    for `idle` seconds, exits non-zero, or prints no RESULT line; its processes are killed in every
    case. `env`: more environment variables for the script.
    """
    run = Watched([sys.executable, "-c", script, *map(str, args)], watch=watch,
                  env={**os.environ, **(env or {})})
    try:
        rc = run.wait(what=what, timeout=timeout, idle=idle if idle is not None else float("inf"))
    finally:
        run.end()
    stdout, stderr = run.output, run.errors
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if rc != 0 or not lines:
        raise ScriptFailed(f"{what} failed (exit {rc}):\n{stdout[-3000:]}\n{stderr[-6000:]}", stdout, stderr)
    return json.loads(lines[0][len("RESULT "):])


class ScriptFailed(AssertionError):
    """A script of `run_result_script` that failed (the test fails on it as on an assert); its whole output."""

    def __init__(self, message: str, stdout: str, stderr: str):
        super().__init__(message)
        self.stdout, self.stderr = stdout, stderr


# what Ray's `Node` raises when its raylet has not registered with the GCS within its fixed 30 s
NODE_START_TIMEOUT = "The current node timed out during startup"


def run_cluster_script(script: str, tmp: Path, args, up: str = "STAGE two nodes up", **kw) -> tuple[dict, Path]:
    """`run_result_script` for a simulated cluster's script, which prints `up` once its nodes are up: `args(folder)`
    gives its arguments for a folder under `tmp`; (the RESULT, that folder).

    A run that ended because a node's raylet missed Ray's fixed 30 s registration window (`NODE_START_TIMEOUT` in
    its output) before the script said `up` (the cluster never came up, so nothing the test asserts had run) is
    started once more in a new folder, its first session's processes killed; it says so on stderr. Any other
    failure, that window missed after `up`, or missed twice, fails the test as `run_result_script` does.
    """
    for attempt in (1, 2):
        folder = tmp / f"run-{attempt}"
        folder.mkdir(parents=True)
        try:
            return run_result_script(script, *args(folder), watch=folder, **kw), folder
        except ScriptFailed as e:
            missed = NODE_START_TIMEOUT in e.stdout + e.stderr and up not in e.stdout
            if attempt == 2 or not missed:
                raise
            print(f"[test] {kw.get('what', 'the script')}: a node missed Ray's fixed 30 s start-up window (a busy "
                  "machine); started once more in a new folder", file=sys.stderr)
    raise AssertionError("unreachable")
