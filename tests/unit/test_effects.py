"""The effects experiment's pieces: its statistics against hand-computed values, its spec's checks, the
training pairs' positives, DAR's labeled/unlabeled split of the test judgements, and BM25 runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from pipeline.effects.spec import fill, load_experiment, split_command
from pipeline.effects.stats import effect, verdict
from pipeline.errors import ConfigError, PipelineError


# ------------------------------------------------------------------ statistics

def test_the_effect_of_two_seeds_over_a_zero_shot_baseline_is_computed_by_hand():
    method = {0: {"a": 0.5, "b": 0.7}, 1: {"a": 0.6, "b": 0.8}}
    base = {None: {"a": 0.4, "b": 0.6}}
    e = effect(method, base, direction=1)
    assert e["per_seed"] == pytest.approx([0.1, 0.2])
    assert e["difference"] == pytest.approx(0.15)
    assert e["sd"] == pytest.approx(math.sqrt(0.005))  # ((0.05)^2 + (0.05)^2) / 1
    half = st.t.ppf(0.975, 1) * math.sqrt(0.005) / math.sqrt(2)
    assert e["interval"] == pytest.approx([0.15 - half, 0.15 + half])
    assert e["queries"] == 2 and e["n_seeds"] == 2
    assert e["method_mean"] == pytest.approx(0.65) and e["baseline_mean"] == pytest.approx(0.5)
    # the smallest detectable effect over seeds: (t.975 + t.80) sd / sqrt(n)
    assert e["mde_seeds"] == pytest.approx((st.t.ppf(0.975, 1) + st.t.ppf(0.8, 1)) * math.sqrt(0.005) / math.sqrt(2))
    assert e["verdict"] == "inconclusive"  # the interval holds 0


def test_seeds_pair_by_value_and_only_common_queries_count():
    method = {0: {"a": 1.0, "b": 0.0, "c": 0.5}, 1: {"a": 1.0, "b": 1.0}, 7: {"a": 0.0, "b": 0.0}}
    base = {0: {"a": 0.0, "b": 0.0}, 1: {"a": 0.5, "b": 0.5}}
    e = effect(method, base)
    assert e["seeds"] == [0, 1] and e["queries"] == 2  # seed 7 has no baseline; c is not in every run
    assert e["per_seed"] == pytest.approx([0.5, 0.5])


def _scores(rng, n_queries, shift, noise=0.05, seeds=5):
    base = rng.uniform(0.2, 0.6, n_queries)
    out = {}
    for s in range(seeds):
        vals = base + shift + rng.normal(0, noise, n_queries)
        out[s] = {f"q{i}": float(v) for i, v in enumerate(vals)}
    return out, base


def test_the_verdict_follows_the_interval_and_the_paired_test():
    rng = np.random.default_rng(0)
    method, base = _scores(rng, 200, shift=0.05)
    baseline = {None: {f"q{i}": float(v) for i, v in enumerate(base)}}
    assert effect(method, baseline, direction=1)["verdict"] == "holds beyond noise"
    assert effect(method, baseline, direction=-1)["verdict"] == "opposite beyond noise"
    same, base2 = _scores(rng, 200, shift=0.0)
    e = effect(same, {None: {f"q{i}": float(v) for i, v in enumerate(base2)}}, direction=1)
    assert e["verdict"] == "inconclusive" and e["mde"] > 0
    # a method that is its baseline (a planted no-op): no effect, p = 1, said as such, never "holds"
    e = effect({0: baseline[None], 1: baseline[None]}, baseline)
    assert e["difference"] == 0 and e["p_randomization"] == 1.0 and e["verdict"] == "no difference"
    assert e["identical"] and e["interval"] == [0.0, 0.0]
    # one query moved by a hair in one seed is a difference, and too small to be anything but inconclusive
    nudged = dict(baseline[None], q0=baseline[None]["q0"] + 1e-6)
    e = effect({0: baseline[None], 1: nudged}, baseline)
    assert not e["identical"] and e["verdict"] == "inconclusive"


def test_one_seed_is_always_inconclusive():
    e = effect({0: {"a": 0.9, "b": 0.9}}, {None: {"a": 0.1, "b": 0.1}})
    assert e["interval"] is None and e["verdict"] == "inconclusive"
    assert verdict({"n_seeds": 1, "interval": None}, 1) == "inconclusive"


# ------------------------------------------------------------------ the spec

def _raw(**change):
    raw = {"datasets": ["d"], "seeds": [0, 1], "metric": "nDCG@10", "qrels": "corpus/qrels/test.trec",
           "train_qrels": "corpus/qrels/train.trec", "vars": {"model": "m"},
           "prepare": ["pipeline ingest {data} --out {prep}/corpus"],
           "train": "pipeline train --config {repo}/c.yaml train.seed={seed} model.name_or_path={model}",
           "evaluate": ["pipeline encode --corpus {prep}/corpus --out {run}/emb --model {model_path}"],
           "arms": [{"id": "zero", "title": "zero", "train": None}, {"id": "dpr", "title": "dpr", "train": ["loss.name=dpr"]}],
           "comparisons": [{"id": "dpr-vs-zero", "method": "dpr", "baseline": "zero", "direction": 1, "claim": "c",
                            "source": "s"}]}
    raw.update(change)
    return raw


def test_an_experiment_spec_is_checked():
    exp = load_experiment(_raw(), "fx", "f.yaml", {"d": {}})
    assert exp.arms["zero"].model_path == "{model}" and exp.arms["dpr"].model_path == "{run}/model/model"
    assert exp.cell_id("d", "dpr-vs-zero") == "fx-d-dpr-vs-zero"
    for change, message in [
        ({"bogus": 1}, "unknown key"),
        ({"datasets": ["nope"]}, "dataset 'nope'"),
        ({"seeds": [0, 0]}, "distinct"),
        ({"vars": {"run": 1}}, "may not be named"),
        ({"train": "pipeline train {nowhere}"}, "names nowhere"),
        ({"prepare": ["python x.py"]}, "is a `pipeline ...` command"),
        ({"comparisons": [{"id": "c", "method": "dpr", "baseline": "ghost", "direction": 1, "claim": "c",
                           "source": "s"}]}, "baseline 'ghost'"),
        ({"comparisons": [{"id": "c", "method": "zero", "baseline": "dpr", "direction": 1, "claim": "c",
                           "source": "s"}]}, "has no training"),
        ({"comparisons": [{"id": "c", "method": "dpr", "baseline": "zero", "direction": 2, "claim": "c",
                           "source": "s"}]}, "direction"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_experiment(_raw(**change), "fx", "f.yaml", {"d": {}})


def test_a_command_is_split_once_and_paths_with_spaces_and_quotes_stay_one_argument():
    argv = split_command("pipeline ingest {data} --out {prep}/corpus", "here")
    path = "/tmp/my data/it's \"here\" key=value"
    assert fill(argv, {"data": path, "prep": "/w"}) == ["pipeline", "ingest", path, "--out", "/w/corpus"]
    with pytest.raises(ConfigError, match="cannot be split"):
        split_command("pipeline ingest 'unclosed", "here")


def test_the_shipped_experiment_loads_with_every_arm_and_comparison():
    from pipeline.reproduce import load_matrix

    m = load_matrix()
    exp = m.experiments["effects"]
    assert {"zero-shot", "dpr", "dar", "dar-interpolation", "dar-perturbation", "dpr-hn", "dar-hn", "ance", "ance-in-batch",
            "ance-dar"} <= set(exp.arms)
    assert len(exp.seeds) >= 5 and {"nfcorpus", "scifact-train"} <= set(exp.datasets)
    for d in exp.datasets:
        for c in exp.comparisons:
            cell = m.cells[exp.cell_id(d, c)]
            assert cell.experiment == "effects" and cell.baseline == exp.comparisons[c].baseline


@pytest.mark.parametrize("arms, seeds, changed, recorded", [
    (["zero-shot", "dpr", "dar"], [0, 1, 2], {}, True),       # a part of the experiment as defined
    (["zero-shot", "dpr", "nope"], [0, 1], {}, False),        # an arm it does not define
    (["zero-shot", "dpr"], [0, 7], {}, False),                # a seed it does not define
    (["zero-shot", "dpr"], [0, 1], {"max_steps": 2}, False),  # its vars changed
    (["zero-shot", "dpr"], [0, 1], None, False),              # made from an edited copy of the matrix (no --set)
])
@pytest.mark.slow
def test_record_keeps_a_part_of_the_experiment_never_a_changed_one(arms, seeds, changed, recorded, tmp_path,
                                                                   capsys):
    """`reproduce record --family`: a run of some of the defined arms and seeds with the defined vars is
    recorded (as incomplete); other arms, seeds or vars never are, and nothing is written then. A result made
    from an edited copy of the matrix (its vars differ, no --set: changed_vars is empty) was recorded, and
    `reproduce check` then passed."""
    import json
    import shutil

    from pipeline.cli import main
    from pipeline.reproduce.matrix import load_matrix, matrix_dir

    defined = load_matrix().experiments["effects"].vars
    edited = changed is None
    changed = changed or {}
    vars_ = {**defined, **changed, **({"max_steps": 2, "model": "/tmp/tiny"} if edited else {})}

    folder = tmp_path / "repro"
    shutil.copytree(matrix_dir(), folder, ignore=shutil.ignore_patterns("results"))
    work = tmp_path / "work" / "effects-nfcorpus"
    work.mkdir(parents=True)
    result = {"experiment": "effects", "dataset": "nfcorpus", "arms_run": arms, "seeds": [0, 1, 2, 3, 4],
              "seeds_run": seeds, "changed_vars": changed, "complete": False, "runs_finished": 3, "runs_planned": 51,
              "data": str(tmp_path / "nfcorpus"), "comparisons": {}, "vars": vars_, "metric": "nDCG@10"}
    (work / "result.json").write_text(json.dumps(result))
    rc = main(["reproduce", "record", "--family", "effects", "--on", "nfcorpus", "--matrix", str(folder),
               "--work", str(tmp_path / "work")])
    out = capsys.readouterr()
    written = folder / "results" / "effects-nfcorpus.json"
    if recorded:
        assert rc == 0 and "(incomplete)" in out.out and json.loads(written.read_text())["data"] == "{nfcorpus}"
    elif edited:
        assert rc == 2 and "not the experiment as the matrix defines it: its vars differ from the matrix's " \
            "(max_steps, model)" in out.err and not written.exists()
    else:
        assert rc == 2 and "never recorded" in out.err and not written.exists()


# ------------------------------------------------------------------ training pairs' positives

def test_positives_per_query_keeps_the_highest_grades_and_draws_ties_by_seed_and_query():
    from pipeline.data.training import pick_positives

    pos = {"q1": ("a", "b", "c", "d"), "q2": ("x",)}
    grades = {"q1": (1, 2, 1, 1), "q2": (1,)}
    skipped = {}
    one = pick_positives(pos, grades, 1, seed=0, skipped=skipped)
    assert one == {"q1": ("b",), "q2": ("x",)} and skipped == {"positives_over_cap": 3}
    two = pick_positives(pos, grades, 2, seed=0)
    assert two["q1"][0] == "b" and two["q1"][1] in ("a", "c", "d")
    # the draw depends on (seed, qid), not on the other queries nor on the order
    assert pick_positives({"q1": pos["q1"]}, {"q1": grades["q1"]}, 2, seed=0) == {"q1": two["q1"]}
    draws = {pick_positives(pos, grades, 2, seed=s)["q1"][1] for s in range(20)}
    assert len(draws) > 1


def test_examples_from_qrels_keep_one_positive_per_query_and_record_the_rule(faq, tmp_path):
    import json

    from pipeline.data.training import build_examples, read_examples_table
    from pipeline.train.config import TrainDataConfig

    qrels = tmp_path / "train.trec"
    lines = (faq / "qrels" / "train.trec").read_text().splitlines()
    q0, q1 = lines[0].split()[0], lines[1].split()[0]
    extra = [f"{q0} 0 {lines[k].split()[2]} 1" for k in (5, 6, 7)]  # three more judged passages for one query
    qrels.write_text("\n".join(lines + extra) + "\n")
    cfg = TrainDataConfig(corpus=str(faq), qrels=str(qrels), positives_per_query=1, positives_seed=3)
    meta = build_examples(cfg, tmp_path / "ex", progress=False)
    table = read_examples_table(tmp_path / "ex")
    queries = table["qid"].to_pylist()
    assert len(queries) == len(set(queries)) == len({ln.split()[0] for ln in lines})
    assert meta["positives_per_query"] == 1 and meta["positives_seed"] == 3 and "highest grade" in meta["positives_rule"]
    assert meta["skipped"].get("positives_over_cap") == 3
    assert json.loads((tmp_path / "ex" / "examples.json").read_text())["positives_per_query"] == 1
    del q1


# ------------------------------------------------------------------ labeled / unlabeled

def test_the_judgements_split_by_training_and_each_part_ignores_the_other_parts_documents():
    from pipeline.config import EvalConfig
    from pipeline.eval.label_split import evaluate_parts, part_run, split_judgements

    qrels = {"q1": {"L": 1, "U": 2, "N": 0}, "q2": {"L": 1}, "q3": {"U": 1}}
    parts = split_judgements(qrels, labeled={"L"})
    assert parts["labeled"] == {"q1": {"L": 1, "N": 0}, "q2": {"L": 1}}
    assert parts["unlabeled"] == {"q1": {"U": 2, "N": 0}, "q3": {"U": 1}}
    run = {"q1": {"L": 3.0, "U": 2.0, "N": 1.0}, "q2": {"X": 2.0, "L": 1.0}, "q3": {"U": 1.0}}
    assert part_run(run, qrels, parts["unlabeled"]) == {"q1": {"U": 2.0, "N": 1.0}, "q3": {"U": 1.0}}
    res = evaluate_parts(run, qrels, {"L"}, EvalConfig(measures=("P@1",), per_query=True))
    # unlabeled: q1's L is out of its ranking, so U is first: P@1 = 1 for q1 and q3
    assert res["unlabeled"]["metrics"]["P@1"] == pytest.approx(1.0)
    # labeled: q1 -> L first (1), q2 -> X first (0)
    assert res["labeled"]["metrics"]["P@1"] == pytest.approx(0.5)
    assert res["labeled"]["judgements"] == 2 and res["unlabeled"]["judgements"] == 2


def test_evaluate_split_by_reads_an_examples_folder_or_qrels(faq, tmp_path, capsys):
    from pipeline.cli import main

    run = tmp_path / "run.trec"
    assert main(["bm25", "--corpus", str(faq), "--out", str(run), "--top-k", "10"]) == 0
    qrels = faq / "qrels" / "test.trec"
    assert main(["evaluate", "--run", str(run), "--qrels", str(qrels), "--measures", "nDCG@10", "--split-by",
                 str(faq / "qrels" / "train.trec"), "--json", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    assert "[labeled]" in out and "[unlabeled]" in out and "labeled documents" in out
    import json

    m = json.loads((tmp_path / "m.json").read_text())
    assert set(m["parts"]) == {"labeled", "unlabeled"} and m["split_by"]["documents"] > 0
    assert main(["evaluate", "--run", str(run), "--qa", "x", "--split-by", str(qrels)]) == 2
    assert main(["evaluate", "--run", str(run), "--qrels", str(qrels), "--split-by", str(tmp_path)]) == 2
    assert "not a training examples folder" in capsys.readouterr().err


# ------------------------------------------------------------------ BM25

def test_a_bm25_run_is_bm25s_own_ranking_with_ties_in_corpus_order(faq, tmp_path):
    import json

    import bm25s
    import Stemmer

    from pipeline.eval.runs import read_run
    from pipeline.index.bm25 import B, K1, METHOD, _corpus_texts, _tokenize, bm25_run
    from pipeline.data.manifest import load_manifest

    out = tmp_path / "bm25.trec"
    meta = bm25_run(faq, faq / "queries.tsv", out, top_k=5, qrels=faq / "qrels" / "test.trec", progress=False)
    run = read_run(out)
    assert meta["model"]["k1"] == K1 and meta["model"]["b"] == B and meta["n_queries"] == len(run) == 70
    assert json.loads((tmp_path / "bm25.trec.meta.json").read_text())["corpus_fingerprint"]
    # the same scores bm25s gives directly
    pids, texts = _corpus_texts(faq, load_manifest(faq))
    stem = Stemmer.Stemmer("english")
    r = bm25s.BM25(method=METHOD, k1=K1, b=B)
    r.index(_tokenize(texts, stem), show_progress=False)
    q = next(iter(run))
    from pipeline.data.readers import load_queries

    qt = load_queries(faq / "queries.tsv")[q]
    ids, scores = r.retrieve(_tokenize([qt], stem, ids=False), k=5, show_progress=False)
    assert sorted(run[q].values(), reverse=True) == pytest.approx(sorted(map(float, scores[0]), reverse=True), rel=1e-5)
    # run again as it was run: the run there is kept; another is never put in its place without --overwrite
    before = out.read_bytes()
    assert bm25_run(faq, faq / "queries.tsv", out, top_k=5, qrels=faq / "qrels" / "test.trec", progress=False) == meta
    with pytest.raises(PipelineError, match="a different one"):
        bm25_run(faq, faq / "queries.tsv", out, top_k=5, progress=False)
    with pytest.raises(PipelineError, match="a different one \\(other lines"):
        bm25_run(faq, faq / "queries.tsv", out, top_k=4, qrels=faq / "qrels" / "test.trec", progress=False)
    assert out.read_bytes() == before
    bm25_run(faq, faq / "queries.tsv", out, top_k=5, progress=False, overwrite=True)


def test_a_query_with_no_known_term_gets_no_hits(faq, tmp_path):
    from pipeline.eval.runs import read_run
    from pipeline.index.bm25 import bm25_run

    queries = tmp_path / "q.tsv"
    queries.write_text("a\tzzzzqqq xxyyzz\nb\tpython list\n")
    bm25_run(faq, queries, tmp_path / "r.trec", top_k=3, progress=False)
    run = read_run(tmp_path / "r.trec")
    assert "a" not in run and len(run["b"]) == 3


# ------------------------------------------------------------------ identify

def test_identify_counts_a_beir_folder_and_names_a_mismatch(tmp_path):
    from pipeline.data.bundled import python_faq_dir
    from pipeline.data.identify import check_identity, count

    faq = python_faq_dir()
    assert count(faq, "passages") == 176 and count(faq, "test_queries") == 70
    spec = {"layout": "a BEIR folder", "identify": {"passages": 176, "test_queries": 70}}
    assert check_identity("python_faq", spec, str(faq)) == []
    with pytest.raises(PipelineError, match=r"passages 176 \(expected 5,183\)"):
        check_identity("scifact", {"layout": "x", "identify": {"passages": 5183, "test_queries": 300}}, str(faq))
    # a truncated corpus
    import shutil

    cut = tmp_path / "faq"
    shutil.copytree(faq, cut)
    lines = (cut / "corpus.jsonl").read_text().splitlines()
    (cut / "corpus.jsonl").write_text("\n".join(lines[3:]) + "\n")
    with pytest.raises(PipelineError, match=r"passages 173 \(expected 176\)"):
        check_identity("python_faq", spec, str(cut))
    # a missing split is a mismatch, an uncountable key is said
    with pytest.raises(PipelineError, match="dev_queries 0"):
        check_identity("python_faq", {"layout": "x", "identify": {"dev_queries": 10}}, str(faq))
    assert "not counted" in check_identity("x", {"layout": "x", "identify": {"authors": 3}}, str(faq))[0]


@pytest.mark.slow
def test_retrieve_searches_only_the_queries_a_qrels_file_judges(faq, tiny_model_dir, tmp_path):
    from pipeline.cli import main
    from pipeline.eval.runs import read_run

    emb, index, run = tmp_path / "emb", tmp_path / "index", tmp_path / "run.trec"
    assert main(["encode", "--corpus", str(faq), "--out", str(emb), "--model", str(tiny_model_dir),
                 "encode.runner=local", "encode.backend=torch"]) == 0
    assert main(["index", "--embeddings", str(emb), "--out", str(index)]) == 0
    qrels = faq / "qrels" / "test.trec"
    assert main(["retrieve", "--index", str(index), "--queries", str(faq / "queries.tsv"), "--qrels", str(qrels),
                 "--out", str(run), "--top-k", "5"]) == 0
    judged = {ln.split()[0] for ln in qrels.read_text().splitlines() if ln.strip()}
    assert set(read_run(run)) == judged
    bad = tmp_path / "bad.trec"
    bad.write_text("nope 0 x 1\n")
    assert main(["retrieve", "--index", str(index), "--queries", str(faq / "queries.tsv"), "--qrels", str(bad),
                 "--out", str(tmp_path / "r2.trec")]) == 2


def test_a_finished_run_is_found_from_another_checkout_and_nothing_else_passes_for_it(tmp_path):
    """A run's marker names the checkout its commands read (`--config <repo>/jobs/...`): the same run from
    another clone or a worktree is finished (with or without the marker's recorded `repo`); any other
    difference is not."""
    import json

    from pipeline.effects.runner import _done
    from pipeline.provenance import repo_root

    repo = str(repo_root())
    ours = [["pipeline", "train", "--config", f"{repo}/jobs/configs/effects.yaml", "train.seed=0"],
            ["pipeline", "encode", "--out", "/w/emb"]]

    def marker(commands, **extra):
        (tmp_path / "done.json").write_text(json.dumps({"commands": commands, "wall_seconds": 600.0, **extra}))
        return _done(tmp_path, ours)

    elsewhere = [["pipeline", "train", "--config", "/elsewhere/clone/jobs/configs/effects.yaml", "train.seed=0"],
                 ours[1]]
    assert marker(ours)["wall_seconds"] == 600.0
    assert marker(elsewhere) is not None and marker(elsewhere, repo="/elsewhere/clone") is not None
    assert marker([elsewhere[0][:-1] + ["train.seed=1"], ours[1]]) is None          # another seed
    assert marker([elsewhere[0], ["pipeline", "encode", "--out", "/w/other"]]) is None  # another output
    assert marker([elsewhere[0][:3] + ["/elsewhere/clone/jobs/configs/dpr.yaml", "train.seed=0"], ours[1]]) is None
    assert marker(elsewhere, repo="/third") is None


def test_a_finished_run_of_an_arm_defined_otherwise_now_is_set_aside_and_run_again(tmp_path, monkeypatch):
    """The arm's commands changed since a seed finished: that seed's folder is kept whole under another name
    (its figures are no longer the arm's), the run is made again, and a run whose commands agree is kept."""
    import json

    from pipeline.effects import runner as R

    ran = []

    def fake_steps(steps, logs, say):
        ran.append(steps[0][1])
        logs.mkdir(parents=True, exist_ok=True)
        return {name: 1.0 for name, _ in steps}

    monkeypatch.setattr(R, "_run_steps", fake_steps)
    monkeypatch.setattr(R.ExperimentRun, "prepare", lambda self: None)
    monkeypatch.setattr(R.ExperimentRun, "labeled_documents", lambda self: set())
    part = {"mean": 0.5, "per_query": {"q1": 0.5}}
    monkeypatch.setattr(R.ExperimentRun, "score", lambda self, folder, labeled: {p: part for p in R.PARTS})
    said = []
    exp = load_experiment(_raw(), "fx", "f.yaml", {"d": {}})
    run = R.ExperimentRun(exp, "d", "/data", tmp_path / "w", arms=["dpr"], seeds=[0, 1],
                          print_fn=lambda text, **kw: said.append(text))
    run.run()
    assert len(ran) == 2
    for s in (0, 1):
        assert (tmp_path / "w" / "arms" / "dpr" / f"seed-{s}" / "done.json").exists()
    # seed 0's marker now records other commands (as after a change of the arm's overrides)
    marker = tmp_path / "w" / "arms" / "dpr" / "seed-0" / "done.json"
    old = json.loads(marker.read_text())
    old["commands"][0] = old["commands"][0] + ["data.hard_negatives=1"]
    marker.write_text(json.dumps(old))
    (marker.parent / "keep-me.txt").write_text("the earlier run's own file")
    ran.clear()
    run.run()
    assert len(ran) == 1 and "train.seed=0" in ran[0]
    kept = list((tmp_path / "w" / "arms" / "dpr").glob("seed-0.replaced-*"))
    assert len(kept) == 1 and (kept[0] / "keep-me.txt").read_text() == "the earlier run's own file"
    assert json.loads((kept[0] / "done.json").read_text()) == old
    assert any("definition changed" in t and str(kept[0]) in t for t in said)
    assert not (tmp_path / "w" / "arms" / "dpr" / "seed-0" / "keep-me.txt").exists()
    # killed runs (started.json, no done.json): one of the same commands resumes where it is, one of other
    # commands is set aside as "started"
    seed1 = tmp_path / "w" / "arms" / "dpr" / "seed-1"
    (seed1 / "done.json").unlink()
    (seed1 / "checkpoint").write_text("a killed run's own")
    ran.clear()
    run.run()
    assert len(ran) == 1 and (seed1 / "checkpoint").exists() and not list(seed1.parent.glob("seed-1.replaced-*"))
    started = json.loads((seed1 / "started.json").read_text())
    started["commands"][0] = started["commands"][0] + ["loss.name=dar"]
    (seed1 / "started.json").write_text(json.dumps(started))
    (seed1 / "done.json").unlink()
    ran.clear()
    run.run()
    kept = list(seed1.parent.glob("seed-1.replaced-*"))
    assert len(ran) == 1 and len(kept) == 1 and (kept[0] / "checkpoint").exists()
    assert any("seed 1: started earlier with other commands" in t for t in said)


def _summaries_only(monkeypatch, R, fake_steps) -> str:
    """The runner with its steps replaced by `fake_steps` (which writes the trainer's summary), nothing
    prepared, and every query scoring the same; returns the experiment's train command template."""
    monkeypatch.setattr(R, "_run_steps", fake_steps)
    monkeypatch.setattr(R.ExperimentRun, "prepare", lambda self: None)
    monkeypatch.setattr(R.ExperimentRun, "labeled_documents", lambda self: set())
    part = {"mean": 0.5, "per_query": {"q1": 0.5, "q2": 0.4}}
    monkeypatch.setattr(R.ExperimentRun, "score", lambda self, folder, labeled: {p: part for p in R.PARTS})
    return "pipeline train --config {repo}/c.yaml train.storage_path={run} train.seed={seed} model.name_or_path={model}"


def test_a_comparison_of_arms_trained_on_other_pairs_or_steps_is_not_comparable(tmp_path, monkeypatch):
    """The hard-negative arm that left out the queries BM25 had nothing for trained on fewer pairs and steps
    than DPR: its difference is not the method's effect, and the result, the page and the verdict say so."""
    import json

    from pipeline.effects import report
    from pipeline.effects import runner as R

    def fake_steps(steps, logs, say):
        from pathlib import Path

        train = steps[0][1]
        if train[1] != "train":
            return {name: 1.0 for name, _ in steps}
        run = Path(next(a for a in train if a.startswith("train.storage_path=")).split("=", 1)[1])
        fewer = "data.hard_negatives=1" in train and "data.missing_negatives=random" not in train
        (run / "model").mkdir(parents=True, exist_ok=True)
        (run / "model" / "summary.json").write_text(json.dumps(
            {"examples": 2386 if fewer else 2590, "steps": 74 if fewer else 80, "global_batch": 32}))
        return {name: 1.0 for name, _ in steps}

    train = _summaries_only(monkeypatch, R, fake_steps)
    arms = [{"id": "zero", "title": "zero", "train": None}, {"id": "dpr", "title": "dpr", "train": ["loss.name=dpr"]},
            {"id": "hn", "title": "hn", "train": ["loss.name=dpr", "data.hard_negatives=1"]},
            {"id": "hn-all", "title": "hn", "train": ["loss.name=dpr", "data.hard_negatives=1",
                                                      "data.missing_negatives=random"]}]
    comps = [{"id": f"{a}-vs-{b}", "method": a, "baseline": b, "direction": 1, "claim": "c", "source": "s"}
             for a, b in (("dpr", "zero"), ("hn", "dpr"), ("hn-all", "dpr"))]
    exp = load_experiment(_raw(train=train, arms=arms, comparisons=comps), "fx", "f.yaml", {"d": {}})
    result = R.ExperimentRun(exp, "d", "/data", tmp_path / "w", print_fn=lambda *a, **k: None).run()
    rows = result["comparisons"]
    assert rows["hn-vs-dpr"]["verdict"] == "not comparable"
    assert rows["hn-vs-dpr"]["not_comparable"] == ("seed 0: hn trained on examples 2,386 against 2,590, "
                                                   "steps 74 against 80 (dpr)")
    assert all(e["verdict"] == "not comparable" for e in rows["hn-vs-dpr"]["parts"].values())
    assert rows["hn-all-vs-dpr"]["verdict"] != "not comparable" and "not_comparable" not in rows["hn-all-vs-dpr"]
    assert rows["dpr-vs-zero"]["verdict"] != "not comparable"  # a baseline without training compares with any
    assert result["arms"]["hn"]["seeds"]["0"]["training"] == {"examples": 2386, "steps": 74, "global_batch": 32}
    page = "\n".join(report.markdown(result))
    assert "**hn-vs-dpr is not comparable**: seed 0: hn trained on examples 2,386" in page


def test_an_ance_run_whose_trainer_took_no_refreshed_version_is_not_comparable(tmp_path, monkeypatch):
    """An ANCE run whose refresher ran but whose trainer never switched to a refreshed version trained on its
    first (BM25) negatives throughout: it is DPR with hard negatives, not ANCE. The run says so when it ends,
    and every cell comparing that arm (as method or as baseline) reads "not comparable", with the seed and the
    reason; an ANCE arm whose trainer switched is compared as usual, with the versions it took recorded."""
    import json

    from pipeline.effects import report
    from pipeline.effects import runner as R

    def fake_steps(steps, logs, say):
        from pathlib import Path

        train = steps[0][1]
        if train[1] != "train":
            return {name: 1.0 for name, _ in steps}
        run = Path(next(a for a in train if a.startswith("train.storage_path=")).split("=", 1)[1])
        summary = {"examples": 2590, "steps": 80, "global_batch": 32, "negatives_versions": []}
        if "loss.name=ance" in train:
            summary["refresher"] = {"settings": {}}
            if "ance.refresh_every=10" in train:  # the schedule that lets the trainer switch
                summary["negatives_versions"] = [{"version": 1, "at_step": 42, "checkpoint_step": 10}]
        (run / "model").mkdir(parents=True, exist_ok=True)
        (run / "model" / "summary.json").write_text(json.dumps(summary))
        return {name: 1.0 for name, _ in steps}

    said = []
    train = _summaries_only(monkeypatch, R, fake_steps)
    arms = [{"id": "dpr", "title": "dpr", "train": ["loss.name=dpr"]},
            {"id": "stuck", "title": "ance", "train": ["loss.name=ance", "ance.refresh_every=40"]},
            {"id": "ance", "title": "ance", "train": ["loss.name=ance", "ance.refresh_every=10"]},
            {"id": "ance-dar", "title": "ance+dar", "train": ["loss.name=ance_dar", "ance.refresh_every=10"]}]
    comps = [{"id": f"{a}-vs-{b}", "method": a, "baseline": b, "direction": 1, "claim": "c", "source": "s"}
             for a, b in (("stuck", "dpr"), ("ance", "dpr"), ("ance-dar", "stuck"))]
    exp = load_experiment(_raw(train=train, arms=arms, comparisons=comps), "fx", "f.yaml", {"d": {}})
    result = R.ExperimentRun(exp, "d", "/data", tmp_path / "w", print_fn=lambda *a, **k: said.append(a[0])).run()
    rows = result["comparisons"]
    reason = ("seed 0: the trainer used no refreshed negatives version (its refresher ran, but training kept its "
              "first negatives throughout), so the run is not stuck")
    assert rows["stuck-vs-dpr"]["verdict"] == "not comparable" and rows["stuck-vs-dpr"]["not_comparable"] == reason
    assert rows["ance-dar-vs-stuck"]["verdict"] == "not comparable"  # the unrefreshed arm as the baseline too
    assert rows["ance-dar-vs-stuck"]["not_comparable"] == reason
    assert all(e["verdict"] == "not comparable" for e in rows["stuck-vs-dpr"]["parts"].values())
    assert rows["ance-vs-dpr"]["verdict"] != "not comparable" and "not_comparable" not in rows["ance-vs-dpr"]
    seeds = result["arms"]
    assert seeds["ance"]["seeds"]["0"]["refreshed_versions"] == [{"version": 1, "at_step": 42}]
    assert seeds["stuck"]["seeds"]["1"]["refreshed_versions"] == []
    assert "refreshed_versions" not in seeds["dpr"]["seeds"]["0"]  # no refresher: nothing to say
    warnings = [t for t in said if "WARNING" in t]
    assert len(warnings) == 2 and all("stuck seed" in t for t in warnings)  # both seeds of the stuck arm, said once each
    assert "so the run is not stuck; every cell comparing stuck reads 'not comparable'" in warnings[0]
    page = "\n".join(report.markdown(result))
    assert "**stuck-vs-dpr is not comparable**: " + reason in page
    assert [cid for cid, _ in report.plotted(result)] == ["ance-vs-dpr"]  # the figure shows no non-effect


def test_the_run_summary_gives_a_not_comparable_cell_its_reason_and_no_figure():
    from pipeline.cli.reproduce import _print_effects

    part = {"difference": -0.2445, "interval": None, "p_randomization": 0.0, "n_seeds": 1, "mde": 0.0436}
    ok = {"difference": 0.0016, "interval": [0.001, 0.0021], "p_randomization": 0.047, "n_seeds": 4, "mde": 0.0022}
    result = {"comparisons": {
        "ance-vs-dpr": {"parts": {"all": part}, "verdict": "not comparable",
                        "not_comparable": "seed 0: the trainer used no refreshed negatives version"},
        "a-vs-b": {"parts": {"all": ok}, "verdict": "holds beyond noise"},
        "c-vs-d": {"verdict": "not run"}}}
    said = []
    _print_effects(result, said.append)
    assert said == ["ance-vs-dpr: not comparable: seed 0: the trainer used no refreshed negatives version",
                    "a-vs-b: +0.0016 [+0.0010, +0.0021], p 0.047, 4 seed(s): holds beyond noise "
                    "(smallest detectable 0.0022)"]


def test_a_run_that_shared_the_machine_is_marked_with_its_load_and_its_rows_say_so(tmp_path, monkeypatch):
    """The load sampled while a run went on is in its marker and the record; a seed whose mean load was above the
    cores by more than one process is marked *shared* in the table of arms and seeds, and the rows whose wall
    time it is part of say how many seeds shared (a wall time that says more about the machine than the arm)."""
    import json

    from pipeline.effects import record, report
    from pipeline.effects import runner as R

    loads = iter([1.0, 6.0, 1.0])  # in the plan's order: the zero-shot arm alone, dpr seed 0 beside other work, seed 1 alone

    class FakeSampler:
        def __init__(self, every=15.0):
            self.value = next(loads)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def summary(self):
            return {"mean": self.value, "max": self.value, "cpus": 2, "samples": 3}

    monkeypatch.setattr(R, "LoadSampler", FakeSampler)
    train = _summaries_only(monkeypatch, R, lambda steps, logs, say: {name: 1.0 for name, _ in steps})
    arms = [{"id": "zero", "title": "zero", "train": None}, {"id": "dpr", "title": "dpr", "train": ["loss.name=dpr"]}]
    comps = [{"id": "dpr-vs-zero", "method": "dpr", "baseline": "zero", "direction": 1, "claim": "c", "source": "s"}]
    exp = load_experiment(_raw(train=train, arms=arms, comparisons=comps), "fx", "f.yaml", {"d": {}})
    result = R.ExperimentRun(exp, "d", "/data", tmp_path / "w", seeds=[0, 1], print_fn=lambda *a, **k: None).run()
    done = json.loads((tmp_path / "w" / "arms" / "dpr" / "seed-0" / "done.json").read_text())
    assert done["load"] == {"mean": 6.0, "max": 6.0, "cpus": 2, "samples": 3}
    assert result["arms"]["dpr"]["seeds"]["0"]["load"]["mean"] == 6.0 and result["arms"]["dpr"]["shared_seeds"] == 1
    assert "shared_seeds" not in result["arms"]["zero"] and result["comparisons"]["dpr-vs-zero"]["shared_seeds"] == 1
    page = "\n".join(report.markdown(result))
    assert "| dpr | 0 | 0.5000 | 0.5000 | 0.5000 | 0.0 min (shared: load 6.0 on 2 cores) |" in page
    assert "| dpr | 1 | 0.5000 | 0.5000 | 0.5000 | 0.0 min |" in page
    assert "0.0 min (1 shared) |" in page and "A wall time marked *shared*" in page
    # the threshold: more than one runnable process above the cores; no sample, no verdict
    assert record.shared({"mean": 3.01, "cpus": 2}) and not record.shared({"mean": 3.0, "cpus": 2})
    assert not record.shared(None) and not record.shared({"mean": 9.0})


def test_the_load_sampler_samples_the_machine_while_a_run_goes_on():
    import os
    import time

    from pipeline.effects.runner import LoadSampler

    with LoadSampler(every=0.01) as load:
        time.sleep(0.1)
    got = load.summary()
    assert got["samples"] >= 2 and got["cpus"] == os.cpu_count() and 0 <= got["mean"] <= got["max"]
    n = got["samples"]
    time.sleep(0.05)
    assert load.summary()["samples"] == n  # stopped when the run ended


def test_a_row_far_off_the_others_scale_is_drawn_at_the_edge_with_its_figures(tmp_path):
    """A collapsed method (-0.24) beside effects of a few thousandths: the figure keeps the others' scale and
    writes the far row's figures at the edge, instead of squashing every other row into a point."""
    from pipeline.effects import report

    def row(d, spread=0.002):
        return {"per_seed": [d - spread, d + spread], "interval": [d - spread, d + spread], "difference": d,
                "verdict": "inconclusive", "n_seeds": 2}

    rows = [("a", row(0.003)), ("b", row(-0.004)), ("c", row(0.001)), ("collapsed", row(-0.24, 0.02))]
    limit, off = report.scale(rows)
    assert off == ["collapsed"] and limit == pytest.approx(1.15 * 0.006)
    assert report.scale(rows[:3]) == (None, [])  # all on one scale: matplotlib's own limits
    assert report.scale([("a", row(0.003)), ("x", row(-0.24))]) == (None, [])  # two rows: no median to judge by
    result = {"dataset": "d", "metric": "nDCG@10", "comparisons": {
        cid: {"parts": {"all": e}} for cid, e in rows}}
    assert report.figure(result, tmp_path / "f.png") and (tmp_path / "f.png").stat().st_size > 5000
