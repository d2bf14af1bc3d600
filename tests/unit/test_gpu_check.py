"""scripts/gpu_check.sh (#63): it runs with `--device cpu` as it would on the first lent GPU, prints its one table
(equality with the CPU, throughput, a training step, what it skipped), and imports no Ray: a `ray` that cannot be
imported is on its path, and the check passes all the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_check_runs_on_a_cpu_without_ray(tmp_path):
    fake = tmp_path / "no-ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('Ray is not installed on the GPU machine')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "no-ray"), "PYTHON": sys.executable}
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--json",
                           str(tmp_path / "figures.json")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    text = "\n".join(table)
    for row in ("encode fp32 vs CPU fp32 (min cosine", "DPR loss: cpu vs CPU", "DAR loss (deterministic form)",
                "DPR loss after one AdamW step", "encode bf16, tiny (2 x 64) @ 128 tokens", "DPR step, tiny",
                "skipped: Ray's runners", "skipped: FAISS on the GPU", "| Ray imported by this check | no |"):
        assert row in text, row
    assert "FAIL" not in text
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["equality"]["min_cosine_fp32"] > 0.99999
    assert figures["throughput"]["tiny (2 x 64) @ 256 tokens"]["passages_per_s"] > 0
