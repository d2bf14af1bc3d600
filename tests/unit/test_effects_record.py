"""An effects experiment's record: each run's per-query values kept, every comparison computed again from the
record alone equal to the one computed from the runs, and records made in other work folders (sessions,
machines) merged into one without losing or mixing runs."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from pipeline.effects.record import definition_digest, merge, runs_of, tables
from pipeline.effects.spec import load_experiment
from pipeline.effects.stats import effect
from pipeline.errors import PipelineError

PARTS = ("all", "labeled", "unlabeled")
MACHINE_A = {"cpu": "A", "cores": 2, "isa": ["avx2"]}
MACHINE_B = {"cpu": "B", "cores": 16, "isa": ["avx512_bf16"]}


def _exp(**change):
    raw = {"datasets": ["d"], "seeds": [0, 1, 2, 3], "metric": "nDCG@10", "qrels": "corpus/qrels/test.trec",
           "train_qrels": "corpus/qrels/train.trec", "vars": {"model": "m"},
           "prepare": ["pipeline ingest {data} --out {prep}/corpus"],
           "train": "pipeline train --config {repo}/c.yaml train.seed={seed} model.name_or_path={model}",
           "evaluate": ["pipeline encode --corpus {prep}/corpus --out {run}/emb --model {model_path}"],
           "arms": [{"id": "zero", "title": "zero", "train": None},
                    {"id": "dpr", "title": "dpr", "train": ["loss.name=dpr"]},
                    {"id": "dar", "title": "dar", "train": ["loss.name=dar"]}],
           "comparisons": [{"id": "dpr-vs-zero", "method": "dpr", "baseline": "zero", "direction": 1, "claim": "c",
                            "source": "s"},
                           {"id": "dar-vs-dpr", "method": "dar", "baseline": "dpr", "direction": 1, "claim": "c",
                            "source": "s"}]}
    raw.update(change)
    return load_experiment(raw, "fx", "f.yaml", {"d": {}})


def _run(rng, shift, machine=MACHINE_A, queries=40):
    scores = {}
    for p in PARTS:
        per = {f"q{i}": round(float(np.clip(0.4 + shift + rng.normal(0, 0.1), 0, 1)), 6) for i in range(queries)}
        scores[p] = {"mean": float(np.mean(list(per.values()))), "per_query": per}
    return {"scores": scores, "wall_seconds": 60.0, "date": "2026-11-29T10:00:00", "code_digest": "c0de",
            "machine": machine, "training": {"examples": 100, "steps": 10, "global_batch": 8}, "refreshed": None}


def _runs(rng, seeds, machine=MACHINE_A, with_zero=True):
    out = {"dpr": {s: _run(rng, 0.0, machine) for s in seeds}, "dar": {s: _run(rng, 0.02, machine) for s in seeds}}
    if with_zero:
        out["zero"] = {None: {**_run(rng, -0.01, machine), "training": None}}
    return out


def _result(exp, runs, machine=MACHINE_A, date="2026-11-29T12:00:00"):
    """What the runner writes: its head fields and the tables of its runs."""
    return {"experiment": exp.family, "dataset": "d", "metric": exp.metric, "seeds": list(exp.seeds),
            "vars": dict(exp.vars), "date": date, "commit": "abc",
            "machine": machine, **tables(exp, "d", runs)}


def test_every_comparison_computed_again_from_the_record_alone_is_the_one_recorded():
    exp = _exp()
    rng = np.random.default_rng(1)
    runs = _runs(rng, [0, 1, 2])
    recorded = json.loads(json.dumps(_result(exp, runs)))  # through JSON, as the file is
    again = tables(exp, "d", runs_of(recorded))
    assert again["comparisons"] == recorded["comparisons"]
    for cid, row in recorded["comparisons"].items():  # and it is the effect of the runs' own per-query values
        m, b = row["method"], row["baseline"]
        direct = effect({s: r["scores"]["all"]["per_query"] for s, r in runs[m].items()},
                        {s: r["scores"]["all"]["per_query"] for s, r in runs[b].items()}, 1)
        assert row["parts"]["all"]["difference"] == pytest.approx(direct["difference"], abs=1e-12)
        assert row["parts"]["all"]["p_randomization"] == direct["p_randomization"]
    seed0 = recorded["arms"]["dpr"]["seeds"]["0"]
    assert len(seed0["per_query"]["all"]) == len(recorded["queries"]["all"]) == 40
    assert recorded["arms"]["dpr"]["definition"] == definition_digest(exp, exp.arms["dpr"])


def test_seeds_run_in_two_work_folders_merge_into_one_record_with_every_run_and_the_paired_test_over_all():
    exp = _exp()
    rng = np.random.default_rng(2)
    first = _runs(rng, [0, 1], MACHINE_A)
    second = _runs(rng, [1, 2, 3], MACHINE_B, with_zero=False)  # seed 1 again: the newer run replaces it
    earlier = json.loads(json.dumps(_result(exp, first)))
    new = json.loads(json.dumps(_result(exp, second, MACHINE_B)))
    merged, said = merge(exp, earlier, new)
    want = {"zero": first["zero"], "dpr": {0: first["dpr"][0], **second["dpr"]},
            "dar": {0: first["dar"][0], **second["dar"]}}
    direct = tables(exp, "d", want)
    assert merged["comparisons"] == direct["comparisons"]
    assert merged["comparisons"]["dar-vs-dpr"]["parts"]["all"]["seeds"] == [0, 1, 2, 3]
    assert merged["comparisons"]["dpr-vs-zero"]["parts"]["all"]["n_seeds"] == 4  # zero-shot from the first
    assert merged["arms"]["dpr"]["seeds"]["1"]["all"] == second["dpr"][1]["scores"]["all"]["mean"]
    assert merged["arms"]["dpr"]["seeds"]["0"]["machine"] == MACHINE_A
    assert merged["arms"]["dpr"]["seeds"]["2"]["machine"] == MACHINE_B
    assert merged["machines"] == [MACHINE_A, MACHINE_B]
    assert merged["runs_finished"] == 9 and merged["runs_planned"] == 9 and merged["complete"]
    assert merged["seeds_run"] == [0, 1, 2, 3] and merged["arms_run"] == ["zero", "dpr", "dar"]
    assert any("3 of its runs kept beside this result's 6, 2 replaced" in s for s in said)
    # merging the same result again changes nothing
    again, _ = merge(exp, merged, new)
    assert again["comparisons"] == merged["comparisons"] and again["arms"] == merged["arms"]


def test_a_row_whose_runs_kept_no_per_query_values_stays_as_recorded_until_the_new_runs_cover_as_many_seeds():
    """A record made before per-query values were kept: its rows cannot be computed again. New runs with fewer
    seeds leave the row as it was (marked, with its date and commit); new runs over as many seeds replace it."""
    exp = _exp()
    rng = np.random.default_rng(3)
    legacy = json.loads(json.dumps(_result(exp, _runs(rng, [0, 1, 2]))))
    for a in legacy["arms"].values():
        a.pop("definition")
        for v in a["seeds"].values():
            v.pop("per_query")
    legacy.pop("queries")
    old_row = copy.deepcopy(legacy["comparisons"]["dar-vs-dpr"])
    merged, said = merge(exp, legacy, json.loads(json.dumps(_result(exp, _runs(rng, [0, 1], with_zero=False)))))
    row = merged["comparisons"]["dar-vs-dpr"]
    assert row["parts"] == old_row["parts"] and row["verdict"] == old_row["verdict"]
    assert row["as_recorded"] == {"date": "2026-11-29T12:00:00", "commit": "abc", "machine": MACHINE_A}
    assert any(s.startswith("dar-vs-dpr: kept as recorded on 2026-11-29 (3 seeds") for s in said)
    # the seeds of the legacy runs not run again stay in the arms' table
    assert sorted(merged["arms"]["dar"]["seeds"]) == ["0", "1", "2"]
    merged, _ = merge(exp, merged, json.loads(json.dumps(_result(exp, _runs(rng, [0, 1, 2])))))
    row = merged["comparisons"]["dar-vs-dpr"]
    assert "as_recorded" not in row and row["parts"]["all"]["n_seeds"] == 3


def test_runs_of_an_arm_defined_otherwise_are_left_out_and_other_vars_are_refused():
    exp = _exp()
    rng = np.random.default_rng(4)
    earlier = json.loads(json.dumps(_result(exp, _runs(rng, [0, 1]))))
    earlier["arms"]["dar"]["definition"] = "0123456789abcdef"  # as if its overrides had changed since
    new = json.loads(json.dumps(_result(exp, _runs(rng, [2, 3], with_zero=False))))
    merged, said = merge(exp, earlier, new)
    assert sorted(merged["arms"]["dar"]["seeds"]) == ["2", "3"] and sorted(merged["arms"]["dpr"]["seeds"]) == \
        ["0", "1", "2", "3"]
    assert any("dar: 2 recorded runs (seed 0, 1) made with another definition of the arm; left out" in s for s in said)
    other = copy.deepcopy(new)
    other["vars"] = {"model": "another"}
    with pytest.raises(PipelineError, match="other vars"):
        merge(exp, earlier, other)


def test_recording_merges_into_the_matrix_and_never_replaces_an_unreadable_file(tmp_path, monkeypatch):
    import pipeline.reproduce as reproduce
    from pipeline.cli.reproduce import _keep_family_record

    exp = _exp()
    rng = np.random.default_rng(5)
    monkeypatch.setattr(reproduce, "results_dir", lambda folder=None: tmp_path / "results")
    (tmp_path / "results").mkdir()
    said = []
    _keep_family_record(exp, "d", {**_result(exp, _runs(rng, [0, 1])), "data": "/data/d"}, None, tmp_path / "w1",
                        said.append)
    _keep_family_record(exp, "d", {**_result(exp, _runs(rng, [2, 3], with_zero=False)), "data": "/data/d"}, None,
                        tmp_path / "w2", said.append)
    kept = json.loads((tmp_path / "results" / "fx-d.json").read_text())
    assert kept["runs_finished"] == 9 and kept["comparisons"]["dar-vs-dpr"]["parts"]["all"]["n_seeds"] == 4
    assert "/data/d" not in json.dumps(kept)  # local paths as placeholders, as before
    assert any("9 of 9 runs -> " in s for s in said)
    bad = tmp_path / "results" / "fx-d.json"
    bad.write_text("{ not json")
    with pytest.raises(PipelineError, match="not a readable result, so not replaced"):
        _keep_family_record(exp, "d", _result(exp, _runs(rng, [0])), None, tmp_path / "w3", said.append)
    assert bad.read_text() == "{ not json"


def test_the_page_of_a_merged_record_names_each_run_s_machine_and_each_row_kept_as_recorded():
    from pipeline.effects import report

    exp = _exp()
    rng = np.random.default_rng(6)
    legacy = json.loads(json.dumps(_result(exp, _runs(rng, [0, 1, 2]))))
    for a in legacy["arms"].values():
        for v in a["seeds"].values():
            v.pop("per_query")
    merged, _ = merge(exp, legacy, json.loads(json.dumps(_result(exp, _runs(rng, [3], MACHINE_B, False),
                                                                 MACHINE_B))))
    page = "\n".join(report.markdown(merged))
    assert "on A (2 cores, avx2); B (16 cores, avx512_bf16)" in page
    assert "| dpr | 3 | " in page and "| B (16 cores) | 2026-11-29 |" in page and "| A (2 cores) |" in page
    assert "* **dar-vs-dpr** is as recorded on 2026-11-29 (commit abc)" in page


def test_reproduce_check_finds_a_recorded_row_its_runs_do_not_give(tmp_path):
    """A figure edited by hand in a record (or written by code that computed otherwise) is found: every row is
    computed again from the record's per-query values."""
    from types import SimpleNamespace

    from pipeline.reproduce.checks import check_records

    exp = _exp()
    matrix = SimpleNamespace(experiments={"fx": exp})
    (tmp_path / "results").mkdir()
    record = json.loads(json.dumps(_result(exp, _runs(np.random.default_rng(7), [0, 1, 2]))))
    path = tmp_path / "results" / "fx-d.json"
    path.write_text(json.dumps(record))
    assert check_records(matrix, tmp_path) == []
    # the last digits of the statistics differ between numpy/scipy releases (Python 3.10 gets older ones): the same
    # record computed there is not a record computed otherwise; a figure off in its ninth digit is
    part = record["comparisons"]["dar-vs-dpr"]["parts"]["all"]
    exact = json.loads(json.dumps(part))
    part["interval"] = [v * (1 + 1e-14) for v in part["interval"]]
    part["difference"] *= 1 + 1e-13
    path.write_text(json.dumps(record))
    assert check_records(matrix, tmp_path) == []
    part.update(exact, difference=exact["difference"] * (1 + 1e-8))
    path.write_text(json.dumps(record))
    assert len(check_records(matrix, tmp_path)) == 1
    part.update(exact)
    record["comparisons"]["dar-vs-dpr"]["parts"]["all"]["difference"] += 0.01
    path.write_text(json.dumps(record))
    problems = check_records(matrix, tmp_path)
    assert len(problems) == 1 and problems[0].startswith("fx-d.json: dar-vs-dpr: the row is not what the record's")


def test_a_seed_trained_in_bf16_against_one_trained_in_fp32_is_not_comparable():
    """`train.amp=auto` trains in bf16 on a CPU with native bf16 and in fp32 elsewhere: a record merged from two
    such machines could pair a bf16 method seed with an fp32 baseline seed. That pair is not the method's
    effect; a run recorded before precision was kept is compared on the keys it has."""
    exp = _exp()
    rng = np.random.default_rng(8)
    runs = _runs(rng, [0, 1])
    for s in (0, 1):
        runs["dpr"][s]["training"] = {**runs["dpr"][s]["training"], "precision": "fp32"}
        runs["dar"][s]["training"] = {**runs["dar"][s]["training"], "precision": "bf16"}
    row = tables(exp, "d", runs)["comparisons"]["dar-vs-dpr"]
    assert row["verdict"] == "not comparable"
    assert row["not_comparable"] == "seed 0: dar trained on precision bf16 against fp32 (dpr)"
    for s in (0, 1):
        runs["dpr"][s]["training"].pop("precision")  # as recorded before precision was kept
    assert tables(exp, "d", runs)["comparisons"]["dar-vs-dpr"]["verdict"] != "not comparable"
