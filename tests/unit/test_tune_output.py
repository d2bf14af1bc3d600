"""A sweep's `output` through the storage layer (tune/output.py): credentials in a URI refused before
anything is written, the output rules on an object store (moto's S3 server on 127.0.0.1), the
staging folder and its uploads. No Ray."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import s3_emulator
import yaml

from pipeline import storage
from pipeline.errors import ConfigError, PipelineError
from pipeline.tune.output import SweepOutput

BASE = {
    "model": {"name_or_path": "minilm"},
    "data": {"corpus": "runs/c"},
    "loss": {"name": "dar", "n_perturb": 3},
    "train": {"max_steps": 20, "eval_every": 5, "num_workers": 1, "cpus_per_worker": 0.9},
    "validation": {"dev_split": 0.1, "metric": "MRR@10"},
}
DAR = SimpleNamespace(loss=SimpleNamespace(name="dar"))
IDENTITY = {"base": {}, "space": [], "search": {}}


@pytest.mark.parametrize("output, secret", [
    ("s3://bucket/x?secret_key=abc", "abc"),
    ("s3://bucket/x?region=us-east-1;secret_key=abc", "abc"),
    ("s3://bucket/x#secret_key=abc", "abc"),
    ("s3://AKIAXXXX:ab/cd+ef@bucket/x", "ab/cd+ef"),
])
def test_a_credential_in_the_output_uri_is_refused_before_anything_is_written(output, secret, tmp_path, monkeypatch,
                                                                              capsys):
    """`pipeline tune ... output=s3://bucket/x?secret_key=abc`: exit 2, one error line without the
    secret, before Ray starts; no `./s3:/bucket/x?secret_key=abc/` folder, no staging folder."""
    import ray

    from pipeline.cli import main

    sweep = tmp_path / "conf" / "sweep.yaml"
    sweep.parent.mkdir()
    sweep.write_text(yaml.safe_dump({"base": BASE, "output": str(tmp_path / "unused"),
                                     "space": {"loss.n_perturb": {"grid": [3, 5]}}, "search": {"grace_period": 5}}))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("PIPELINE_STAGING_DIR", str(tmp_path / "staging"))
    started = []  # an earlier test of the session may have left Ray up: what matters is that this call starts none
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append((a, k)))
    assert main(["tune", "--config", str(sweep), f"output={output}"]) == 2
    out = capsys.readouterr()
    assert out.err.startswith("error: ") and "credentials in a storage URI" in out.err, out.err
    assert secret not in out.err + out.out and "Traceback" not in out.err
    assert list(work.iterdir()) == [] and not (tmp_path / "staging").exists() and not (tmp_path / "unused").exists()
    assert started == []


@pytest.fixture
def bucket(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_STAGING_DIR", str(tmp_path / "staging"))
    return s3_emulator.make_bucket()


def test_output_rules_on_a_uri(bucket):
    fresh = SweepOutput.resolve(s3_emulator.uri(bucket, "fresh"))
    assert fresh.remote and fresh.trials == str(storage.resolve(s3_emulator.uri(bucket, "fresh/trials")))
    fresh.check(False, IDENTITY, DAR)  # empty: a new sweep may start (the write probe left nothing)
    assert list(fresh.location.iterdir()) == []
    with pytest.raises(PipelineError, match="holds no sweep to resume"):
        fresh.check(True, IDENTITY, DAR)
    (storage.resolve(s3_emulator.uri(bucket, "used")) / "notes.txt").write_text("mine")
    with pytest.raises(PipelineError, match="already holds files that are not a sweep's"):
        SweepOutput.resolve(s3_emulator.uri(bucket, "used")).check(False, IDENTITY, DAR)
    with pytest.raises(ConfigError, match="an RCL sweep's trials keep their stages"):
        fresh.check(False, IDENTITY, SimpleNamespace(loss=SimpleNamespace(name="rcl")))
    with pytest.raises(ConfigError, match="bucket does not exist"):
        SweepOutput.resolve(s3_emulator.uri("no-such-bucket-here", "x")).check(False, IDENTITY, DAR)


def test_staging_uploads_and_resume_downloads(bucket, tmp_path):
    out = SweepOutput.resolve(s3_emulator.uri(bucket, "sweep"))
    stale = storage.staging_dir(out.location, "tune") / "results.md"
    stale.write_text("an earlier sweep's")
    local = out.prepare(resume=False)
    assert local == stale.parent and list(local.iterdir()) == []  # the cache holds nothing of another sweep
    (local / "sweep.json").write_text(json.dumps({"identity": IDENTITY}))
    out.upload("sweep.json")
    with pytest.raises(PipelineError, match="already holds a sweep"):
        SweepOutput.resolve(s3_emulator.uri(bucket, "sweep")).check(False, IDENTITY, DAR)
    (local / "events.jsonl").write_text('{"event": "start", "trial": "t0"}\n')
    out.sync_events()
    assert (out.location / "events.jsonl").read_text() == (local / "events.jsonl").read_text()
    (local / "plots").mkdir()
    (local / "plots" / "learning_curves.png").write_bytes(b"png")
    (local / "results.md").write_text("| trial |\n")
    (local / "summary.json").write_text('{"trials": 1}\n')
    (out.location / "summary.json").write_text('{"stale": true}\n')
    out.publish()
    assert out.location.file_sizes() == {str(p.relative_to(local)): p.stat().st_size
                                         for p in local.rglob("*") if p.is_file()}
    assert storage.read_json(out.location / "summary.json") == {"trials": 1}

    (local / "events.jsonl").write_text("not uploaded\n")  # a resume takes the URI's files, not the cache's
    again = SweepOutput.resolve(s3_emulator.uri(bucket, "sweep"))
    local2 = again.prepare(resume=True)
    assert sorted(p.name for p in local2.iterdir()) == ["events.jsonl", "sweep.json"]
    assert (local2 / "events.jsonl").read_text() == '{"event": "start", "trial": "t0"}\n'


def test_a_local_or_file_output_is_the_folder_itself(tmp_path):
    out = SweepOutput.resolve(f"file://{tmp_path}/sw")
    assert not out.remote and out.location == tmp_path / "sw" and out.trials == str(tmp_path / "sw" / "trials")
    assert out.prepare(resume=False) == tmp_path / "sw" and (tmp_path / "sw").is_dir()
    assert out.tune_storage() == (str(tmp_path / "sw"), None)
    out.upload("sweep.json")
    out.publish()  # no-ops
    assert list((tmp_path / "sw").iterdir()) == []
