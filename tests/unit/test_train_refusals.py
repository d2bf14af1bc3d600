"""`pipeline train` refuses a runner or a device that cannot work before anything is written: the
`validation.dev_split` split files (<storage>/<name>/split/) are written only once those checks pass."""

from __future__ import annotations

import pytest

from pipeline.cli import main


@pytest.mark.parametrize("extra, message", [
    (["train.runner=local", "train.num_workers=2"], "train.runner=local trains one worker in this process"),
    (["train.use_gpu=false", "validation.precision=fp16"], "validation.precision=fp16 needs GPU workers"),
])
def test_a_refused_run_leaves_no_split_behind(faq, tiny_model_dir, tmp_path, capsys, extra, message):
    storage = tmp_path / "runs"
    rc = main(["train", f"data.corpus={faq}", f"model.name_or_path={tiny_model_dir}", f"train.storage_path={storage}",
               "train.name=r", "validation.dev_split=0.1", *extra])
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and message in errors[0], errors
    assert not (storage / "r" / "split").exists() and not storage.exists()
