"""Symlink loops are named as such: an input of `ingest` that is one (or lies inside one) is not "file not
found", and a loop inside a model folder is refused with one line before any file is hashed (os.walk with
followlinks=True walked it ~40 levels deep, hashing every file each time)."""

from __future__ import annotations

import shutil

import pytest

from pipeline import io_utils
from pipeline.cli import main
from pipeline.errors import InputError


def _error_lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]


@pytest.mark.parametrize("case", ["corpus", "inside", "beir", "queries"])
def test_ingest_names_a_symlink_loop_and_writes_nothing(tmp_path, capsys, case):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    good = tmp_path / "collection.tsv"
    good.write_text("1\tdense retrieval\n2\tsparse retrieval\n")
    loop = tmp_path / ("a/collection.tsv" if case == "inside" else "a")
    out = tmp_path / "out"
    argv = {"corpus": [str(loop), "--format", "msmarco"], "inside": [str(loop), "--format", "msmarco"],
            "beir": [str(loop), "--format", "beir"],
            "queries": [str(good), "--format", "msmarco", "--queries", str(loop)]}
    assert main(["ingest", *argv[case], "--out", str(out)]) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith(f"error: {loop}: a symlink loop"), lines
    assert "not found" not in lines[0]
    assert not out.exists()


def test_ingest_names_a_link_to_nothing(tmp_path, capsys):
    (tmp_path / "gone.tsv").symlink_to(tmp_path / "moved.tsv")
    assert main(["ingest", str(tmp_path / "gone.tsv"), "--format", "msmarco", "--out", str(tmp_path / "out")]) == 2
    assert _error_lines(capsys) == [f"error: {tmp_path / 'gone.tsv'}: a symlink to {tmp_path / 'moved.tsv'}, "
                                    "which does not exist"]


def _tree(root):
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "sub" / "weights.bin").write_bytes(b"\x00" * 64)
    return root


def test_a_loop_in_a_folder_tree_is_refused_before_any_file_is_read(tmp_path, monkeypatch):
    model = _tree(tmp_path / "model")
    (model / "sub" / "again").symlink_to(model)  # leads back to a folder it is inside
    read = []
    real = io_utils.sha256_file
    monkeypatch.setattr(io_utils, "sha256_file", lambda p, *a: read.append(p) or real(p, *a))
    with pytest.raises(InputError, match=rf"^{model / 'sub' / 'again'}: a symlink loop: it leads back to {model},"):
        io_utils.sha256_tree(model)
    assert read == []
    (model / "sub" / "again").unlink()
    (model / "self").symlink_to(model / "self")  # a link to itself
    with pytest.raises(InputError, match=rf"^{model / 'self'}: a symlink loop"):
        io_utils.sha256_tree(model)


def test_links_that_are_no_loop_are_followed_as_before(tmp_path):
    """A model folder of links (to a cache, to one shared folder twice) has the digest of the same files
    copied in; a link to nothing is skipped."""
    shared = _tree(tmp_path / "cache")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "one").symlink_to(shared)
    (linked / "two").symlink_to(shared)
    (linked / "config.json").symlink_to(shared / "config.json")
    (linked / "dangling").symlink_to(tmp_path / "nothing")
    copied = tmp_path / "copied"
    shutil.copytree(shared, copied / "one")
    shutil.copytree(shared, copied / "two")
    shutil.copy(shared / "config.json", copied / "config.json")
    assert io_utils.sha256_tree(linked) == io_utils.sha256_tree(copied)
    assert sorted(rel for rel, _ in io_utils.tree_files(linked)) == [
        "config.json", "one/config.json", "one/sub/weights.bin", "two/config.json", "two/sub/weights.bin"]


def test_a_model_folder_with_a_loop_is_one_error_line(tiny_model_dir, faq, tmp_path, capsys):
    from pipeline.models.loading import model_digest

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "loop").symlink_to(model)
    with pytest.raises(InputError, match="a symlink loop"):
        model_digest(model)
    out = tmp_path / "emb"
    assert main(["encode", "--corpus", str(faq), "--out", str(out), "--model", str(model),
                 "encode.runner=local"]) == 2
    assert _error_lines(capsys) == [f"error: {model / 'loop'}: a symlink loop: it leads back to {model}, a folder "
                                    "it is inside; remove the link or point it at a real folder"]
    assert not out.exists()
