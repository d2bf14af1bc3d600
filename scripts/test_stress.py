#!/usr/bin/env python3
"""`make test-stress`: the integration tests, several times back to back, with one core kept busy.

A CPU hog (a process spinning in a loop) is started first and stopped at the end however the
script ends; then `pytest tests/integration` runs ROUNDS times (default 3). Each round's counts
(passed / failed / errors / skipped) and wall time are printed as they finish, and a summary
table at the end; the exit code is 0 only when no round had a failure or an error.

    python scripts/test_stress.py [--rounds 3] [--hogs 1] [--tests PATHS] [-- extra pytest args]

The log of each round goes to .stress/round-N.log (printed tails only on failure).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _spin(parent: int) -> None:
    """The hog: one busy core until terminated, or until its parent is gone (a killed script)."""
    x = 0
    while os.getppid() == parent:
        for _ in range(200_000):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def _counts(text: str) -> dict[str, int]:
    """pytest's closing line ("3 failed, 70 passed, 2 skipped in 5.1s") as counts."""
    out = {k: 0 for k in ("passed", "failed", "errors", "skipped")}
    tail = [ln for ln in text.splitlines() if re.search(r"\b(passed|failed|error|errors|no tests ran)\b", ln)]
    for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", tail[-1] if tail else ""):
        out["errors" if word.startswith("error") else word] += int(n)
    return out


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="how many back-to-back runs of tests/integration")
    ap.add_argument("--hogs", type=int, default=1, help="busy processes kept running (1 = one core busy)")
    ap.add_argument("--tests", default="tests/integration", help="what pytest runs each round")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)
    logs = REPO / ".stress"
    logs.mkdir(exist_ok=True)
    print(f"[stress] {args.rounds} round(s) of {args.tests} with {args.hogs} busy core(s) "
          f"on {os.cpu_count()} CPU(s), {_cpu()}", flush=True)
    hogs = [mp.Process(target=_spin, args=(os.getpid(),), daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    rows = []
    try:
        for r in range(1, args.rounds + 1):
            log = logs / f"round-{r}.log"
            t0 = time.monotonic()
            with open(log, "w") as f:
                rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                      *args.tests.split(), *args.pytest_args], cwd=REPO, stdout=f,
                                     stderr=subprocess.STDOUT)
            secs = time.monotonic() - t0
            text = log.read_text(errors="replace")
            c = _counts(text)
            ok = rc in (0, 5) and c["failed"] == 0 and c["errors"] == 0
            rows.append((r, c, secs, ok))
            print(f"[stress] round {r}/{args.rounds}: {c['passed']} passed, {c['failed']} failed, "
                  f"{c['errors']} errors, {c['skipped']} skipped in {secs / 60:.1f} min"
                  + ("" if ok else f" (exit {rc}; log {log})"), flush=True)
            if not ok:
                failed = [ln for ln in text.splitlines() if ln.startswith(("FAILED", "ERROR"))]
                print("\n".join(failed[-20:]), flush=True)
    finally:
        for h in hogs:
            h.terminate()
            h.join(5)
    bad = [r for r in rows if not r[3]]
    total = sum(r[2] for r in rows)
    print(f"[stress] done: {len(rows)} round(s), {len(rows) - len(bad)} clean, "
          f"{sum(r[1]['failed'] + r[1]['errors'] for r in rows)} failures in {total / 60:.1f} min "
          f"(rounds: {', '.join(f'{r[2] / 60:.1f}' for r in rows)} min)", flush=True)
    return 1 if bad or len(rows) < args.rounds else 0


if __name__ == "__main__":
    sys.exit(main())
