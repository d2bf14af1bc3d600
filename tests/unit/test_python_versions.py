"""The code runs on the oldest Python that pyproject.toml's `requires-python` admits: vermin reads every file of
the package, its tests, scripts, benchmarks and job entrypoints and names any module, function or syntax that
Python lacks (`import tomllib` on 3.10 made the unit suite fail to collect there; the CI machine runs 3.11)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vermin")

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("pipeline", "tests", "scripts", "bench", "jobs")


def _oldest_python() -> str:
    """The lower bound of `requires-python` (">=3.10,<3.14" -> "3.10")."""
    m = re.search(r'^requires-python\s*=\s*">=\s*(\d+\.\d+)[,"]', (ROOT / "pyproject.toml").read_text(), re.M)
    assert m, "pyproject.toml declares requires-python as \">=X.Y\" or \">=X.Y,<X.Z\""
    return m.group(1)


def _vermin(target: str, *paths: Path) -> subprocess.CompletedProcess:
    # --eval-annotations: annotations count too (`from __future__ import annotations` defers them, but
    # typing.get_type_hints and the config's dataclasses evaluate them); --violations: only what fails the target
    return subprocess.run([sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())",
                           f"-t={target}-", "--violations", "--no-tips", "--eval-annotations",
                           "--no-make-paths-absolute", *map(str, paths)], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.slow
def test_every_file_runs_on_the_oldest_declared_python():
    target = _oldest_python()
    done = _vermin(target, *(ROOT / f for f in FOLDERS))
    assert done.returncode == 0, f"not Python {target}:\n{done.stdout}{done.stderr}"


def test_the_check_can_fail(tmp_path):
    """A file that needs 3.11 (tomllib) or 3.12 (itertools.batched) is named, with what it needs."""
    (tmp_path / "newer.py").write_text("import tomllib\nfrom itertools import batched\n")
    done = _vermin("3.10", tmp_path / "newer.py")
    assert done.returncode != 0 and "'tomllib' module requires !2, 3.11" in done.stdout
    assert "batched" in done.stdout and "3.12" in done.stdout
