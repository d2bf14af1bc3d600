"""The effects experiment's machinery end to end on the bundled FAQ with the tests' tiny BERT, two seeds, three
arms and two steps each (CI keeps the machinery honest; the figures are the NFCorpus run's, not asserted here):
every arm and seed runs, the result holds each comparison's statistics on every part (DPR against the zero-shot
run it pairs with every seed: each seed's difference is that seed's DPR figure less the zero-shot one), a planted
no-op method is reported as no difference, a re-run runs nothing that finished, a run whose marker is gone runs
again alone.
Each run is 4-5 `pipeline` processes (what `reproduce run` starts, so they are what is tested): a third trained
arm would add 10 processes and ~50 s and assert nothing the DPR arm does not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main

pytestmark = pytest.mark.integration


def _matrix_with_a_no_op(tmp_path: Path) -> Path:
    """The shipped matrix plus a planted no-op method: an arm that trains exactly as DPR does, under another
    name, compared with DPR (as a reviewer would plant one)."""
    matrix = tmp_path / "repro"
    matrix.mkdir()
    for f in (Path(__file__).resolve().parents[2] / "repro").glob("*.yaml"):
        shutil.copy(f, matrix / f.name)
    spec = yaml.safe_load((matrix / "effects.yaml").read_text())
    spec["experiment"]["arms"].append({"id": "no-op", "title": "DPR under another name", "train": ["loss.name=dpr"]})
    spec["experiment"]["comparisons"].append({"id": "no-op-vs-dpr", "method": "no-op", "baseline": "dpr",
                                              "direction": 1, "claim": "a planted no-op", "source": "this test"})
    (matrix / "effects.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return matrix


def test_the_experiment_runs_every_arm_and_seed_and_resumes(tmp_path, tiny_model_dir, capsys):
    work = tmp_path / "work"
    args = ["reproduce", "run", "--matrix", str(_matrix_with_a_no_op(tmp_path)), "--family", "effects",
            "--on", "python_faq", "--seeds", "0,1", "--arms", "zero-shot,dpr,no-op", "--set", "max_steps=2",
            "--set", f"model={tiny_model_dir}", "--work", str(work)]
    assert main(args) == 0
    out = capsys.readouterr().out
    # a run with --set values has a work folder of its own: it never shares (nor sets aside) a defined run
    assert not (work / "effects-python_faq").exists()
    (root,) = work.glob("effects-python_faq-set-*")
    assert f"this run has a work folder of its own, {root}" in out
    result = json.loads((root / "result.json").read_text())
    # this command's part finished; the experiment as defined (every arm, five seeds) did not, and says so
    assert result["this_invocation"] == {"runs_planned": 5, "runs_finished": 5, "complete": True}
    # 13 seeded arms and the no-op x 5 seeds + zero-shot once
    assert not result["complete"] and result["runs_finished"] == 5 and result["runs_planned"] == 71
    assert result["seeds"] == [0, 1, 2, 3, 4] and result["seeds_run"] == [0, 1]
    assert result["changed_vars"]["max_steps"] == 2
    assert set(result["arms"]) == {"zero-shot", "dpr", "no-op"}
    assert set(result["arms"]["dpr"]["seeds"]) == {"0", "1"} and set(result["arms"]["zero-shot"]["seeds"]) == {"once"}
    row = result["comparisons"]["dpr-vs-zero-shot"]  # the zero-shot run pairs with each seed of DPR's
    e = row["parts"]["all"]
    assert e["n_seeds"] == 2 and len(e["per_seed"]) == 2 and e["queries"] == 70
    # each seed's difference is that seed's DPR run against the one zero-shot run, scored from their own records
    arms = result["arms"]
    zero = arms["zero-shot"]["seeds"]["once"]["all"]
    assert e["baseline_per_seed"] == [pytest.approx(zero, abs=1e-6)] * 2
    assert e["per_seed"] == [pytest.approx(arms["dpr"]["seeds"][s]["all"] - zero, abs=1e-6) for s in ("0", "1")]
    assert e["difference"] == pytest.approx(sum(e["per_seed"]) / 2)
    assert e["interval"][0] <= e["difference"] <= e["interval"][1] and 0 <= e["p_randomization"] <= 1
    assert row["verdict"] in ("holds beyond noise", "opposite beyond noise", "no difference", "inconclusive")
    assert result["comparisons"]["ance-vs-dpr"]["verdict"] == "not run"
    assert result["comparisons"]["dar-vs-dpr"]["verdict"] == "not run"
    # the planted no-op: the same seeds give the same model and rankings (a run's training depends on its commands
    # and seed, not on its folder or arm), so its cell says "no difference", never "holds"
    noop = result["comparisons"]["no-op-vs-dpr"]
    assert noop["verdict"] == "no difference"
    assert noop["parts"]["all"]["per_seed"] == [0.0, 0.0] and noop["parts"]["all"]["interval"] == [0.0, 0.0]
    for seed in ("seed-0", "seed-1"):  # each run kept its commands' output in its own logs
        assert (root / "arms" / "dpr" / seed / "logs" / "train.log").is_file()
        assert json.loads((root / "arms" / "dpr" / seed / "done.json").read_text())["commands"][0][1] == "train"
    assert "dpr-vs-zero-shot:" in out and "[effects] python_faq:" in out and "5 of 71 runs finished" in out
    assert "no-op-vs-dpr: +0.0000 [+0.0000, +0.0000], p 1.000, 2 seed(s): no difference" in out
    # the same command again: nothing runs
    assert main(args) == 0
    assert "5 runs (5 done before)" in capsys.readouterr().out
    # a run without its marker (killed before it finished) runs again, alone
    (root / "arms" / "dpr" / "seed-1" / "done.json").unlink()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "5 runs (4 done before)" in out and "dpr seed 1: train" in out and "dpr seed 0: train" not in out
    assert "no-op seed 1: train" not in out
    # a run with other vars, arms or seeds than the experiment defines is never recorded into the matrix
    assert main(["reproduce", "record", "--matrix", args[3], "--family", "effects", "--on", "python_faq",
                 "--work", str(work)]) == 2
    assert "no result of effects on python_faq to record" in capsys.readouterr().err
    # the work folder is this command's: a user's file in it is refused, never deleted
    (root / "notes.txt").write_text("mine")
    assert main(args) == 2
    assert (root / "notes.txt").read_text() == "mine"


def test_an_experiment_never_records_a_changed_run(tmp_path, capsys):
    assert main(["reproduce", "run", "--family", "effects", "--on", "python_faq", "--set", "max_steps=2",
                 "--record", "--work", str(tmp_path)]) == 2
    assert "--record keeps a run of the experiment as it is defined" in capsys.readouterr().err
    assert main(["reproduce", "run", "--family", "nope"]) == 2
    assert main(["reproduce", "run", "--family", "effects", "--on", "python_faq", "--set", "nope=1",
                 "--work", str(tmp_path)]) == 2
    assert "not a var of the experiment" in capsys.readouterr().err

