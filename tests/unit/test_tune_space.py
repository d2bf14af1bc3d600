"""The sweep file: space vocabulary, keys and values checked against the training config, metrics,
searcher/space fit, resource plan, and the outputs built from an event log. No Ray."""

from __future__ import annotations

import csv
import json
import os

import pytest
import yaml

from pipeline.errors import ConfigError, ResourceError
from pipeline.train.config import load_train_config
from pipeline.tune.results import best_trial, read_events, trial_records, write_results
from pipeline.tune.runner import count_trials, plan_concurrency, trial_job
from pipeline.tune.space import load_sweep_config, parse_param, to_tune

BASE = {
    "model": {"name_or_path": "minilm"},
    "data": {"corpus": "runs/c"},
    "loss": {"name": "dar", "n_perturb": 3},
    "train": {"max_steps": 20, "eval_every": 5, "num_workers": 1, "cpus_per_worker": 0.9},
    "validation": {"dev_split": 0.1, "metric": "MRR@10"},  # held-out training queries, never a test split
}


def sweep(tmp_path, space=None, search=None, base=None, overrides=None, name="s.yaml"):
    doc = {"base": BASE if base is None else base, "output": str(tmp_path / "out"),
           "space": space or {"loss.n_perturb": {"grid": [3, 5, 7, 9]}},
           "search": {"grace_period": 5, **(search or {})}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return load_sweep_config(path, overrides)


def test_vocabulary_parses_to_tune_domains(tmp_path):
    cfg = sweep(tmp_path, space={"loss.n_perturb": {"randint": [3, 10]}, "loss.dropout_p": {"uniform": [0.05, 0.3]},
                                 "loss.temperature": {"loguniform": [0.01, 0.1]},
                                 "loss.mix_weight": {"choice": [0.05, 0.1]}}, search={"searcher": "random"})
    kinds = {p.key: p.kind for p in cfg.space}
    assert kinds == {"loss.n_perturb": "randint", "loss.dropout_p": "uniform", "loss.temperature": "loguniform",
                     "loss.mix_weight": "choice"}
    from ray.tune.search.sample import Categorical, Float, Integer

    dom = to_tune(cfg.space)
    assert isinstance(dom["loss.n_perturb"], Integer) and (dom["loss.n_perturb"].lower, dom["loss.n_perturb"].upper) == (3, 10)
    assert isinstance(dom["loss.dropout_p"], Float) and isinstance(dom["loss.mix_weight"], Categorical)
    assert dom["loss.temperature"].sampler.__class__.__name__.lstrip("_") == "LogUniform"


@pytest.mark.parametrize("spec, match", [
    ({"between": [1, 2]}, "unknown kind"),
    ({"choice": []}, "non-empty list"),
    ({"grid": [3, 3]}, "twice"),
    ({"uniform": [0.3, 0.1]}, "low < high"),
    ({"uniform": [0.1]}, r"\[low, high\]"),
    ({"loguniform": [0, 1]}, "low > 0"),
    ({"randint": [3, 4]}, "fewer than two"),
    ({"randint": [3.0, 9]}, "two integers"),
    ([3, 5], "expected one of"),
])
def test_bad_domains(spec, match):
    with pytest.raises(ConfigError, match=match):
        parse_param("loss.n_perturb", spec)


def test_unknown_training_key_is_refused_with_its_name(tmp_path):
    with pytest.raises(ConfigError, match=r"space.loss.n_pertub.*unknown config key.*did you mean loss.n_perturb"):
        sweep(tmp_path, space={"loss.n_pertub": {"grid": [3, 5]}})
    with pytest.raises(ConfigError, match=r"space.optim.learning_rate"):
        sweep(tmp_path, space={"optim.learning_rate": {"grid": [1e-5, 2e-5]}})
    # a DAR key under a DPR base: the method's own loss block refuses it
    with pytest.raises(ConfigError, match=r"space.loss.n_perturb.*unknown config key"):
        sweep(tmp_path, base={**BASE, "loss": {"name": "dpr"}})


def test_values_the_training_config_refuses(tmp_path):
    with pytest.raises(ConfigError, match=r"space.loss.n_perturb=2.5.*integer"):
        sweep(tmp_path, space={"loss.n_perturb": {"choice": [3, 2.5]}})
    with pytest.raises(ConfigError, match=r"space.optim.lr=0.0.*optim.lr: must be > 0"):
        sweep(tmp_path, space={"optim.lr": {"uniform": [0.0, 1e-4]}}, search={"searcher": "random"})
    with pytest.raises(ConfigError, match="set by the sweep itself"):
        sweep(tmp_path, space={"train.name": {"grid": ["a", "b"]}})
    with pytest.raises(ConfigError, match="set by the sweep itself"):
        sweep(tmp_path, space={"ray.num_cpus": {"grid": [1, 2]}})


def test_metric_must_be_reported_by_the_trainer(tmp_path):
    with pytest.raises(ConfigError, match=r"search.metric='val_spearman' is not reported.*val_metric.*val_RR@10"):
        sweep(tmp_path, search={"metric": "val_spearman"})
    no_val = {k: v for k, v in BASE.items() if k != "validation"}
    with pytest.raises(ConfigError, match="need validation.corpus"):
        sweep(tmp_path, base=no_val, search={"metric": "val_metric"})
    from pipeline.tune.space import metric_mode

    cfg = sweep(tmp_path, search={"metric": "val_MRR@10"})  # an alias of RR@10
    job = load_train_config(None, [])
    assert metric_mode(cfg, trial_job(cfg.base_data(), {}, "/tmp/s", "t")) == ("val_RR@10", "max")
    cfg = sweep(tmp_path, search={"metric": "mix", "scheduler": "none"})  # DAR's term: minimised
    assert metric_mode(cfg, trial_job(cfg.base_data(), {}, "/tmp/s", "t")) == ("mix", "min")
    del job


def test_searcher_and_space_must_fit(tmp_path):
    with pytest.raises(ConfigError, match="grid needs finite values.*loss.dropout_p"):
        sweep(tmp_path, space={"loss.dropout_p": {"uniform": [0.05, 0.3]}})
    with pytest.raises(ConfigError, match="optuna does not take grid"):
        sweep(tmp_path, search={"searcher": "optuna"})
    with pytest.raises(ConfigError, match="needs train.eval_every"):
        sweep(tmp_path, base={**BASE, "train": {"max_steps": 20}})
    with pytest.raises(ConfigError, match="needs search.max_t"):
        sweep(tmp_path, base={**BASE, "train": {"eval_every": 5}})
    with pytest.raises(ConfigError, match="unknown config key.*search.metrc"):
        sweep(tmp_path, search={"metrc": "loss"})


def test_cli_overrides_split_between_sweep_and_training(tmp_path):
    cfg = sweep(tmp_path, overrides=["search.num_samples=3", "train.max_steps=40", "optim.lr=1e-4"])
    assert cfg.search.num_samples == 3 and count_trials(cfg) == 12
    job = trial_job(cfg.base_data(), {"loss.n_perturb": 9}, "/tmp/sw/trials", "abc_00001")
    assert job.train.max_steps == 40 and job.optim.lr == 1e-4 and job.loss.n_perturb == 9
    assert (job.train.name, job.train.storage_path, job.train.resume) == ("abc_00001", "/tmp/sw/trials", "auto")


def test_one_worker_trials_train_in_their_own_process_and_hold_its_cpus(tmp_path):
    """A one-worker DAR sweep on one node, on local storage: each trial trains in its own process, so its
    placement group's one bundle holds the driver's and the worker's CPUs, and the refusal names that
    shape. Two workers, train.runner=ray, an object-store output or several nodes keep Ray Train runs."""
    from pipeline.tune.drivers import placement
    from pipeline.tune.runner import trial_demand, trials_in_process

    cfg = sweep(tmp_path)
    base = trial_job(cfg.base_data(), {}, "/tmp/s", "t")
    assert trials_in_process(cfg, base, "/tmp/s/trials", multi_node=False)
    d = trial_demand(cfg, base, 2.0, storage="/tmp/s/trials", multi_node=False)
    assert d.in_process and d.workers == 0 and d.bundles == ({"CPU": pytest.approx(1.0)},)
    assert placement(d).bundles == [{"CPU": pytest.approx(1.0)}]
    cfg3 = sweep(tmp_path, search={"max_concurrent_trials": 3})
    with pytest.raises(ResourceError, match=r"3 concurrent trial\(s\) x \(0.1 CPU trial driver \+ 0.9 CPU training "
                                            r"in the trial's own process\).*3 CPUs asked, the cluster has 2"):
        plan_concurrency(cfg3, base, 4, resources={"CPU": 2.0, "GPU": 0.0})
    # what keeps the trials in Ray Train runs
    assert not trials_in_process(cfg, base, "s3://bucket/sweep/trials", multi_node=False)
    assert not trials_in_process(cfg, base, "/tmp/s/trials", multi_node=True)
    ray_runner = sweep(tmp_path, base={**BASE, "train": {**BASE["train"], "runner": "ray"}})
    assert not trials_in_process(ray_runner, trial_job(ray_runner.base_data(), {}, "/tmp/s", "t"), "/tmp/s/trials", False)
    cfgw = sweep(tmp_path, space={"train.num_workers": {"grid": [1, 2]}})  # all trials or none: one placement group
    assert not trials_in_process(cfgw, base, "/tmp/s/trials", multi_node=False)
    dw = trial_demand(cfgw, base, 2.0, storage="/tmp/s/trials", multi_node=False)
    assert not dw.in_process and dw.bundles == ({"CPU": 0.1},) and dw.workers == 2


def test_base_file_relative_to_the_sweep_file(tmp_path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    cfg = sweep(tmp_path, base="base.yaml")
    assert cfg.base_source.endswith("base.yaml") and cfg.base_data()["loss"]["name"] == "dar"


def test_concurrency_fits_the_cluster_or_is_refused(tmp_path):
    cfg = sweep(tmp_path)
    base = trial_job(cfg.base_data(), {}, "/tmp/s", "t")
    two = {"CPU": 2.0, "GPU": 0.0}
    assert plan_concurrency(cfg, base, 4, resources=two) == 2  # 2 x (0.1 + 0.9)
    cfg3 = sweep(tmp_path, search={"max_concurrent_trials": 3})
    with pytest.raises(ResourceError, match=r"3 concurrent trial\(s\).*3 CPUs asked, the cluster has 2"):
        plan_concurrency(cfg3, base, 4, resources=two)
    # a swept worker count: the hungriest trial decides
    cfgw = sweep(tmp_path, space={"train.num_workers": {"grid": [1, 2]}}, search={"max_concurrent_trials": 2})
    with pytest.raises(ResourceError, match="concurrent"):
        plan_concurrency(cfgw, base, 2, resources=two)


def _events(tmp_path):
    ev = [
        {"event": "start", "trial": "t0", "params": {"loss.n_perturb": 3}, "time": 0},
        {"event": "start", "trial": "t1", "params": {"loss.n_perturb": 5}, "time": 0},
        {"event": "result", "trial": "t0", "metrics": {"step": 5, "total_steps": 20, "loss": 3.0, "val_metric": 0.4,
                                                       "val_RR@10": 0.4}},
        {"event": "result", "trial": "t1", "metrics": {"step": 5, "total_steps": 20, "loss": 2.0, "val_metric": 0.2,
                                                       "val_RR@10": 0.2}},
        {"event": "early-stopped", "trial": "t1", "time": 10},
        {"event": "result", "trial": "t0", "metrics": {"step": 20, "total_steps": 20, "loss": 1.0, "val_metric": 0.5,
                                                       "val_RR@10": 0.5}},
        {"event": "complete", "trial": "t0", "time": 30},
        {"event": "start", "trial": "t2", "params": {"loss.n_perturb": 7}, "time": 31},
        {"event": "error", "trial": "t2", "time": 32, "error": "RuntimeError: boom"},
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in ev) + "\n" + '{"event": "result", "tri')  # cut by a kill
    return path


def test_records_table_best_config_and_plots_from_the_event_log(tmp_path):
    path = _events(tmp_path)
    recs = {r.trial: r for r in trial_records(read_events(path), "val_metric")}
    assert {t: r.status for t, r in recs.items()} == {"t0": "terminated", "t1": "early-stopped", "t2": "error"}
    assert recs["t0"].metric == 0.5 and recs["t0"].steps == 20 and recs["t0"].wall_s == 30
    assert recs["t1"].metric == 0.2 and recs["t1"].steps == 5
    assert best_trial(list(recs.values()), "max").trial == "t0"

    cfg = sweep(tmp_path)
    (tmp_path / "out").mkdir()
    summary = write_results(cfg, path, "val_metric", "max")
    out = tmp_path / "out"
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["trial"] for r in rows] == ["t0", "t1", "t2"]
    assert rows[0]["status"] == "terminated" and rows[0]["loss.n_perturb"] == "3" and rows[0]["steps"] == "20"
    assert rows[2]["error"] == "RuntimeError: boom"
    md = (out / "results.md").read_text()
    assert "| **t0** | terminated | 3 | **0.5** |" in md and "1 early-stopped" in md
    assert (out / "plots" / "metric_vs_loss.n_perturb.png").stat().st_size > 1000
    assert (out / "plots" / "learning_curves.png").stat().st_size > 1000
    assert summary["best"]["trial"] == "t0"
    # best.yaml is a complete training config with the trial's values and its own run name
    best = load_train_config(out / "best.yaml")
    assert best.loss.name == "dar" and best.loss.n_perturb == 3 and best.train.max_steps == 20
    assert best.train.name.endswith("-best")


def test_optuna_searcher_suggests_within_the_space_and_learns(tmp_path):
    """The pinned Optuna through Ray 2.60's OptunaSearch (no cluster needed): suggestions fall in
    the declared domains, under our dotted keys, and load as training configs; results are taken."""
    import optuna

    from pipeline.tune.runner import build_search

    assert optuna.__version__ == "5.0.0"
    cfg = sweep(tmp_path, space={"loss.n_perturb": {"randint": [3, 10]}, "loss.dropout_p": {"uniform": [0.05, 0.3]},
                                 "loss.temperature": {"loguniform": [0.01, 0.1]},
                                 "loss.mix_weight": {"choice": [0.05, 0.1, 0.2]}},
                search={"searcher": "optuna", "num_samples": 6, "seed": 1})
    space, alg, sched = build_search(cfg, "val_metric", "max", 20)
    assert type(alg).__name__ == "OptunaSearch" and type(sched).__name__ == "AsyncHyperBandScheduler"
    alg.set_search_properties("val_metric", "max", space)
    seen = []
    for i in range(6):
        s = alg.suggest(f"t{i}")
        assert set(s) == {"loss.n_perturb", "loss.dropout_p", "loss.temperature", "loss.mix_weight"}
        assert 3 <= s["loss.n_perturb"] < 10 and 0.05 <= s["loss.dropout_p"] <= 0.3
        assert 0.01 <= s["loss.temperature"] <= 0.1 and s["loss.mix_weight"] in (0.05, 0.1, 0.2)
        job = trial_job(cfg.base_data(), s, "/tmp/s", f"t{i}")
        assert job.loss.n_perturb == s["loss.n_perturb"]
        alg.on_trial_complete(f"t{i}", {"val_metric": s["loss.dropout_p"], "step": 20})
        seen.append(s)
    assert len({json.dumps(x, sort_keys=True) for x in seen}) == 6
    assert len(alg._ot_study.trials) == 6 and alg._ot_study.best_value == max(x["loss.dropout_p"] for x in seen)


def test_cli_bad_sweeps_exit_2_before_any_trial(tmp_path, capsys):
    from pipeline.cli import main

    def run(doc, *extra):
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(doc))
        code = main(["tune", "--config", str(path), *extra])
        return code, capsys.readouterr().err

    doc = {"base": BASE, "space": {"loss.n_pertub": {"grid": [3, 5]}}, "search": {"grace_period": 5},
           "output": str(tmp_path / "out")}
    code, err = run(doc)
    assert code == 2 and err.startswith("error: space.loss.n_pertub") and "Traceback" not in err
    code, err = run({**doc, "space": {"loss.n_perturb": {"grid": [3, 5]}}}, "search.metric=val_R@1000")
    assert code == 2 and "search.metric='val_R@1000' is not reported" in err
    code, err = run({**doc, "space": {"loss.n_perturb": {"grid": [3, 5]}}}, "--resume")
    assert code == 2 and "holds no sweep to resume" in err
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    code, err = run({**doc, "space": {"loss.n_perturb": {"grid": [3, 5]}}})
    assert code == 2 and "already holds files that are not a sweep's" in err
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine" and not (tmp_path / "out" / "tune").exists()
    assert not list(tmp_path.glob("out/events.jsonl"))
    code, err = run({**doc, "space": {"loss.n_perturb": {"grid": [3, 5]}}, "output": str(tmp_path / "out2")})
    assert code == 2 and "input(s) not found" in err and "data.corpus=runs/c" in err  # not one error per trial
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("name, searcher, n", [("tune_dar.yaml", "random", 8), ("tune_dpr.yaml", "optuna", 8)])
def test_shipped_sweeps_load(name, searcher, n, monkeypatch):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    cfg = load_sweep_config(repo / "jobs" / "configs" / name)
    assert cfg.search.searcher == searcher and count_trials(cfg) == n
    job = trial_job(cfg.base_data(), {p.key: p.candidates()[0] for p in cfg.space}, "/tmp/s", "t")
    assert job.train.max_steps == 48 and job.train.eval_every == 12 and job.validation.dev_split


def test_a_trial_interrupted_and_resumed_counts_both_runs():
    ev = [{"event": "start", "trial": "t", "params": {"a.b": 1}, "time": 40},
          {"event": "result", "trial": "t", "time": 50, "metrics": {"step": 2, "total_steps": 4, "loss": 2.0}},
          {"event": "start", "trial": "t", "params": {"a.b": 1}, "time": 100},
          {"event": "result", "trial": "t", "time": 110, "metrics": {"step": 4, "total_steps": 4, "loss": 1.0}}]
    (rec,) = trial_records(ev, "loss")
    assert rec.status == "unfinished" and rec.wall_s == 20 and rec.steps == 4
    (rec,) = trial_records(ev + [{"event": "complete", "trial": "t", "time": 120}], "loss")
    assert rec.status == "terminated" and rec.wall_s == 30 and rec.metric == 1.0
    assert [h["step"] for h in rec.history] == [2, 4]


def test_last_report_is_held_back_until_the_run_returns():
    """ASHA stops a trial the moment it reports max_t: the run's last report (final step, or the
    step its validation hook stopped it at) waits until the model is exported, then comes from the
    run's summary (or RCL's record), with the run's total steps."""
    from types import SimpleNamespace

    from pipeline.tune.runner import StepReport, final_report

    sent = []
    cb = StepReport.__new__(StepReport)  # (its __init__ needs a Tune session)
    cb._training_actor_item_queue = SimpleNamespace(put=sent.append)
    ctx = SimpleNamespace(train_loop_config={"total_steps": 4})
    for step in (1, 2, 3):
        cb.after_report(ctx, [{"step": step, "loss": 1.0}], None)
    cb.after_report(ctx, [{"step": 4, "loss": 0.5}], None)                       # the final step
    cb.after_report(ctx, [{"step": 2, "loss": 0.5, "stopped_early": 1.0}], None)  # the hook's stop
    assert [m["step"] for m in sent] == [1, 2, 3] and all(m["total_steps"] == 4 for m in sent)

    # a trial training in its own process: the same reports, sent by the loop's session (LocalSession)
    import ray.tune

    from pipeline.tune.runner import LocalStepReport

    local_sent = []
    orig = ray.tune.report
    ray.tune.report = lambda metrics, **kw: local_sent.append(metrics)
    try:
        report = LocalStepReport()
        for m in ({"step": 1, "loss": 1.0}, {"step": 2, "loss": 1.0}, {"step": 3, "loss": 1.0},
                  {"step": 4, "loss": 0.5}, {"step": 2, "loss": 0.5, "stopped_early": 1.0}):
            report(m, total_steps=4)
    finally:
        ray.tune.report = orig
    assert local_sent == sent

    summary = {"final_metrics": {"step": 4, "loss": 0.5, "val_metric": 0.7, "note": "x"}, "total_steps": 4}
    assert final_report(summary) == {"step": 4, "loss": 0.5, "val_metric": 0.7, "total_steps": 4}
    rcl = {"stages": {"final": {"final_metrics": {"step": 3, "loss": 0.2}, "total_steps": 6}}}
    assert final_report(rcl) == {"step": 3, "loss": 0.2, "total_steps": 6}
    assert final_report({"stages": {}}) is None and final_report({}) is None


def test_trial_reports_its_runs_final_metrics_after_the_run_returns(monkeypatch, tmp_path):
    """run_trial: the run gets StepReport (which holds its last report back), and once it returns
    the trial reports the run's final metrics (also when a resumed trial's run was already
    complete and trained nothing) - the report the results table's `terminated, steps 4` rests on."""
    import ray.tune

    import pipeline.tune.drivers as drivers
    from pipeline.tune.runner import LocalStepReport, StepReport, run_trial

    monkeypatch.setattr(StepReport, "__init__", lambda self: None)  # (needs a Tune session)
    monkeypatch.setattr(ray.tune, "get_context", lambda: type("C", (), {"get_trial_id": lambda self: "t0"})())
    reported, runs = [], []
    monkeypatch.setattr(ray.tune, "report", lambda metrics, **kw: reported.append(metrics))

    def fake_run_job(job, callbacks, runner=None):
        runs.append((job.train.name, job.train.resume, job.loss.n_perturb, callbacks, runner))
        return {"final_metrics": {"step": 20, "loss": 0.3, "val_metric": 0.61},
                "total_steps": 20}

    monkeypatch.setattr(drivers, "run_job", fake_run_job)
    cwd = os.getcwd()
    ctx = {"cwd": str(tmp_path), "base": BASE, "storage": str(tmp_path / "trials")}
    try:
        run_trial({"loss.n_perturb": 5}, ctx)
        run_trial({"loss.n_perturb": 5}, {**ctx, "in_process": True})  # the sweep's trials train in their process
    finally:
        os.chdir(cwd)
    name, resume, n, callbacks, runner = runs[0]
    assert (name, resume, n, runner) == ("t0", "auto", 5, None) and isinstance(callbacks[0], StepReport)
    name, resume, n, callbacks, runner = runs[1]
    assert (name, resume, n, runner) == ("t0", "auto", 5, "local") and isinstance(callbacks[0], LocalStepReport)
    assert reported == [{"step": 20, "loss": 0.3, "val_metric": 0.61, "total_steps": 20}] * 2


@pytest.mark.parametrize("validation, rejected", [
    ({"corpus": "runs/c"}, "validation.qrels=runs/c/qrels/test.trec"),            # the Validator's default
    ({"corpus": "runs/c", "qrels": "runs/c/qrels/test.trec"}, "validation.qrels=runs/c/qrels/test.trec"),
    ({"corpus": "runs/c", "qrels": "qrels.test.tsv"}, "validation.qrels=qrels.test.tsv"),
    ({"corpus": "runs/c", "qrels": "beir/scifact/test"}, "validation.qrels=beir/scifact/test"),
    ({"corpus": "runs/c", "qrels": "runs/c/qrels/dev.trec"}, None),
    ({"corpus": "runs/c", "qrels": "msmarco-passage/dev/small"}, None),
    ({"dev_split": 0.1}, None),
])
def test_a_sweep_never_selects_on_a_test_split(tmp_path, validation, rejected):
    base = {**BASE, "validation": {**validation, "metric": "MRR@10"}}
    if rejected is None:
        sweep(tmp_path, base=base)
        return
    with pytest.raises(ConfigError, match="would select on a test split") as err:
        sweep(tmp_path, base=base)
    assert rejected in str(err.value) and "validation.dev_split" in str(err.value)
    assert "search.allow_test_selection: true" in str(err.value)
    cfg = sweep(tmp_path, base=base, search={"allow_test_selection": True})  # asked for: allowed, and said
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "events.jsonl").write_text(json.dumps({"event": "start", "trial": "t0", "params": {"loss.n_perturb": 3},
                                                  "time": 1}) + "\n")
    write_results(cfg, out / "events.jsonl", "val_metric", "max")
    assert "WARNING**: this sweep selected on a test split" in (out / "results.md").read_text()



@pytest.mark.parametrize("innocent", ["data/test/qrels.tsv", "testset.trec", "heldout_testing.trec",
                                      "trec-dl-2019.qrels", "dev.trec"])
def test_a_test_split_renamed_to_something_innocent_is_refused_by_its_content(tmp_path, faq, innocent):
    """The guard reads what the file holds: judgements of the corpus's test split, whatever the file is
    called, are refused (the same set, or a part of it); a dev split of training queries is not."""
    import shutil

    copy = tmp_path / innocent
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(faq / "qrels" / "test.trec", copy)
    base = {**BASE, "data": {"corpus": str(faq)},
            "validation": {"corpus": str(faq), "qrels": str(copy), "metric": "MRR@10"}}
    with pytest.raises(ConfigError, match="holds the same judgements as .*qrels/test.trec, the corpus's test split"):
        sweep(tmp_path, base=base)
    # part of the test split (a few of its queries mixed into a dev file): refused too, with the count
    lines = (faq / "qrels" / "test.trec").read_text().splitlines()[:5]
    train = (faq / "qrels" / "train.trec").read_text().splitlines()[:20]
    mixed = tmp_path / "mixed_dev.trec"
    mixed.write_text("\n".join(train + lines) + "\n")
    base["validation"]["qrels"] = str(mixed)
    with pytest.raises(ConfigError, match=r"holds \d+ judgements of \d+ queries of .*test.trec"):
        sweep(tmp_path, base=base)
    # training queries only: fine; and a dev split carved from training qrels that are the test split: refused
    clean = tmp_path / "clean_dev.trec"
    clean.write_text("\n".join(train) + "\n")
    base["validation"]["qrels"] = str(clean)
    sweep(tmp_path, base=base)
    renamed_train = {**BASE, "data": {"corpus": str(faq), "qrels": str(copy)},
                     "validation": {"dev_split": 0.1, "metric": "MRR@10"}}
    with pytest.raises(ConfigError, match=r"validation.dev_split \(carved from .*\) holds the same judgements"):
        sweep(tmp_path, base=renamed_train)


def test_a_base_whose_dev_split_cannot_apply_is_refused_before_anything_is_written(tmp_path):
    base = {**BASE, "validation": {"dev_split": 0.1, "qrels": "runs/c/qrels/dev.trec", "metric": "MRR@10"}}
    with pytest.raises(ConfigError, match=r"base .*validation.dev_split=0.1 and validation.qrels=.* both name"):
        sweep(tmp_path, base=base)
    assert not (tmp_path / "out").exists()
