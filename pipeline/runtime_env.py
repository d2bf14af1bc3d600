"""Process-wide settings every entry point applies first: offline Hugging Face, quiet logs."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def setup_offline_env() -> None:
    """No network at run time: HF hub and datasets offline, HF cache kept local to the project."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "HF_HOME" not in os.environ:
        repo = Path(__file__).resolve().parent.parent
        base = repo if (repo / "pyproject.toml").exists() else Path.home() / ".cache" / "pipeline"
        os.environ["HF_HOME"] = str(base / ".hf_home")
    # Quiet transformers without importing it (0.7 s; `pipeline --help` must not pay it): both are read
    # when transformers is first imported. Already imported: set now. (models/loading.py also silences
    # it around every load, for library callers that never call this.)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()
        except ImportError:
            pass
