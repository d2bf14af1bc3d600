"""An effects record that cannot mix runs (#60): one identity per run (the arm's definition, the vars, the
config files its commands name, the data's fingerprint, the prepare, the seed), used by the runner, `record`,
the status and `reproduce check`; scores that follow the metric and the labeled documents; verdicts adjusted
over the table (Holm); the command line's seeds and arms; a killed run that leaves nothing training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.effects import runner as R
from pipeline.effects.record import definition_digest, merge, recordable, run_definition, tables
from pipeline.effects.spec import load_experiment
from pipeline.effects.stats import adjust, effect, holm
from pipeline.errors import ConfigError, PipelineError

PARTS = ("all", "labeled", "unlabeled")


def _raw(**change):
    raw = {"datasets": ["d"], "seeds": [0, 1], "metric": "nDCG@10", "qrels": "corpus/qrels/test.trec",
           "train_qrels": "corpus/qrels/train.trec", "vars": {"model": "m", "positives": 0},
           "prepare": ["pipeline ingest {data} --out {prep}/corpus"],
           "train": "pipeline train --config {repo}/c.yaml train.seed={seed} model.name_or_path={model}",
           "evaluate": ["pipeline encode --corpus {prep}/corpus --out {run}/emb --model {model_path}"],
           "arms": [{"id": "zero", "title": "zero", "train": None},
                    {"id": "dpr", "title": "dpr", "train": ["loss.name=dpr"]}],
           "comparisons": [{"id": "dpr-vs-zero", "method": "dpr", "baseline": "zero", "direction": 1, "claim": "c",
                            "source": "s"}]}
    raw.update(change)
    return raw


# ------------------------------------------------------------------ the runner: a run's identity


def _prepared(work: Path, test_lines: list[str], train_lines: list[str]) -> None:
    """A prepared dataset as the prepare leaves it: a corpus with a manifest and its judgements."""
    from pipeline.io_utils import WORK_MARKER

    corpus = work / "prepare" / "corpus"
    (corpus / "qrels").mkdir(parents=True, exist_ok=True)
    (work / WORK_MARKER).write_text("made by pipeline reproduce\n")
    (corpus / "manifest.json").write_text(json.dumps({"variant": "v", "sources": [{"sha256": "s"}],
                                                     "title_join": "none", "rows": 3}))
    (corpus / "qrels" / "test.trec").write_text("".join(f"{ln}\n" for ln in test_lines))
    (corpus / "qrels" / "train.trec").write_text("".join(f"{ln}\n" for ln in train_lines))
    (work / "prepare" / "done.json").write_text("{}")


@pytest.fixture
def fake_runner(monkeypatch):
    """The runner with its commands replaced (each run writes a run.trec), the prepare taken as done, and a
    score that reads the run and the current metric: what the identity and the scoring keys decide is real."""
    ran = []

    def fake_steps(steps, logs, say):
        ran.append(steps)
        logs.mkdir(parents=True, exist_ok=True)
        folder = logs.parent
        (folder / "run.trec").write_text("q1 Q0 d1 1 1.0 x\nq2 Q0 d2 1 1.0 x\n")
        return {name: 1.0 for name, _ in steps}

    monkeypatch.setattr(R, "_run_steps", fake_steps)
    monkeypatch.setattr(R.ExperimentRun, "prepare", lambda self: None)
    return ran


def _experiment_run(tmp_path, exp, said, **kw):
    return R.ExperimentRun(exp, "d", "/data", tmp_path / "w", print_fn=lambda text, **k: said.append(text), **kw)


def test_a_finished_run_is_not_done_after_its_judgements_or_a_config_file_change_and_says_why(
        tmp_path, fake_runner, monkeypatch):
    """Finished runs were reused after the prepare was made again from other data (the arm's commands name
    {prep}, not the data), and the training config file a command names was in no identity. Each now makes the
    run another one: set aside, saying what differs, and run again; the same data and config reuse it."""
    repo = tmp_path / "checkout"
    (repo / "jobs").mkdir(parents=True)
    (repo / "c.yaml").write_text("train: {epochs: 1}\n")
    monkeypatch.setattr(R, "repo_root", lambda: repo)
    exp = load_experiment(_raw(), "fx", "f.yaml", {"d": {}})
    work = tmp_path / "w"
    _prepared(work, ["q1 0 d1 1", "q2 0 d2 1"], ["q9 0 d1 1"])
    said = []
    run = _experiment_run(tmp_path, exp, said, arms=["dpr"])
    result = run.run()
    assert len(fake_runner) == 2 and result["data_fingerprint"]["qrels"] is not None
    done = json.loads((work / "arms" / "dpr" / "seed-0" / "done.json").read_text())
    assert done["identity"]["configs"] == {"{repo}/c.yaml": done["identity"]["configs"]["{repo}/c.yaml"]}
    fake_runner.clear()
    run.run()
    assert fake_runner == []  # the same identity: nothing runs again
    # the judgements scored are other ones (the prepare made again from another copy of the data)
    _prepared(work, ["q1 0 d1 1", "q2 0 d3 1"], ["q9 0 d1 1"])
    run.run()
    assert len(fake_runner) == 2
    assert any("seed 0: finished earlier, made with other data (corpus or judgements)" in t for t in said)
    assert len(list((work / "arms" / "dpr").glob("seed-0.replaced-*"))) == 1
    # the config file the train command names is edited
    fake_runner.clear()
    (repo / "c.yaml").write_text("train: {epochs: 2}\n")
    run.run()
    assert len(fake_runner) == 2 and any("made with other config files its commands name ({repo}/c.yaml)" in t for t in said)


def test_scores_follow_the_metric_and_the_labeled_documents_follow_the_positives(tmp_path, fake_runner):
    """After `metric:` went from nDCG@10 to MRR@10 nothing ran again and result.json called the nDCG@10 values
    MRR@10; labeled-documents.txt was written once and reused under other positives. A run's scores record what
    they were computed with and are computed again from its run.trec when that is not today's."""
    work = tmp_path / "w"
    _prepared(work, ["q1 0 d1 1", "q1 0 d9 1", "q2 0 d2 1"], ["q9 0 d1 2", "q9 0 d2 1"])
    exp = load_experiment(_raw(), "fx", "f.yaml", {"d": {}})
    said = []
    first = _experiment_run(tmp_path, exp, said, arms=["dpr"]).run()
    ndcg = first["arms"]["dpr"]["seeds"]["0"]["all"]
    assert first["metric"] == "nDCG@10" and (work / "labeled-documents.txt").read_text().split() == ["d1", "d2"]
    fake_runner.clear()
    exp_rr = load_experiment(_raw(metric="RR@10"), "fx", "f.yaml", {"d": {}})
    again = _experiment_run(tmp_path, exp_rr, said, arms=["dpr"]).run()
    assert fake_runner == []  # nothing trained again: the runs are scored again from their run.trec
    rr = again["arms"]["dpr"]["seeds"]["0"]["all"]
    assert again["metric"] == "RR@10" and rr == pytest.approx(1.0) and ndcg != pytest.approx(rr)
    scores = json.loads((work / "arms" / "dpr" / "seed-0" / "scores.json").read_text())
    assert scores["scored_with"]["metric"] == "RR@10"
    # one positive per query (the highest grade): the labeled documents are drawn again
    exp_one = load_experiment(_raw(vars={"model": "m", "positives": 1}), "fx", "f.yaml", {"d": {}})
    _experiment_run(tmp_path, exp_one, said, arms=["dpr"], set_vars=None).labeled_documents()
    assert (work / "labeled-documents.txt").read_text().split() == ["d1"]
    assert json.loads((work / "labeled-documents.json").read_text())["positives"] == 1


# ------------------------------------------------------------------ the record


MACHINE = {"cpu": "A", "cores": 2, "isa": []}


def _run(rng, shift, date="2026-11-29T10:00:00", definition=None, code="c0de", queries=30):
    scores = {}
    for p in PARTS:
        per = {f"q{i}": round(float(np.clip(0.4 + shift + rng.normal(0, 0.1), 0, 1)), 6) for i in range(queries)}
        scores[p] = {"mean": float(np.mean(list(per.values()))), "per_query": per}
    return {"scores": scores, "wall_seconds": 60.0, "date": date, "code_digest": code, "machine": MACHINE,
            "training": {"examples": 100, "steps": 10, "global_batch": 8}, "refreshed": None,
            **({"identity": {"definition": definition}} if definition else {})}


def _result(exp, runs, date="2026-11-29T12:00:00"):
    return {"experiment": exp.family, "dataset": "d", "metric": exp.metric, "seeds": list(exp.seeds),
            "vars": dict(exp.vars), "date": date, "commit": "abc", "machine": MACHINE, **tables(exp, "d", runs)}


def test_merge_leaves_out_new_runs_of_another_definition_and_keeps_the_newer_run_of_a_seed():
    """Only the earlier record's runs were checked for their definition: a new result's runs made before an arm
    was edited were kept and relabelled with today's digest. And where both hold a seed the new result's run
    replaced the recorded one even when it was older."""
    exp = load_experiment(_raw(seeds=[0, 1, 2]), "fx", "f.yaml", {"d": {}})
    rng = np.random.default_rng(1)
    today = run_definition(exp, exp.arms["dpr"])
    earlier = json.loads(json.dumps(_result(exp, {
        "dpr": {0: _run(rng, 0.02, "2026-11-30T10:00:00", today)}, "zero": {None: _run(rng, 0.0)}})))
    new = json.loads(json.dumps(_result(exp, {
        "dpr": {0: _run(rng, 0.05, "2026-11-20T10:00:00", today), 1: _run(rng, 0.02, definition="0" * 16),
                2: _run(rng, 0.02, "2026-12-01T10:00:00", today)},
        "zero": {None: _run(rng, 0.0, "2026-12-01T00:00:00")}})))
    merged, said = merge(exp, earlier, new)
    assert sorted(merged["arms"]["dpr"]["seeds"]) == ["0", "2"]
    assert merged["arms"]["dpr"]["seeds"]["0"]["date"] == "2026-11-30T10:00:00"  # the newer (recorded) one stays
    assert any("dpr: 1 new run (seed 1) made with another definition of the arm; left out" in s for s in said)
    assert any("1 of this result's runs older than the recorded ones, which stay" in s for s in said)
    assert recordable(exp, new) == ["dpr seed 1 was made with another definition of the arm"]
    assert recordable(exp, {**earlier, "metric": "RR@10"}) == ["its metric is RR@10, the matrix's nDCG@10"]


def test_a_redefined_arm_never_brings_back_its_old_row_and_its_record_is_stale():
    """After an arm was redefined, "kept as recorded" brought back the old definition's five-seed row over the
    new runs' (with a note that the runs kept no per-query values, which was false), and the cell's status
    said "current" whatever the arm's definition: `reproduce list` showed the old verdict, `check` passed."""
    from pipeline.reproduce.matrix import Cell
    from pipeline.reproduce.status import effect_definition_changes, status_word

    old_exp = load_experiment(_raw(seeds=[0, 1, 2]), "fx", "f.yaml", {"d": {}})
    new_arms = [{"id": "zero", "title": "zero", "train": None},
                {"id": "dpr", "title": "dpr", "train": ["loss.name=dpr", "loss.temperature=0.1"]}]
    exp = load_experiment(_raw(seeds=[0, 1, 2], arms=new_arms), "fx", "f.yaml", {"d": {}})
    rng = np.random.default_rng(2)
    earlier = json.loads(json.dumps(_result(old_exp, {
        "dpr": {s: _run(rng, 0.05) for s in (0, 1, 2)}, "zero": {None: _run(rng, 0.0)}})))
    earlier["comparisons"]["dpr-vs-zero"]["parts"]["all"]["n_seeds"] = 5  # as a row over more seeds would be
    new = json.loads(json.dumps(_result(exp, {"dpr": {0: _run(rng, 0.0)}, "zero": {None: _run(rng, 0.0)}})))
    merged, said = merge(exp, earlier, new)
    row = merged["comparisons"]["dpr-vs-zero"]
    assert not row.get("as_recorded") and row["parts"]["all"]["n_seeds"] == 1
    assert not any("kept as recorded" in s for s in said)
    cell = Cell(id="fx-d-dpr-vs-zero", family="fx", title="t", data=["d"], commands=[], metric={"name": "x"},
                expected=None, tolerance=0.0, tolerance_why="", source="", hardware={}, experiment="fx",
                comparison="dpr-vs-zero",
                defined_as={"arms": {a: definition_digest(exp, exp.arms[a]) for a in ("dpr", "zero")},
                            "vars": {k: str(v) for k, v in exp.vars.items()}, "metric": exp.metric})
    changes = effect_definition_changes(earlier, earlier["comparisons"]["dpr-vs-zero"], cell)
    assert changes == ["the method arm dpr is defined otherwise now"]
    assert status_word({**earlier["comparisons"]["dpr-vs-zero"], "_definition": "changed"}, cell) == "stale"


@pytest.mark.slow
def test_reproduce_check_fails_a_record_whose_arm_was_redefined(tmp_path):
    import shutil

    from pipeline.cli import main
    from pipeline.reproduce.matrix import matrix_dir

    folder = tmp_path / "repro"
    shutil.copytree(matrix_dir(), folder)
    text = (folder / "effects.yaml").read_text()
    text = text.replace("train: [loss.name=dar, loss.n_perturb=7, loss.dropout_p=0.1, loss.mix_weight=0.1]\n",
                        "train: [loss.name=dar, loss.n_perturb=5, loss.dropout_p=0.1, loss.mix_weight=0.1]\n", 1)
    (folder / "effects.yaml").write_text(text)
    assert main(["reproduce", "check", "--matrix", str(folder)]) == 2
    from pipeline.reproduce.matrix import load_matrix
    from pipeline.reproduce.status import cell_status, status_word

    matrix = load_matrix(folder)
    cell = matrix.cell("effects-nfcorpus-dar-vs-dpr")
    status = cell_status(cell, None, folder)
    assert status_word(status, cell) == "stale" and "dar is defined otherwise now" in " ".join(status["_changes"])


# ------------------------------------------------------------------ verdicts that hold for the table


def test_holm_adjusts_a_family_as_computed_by_hand():
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.5})
    assert adjusted == pytest.approx({"a": 0.04, "c": 0.09, "b": 0.09, "d": 0.5})
    assert holm({"a": 0.6, "b": 0.9}) == pytest.approx({"a": 1.0, "b": 1.0})


def test_a_table_of_planted_no_op_methods_that_train_otherwise_reads_no_effect_after_holm():
    """A method that does nothing read "no difference" only when its training was bit-identical to its baseline's;
    a non-deterministic no-op (an ANCE clone: its versions switch at wall-time-dependent steps) has noise of its
    own, and over a table of such rows some read "beyond noise" alone. Holm over the table: none does."""
    rng = np.random.default_rng(2)  # a draw in which two of the 40 rows read beyond noise alone
    queries = [f"q{i}" for i in range(60)]
    family = {}
    for k in range(40):
        base = {s: {q: float(rng.uniform(0.2, 0.6)) for q in queries} for s in range(5)}
        clone = {s: {q: v + float(rng.normal(0, 0.05)) for q, v in per.items()} for s, per in base.items()}
        family[f"noop-{k}"] = effect(clone, base, +1, resamples=2000)
    alone = [k for k, e in family.items() if e["verdict"] != "inconclusive"]
    assert alone, "the draw gives some rows beyond noise alone (the reason for the adjustment)"
    assert not any(e["identical"] for e in family.values())
    adjust(family)
    assert all(e["verdict"] == "inconclusive" for e in family.values())
    assert all(family[k]["verdict_raw"] != "inconclusive" for k in alone)
    e = family["noop-0"]
    assert e["resamples"] == 2000 and e["p_mc_se"] == pytest.approx((e["p_randomization"] *
                                                                     (1 - e["p_randomization"]) / 2000) ** 0.5)


def test_the_report_of_a_part_no_query_can_be_scored_on_is_a_row_not_a_crash():
    """`reproduce report` crashed (KeyError 'method_mean') where the training positives and the test judgements
    share no document: the labeled part has no query to score (the bundled FAQ is such a dataset)."""
    from pipeline.effects.report import markdown

    exp = load_experiment(_raw(), "fx", "f.yaml", {"d": {}})
    rng = np.random.default_rng(3)
    runs = {"dpr": {s: _run(rng, 0.02) for s in (0, 1)}, "zero": {None: _run(rng, 0.0)}}
    for by_seed in runs.values():
        for r in by_seed.values():
            r["scores"]["labeled"] = {"mean": None, "per_query": {}}
    result = {**_result(exp, runs), "runs_finished": 3, "runs_planned": 3, "labeled_documents": 0}
    text = "\n".join(markdown(result))
    assert "no query can be scored on this part" in text and "Holm's adjustment" in text


# ------------------------------------------------------------------ the command line


def test_seeds_and_arms_on_the_command_line_are_refused_when_they_cannot_mean_what_they_say():
    from pipeline.cli.reproduce import _arms_arg, _seeds_arg

    assert _seeds_arg("0-2,4", [0, 1, 2, 3, 4]) == [0, 1, 2, 4] and _seeds_arg(None) is None
    for text, said in [("4-0", "runs backwards"), ("", "seeds as 0,1,2"), ("0,0", "seed 0 named twice"),
                       ("0-2,1", "seed 1 named twice"), ("7", "seed 7 is not one the experiment names")]:
        with pytest.raises(ConfigError, match=said):
            _seeds_arg(text, [0, 1, 2, 3, 4])
    with pytest.raises(ConfigError, match="an empty one is not an arm"):
        _arms_arg("")
    with pytest.raises(ConfigError, match="dpr named twice"):
        _arms_arg("dpr,dpr")


def test_a_set_run_has_a_work_folder_of_its_own():
    from pipeline.cli.reproduce import set_work_folder

    exp = load_experiment(_raw(), "fx", "f.yaml", {"d": {}})
    work = Path("/w/fx-d")
    assert set_work_folder(work, exp, {}) == work and set_work_folder(work, exp, {"model": "m"}) == work
    other = set_work_folder(work, exp, {"model": "tiny"})
    assert other.parent == work.parent and other.name.startswith("fx-d-set-") and other != work
    assert set_work_folder(work, exp, {"model": "tiny"}) == other != set_work_folder(work, exp, {"model": "t2"})


_PARENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from pipeline.effects import runner as R
    R.CLI_MODULE = "sleeper"
    work = R.WorkFolder(Path(sys.argv[1])).open()
    R._run_steps([("train", ["pipeline", "train"])], Path(sys.argv[1] + "-logs"), lambda s: None)
""")

_SLEEPER = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    if os.environ.get("IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(os.environ["PID_FILE"]).write_text(str(os.getpid()))
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("ignore_term", [False, True])
def test_a_killed_reproduce_run_leaves_no_training_going_on_and_no_free_lock(tmp_path, ignore_term):
    """A killed `reproduce run` left its `pipeline train` child training and the work folder's lock released,
    so a re-run started beside it. The child dies with its parent (SIGTERM); one that would not die still holds
    the lock, so the next run is refused instead of starting beside it."""
    from pipeline.io_utils import claim_work_folder

    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "sleeper.py").write_text(_SLEEPER)
    work = tmp_path / "w"
    pid_file = tmp_path / "child.pid"
    env = {**os.environ, "PID_FILE": str(pid_file), "PYTHONPATH": str(tmp_path / "mods"),
           **({"IGNORE_TERM": "1"} if ignore_term else {})}
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(work), str(tmp_path / "mods")], env=env)
    child = None
    try:
        deadline = time.time() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        if ignore_term:
            time.sleep(0.5)
            assert _alive(child)
            with pytest.raises(PipelineError, match="another `pipeline reproduce` run is using this work folder"):
                claim_work_folder(work, R.OWN_ENTRIES)
        else:
            deadline = time.time() + 30
            while _alive(child) and time.time() < deadline:
                time.sleep(0.05)
            assert not _alive(child)
            claim_work_folder(work, R.OWN_ENTRIES).close()
    finally:
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
