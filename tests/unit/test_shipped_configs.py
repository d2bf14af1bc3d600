"""Every shipped config in jobs/configs/ loads: training configs with `load_train_config`, sweeps
(tune_*.yaml) with `load_sweep_config` (which also loads their base and every value of their space).
Plus the paper settings the NQ and RCL recipes must keep (issue 20). No Ray, no model loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.train.config import load_train_config
from pipeline.train.methods import method_names
from pipeline.tune.space import load_sweep_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "jobs" / "configs").glob("*.yaml"))
TRAIN = [p for p in CONFIGS if not p.name.startswith("tune_")]
SWEEPS = [p for p in CONFIGS if p.name.startswith("tune_")]


def test_the_config_folder_is_found():
    names = {p.name for p in CONFIGS}
    assert {"dpr.yaml", "dar.yaml", "dpr_nq.yaml", "dar_nq.yaml", "dpr_nq_hn.yaml", "dar_nq_hn.yaml",
            "rcl.yaml", "rcl_sts.yaml"} <= names
    assert SWEEPS


@pytest.mark.parametrize("path", TRAIN, ids=lambda p: p.name)
def test_every_training_config_loads(path):
    job = load_train_config(path)
    assert job.loss.name in method_names()
    # each file starts with a comment block saying what it is and how to launch it
    lines = path.read_text().splitlines()
    head = lines[:next(i for i, line in enumerate(lines) if not line.startswith("#"))]
    assert head and any("--config jobs/configs/" in line for line in head), path.name


OWN_LAUNCH = ["dpr.yaml", "dar.yaml", "dpr_nq.yaml", "dar_nq.yaml", "dpr_nq_hn.yaml", "dar_nq_hn.yaml", "rcl.yaml",
              "rcl_sts.yaml", "tune_dpr.yaml", "tune_dar.yaml", "tune_rcl.yaml"]


@pytest.mark.parametrize("name", OWN_LAUNCH)
def test_the_launch_command_names_the_file_itself(name):
    lines = (REPO / "jobs" / "configs" / name).read_text().splitlines()
    head = lines[:next(i for i, line in enumerate(lines) if not line.startswith("#"))]
    assert any("--config jobs/configs/" + name in line for line in head)


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_sweep_loads(path, monkeypatch):
    monkeypatch.chdir(REPO)  # sweep bases are repo-relative paths
    cfg = load_sweep_config(path)
    assert cfg.space


# --------------------------------------------------------------------------- the papers' settings


def _nq(name):
    return load_train_config(REPO / "jobs" / "configs" / name)


@pytest.mark.parametrize("name, method, hard", [("dpr_nq.yaml", "dpr", 0), ("dar_nq.yaml", "dar", 0),
                                                ("dpr_nq_hn.yaml", "dpr", 1), ("dar_nq_hn.yaml", "dar", 1)])
def test_nq_recipes_are_the_dar_papers(name, method, hard):
    """DAR paper (seed 000, appendix A/B.1): BERT-base CLS, dot product, batch 32 on one GPU, Adam
    lr 2e-5, 25 epochs; the main table in-batch only, Table 6 with one BM25 hard negative."""
    job = _nq(name)
    assert job.loss.name == method and job.train.name == name.removesuffix(".yaml")
    assert (job.loss.similarity, job.loss.temperature, job.model.pooling, job.model.normalize) == ("dot", 1.0, "cls", False)
    assert job.data.hard_negatives == hard and job.data.source == "dpr-json" and job.data.negatives == "hard"
    assert (job.train.batch_size, job.train.num_workers, job.train.epochs) == (32, 1, 25)
    assert (job.optim.lr, job.optim.weight_decay) == (2e-5, 0.0)
    assert (job.model.query_max_length, job.model.doc_max_length) == (256, 256)
    assert "bert-base" in job.model.name_or_path and "bert-base" in job.model.query_name_or_path
    if method == "dar":
        lc = job.loss
        assert (lc.n_perturb, lc.dropout_p, lc.mix_weight, lc.mix_scale) == (7, 0.1, 0.1, 10.0)
        assert (lc.mix_grouping, lc.mix_hard_negatives) == ("drop_positive", True)


def test_nq_pairs_differ_only_in_the_hard_negatives_and_the_name():
    for a, b in (("dpr_nq.yaml", "dpr_nq_hn.yaml"), ("dar_nq.yaml", "dar_nq_hn.yaml")):
        ja, jb = _nq(a), _nq(b)
        assert ja.model == jb.model and ja.loss == jb.loss and ja.optim == jb.optim
        assert ja.train == jb.train.__class__(**{**jb.train.__dict__, "name": ja.train.name})
        assert ja.data == jb.data.__class__(**{**jb.data.__dict__, "hard_negatives": ja.data.hard_negatives})


def test_rcl_faq_keeps_the_best_dev_map_final_model():
    """RCL paper (seed 001, A.1.2): initial and final model each kept at the best dev MAP."""
    job = load_train_config(REPO / "jobs" / "configs" / "rcl.yaml")
    s = job.section("rcl")
    assert s.entropy_init == "initial" and s.initial_metric == "AP@100"
    assert s.final_select == "best" and job.validation.metric == "AP@100"
    # `best` needs a dev split and evaluations along the way (pipeline/recipes/rcl.py)
    assert s.dev_split > 0 and (s.eval_every or job.train.eval_every) > 0
    sts = load_train_config(REPO / "jobs" / "configs" / "rcl_sts.yaml").section("rcl")
    assert sts.final_select == "best" and sts.entropy_init == "base"


# --------------------------------------------------------------------------- whose runs (issue 42)


def _run_folder(job) -> Path:
    return Path(job.train.storage_path) / job.train.name


@pytest.mark.parametrize("path", TRAIN, ids=lambda p: p.name)
def test_a_shipped_config_trains_outside_the_demo(path):
    """`make demo` trains into runs/demo/train and resumes there: a user's `pipeline train --config` of a
    shipped file must start its own run, never find the demo's (already complete, or "cannot resume")."""
    run = _run_folder(load_train_config(path))
    assert not run.is_absolute() and Path("runs/demo") not in (run, *run.parents), f"{path.name}: {run}"


def test_no_two_shipped_configs_share_a_run_folder():
    runs = {}
    for path in TRAIN:
        run = _run_folder(load_train_config(path))
        assert run not in runs, f"{path.name} and {runs[run]} both train into {run}"
        runs[run] = path.name


@pytest.mark.parametrize("path", TRAIN, ids=lambda p: p.name)
def test_every_run_folder_a_config_comment_names_is_the_one_it_trains_into(path):
    """The launch comments point at the run the file trains (e.g. `refresh --run-dir runs/train/ance`)."""
    run = _run_folder(load_train_config(path)).as_posix()
    for line in path.read_text().splitlines():
        if line.startswith("#") and "--run-dir " in line:
            assert line.split("--run-dir ", 1)[1].split()[0] == run, line


def test_the_demo_trains_into_its_own_run_folders(tmp_path, monkeypatch):
    """recipes/demo.py passes its own train.storage_path (<out>/train) and train.name, whatever the shipped
    configs name for a user's runs."""
    import pipeline.index.validate as validate
    import pipeline.train.dev_split as dev_split
    import pipeline.train.trainer as trainer
    from pipeline.recipes import demo

    seen = []
    monkeypatch.setattr(dev_split, "apply_dev_split", lambda job: job)
    monkeypatch.setattr(validate, "validator_for_job", lambda job: None)
    monkeypatch.setattr(trainer, "train", lambda job, validate_fn=None: seen.append(job) or {})
    out = tmp_path / "demo"
    for method in demo.METHODS:
        demo._train(method, out / "corpus", out)
    assert [_run_folder(j) for j in seen] == [out / "train" / m for m in demo.METHODS]
    assert [j.loss.name for j in seen] == list(demo.METHODS)
