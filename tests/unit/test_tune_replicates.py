"""Sweeps with replicates (`search.replicate_key: train.seed`): trials differing only in the seed
form one configuration, the best configuration is chosen by the mean over its seeds, results report
mean ± sd and each seed's value, and ASHA (which ranks across seeds) is refused. No Ray."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
import yaml

from pipeline.errors import ConfigError
from pipeline.train.config import load_train_config
from pipeline.tune.results import best_group, best_trial, group_replicates, read_events, trial_records, write_results
from pipeline.tune.space import load_sweep_config

BASE = {
    "model": {"name_or_path": "minilm"},
    "data": {"corpus": "runs/c"},
    "loss": {"name": "dar", "n_perturb": 3},
    "optim": {"lr": 2e-5},
    "train": {"max_steps": 20, "eval_every": 5, "num_workers": 1, "cpus_per_worker": 0.9, "seed": 7},
    "validation": {"dev_split": 0.1, "metric": "MRR@10"},
}
SPACE = {"optim.lr": {"grid": [1e-3, 1e-4, 1e-5]}, "train.seed": {"grid": [0, 43, 314]}}
REPLICATES = {"replicate_key": "train.seed", "scheduler": "none"}

# optim.lr -> the final val_metric of seeds 0, 43, 314 (None: the trial failed)
RESULTS = {
    1e-3: [0.70, 0.40, 0.45],   # the single luckiest trial (0.70), a poor mean (0.5167)
    1e-4: [0.60, 0.62, 0.64],   # the best mean over seeds: 0.62 ± 0.02
    1e-5: [0.66, None, 0.68],   # a higher mean (0.67), but one seed failed: not complete, not selected
}


def sweep(tmp_path, space=None, search=None, base=None, overrides=None):
    doc = {"base": BASE if base is None else base, "output": str(tmp_path / "out"),
           "space": space or SPACE, "search": {"grace_period": 5, **(search or {})}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_sweep_config(path, overrides)


def _events(results=RESULTS, seeds=(0, 43, 314)) -> list[dict]:
    ev, n = [], 0
    for lr, values in results.items():
        for seed, value in zip(seeds, values):
            tid = f"t{n}"
            n += 1
            ev.append({"event": "start", "trial": tid, "params": {"optim.lr": lr, "train.seed": seed}, "time": 0})
            if value is None:
                ev.append({"event": "error", "trial": tid, "time": 5, "error": "RuntimeError: boom"})
                continue
            for step, v in ((10, value - 0.1), (20, value)):
                ev.append({"event": "result", "trial": tid,
                           "metrics": {"step": step, "total_steps": 20, "loss": 1.0, "val_metric": v}})
            ev.append({"event": "complete", "trial": tid, "time": 10})
    return ev


def _write(tmp_path, ev) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in ev) + "\n")
    return path


def test_trials_group_by_everything_but_the_replicate_key():
    recs = trial_records(_events(), "val_metric")
    groups = group_replicates(recs, ["optim.lr", "train.seed"], "train.seed", [0, 43, 314])
    assert [g.params for g in groups] == [{"optim.lr": 1e-3}, {"optim.lr": 1e-4}, {"optim.lr": 1e-5}]
    by_lr = {g.params["optim.lr"]: g for g in groups}
    for lr, values in RESULTS.items():
        g = by_lr[lr]
        assert [r.params["train.seed"] for r in g.trials.values()] == [0, 43, 314]
        assert all(r.params["optim.lr"] == lr for r in g.trials.values())
        scored = [v for v in values if v is not None]
        assert g.n == len(scored) and list(g.scored().values()) == pytest.approx(scored)
        assert g.mean == pytest.approx(statistics.fmean(scored))
        assert g.sd == pytest.approx(statistics.stdev(scored))  # sample sd (n - 1)
    assert by_lr[1e-4].mean == pytest.approx(0.62) and by_lr[1e-4].sd == pytest.approx(0.02)
    assert by_lr[1e-3].complete and by_lr[1e-4].complete and not by_lr[1e-5].complete


def test_best_is_the_best_mean_over_seeds_not_the_luckiest_trial():
    recs = trial_records(_events(), "val_metric")
    luckiest = best_trial(recs, "max")
    assert luckiest.params == {"optim.lr": 1e-3, "train.seed": 0}  # what a sweep without replicates picks
    groups = group_replicates(recs, ["optim.lr", "train.seed"], "train.seed", [0, 43, 314])
    best = best_group(groups, "max")
    assert best.params == {"optim.lr": 1e-4} and best.complete  # 1e-5's higher mean lacks a seed
    # minimising: the lowest mean among complete configurations
    assert best_group(groups, "min").params == {"optim.lr": 1e-3}
    # with no configuration complete, the best mean among those with results
    partial = group_replicates(trial_records(_events({1e-3: [0.5, None, 0.5], 1e-4: [0.6, 0.7, None]}), "val_metric"),
                               ["optim.lr", "train.seed"], "train.seed", [0, 43, 314])
    assert best_group(partial, "max").params == {"optim.lr": 1e-4}
    # an unfinished replicate (not yet run) leaves its configuration incomplete too
    ev = [e for e in _events() if not (e["trial"] == "t5" and e["event"] in ("result", "complete"))]
    groups = group_replicates(trial_records(ev, "val_metric"), ["optim.lr", "train.seed"], "train.seed",
                              [0, 43, 314])
    assert best_group(groups, "max").params == {"optim.lr": 1e-3}  # 1e-4 lost seed 314 (t5): only 1e-3 complete


def test_results_report_mean_sd_and_each_seed_and_best_yaml(tmp_path):
    cfg = sweep(tmp_path, search=REPLICATES)
    (tmp_path / "out").mkdir()
    summary = write_results(cfg, _write(tmp_path, _events()), "val_metric", "max")
    out = tmp_path / "out"
    md = (out / "results.md").read_text()
    assert "## By configuration: mean ± sd over train.seed" in md
    assert "| optim.lr | val_metric mean ± sd | n | train.seed=0 | train.seed=43 | train.seed=314 |" in md
    assert "| **0.0001** | **0.62 ± 0.02** | **3/3** | **0.6** | **0.62** | **0.64** |" in md  # best, bold, first
    assert "| 0.001 | 0.5167 ± 0.1607 | 3/3 | 0.7 | 0.4 | 0.45 |" in md
    assert "| 1e-05 | 0.67 ± 0.0141 | 2/3 | 0.66 | error | 0.68 |" in md
    lines = md.splitlines()
    rows = [ln for ln in lines if ln.startswith("| ") and "±" in ln and "mean" not in ln]
    assert rows[0].startswith("| **0.0001**") and rows[1].startswith("| 0.001")  # complete ones by mean, then partial
    assert "best by the mean over train.seed among complete configurations: **optim.lr=0.0001**" in md
    # the per-trial table follows; the best configuration's trials are bold, the luckiest trial is not
    assert "## Trials" in md and "| **t3** |" in md and "| **t0** |" not in md and "| t0 |" in md
    by_config = list(csv.DictReader((out / "results_by_config.csv").open()))
    assert [r["optim.lr"] for r in by_config] == ["0.0001", "0.001", "1e-05"]
    assert float(by_config[0]["val_metric_mean"]) == pytest.approx(0.62)
    assert float(by_config[0]["val_metric_sd"]) == pytest.approx(0.02)
    assert by_config[0]["n"] == "3" and by_config[0]["complete"] == "True" and by_config[2]["complete"] == "False"
    assert [by_config[0][f"train.seed={s}"] for s in (0, 43, 314)] == ["0.6", "0.62", "0.64"]
    assert by_config[2]["train.seed=43"] == "" and by_config[0]["trials"] == "t3 t4 t5"
    assert len(list(csv.DictReader((out / "results.csv").open()))) == 9  # one row per trial, as before
    # summary: the best configuration by its mean; every configuration with its replicates
    best = summary["best"]
    assert best["params"] == {"optim.lr": 1e-4} and best["metric"] == pytest.approx(0.62)
    assert best["sd"] == pytest.approx(0.02) and best["n"] == 3 and best["complete"]
    assert [(r["train.seed"], r["trial"]) for r in best["replicates"]] == [(0, "t3"), (43, "t4"), (314, "t5")]
    assert "results_by_config.csv" in summary["files"] and "best.yaml" in summary["files"]
    saved = json.loads((out / "summary.json").read_text())
    assert saved["replicate_key"] == "train.seed" and len(saved["configurations"]) == 3
    assert saved["configurations"][0]["params"] == {"optim.lr": 1e-4}
    # best.yaml: the configuration, the seed left at the base's; its header has mean ± sd and each seed
    text = (out / "best.yaml").read_text()
    job = load_train_config(out / "best.yaml")
    assert job.optim.lr == 1e-4 and job.train.seed == 7 and job.train.name.endswith("-best")
    assert "val_metric 0.62 ± 0.02" in text and "train.seed=43: 0.62 (t4)" in text and "0, 43, 314" in text


def test_without_a_replicate_key_the_outputs_are_per_trial(tmp_path):
    cfg = sweep(tmp_path, search={"scheduler": "none"})
    (tmp_path / "out").mkdir()
    summary = write_results(cfg, _write(tmp_path, _events()), "val_metric", "max")
    assert summary["best"]["trial"] == "t0" and summary["best"]["metric"] == pytest.approx(0.70)
    assert not (tmp_path / "out" / "results_by_config.csv").exists()
    assert "By configuration" not in (tmp_path / "out" / "results.md").read_text()


@pytest.mark.parametrize("space, search, match", [
    (None, {"replicate_key": "train.seed"}, r"scheduler=asha.*set search.scheduler: none"),
    ({"optim.lr": {"grid": [1e-3, 1e-4]}}, REPLICATES, r"replicate_key='train.seed' is not a key of space"),
    ({"optim.lr": {"choice": [1e-3, 1e-4]}, "train.seed": {"randint": [0, 1000]}}, {**REPLICATES, "searcher": "random"},
     r"space.train.seed must list its replicate values"),
    ({"optim.lr": {"choice": [1e-3, 1e-4]}, "train.seed": {"choice": [0, 43]}}, {**REPLICATES, "searcher": "random"},
     r"needs search.searcher=grid"),
    (None, {**REPLICATES, "num_samples": 2}, r"num_samples=2.*list the replicates in space.train.seed"),
])
def test_replicate_key_is_validated(tmp_path, space, search, match):
    with pytest.raises(ConfigError, match=match):
        sweep(tmp_path, space=space, search=search)


def test_replicate_key_loads_and_keeps_older_sweeps_resumable(tmp_path):
    from pipeline.tune.runner import build_search, count_trials, sweep_identity

    cfg = sweep(tmp_path, search=REPLICATES)
    assert cfg.search.replicate_key == "train.seed" and count_trials(cfg) == 9
    _, _, scheduler = build_search(cfg, "val_metric", "max", 20)
    assert type(scheduler).__name__ == "FIFOScheduler"  # no early stopping across seeds
    assert sweep_identity(cfg)["search"]["replicate_key"] == "train.seed"
    # a sweep without the key has the identity it had before the key existed (--resume still matches)
    assert "replicate_key" not in sweep_identity(sweep(tmp_path, search={"scheduler": "none"}))["search"]


def test_shipped_arr_sweep_selects_within_seeds(monkeypatch):
    from pipeline.tune.runner import count_trials

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    cfg = load_sweep_config(repo / "jobs" / "configs" / "tune_arr.yaml")
    s = cfg.search
    assert (s.searcher, s.replicate_key, s.scheduler, s.num_samples) == ("grid", "train.seed", "none", 1)
    assert {p.key: list(p.values) for p in cfg.space}["train.seed"] == [0, 43, 314] and count_trials(cfg) == 36
