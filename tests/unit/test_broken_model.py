"""A model folder transformers cannot load is one error line naming the folder and what is wrong,
in every verb that loads a model (sts, encode, retrieve, train), never a traceback; a failed
`train` leaves no empty run folder behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.cli import main

DPR_YAML = str(Path(__file__).resolve().parents[2] / "jobs" / "configs" / "dpr.yaml")


def _weights(d: Path) -> list[Path]:
    return sorted(d.glob("*.safetensors")) + sorted(d.glob("*.bin"))


BREAKS = {
    "bad config.json": (lambda d: (d / "config.json").write_text("{not json"), "is not a valid JSON file"),
    "unknown model type": (lambda d: (d / "config.json").write_text('{"model_type": "nosuch"}'),
                           "model type `nosuch`"),
    "no weights": (lambda d: [p.unlink() for p in _weights(d)], "no file named model.safetensors"),
    "truncated safetensors": (lambda d: [p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]) for p in _weights(d)],
                              "(*.safetensors) is truncated or corrupt"),
}


@pytest.fixture(scope="module")
def broken(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("broken_models")
    out = {}
    for name, (damage, _) in BREAKS.items():
        d = root / name.replace(" ", "_").replace(".", "_")
        shutil.copytree(tiny_model_dir, d)
        assert _weights(d)
        damage(d)
        out[name] = d
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from pipeline.data.ingest import ingest

    d = tmp_path_factory.mktemp("broken_model_corpus")
    (d / "c.tsv").write_text("1\tone passage\n2\ttwo passages\n3\tthree\n")
    (d / "q.tsv").write_text("q1\tone\nq2\ttwo\n")
    (d / "qrels.trec").write_text("q1 0 1 1\nq2 0 2 1\n")
    ingest([d / "c.tsv"], "msmarco", d / "corpus", queries=d / "q.tsv", qrels={"train": d / "qrels.trec",
                                                                               "test": d / "qrels.trec"},
           progress=False)
    return d / "corpus"


def _one_error_line(capsys, folder: Path, reason: str) -> None:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith(f"error: model folder {folder}: cannot load the model: "), err
    assert reason in last, err


@pytest.mark.parametrize("name", list(BREAKS))
def test_sts_and_encode_name_the_folder_and_the_problem(broken, corpus, tmp_path, capsys, name):
    folder, reason = broken[name], BREAKS[name][1]
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a cat\ta dog\t1\na man\ta woman\t3\n")
    assert main(["sts", "--pairs", str(pairs), "--model", str(folder)]) == 2
    _one_error_line(capsys, folder, reason)
    assert main(["encode", "--corpus", str(corpus), "--model", str(folder), "--out", str(tmp_path / "emb")]) == 2
    _one_error_line(capsys, folder, reason)
    assert not (tmp_path / "emb").exists()


@pytest.mark.parametrize("name", ["bad config.json", "truncated safetensors"])
def test_train_names_the_folder_and_leaves_no_run_folder(broken, corpus, tmp_path, capsys, name):
    folder, reason = broken[name], BREAKS[name][1]
    storage = tmp_path / "runs" / "train"
    assert main(["train", "--config", DPR_YAML, f"data.corpus={corpus}", f"model.name_or_path={folder}",
                 f"train.storage_path={storage}", "train.num_workers=1"]) == 2
    _one_error_line(capsys, folder, reason)
    assert not (tmp_path / "runs").exists()


def test_a_train_that_fails_building_its_examples_removes_only_the_folders_it_made(tiny_model_dir, corpus,
                                                                                   tmp_path, capsys):
    """The examples are refused (a qrels file naming an unknown query) after the run folder was
    made: the empty folders this run created go, a folder that was there before stays."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "notes.txt").write_text("mine")
    bad = tmp_path / "bad_corpus"
    shutil.copytree(corpus, bad)
    (bad / "qrels" / "train.trec").write_text("q1 0 1 1\nq7 0 2 1\n")
    storage = tmp_path / "runs" / "new" / "train"
    assert main(["train", "--config", DPR_YAML, f"data.corpus={bad}", "validation.dev_split=0",
                 f"validation.corpus={bad}", f"validation.qrels={bad}/qrels/test.trec", f"model.name_or_path={tiny_model_dir}",
                 "model.pooling=mean", f"train.storage_path={storage}", "train.num_workers=1"]) == 2
    err = capsys.readouterr().err
    assert "q7" in err and "Traceback" not in err, err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["notes.txt"]
