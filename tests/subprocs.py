"""Scripts run in a process group of their own (the simulated clusters), and free loopback ports.

A simulated cluster (`ray.cluster_utils.Cluster`) runs in a subprocess so it never meets the
session's local Ray (a process is connected to one Ray at a time); killing its process group ends
every Ray process it started, whatever happened.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

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


def run_result_script(script: str, *args: str, timeout: float, what: str) -> dict:
    """Run `python -c script args...` in its own process group; the JSON it printed after `RESULT `.

    Fails the test (with the script's output tails) when it does not finish within `timeout`
    seconds, exits non-zero, or prints no RESULT line; its process group is killed in every case.
    """
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{what} did not finish in {timeout:g} s:\n{stdout[-2000:]}\n{stderr[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{what} failed (exit {proc.returncode}):\n{stdout[-3000:]}\n{stderr[-6000:]}"
    return json.loads(lines[0][len("RESULT "):])
