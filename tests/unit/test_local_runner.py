"""What a training run refuses before it writes anything (the runner, the device), and the run's identity:
the precision it trains in and `train.length_group_rows` are part of it, and checkpoints written before
they were still resume when they trained as the run would."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from fixtures import dpr_job

from pipeline.config import to_dict
from pipeline.errors import ConfigError, PipelineError
from pipeline.models.checkpoint import finalize_checkpoint
from pipeline.train import runner_choice
from pipeline.train.config import dump_job, load_train_config
from pipeline.train.identity import check_identity, check_resume_early, run_identity
from pipeline.train.trainer import train


def _job(tiny_model_dir, faq, storage, *extra):
    return dpr_job(tiny_model_dir, faq, storage, "run", "train.num_workers=1", "train.max_steps=2", *extra)


def _untouched(storage) -> None:
    """Nothing of the run: no run folder, so no config.yaml and no examples/."""
    assert not (storage / "run").exists() and not list(storage.rglob("config.yaml")) \
        and not list(storage.rglob("examples")), sorted(storage.rglob("*"))


@pytest.mark.parametrize("extra, env, named", [
    (("ray.address=127.0.0.1:6379",), None, r"ray.address / RAY_ADDRESS"),
    ((), "127.0.0.1:6379", r"ray.address / RAY_ADDRESS"),
    (("train.num_workers=2",), None, r"train.num_workers=2 \(local runs one worker\)"),
    (("data.streaming=ray-data",), None, r"data.streaming=ray-data"),
])
def test_every_local_runner_refusal_leaves_the_storage_path_untouched(tiny_model_dir, faq, tmp_path, monkeypatch,
                                                                      extra, env, named):
    """The refusals of train.runner=local came after the examples were built (config.yaml and examples/
    left behind); now they come first."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if env:
        monkeypatch.setenv("RAY_ADDRESS", env)
    storage = tmp_path / "runs"
    storage.mkdir()
    with pytest.raises(ConfigError, match=rf"train.runner=local .*{named}.* needs train.runner=ray"):
        train(_job(tiny_model_dir, faq, storage, "train.runner=local", *extra), progress=False)
    _untouched(storage)


def test_a_local_runner_on_object_storage_is_refused_before_the_network(tiny_model_dir, faq, tmp_path, monkeypatch):
    """An S3 storage path with the local runner: refused by name, not by an unreachable bucket (nothing is
    uploaded: the endpoint below listens nowhere, so any request would fail on the network instead)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    uri = "s3://no-such-bucket/runs?endpoint_override=http://127.0.0.1:9&access_key=a&secret_key=b"
    with pytest.raises(ConfigError, match="train.runner=local .*a storage URI as train.storage_path"):
        train(_job(tiny_model_dir, faq, uri, "train.runner=local"), progress=False)
    assert not list(tmp_path.iterdir())  # no local staging copy either


@pytest.mark.parametrize("runner", ["local", "auto", "ray"])
def test_use_gpu_without_a_gpu_is_refused_under_every_runner(tiny_model_dir, faq, tmp_path, monkeypatch, runner):
    """train.use_gpu=true on a machine without a GPU trained on the CPU (exit 0) under the local and auto
    runners; now every runner refuses it with one line, before anything is written. With train.amp=fp16 the
    line says that there is no GPU here (it said fp16 "needs GPU workers (train.use_gpu=true)")."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("pipeline.device.gpu_here", lambda: False)
    monkeypatch.setattr(runner_choice, "_ray_running", lambda: False)  # this machine's workers, not a Ray's
    storage = tmp_path / "runs"
    storage.mkdir()
    for amp in ("auto", "fp16"):
        with pytest.raises(PipelineError, match="train.use_gpu=true: no CUDA GPU is visible on this machine") as e:
            train(_job(tiny_model_dir, faq, storage, f"train.runner={runner}", "train.use_gpu=true",
                       f"train.amp={amp}"), progress=False)
        assert "needs GPU workers" not in str(e.value) and "\n" not in str(e.value)
        assert ("train.amp=fp16 needs one too" in str(e.value)) == (amp == "fp16")
        _untouched(storage)


def test_fp16_validation_on_cpu_workers_is_refused_as_fp16_training_is(tiny_model_dir, faq, tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    storage = tmp_path / "runs"
    storage.mkdir()
    with pytest.raises(PipelineError, match=r"validation.precision=fp16 needs GPU workers \(train.use_gpu=true\)"):
        train(_job(tiny_model_dir, faq, storage, "validation.precision=fp16"), progress=False)
    _untouched(storage)
    # CPU workers on a cluster are CPUs too: refused without asking the cluster
    cluster = load_train_config(None, ["ray.address=10.0.0.1:6379", "validation.precision=fp16"])
    with pytest.raises(PipelineError, match="validation.precision=fp16 needs GPU workers"):
        runner_choice.check_device(cluster, "ray")
    with pytest.raises(PipelineError, match="train.amp=fp16 needs GPU workers"):
        runner_choice.check_device(load_train_config(None, ["ray.address=10.0.0.1:6379", "train.amp=fp16"]), "ray")
    # bf16 and auto on a cluster's CPUs: the workers' CPU decides (the driver does not know the precision)
    assert runner_choice.check_device(load_train_config(None, ["ray.address=10.0.0.1:6379", "train.amp=bf16"]),
                                      "ray") is None
    # on this machine the driver knows what the run trains in (the identity records it)
    assert runner_choice.check_device(load_train_config(None, ["train.amp=no"]), "local") == "fp32"


# --------------------------------------------------------------------------- the run's identity

META, DIGEST = {"examples": 100}, "ab" * 32


def _checkpoint(tmp_path, name: str, job, identity: dict, precision: str | None = None, drop_key: bool = False):
    """A complete checkpoint folder recording `identity` (and `precision`), with the job's config.yaml
    (without train.length_group_rows when `drop_key`, as written before the key existed)."""
    d = tmp_path / name
    d.mkdir()
    text = dump_job(job)
    if drop_key:
        text = "\n".join(line for line in text.splitlines() if "length_group_rows" not in line) + "\n"
    (d / "config.yaml").write_text(text)
    finalize_checkpoint(d, {"step": 2, "identity": identity,
                            **({"precision": precision} if precision is not None else {})})
    return d


def test_the_identity_holds_the_precision_and_length_group_rows_and_a_resume_with_another_is_refused(tmp_path):
    """Resuming with another train.amp was accepted silently (the summary said bf16 for a run half in fp32),
    and train.length_group_rows (it changes the dropout masks of a step) was not compared."""
    job = load_train_config(None, [])
    ident = run_identity(job, META, DIGEST, 1, 10, "bf16")
    assert ident["amp"] == "bf16" and ident["length_group_rows"] == 16
    assert "amp" not in run_identity(job, META, DIGEST, 1, 10, None)  # a cluster's workers decide
    ckpt = _checkpoint(tmp_path, "step-00000002", job, ident, "bf16")
    check_identity(ckpt, ident)  # the same run resumes
    with pytest.raises(PipelineError, match=r"differs in amp \('bf16' in the checkpoint, 'fp32' now\); "
                                            r"train.amp=bf16 trains as the checkpoint did"):
        check_identity(ckpt, run_identity(job, META, DIGEST, 1, 10, "fp32"))
    other = load_train_config(None, ["train.length_group_rows=0"])
    with pytest.raises(PipelineError, match=r"differs in length_group_rows \(16 in the checkpoint, 0 now\); "
                                            r"train.length_group_rows=16 computes as the checkpoint did"):
        check_identity(ckpt, run_identity(other, META, DIGEST, 1, 10, "bf16"))


def test_checkpoints_written_before_the_keys_joined_the_identity_still_resume(tmp_path):
    job = load_train_config(None, [])
    now = run_identity(job, META, DIGEST, 1, 10, "bf16")
    old = {k: v for k, v in now.items() if k not in ("amp", "length_group_rows")}
    # no precision recorded: what it trained in is unknown, so any train.amp is accepted; its config.yaml
    # says length_group_rows 16 (the default since the key exists)
    unknown = _checkpoint(tmp_path, "a", job, old)
    check_identity(unknown, now)
    check_identity(unknown, run_identity(job, META, DIGEST, 1, 10, "fp32"))
    with pytest.raises(PipelineError, match=r"length_group_rows \(16 in the checkpoint, 0 now\)"):
        check_identity(unknown, run_identity(load_train_config(None, ["train.length_group_rows=0"]),
                                             META, DIGEST, 1, 10, "bf16"))
    # its state.json says what it trained in: that is compared
    recorded = _checkpoint(tmp_path, "b", job, old, precision="fp32")
    check_identity(recorded, run_identity(job, META, DIGEST, 1, 10, "fp32"))
    with pytest.raises(PipelineError, match=r"amp \('fp32' in the checkpoint, 'bf16' now\); train.amp=no"):
        check_identity(recorded, now)
    # a config.yaml without the key predates train.length_group_rows: one padded batch per tower (0)
    before = _checkpoint(tmp_path, "c", job, old, drop_key=True)
    check_identity(before, run_identity(load_train_config(None, ["train.length_group_rows=0"]),
                                        META, DIGEST, 1, 10, "bf16"))
    with pytest.raises(PipelineError, match=r"length_group_rows \(0 in the checkpoint, 16 now\)"):
        check_identity(before, now)


def test_an_ance_run_resumes_with_its_refresher_moved_apart_and_a_loss_change_is_named(tmp_path):
    """ance.start_refresher, the refresher's resources and failure rules went into the loss hash, so the
    ance.md pair (`ance.start_refresher=false` + `pipeline refresh`) could not resume a run trained with the
    refresher beside it ("loss_config_sha256 differs"), and a real loss change was named only by its hash."""
    base = ["loss.name=ance"]
    job = load_train_config(None, base)
    ident = run_identity(job, META, DIGEST, 1, 10, "bf16")
    ckpt = _checkpoint(tmp_path, "a", job, ident, "bf16")
    moved = load_train_config(None, base + ["ance.start_refresher=false", "ance.cpus=2", "ance.poll_seconds=5",
                                            "ance.on_refresher_failure=continue", "ance.keep_versions=4"])
    check_identity(ckpt, run_identity(moved, META, DIGEST, 1, 10, "bf16"))
    # a checkpoint hashed by the old rule (operational keys in): its config.yaml is hashed again by today's
    old_rule = {"loss": to_dict(job.loss), **{k: to_dict(v) for k, v in job.sections.items()}}
    old = dict(ident, loss_config_sha256=hashlib.sha256(json.dumps(old_rule, sort_keys=True).encode()).hexdigest()[:16])
    assert old["loss_config_sha256"] != ident["loss_config_sha256"]
    check_identity(_checkpoint(tmp_path, "b", job, old, "bf16"), run_identity(moved, META, DIGEST, 1, 10, "bf16"))
    other = load_train_config(None, base + ["ance.negatives=8", "loss.temperature=0.1"])
    with pytest.raises(PipelineError, match=r"differs in the loss settings: ance.negatives \(20 in the checkpoint, "
                                            r"8 now\), loss.temperature \(None in the checkpoint, 0.1 now\)"):
        check_identity(ckpt, run_identity(other, META, DIGEST, 1, 10, "bf16"), other)
    # before ANCE's refresher starts (it writes into the run): the same refusal, operational keys and the
    # loss's similarity/temperature (resolved against the model later) aside
    check_resume_early(ckpt, moved)
    check_resume_early(ckpt, load_train_config(None, base + ["loss.temperature=0.1"]))
    with pytest.raises(PipelineError, match=r"differs in the loss settings: ance.negatives \(20 in the checkpoint, "
                                            r"8 now\)\. Resuming needs .*another train.name .*nothing was built or started"):
        check_resume_early(ckpt, other)
    # and the train.* keys of the identity the config alone decides, each named with the setting that resumes
    for extra, named in [("train.batch_size=8", r"batch_per_worker \(32 in the checkpoint, 8 now\)"),
                         ("train.seed=7", r"seed \(0 in the checkpoint, 7 now\)"),
                         ("train.num_workers=2", r"world_size \(1 in the checkpoint, 2 now\)"),
                         ("train.length_group_rows=0", r"length_group_rows \(16 in the checkpoint, 0 now\); "
                                                       r"train.length_group_rows=16 computes as the checkpoint did"),
                         ("train.drophead=0.1", r"attention_regularizers .*train.drophead=0 trains as")]:
        with pytest.raises(PipelineError, match=named):
            check_resume_early(ckpt, load_train_config(None, base + [extra]))


def test_a_resume_refused_for_a_train_setting_builds_no_examples(tiny_model_dir, faq, tmp_path):
    """A resume with another train.seed (or batch size, workers, length groups, attention regularizers) was
    refused only after the examples were built: minutes on a big corpus, and a data setting changed with it
    rebuilt the run's own examples with the other settings before the refusal."""
    import json

    train(_job(tiny_model_dir, faq, tmp_path, "train.runner=local"), progress=False)
    meta = tmp_path / "run" / "examples" / "examples.json"
    before = meta.read_text()
    with pytest.raises(PipelineError, match=r"differs in seed \(3 in the checkpoint, 7 now\)\. Resuming .*nothing was built"):
        train(_job(tiny_model_dir, faq, tmp_path, "train.runner=local", "train.seed=7",
                   "data.negatives_depth=50"), progress=False)
    assert meta.read_text() == before and json.loads(before)["depth"] == 100


@pytest.mark.slow
def test_a_resume_refused_for_its_examples_leaves_the_runs_examples_as_they_were(tiny_model_dir, faq, tmp_path):
    """A resume with other judgements (another examples digest) rebuilt the run's own examples in place before
    the refusal: the run's folder then held examples its checkpoints were not trained on. It now builds beside
    them; a resume whose rebuilt examples are the same ones (another negatives depth without a negatives run)
    is accepted and keeps them, and a plain resume leaves every file as it was."""
    import json
    import os

    from pipeline.data.examples_store import RESUME_STAGING

    train(_job(tiny_model_dir, faq, tmp_path, "train.runner=local"), progress=False)
    examples = tmp_path / "run" / "examples"
    before = {p.name: p.read_bytes() for p in examples.iterdir()}
    inode = os.stat(examples / "examples.json").st_ino
    lines = (Path(faq) / "qrels" / "train.trec").read_text().splitlines()
    half = tmp_path / "half.trec"
    half.write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    with pytest.raises(PipelineError, match=r"differs in .*examples"):
        train(_job(tiny_model_dir, faq, tmp_path, "train.runner=local", f"data.qrels={half}"),
              progress=False)
    assert {p.name: p.read_bytes() for p in examples.iterdir()} == before
    assert not (tmp_path / "run" / RESUME_STAGING).exists()
    train(_job(tiny_model_dir, faq, tmp_path, "train.runner=local"), progress=False)
    assert os.stat(examples / "examples.json").st_ino == inode  # reused, not rewritten
    train(_job(tiny_model_dir, faq, tmp_path, "train.runner=local", "data.negatives_depth=50"),
          progress=False)
    assert json.loads((examples / "examples.json").read_text())["depth"] == 50
    assert not (tmp_path / "run" / RESUME_STAGING).exists()


@pytest.mark.slow
def test_a_finished_run_called_again_keeps_the_wall_time_that_trained_it(tiny_model_dir, faq, tmp_path, capsys):
    """`pipeline train` again on a finished run trains nothing; its summary (what `pipeline info` shows) said
    the no-op call's 0.4 s as the run's wall time and lost the split of the call that trained."""
    import json

    monkey_job = _job(tiny_model_dir, faq, tmp_path, "train.runner=local")
    first = train(monkey_job, progress=False)
    assert first["time_split"]["training"] >= 0 and first["wall_seconds"] > 0
    first_file = json.loads((tmp_path / "run" / "summary.json").read_text())
    again = train(monkey_job, progress=True)
    assert "already complete" in capsys.readouterr().out
    assert again["wall_seconds"] == first["wall_seconds"] and again["time_split"] == first["time_split"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == {**first_file, "versions": again["versions"]}


@pytest.mark.slow
def test_the_attention_a_run_trains_with_joins_its_identity_and_auto_resumes_with_the_checkpoints(
        tiny_model_dir, faq, tmp_path):
    """train.attention (models/attention.py) changes the dropout draws of a step: a resume with another is
    refused with the setting that resumes; auto takes the checkpoint's, and the towers' own (SDPA) for a
    checkpoint made before the key was recorded."""
    import json

    steps = ("train.runner=local", "train.max_steps=4", "train.checkpoint_every=2")
    with pytest.raises(Exception, match="simulated failure right after the checkpoint"):
        train(_job(tiny_model_dir, faq, tmp_path, *steps, "train.fail_after_checkpoint=2"), progress=False)
    state_file = tmp_path / "run" / "step-00000002" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["identity"]["attention"] == state["attention"] == "threshold-dropout"  # auto on a CPU
    with pytest.raises(PipelineError, match=r"attention \('threshold-dropout' in the checkpoint, 'sdpa' now\); "
                                            r"train.attention=threshold-dropout trains as the checkpoint did"):
        train(_job(tiny_model_dir, faq, tmp_path, *steps, "train.attention=sdpa"), progress=False)
    # as a checkpoint written before the key: auto resumes with the towers' own
    del state["identity"]["attention"], state["attention"]
    state_file.write_text(json.dumps(state))
    done = train(_job(tiny_model_dir, faq, tmp_path, *steps), progress=False)
    assert done["resumed_from"].endswith("step-00000002") and done["attention"] == "sdpa" and done["steps"] == 4
    fresh = train(_job(tiny_model_dir, faq, tmp_path / "fresh", *steps), progress=False)
    assert fresh["attention"] == "threshold-dropout" and fresh["resumed_from"] is None


# --------------------------------------------------------------------------- settings that change a step (#60)

@pytest.mark.parametrize("change, named", [
    ("optim.lr=0.5", r"optim.lr \(2e-05 in the checkpoint, 0.5 now\)"),
    ("optim.warmup_steps=3", r"optim.warmup_steps \(0 in the checkpoint, 3 now\)"),
    ("model.doc_max_length=64", r"model.doc_max_length \(None in the checkpoint, 64 now\)"),
    ("train.max_steps=40", r"train.max_steps \(0 in the checkpoint, 40 now\)"),
    ("train.epochs=3", r"train.epochs \(1 in the checkpoint, 3 now\)"),
    ("data.shuffle_window=5", r"data.shuffle_window \(10000 in the checkpoint, 5 now\)"),
])
def test_a_resume_with_another_optimizer_schedule_or_length_setting_is_refused_naming_the_key(tmp_path, change,
                                                                                             named):
    """A resume with another optim.lr, warm-up, model.doc_max_length or total steps was accepted: the optimizer
    state brought back the checkpoint's learning rate, the schedule was rebuilt with the new total, and
    config.yaml / summary.json recorded only the new values. Each is refused, before anything is built and
    again on the checkpoint the loop loads, naming the key and both values."""
    job = load_train_config(None, [])
    ident = run_identity(job, META, DIGEST, 1, 10, "bf16")
    ckpt = _checkpoint(tmp_path, "step-00000002", job, ident, "bf16")
    check_identity(ckpt, ident, job)
    check_resume_early(ckpt, job)
    other = load_train_config(None, [change])
    assert run_identity(other, META, DIGEST, 1, 10, "bf16")["step_settings_sha256"] != ident["step_settings_sha256"]
    with pytest.raises(PipelineError, match=r"differs in the optimizer, schedule and model settings: " + named
                       + r".*another train.name with train.init_from=<checkpoint>.*nothing was built"):
        check_resume_early(ckpt, other)
    with pytest.raises(PipelineError, match=r"differs in the optimizer, schedule and model settings: " + named):
        check_identity(ckpt, run_identity(other, META, DIGEST, 1, 10, "bf16"), other)


def test_a_checkpoint_made_before_the_step_settings_joined_resumes_by_what_its_config_records(tmp_path):
    """A checkpoint whose identity has no step_settings_sha256 (made before it joined) is judged by its
    config.yaml: the same settings resume, another optim.lr is refused; an unreadable config.yaml refuses."""
    job = load_train_config(None, ["optim.lr=1e-4"])
    old = {k: v for k, v in run_identity(job, META, DIGEST, 1, 10, "fp32").items()
           if k not in ("step_settings_sha256", "init_from")}
    ckpt = _checkpoint(tmp_path, "old", job, old, "fp32")
    check_identity(ckpt, run_identity(job, META, DIGEST, 1, 10, "fp32"), job)
    with pytest.raises(PipelineError, match=r"optim.lr \(0.0001 in the checkpoint, 0.5 now\)"):
        check_identity(ckpt, run_identity(load_train_config(None, ["optim.lr=0.5"]), META, DIGEST, 1, 10, "fp32"),
                       load_train_config(None, ["optim.lr=0.5"]))
    size = (ckpt / "config.yaml").stat().st_size  # the same size: state.json still vouches for the file
    (ckpt / "config.yaml").write_text("[" + " " * (size - 1))
    with pytest.raises(PipelineError, match=r"unknown in the checkpoint: its config.yaml cannot be read"):
        check_resume_early(ckpt, job)


@pytest.mark.slow
def test_a_real_resume_with_another_lr_is_refused_and_a_new_run_from_its_checkpoint_starts_from_its_weights(
        tiny_model_dir, faq, tmp_path, capsys):
    """The tiny run resumed with optim.lr=0.5 trained on at the checkpoint's rate and reported 0.5. Now it is
    refused and leaves the run as it was; `train.init_from` starts another run from that checkpoint's weights
    with a fresh optimizer and schedule, records the checkpoint it started from, and refuses to name the run
    itself or a folder without a checkpoint."""
    import torch
    from safetensors.torch import load_file

    train(_job(tiny_model_dir, faq, tmp_path, "train.runner=local"), progress=False)
    run = tmp_path / "run"
    before = {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    with pytest.raises(PipelineError, match=r"optim.lr \(0.0001 in the checkpoint, 0.5 now\).*nothing was built"):
        train(_job(tiny_model_dir, faq, tmp_path, "train.runner=local", "optim.lr=0.5"), progress=False)
    assert {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before
    with pytest.raises(PipelineError, match=r"a checkpoint of this run \(run\)"):
        train(_job(tiny_model_dir, faq, tmp_path, "train.runner=local", f"train.init_from={run}"), progress=False)
    with pytest.raises(PipelineError, match=r"not a complete checkpoint .*nor a run folder holding one"):
        train(dpr_job(tiny_model_dir, faq, tmp_path, "next", "train.runner=local", "train.num_workers=1", "train.max_steps=2",
                      f"train.init_from={tmp_path / 'nothing'}"), progress=False)
    # a rate so small the weights cannot move: the new run ends where the checkpoint it started from was
    ckpt = run / "step-00000002"
    done = train(dpr_job(tiny_model_dir, faq, tmp_path, "next", "train.runner=local", "train.num_workers=1", "train.max_steps=2",
                         f"train.init_from={run}", "optim.lr=1e-30"), progress=True)
    assert "starting from the weights of" in capsys.readouterr().out
    assert done["init_from"] == str(ckpt.resolve()) and done["resumed_from"] is None and done["steps"] == 2
    assert done["optim"]["lr"] == 1e-30
    start = load_file(next((ckpt / "model").rglob("model.safetensors")))
    end = load_file(next((tmp_path / "next" / "model").rglob("model.safetensors")))
    base = load_file(next(Path(tiny_model_dir).rglob("model.safetensors")))
    assert all(torch.equal(start[k], end[k]) for k in start)
    assert any(not torch.equal(start[k], base[k]) for k in start if k in base)
    # the new run resumes as any run; another starting checkpoint is refused by name
    again = train(dpr_job(tiny_model_dir, faq, tmp_path, "next", "train.runner=local", "train.num_workers=1", "train.max_steps=2",
                          f"train.init_from={run}", "optim.lr=1e-30"), progress=False)
    assert again["steps"] == 2
    with pytest.raises(PipelineError, match=r"train.init_from \(.*step-00000002 in the checkpoint, none now\)"):
        train(dpr_job(tiny_model_dir, faq, tmp_path, "next", "train.runner=local", "train.num_workers=1", "train.max_steps=2",
                      "optim.lr=1e-30"), progress=False)


def test_a_caller_chosen_local_runner_refuses_what_only_ray_train_runs(tiny_model_dir, faq, tmp_path, monkeypatch):
    """`train(runner="local")` (a Tune trial training in its own process, inside Ray already): a cluster's
    address asks nothing of it, several workers or a Ray Train callback are refused before anything is written."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    storage = tmp_path / "runs"
    storage.mkdir()
    with pytest.raises(ConfigError, match=r"the local runner .*train.num_workers=2 .*needs train.runner=ray"):
        train(_job(tiny_model_dir, faq, storage, "train.num_workers=2"), progress=False, runner="local")
    _untouched(storage)
    assert runner_choice.check_runner(_job(tiny_model_dir, faq, storage, "ray.address=127.0.0.1:6379"),
                                      "local") == "local"

    class RayTrainCallback:  # (not callable: Ray Train's UserCallback)
        def after_report(self, run_context, metrics, checkpoint):
            pass

    with pytest.raises(ConfigError, match="RayTrainCallback is a Ray Train callback: it needs train.runner=ray"):
        train(_job(tiny_model_dir, faq, storage, "train.report_every=1"), progress=False, runner="local",
              callbacks=[RayTrainCallback()])


@pytest.mark.slow
def test_the_local_runner_hands_every_report_to_its_callbacks_after_the_checkpoint(tiny_model_dir, faq, tmp_path):
    """What a Tune trial training in its own process sends Tune: each report of the loop with the run's total
    steps, a checkpointing report only once its `step-XXXXXXXX` is complete in the run folder."""
    storage = tmp_path / "runs"
    seen = []

    def report(metrics, total_steps):
        ckpt = storage / "run" / f"step-{int(metrics['step']):08d}"
        seen.append((int(metrics["step"]), total_steps, (ckpt / "state.json").exists(), float(metrics["loss"])))

    summary = train(_job(tiny_model_dir, faq, storage, "train.max_steps=4", "train.report_every=1",
                         "train.checkpoint_every=2"), progress=False, runner="local", callbacks=[report])
    assert [s[:2] for s in seen] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert [s[2] for s in seen if s[0] % 2 == 0] == [True, True]
    assert summary["steps"] == 4 and seen[-1][3] == pytest.approx(summary["final_metrics"]["loss"])
