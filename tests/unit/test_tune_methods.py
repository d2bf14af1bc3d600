"""Sweeps over ARR, RCL and ANCE: the shipped sweep files load and name keys the methods have, the
metric is one the method's trial reports, each trial runs what `pipeline train` runs, and the
trial's resources (driver, ANCE's refresher, RCL's stages at their peak) are planned and refused
before any trial starts. No Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.errors import ConfigError, ResourceError
from pipeline.tune.drivers import kind_of, reported_metrics
from pipeline.tune.runner import count_trials, plan_concurrency, trial_demand, trial_job
from pipeline.tune.space import load_sweep_config, metric_mode, validate_sweep

REPO = Path(__file__).resolve().parents[2]
TWO = {"CPU": 2.0, "GPU": 0.0}

ARR = {"model": {"name_or_path": "minilm"}, "authorship": {"split": "runs/arr/split"},
       "loss": {"name": "arr_cl", "temperature": 0.07},
       "train": {"max_steps": 18, "eval_every": 6, "num_workers": 1, "cpus_per_worker": 0.9}}
ANCE = {"model": {"name_or_path": "minilm"}, "data": {"source": "qrels", "corpus": "runs/c"},
        "loss": {"name": "ance"},
        "train": {"max_steps": 24, "eval_every": 4, "num_workers": 1, "cpus_per_worker": 0.9},
        "validation": {"dev_split": 0.1, "metric": "RR@10"},
        "ance": {"refresh_every": 4, "top_k": 20, "negatives": 5, "cpus": 1.0}}


def _rcl(tiny: Path | str, **rcl) -> dict:
    return {"model": {"name_or_path": str(tiny), "pooling": "mean"}, "data": {"source": "qrels", "corpus": "runs/c"},
            "loss": {"name": "rcl", "similarity": "cos"},
            "train": {"max_steps": 12, "eval_every": 3, "num_workers": 1, "cpus_per_worker": 0.5},
            "validation": {"corpus": "runs/c", "qrels": "runs/c/qrels/dev.trec", "metric": "AP@100"},
            "rcl": {"entropy_lambdas": [0.01, 0.02], "entropy_cpus_per_worker": 0.2,
                    "encode": {"num_actors": 1, "cpus_per_actor": 0.5}, **rcl}}


def sweep(tmp_path, base, space, search=None, overrides=None):
    doc = {"base": base, "output": str(tmp_path / "out"), "space": space,
           "search": {"grace_period": 6, **(search or {})}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_sweep_config(path, overrides)


# --------------------------------------------------------------------------- the shipped sweep files

@pytest.mark.parametrize("name, method, metric, n", [
    ("tune_arr.yaml", "arr", "val_metric", 36),        # τ 4 x lr 3 x seed 3, the paper's grid
    ("tune_rcl.yaml", "rcl", "val_metric", 8),         # λ list (2 or 4 entropy models) x τ 2 x batch 2
    ("tune_ance.yaml", "ance", "val_RR@10", 6),        # refresh interval 3 x negatives per query 2
    ("tune_dar.yaml", "dar", "val_metric", 8),
    ("tune_dpr.yaml", "dpr", "val_metric", 8),
])
def test_every_shipped_sweep_loads_with_a_metric_its_method_reports(name, method, metric, n, monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = load_sweep_config(REPO / "jobs" / "configs" / name)
    base = validate_sweep(cfg)
    assert base.loss.name == method and count_trials(cfg) == n
    assert metric_mode(cfg, base) == (metric, "max")
    assert metric in reported_metrics(base)[0]
    # every value of every key is a valid training config of the method (not only the first)
    for p in cfg.space:
        for v in p.candidates():
            job = trial_job(cfg.base_data(), {p.key: v}, "/tmp/s", "t")
            assert job.loss.name == method
    # on 2 cores every shipped sweep plans at least one trial at a time, without over-asking
    assert plan_concurrency(cfg, base, n, resources=TWO) >= 1


def test_shipped_spaces_are_the_papers(monkeypatch):
    monkeypatch.chdir(REPO)
    arr = {p.key: list(p.values) for p in load_sweep_config(REPO / "jobs/configs/tune_arr.yaml").space}
    assert arr == {"loss.temperature": [0.5, 0.1, 0.05, 0.01], "optim.lr": [1e-3, 1e-4, 1e-5],
                   "train.seed": [0, 43, 314]}
    rcl = {p.key: list(p.values) for p in load_sweep_config(REPO / "jobs/configs/tune_rcl.yaml").space}
    assert rcl["train.batch_size"] == [32, 64] and {len(v) for v in rcl["rcl.entropy_lambdas"]} == {2, 4}
    assert "loss.temperature" in rcl
    ance = {p.key for p in load_sweep_config(REPO / "jobs/configs/tune_ance.yaml").space}
    assert ance == {"ance.refresh_every", "data.hard_negatives"}


# --------------------------------------------------------------------------- metrics per method

def test_arr_reports_r_at_8_only_with_its_split_validator(tmp_path):
    cfg = sweep(tmp_path, ARR, {"loss.temperature": {"grid": [0.5, 0.1]}}, {"metric": "val_R@8"})
    base = validate_sweep(cfg)
    assert kind_of(base) == "authorship" and metric_mode(cfg, base) == ("val_R@8", "max")
    names = reported_metrics(base)[0]
    assert {"val_metric", "val_R@8", "val_MRR", "supcon"} <= set(names)
    # with a validation corpus, index.validate.make_validator gives ARR no validator at all: nothing to rank by
    with pytest.raises(ConfigError, match=r"val_R@8.*not reported by the arr_cl trainer.*authorship.split"):
        sweep(tmp_path, {**ARR, "validation": {"corpus": "runs/c"}}, {"loss.temperature": {"grid": [0.5, 0.1]}},
              {"metric": "val_R@8"})
    # an ARR term is a metric too (minimised)
    cfg = sweep(tmp_path, ARR, {"loss.temperature": {"grid": [0.5, 0.1]}}, {"metric": "supcon", "scheduler": "none"})
    assert metric_mode(cfg, validate_sweep(cfg)) == ("supcon", "min")


def test_rcl_reports_the_final_models_validation(tmp_path, tiny_model_dir):
    space = {"rcl.entropy_lambdas": {"grid": [[0.01], [0.01, 0.02, 0.03, 0.04]]}, "train.batch_size": {"grid": [32, 64]}}
    cfg = sweep(tmp_path, _rcl(tiny_model_dir), space, {"grace_period": 3, "metric": "val_AP@100"})
    base = validate_sweep(cfg)
    assert kind_of(base) == "rcl" and metric_mode(cfg, base) == ("val_AP@100", "max")
    assert {"cl", "entropy", "regulator"} <= set(reported_metrics(base)[0])
    # the dev split carved by rcl.dev_split validates the final model too
    no_val = {k: v for k, v in _rcl(tiny_model_dir, dev_split=0.2).items() if k != "validation"}
    assert "val_metric" in reported_metrics(validate_sweep(sweep(tmp_path, no_val, space, {"grace_period": 3})))[0]
    no_val["rcl"]["dev_split"] = 0.0
    with pytest.raises(ConfigError, match=r"val_metric.*not reported by the rcl trainer.*rcl.dev_split"):
        sweep(tmp_path, no_val, space, {"grace_period": 3})
    # the STS setting: the final model is validated on the STS dev file (Spearman)
    sts = _rcl(tiny_model_dir, sts_dev="sts-dev.csv", final_select="best")
    cfg = sweep(tmp_path, sts, space, {"grace_period": 3, "metric": "val_spearman"})
    assert metric_mode(cfg, validate_sweep(cfg)) == ("val_spearman", "max")
    assert {"val_metric", "val_pearson", "val_best"} <= set(reported_metrics(validate_sweep(cfg))[0])
    # lists are values: grid and random take them, Optuna cannot
    with pytest.raises(ConfigError, match=r"space.rcl.entropy_lambdas: Optuna's choices.*grid or random"):
        sweep(tmp_path, _rcl(tiny_model_dir), {"rcl.entropy_lambdas": {"choice": [[0.01], [0.01, 0.02]]}},
              {"grace_period": 3, "searcher": "optuna"})
    with pytest.raises(ConfigError, match="rcl.entropy_lambdas has duplicates"):
        sweep(tmp_path, _rcl(tiny_model_dir), {"rcl.entropy_lambdas": {"grid": [[0.01, 0.01], [0.02]]}},
              {"grace_period": 3})


# --------------------------------------------------------------------------- resources per method

def test_ance_trial_holds_its_refresher(tmp_path):
    cfg = sweep(tmp_path, ANCE, {"ance.refresh_every": {"grid": [4, 8]}}, {"grace_period": 4})
    base = validate_sweep(cfg)
    d = trial_demand(cfg, base, 2.0)
    assert d.bundles == ({"CPU": 0.1}, {"CPU": 1.0}) and d.cpus == pytest.approx(2.0)
    from pipeline.tune.drivers import placement

    assert placement(d).bundles == [{"CPU": 0.1}, {"CPU": 1.0}]  # the refresher's own bundle in the trial's group
    assert plan_concurrency(cfg, base, 2, resources=TWO) == 1
    cfg2 = sweep(tmp_path, ANCE, {"ance.refresh_every": {"grid": [4, 8]}}, {"grace_period": 4,
                                                                            "max_concurrent_trials": 2})
    with pytest.raises(ResourceError, match=r"2 concurrent trial\(s\).*1 CPU index refresher.*4 CPUs asked"):
        plan_concurrency(cfg2, base, 2, resources=TWO)
    # a refresher on a GPU: the trial's group asks for it, and a CPU-only cluster refuses
    gpu = {**ANCE, "ance": {**ANCE["ance"], "cpus": 0.5, "gpus": 1}}
    cfg3 = sweep(tmp_path, gpu, {"ance.refresh_every": {"grid": [4, 8]}}, {"grace_period": 4})
    assert trial_demand(cfg3, validate_sweep(cfg3), 2.0).bundles[1] == {"CPU": 0.5, "GPU": 1.0}
    with pytest.raises(ResourceError, match="GPUs asked"):
        plan_concurrency(cfg3, validate_sweep(cfg3), 2, resources=TWO)


def test_ance_refresh_interval_must_not_be_pinned_by_checkpoint_every(tmp_path):
    with pytest.raises(ConfigError, match=r"space.ance.refresh_every.*train.checkpoint_every=4"):
        sweep(tmp_path, ANCE, {"ance.refresh_every": {"grid": [4, 8]}}, {"grace_period": 4},
              ["train.checkpoint_every=4"])
    # the hard negatives per query alone may be swept with any checkpoint period
    sweep(tmp_path, ANCE, {"data.hard_negatives": {"grid": [1, 3]}}, {"grace_period": 4}, ["train.checkpoint_every=4"])


def test_rcl_trial_is_planned_at_its_peak_stage(tmp_path, tiny_model_dir):
    space = {"rcl.entropy_lambdas": {"grid": [[0.01], [0.01, 0.02, 0.03, 0.04]]}}
    cfg = sweep(tmp_path, _rcl(tiny_model_dir), space, {"grace_period": 3})
    base = validate_sweep(cfg)
    d = trial_demand(cfg, base, 2.0)
    # stage 1 with 4 entropy models x 1 worker x 0.2 CPU is the peak (stage 3: 0.5, stage 2: 0.5)
    assert d.bundles == ({"CPU": 0.1},) and (d.workers, d.cpus_per_worker) == (4, 0.2)
    assert d.cpus == pytest.approx(0.9) and plan_concurrency(cfg, base, 2, resources=TWO) == 2
    # stage 2's encoder actors are the peak when they ask the most
    big = _rcl(tiny_model_dir)
    big["rcl"]["encode"] = {"num_actors": 1, "cpus_per_actor": 1.5}
    cfg_big = sweep(tmp_path, big, space, {"grace_period": 3})
    assert trial_demand(cfg_big, validate_sweep(cfg_big), 2.0).cpus == pytest.approx(1.6)
    assert plan_concurrency(cfg_big, validate_sweep(cfg_big), 2, resources=TWO) == 1
    # entropy runs that cannot fit beside each other: refused before any trial
    wide = _rcl(tiny_model_dir, entropy_cpus_per_worker=0.6)
    cfg_w = sweep(tmp_path, wide, space, {"grace_period": 3})
    with pytest.raises(ResourceError, match=r"4 worker\(s\) x 0.6 CPU.*CPUs asked, the cluster has 2"):
        plan_concurrency(cfg_w, validate_sweep(cfg_w), 2, resources=TWO)


def test_rcl_sweep_needs_an_explicit_stage2_encoder_shape(tmp_path, tiny_model_dir):
    base = _rcl(tiny_model_dir)
    base["rcl"]["encode"] = {}
    with pytest.raises(ConfigError, match=r"rcl.encode.num_actors and rcl.encode.cpus_per_actor"):
        sweep(tmp_path, base, {"loss.temperature": {"grid": [0.05, 0.1]}}, {"grace_period": 3})
    with pytest.raises(ConfigError, match="set by RCL's stages"):
        sweep(tmp_path, _rcl(tiny_model_dir), {"rcl.regulator_tables": {"grid": [["a"], ["b"]]}}, {"grace_period": 3})


# --------------------------------------------------------------------------- what a trial runs

def test_trials_dispatch_as_pipeline_train(tmp_path, tiny_model_dir, monkeypatch):
    """ARR trains with its R@8 validator, RCL runs every stage with only the final model reporting,
    ANCE starts its refresher beside the trainer: each with Tune's callback on the reporting run."""
    import pipeline.recipes.rcl as rcl_mod
    import pipeline.train.trainer as trainer_mod
    import pipeline.tune.drivers as drivers

    calls, runners = [], []

    def fake_train(job, validate_fn=None, progress=True, negatives_provider=None, callbacks=None, runner=None):
        calls.append((job.train.name, validate_fn, negatives_provider, callbacks))
        runners.append(runner)
        return {"steps": 1}

    monkeypatch.setattr(trainer_mod, "train", fake_train)
    # `pipeline train`'s own choice of validator (ARR: R@8 on the split; others: the spine's)
    monkeypatch.setattr("pipeline.index.validate.make_validator", lambda job: f"validator of {job.loss.name}")
    cb = object()
    arr = trial_job(ARR, {"loss.temperature": 0.1}, str(tmp_path), "arr_t")
    drivers.run_job(arr, [cb])
    assert calls == [("arr_t", "validator of arr_cl", None, [cb])] and runners == [None]
    drivers.run_job(arr, [cb], runner="local")  # a trial training in its own process says so
    assert runners == [None, "local"]

    calls.clear()
    runners.clear()
    seen = {}

    def fake_rcl(job, progress=True, train_fn=None, validator_fn=None):
        seen["progress"] = progress
        for name in ("entropy-0.01", "final"):
            train_fn(_named(job, name), validate_fn=None, progress=progress)
        return {}

    monkeypatch.setattr(rcl_mod, "run_rcl", fake_rcl)
    drivers.run_job(trial_job(_rcl(tiny_model_dir), {}, str(tmp_path), "rcl_t"), [cb])
    assert seen["progress"] is False
    assert [(n, c) for n, _, _, c in calls] == [("entropy-0.01", None), ("final", [cb])]

    calls.clear()
    started = {}
    monkeypatch.setattr(drivers, "run_ance_trial",
                        lambda job, v, callbacks: started.update(job=job.train.name, v=type(v).__name__, cb=callbacks))
    named_dev = {**ANCE, "validation": {"corpus": "runs/c", "qrels": "runs/c/qrels/dev.trec", "metric": "RR@10"}}
    drivers.run_job(trial_job(named_dev, {}, str(tmp_path), "ance_t"), [cb])  # (a dev split would read the qrels)
    assert started == {"job": "ance_t", "v": "str", "cb": [cb]}


def _named(job, name):
    from dataclasses import replace

    return replace(job, train=replace(job.train, name=name))


def test_ance_trial_is_run_ance_with_tunes_callback_on_its_trainer(tmp_path, monkeypatch):
    """The ANCE trial calls pipeline/recipes/ance.run_ance itself (no copy of its orchestration), quietly,
    with Tune's callback for the trainer run_ance starts."""
    import pipeline.recipes.ance as ance_mod
    from pipeline.tune.drivers import run_ance_trial

    got = {}

    def fake_run_ance(job, validate_fn=None, progress=True, callbacks=None):
        got.update(name=job.train.name, validate_fn=validate_fn, progress=progress, callbacks=callbacks)
        return {"steps": 1}

    monkeypatch.setattr(ance_mod, "run_ance", fake_run_ance)
    cb = object()
    assert run_ance_trial(trial_job(ANCE, {}, str(tmp_path), "ance_t"), "v", [cb]) == {"steps": 1}
    assert got == {"name": "ance_t", "validate_fn": "v", "callbacks": [cb], "progress": False}


def test_cli_refuses_bad_method_sweeps_with_exit_2(tmp_path, capsys):
    from pipeline.cli import main

    def run(doc):
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(doc))
        code = main(["tune", "--config", str(path)])
        return code, capsys.readouterr().err

    ance = {"base": {**ANCE, "train": {**ANCE["train"], "checkpoint_every": 4}}, "output": str(tmp_path / "o1"),
            "space": {"ance.refresh_every": {"grid": [4, 8]}}, "search": {"grace_period": 4}}
    code, err = run(ance)
    assert code == 2 and err.startswith("error: space.ance.refresh_every") and "Traceback" not in err
    arr = {"base": ARR, "output": str(tmp_path / "o2"), "space": {"optim.lr": {"grid": [1e-3, 1e-4]}},
           "search": {"grace_period": 6, "metric": "val_RR@10"}}
    code, err = run(arr)
    assert code == 2 and "val_R@8" in err and "Traceback" not in err  # the message lists what ARR reports
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
