"""Loading a model through the library prints none of transformers' progress bars ("Loading weights")
or warnings, also for a caller of the Python API that never set up the CLI's quiet environment, and
transformers' own settings are as the caller left them afterwards."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import sys
from transformers import AutoModel
from transformers.utils import logging as hf_logging
from pipeline.models.loading import _load_tower

hf_logging.enable_progress_bar()
hf_logging.set_verbosity_warning()
path = sys.argv[1]
if sys.argv[2] == "plain":
    AutoModel.from_pretrained(path, local_files_only=True)
else:
    _load_tower(path)
    print("after:", hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity() == hf_logging.WARNING)
"""


def _run(tiny_model_dir, how: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY", "TQDM_DISABLE")}
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_dir), how], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_loading_through_the_library_shows_no_transformers_progress_bar(tiny_model_dir):
    plain = _run(tiny_model_dir, "plain")
    assert plain.returncode == 0, plain.stderr
    assert "Loading weights" in plain.stderr  # what transformers prints on its own: the check can fail
    ours = _run(tiny_model_dir, "library")
    assert ours.returncode == 0, ours.stderr
    assert "Loading weights" not in ours.stderr and "%|" not in ours.stderr, ours.stderr  # no bar of any kind
    assert "after: True True" in ours.stdout  # the caller's settings are put back
