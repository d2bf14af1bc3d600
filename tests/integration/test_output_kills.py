"""`pipeline index --overwrite` SIGKILLed at random moments: the index path always holds a
complete index (the old or the new), and the next run leaves no temporaries.

No Ray is started. The exact kill points (between renames, after the swap) are simulated
deterministically in tests/unit/test_outputs.py; this test kills the real CLI process.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit"))
from test_outputs import make_embeddings  # noqa: E402

KILLS = 24


def _index(emb: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline.cli", "index", "--embeddings", str(emb),
                             "--out", str(out), "--overwrite"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _ntotal(idx: Path) -> int:
    from pipeline.index.faiss_index import LoadedIndex

    return LoadedIndex(idx).index.ntotal


def test_index_killed_at_random_moments_never_loses_the_index(tmp_path):
    a = make_embeddings(tmp_path / "a", n=150000, dim=64)
    b = make_embeddings(tmp_path / "b", n=150001, dim=64)
    idx = tmp_path / "idx"
    t0, t_tmp = time.time(), None
    p = _index(a, idx)
    while p.poll() is None:  # when does the output start being written (its .tmp-* appears)?
        if t_tmp is None and any(n.startswith(".tmp-") for n in os.listdir(tmp_path)):
            t_tmp = time.time() - t0
        time.sleep(0.002)
    assert p.wait(120) == 0, p.stderr.read()
    full = time.time() - t0
    t_tmp = t_tmp or full * 0.8
    rng = random.Random(7)
    lost, landed_in_write, stale_seen = 0, 0, 0
    for i in range(KILLS):
        before = _ntotal(idx)
        src = b if i % 2 == 0 else a
        p = _index(src, idx)
        time.sleep(rng.uniform(0.85 * t_tmp, 1.1 * full))  # aimed at the writing phase
        p.send_signal(signal.SIGKILL)
        p.wait(60)
        try:
            after = _ntotal(idx)  # readable right after the kill: old or new, complete
        except Exception as e:  # noqa: BLE001 - any failure here is the loss we test for
            lost += 1
            print(f"kill {i}: {e}")
            continue
        assert after in (before, 150000 + (src is b)), after
        stale_seen += any(n.startswith((".tmp-", ".old-")) for n in os.listdir(tmp_path))
        landed_in_write += after != before
    assert lost == 0
    p = _index(a, idx)
    assert p.wait(120) == 0
    assert _ntotal(idx) == 150000
    left = [n for n in os.listdir(tmp_path) if n.startswith((".tmp-", ".old-"))]
    assert left == []
    print(json.dumps({"kills": KILLS, "lost": lost, "replaced_before_kill": landed_in_write,
                      "kills_leaving_temporaries": stale_seen,
                      "run_seconds": round(full, 2),
                      "write_phase_from": round(t_tmp, 2)}))
