"""`pipeline encode` into one --out at a time: the run holds an exclusive lock (`<out>/.encode.lock`,
fcntl.flock) while it writes; a second run is refused with one line and writes nothing."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.errors import PipelineError
from pipeline.index.encode import LOCK_NAME, encode_corpus


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def _cfg(model_dir):
    return load_config(None, [f"model.name_or_path={model_dir}", "encode.runner=local", "encode.backend=torch",
                              "encode.precision=fp32", "encode.show_progress=false"])


@pytest.fixture
def held(tmp_path):
    """The lock of `tmp_path / 'emb'` held by another open file, as another encode holds it."""
    out = tmp_path / "emb"
    out.mkdir()
    fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    yield out
    os.close(fd)


def test_a_second_encode_into_a_locked_folder_is_refused_and_writes_nothing(held, faq, tiny_model_dir, capsys):
    before = _tree(held.parent)
    with pytest.raises(PipelineError, match=rf"^{held}: another pipeline encode is writing into this folder"):
        encode_corpus(faq, held, _cfg(tiny_model_dir))
    assert _tree(held.parent) == before
    assert main(["encode", "--corpus", str(faq), "--out", str(held), "--model", str(tiny_model_dir),
                 "encode.runner=local"]) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {held}: another pipeline encode is writing")
    assert _tree(held.parent) == before


@pytest.mark.slow
def test_the_lock_is_held_while_encoding_and_gone_after(faq, tiny_model_dir, tmp_path, monkeypatch):
    from pipeline.index import encode as encode_mod

    out = tmp_path / "emb"
    seen = []
    real = encode_mod._run_local

    def run_local(todo, out_dir, *a, **k):  # another process's attempt, made while this run encodes
        fd = os.open(out_dir / LOCK_NAME, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append(True)
        finally:
            os.close(fd)
        return real(todo, out_dir, *a, **k)

    monkeypatch.setattr(encode_mod, "_run_local", run_local)
    summary = encode_corpus(faq, out, _cfg(tiny_model_dir))
    assert seen == [True] and summary["rows"] > 0
    assert not (out / LOCK_NAME).exists()
    # a finished set (no lock now) is continued by the next run, which reuses every shard
    assert encode_corpus(faq, out, _cfg(tiny_model_dir))["encoded"] == 0


def test_a_failed_first_run_leaves_no_folder_and_no_lock(tmp_path, tiny_model_dir):
    out = tmp_path / "new" / "emb"
    with pytest.raises(PipelineError):
        encode_corpus(tmp_path / "no-corpus", out, _cfg(tiny_model_dir))
    assert not (tmp_path / "new").exists()
