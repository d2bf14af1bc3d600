"""The documentation site builds from docs/ with warnings as errors (properdocs.yml: every page in the nav,
every link and anchor resolving, the API reference generated from every module's docstrings), and the pages
stay plain Markdown: nothing in docs/ is a directive only the site understands."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("properdocs", reason="the docs extra is not installed (make setup installs it)")


def test_the_site_builds_strictly_with_every_page_and_module(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "properdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    site = tmp_path / "site"
    for page in (ROOT / "docs").glob("*.md"):
        assert (site / page.stem / "index.html").is_file(), page.name
    assert "The verbs at a glance" in (site / "index.html").read_text(encoding="utf-8")  # README as the home page
    reference = (site / "reference" / "index.html").read_text(encoding="utf-8")
    for sub in (ROOT / "pipeline").iterdir():
        if sub.is_dir() and list(sub.glob("*.py")):
            assert f"pipeline.{sub.name}" in reference, sub.name
    searcher = (site / "reference" / "pipeline" / "index.html").read_text(encoding="utf-8")
    assert "Dense search over an index folder" in searcher  # a class's docstring, rendered


def test_the_pages_are_plain_markdown():
    for page in (ROOT / "docs").glob("*.md"):
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"^::: ", text, re.M), f"{page.name}: a mkdocstrings directive in a page"
