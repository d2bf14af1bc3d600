"""Data bundled with the package (read from the installed package, never downloaded)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def python_faq_dir() -> Path:
    """The Python FAQ as a BEIR folder (corpus.jsonl = answers, queries.jsonl = questions,
    qrels/), extracted from Debian's python3.11-doc: the demo's corpus and RCL's FAQ setting."""
    return Path(str(resources.files("pipeline") / "resources" / "python_faq"))
