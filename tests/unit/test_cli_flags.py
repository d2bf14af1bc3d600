"""--batch-size / --fp16 / --device map onto the config keys, and impossible combinations are refused
before any work (the verbs' real work is replaced by recorders; nothing starts Ray)."""

from __future__ import annotations

import pytest

from pipeline.cli import main


@pytest.fixture()
def record(monkeypatch):
    seen = {}

    def fake_encode(corpus, out, cfg):
        seen["encode"] = cfg

    def fake_train(job, validate_fn=None, **kw):
        seen["train"] = job

    def fake_retrieve(index, queries, out, cfg, **kw):
        seen["retrieve"] = (cfg, kw)
        return {}

    def fake_build(emb, out, cfg, overwrite=False):
        seen["index"] = cfg

    monkeypatch.setattr("pipeline.index.encode.encode_corpus", fake_encode)
    monkeypatch.setattr("pipeline.train.trainer.train", fake_train)
    monkeypatch.setattr("pipeline.index.retrieve.retrieve", fake_retrieve)
    monkeypatch.setattr("pipeline.index.faiss_index.build_index", fake_build)
    return seen


def _gpu(monkeypatch, present: bool):
    monkeypatch.setattr("pipeline.device.gpu_here", lambda: present)
    # no Ray in this process (an earlier integration test may have left one up, which would decide instead)
    monkeypatch.setattr("pipeline.train.runner_choice._ray_running", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_flags_map_onto_config_keys(record, monkeypatch):
    _gpu(monkeypatch, False)
    assert main(["encode", "--corpus", "c", "--out", "e", "--batch-size", "7", "--device", "cpu"]) == 0
    enc = record["encode"].encode
    assert enc.batch_size == 7 and enc.gpus_per_actor == 0 and enc.precision == "auto"
    # trailing key=value overrides still win over a flag
    assert main(["encode", "--corpus", "c", "--out", "e", "--batch-size", "7", "encode.batch_size=9"]) == 0
    assert record["encode"].encode.batch_size == 9

    _gpu(monkeypatch, True)
    assert main(["encode", "--corpus", "c", "--out", "e", "--device", "cuda", "--fp16"]) == 0
    enc = record["encode"].encode
    assert enc.gpus_per_actor == 1 and enc.precision == "fp16" and enc.fp16 is False  # compute, not storage
    assert main(["encode", "--corpus", "c", "--out", "e", "--device", "auto"]) == 0
    assert record["encode"].encode.gpus_per_actor == 1

    assert main(["train", "--batch-size", "3", "--device", "cuda", "--fp16"]) == 0
    tr = record["train"].train
    assert (tr.batch_size, tr.use_gpu, tr.amp) == (3, True, "fp16")

    assert main(["retrieve", "--index", "i", "--queries", "q.tsv", "--out", "r.trec", "--batch-size", "5"]) == 0
    assert record["retrieve"][0].retrieve.batch_size == 5

    assert main(["index", "--embeddings", "e", "--out", "i", "--device", "cpu"]) == 0
    assert record["index"].use_gpu == "no"


@pytest.mark.parametrize("argv, needle", [
    (["encode", "--corpus", "c", "--out", "e", "--device", "cuda"], "no CUDA GPU is visible"),
    (["encode", "--corpus", "c", "--out", "e", "--fp16"], "--fp16 is fp16 compute, which needs a GPU"),
    (["encode", "--corpus", "c", "--out", "e", "--device", "auto", "--fp16"], "needs a GPU"),
    (["train", "--fp16"], "needs a GPU"),
    (["train", "--device", "cuda"], "no CUDA GPU is visible"),
    (["retrieve", "--index", "i", "--queries", "q.tsv", "--out", "r.trec", "--device", "cuda"], "no CUDA GPU"),
    (["sts", "--pairs", "p.tsv", "--device", "cuda"], "no CUDA GPU"),
    (["encode", "--corpus", "c", "--out", "e", "--batch-size", "0"], "--batch-size must be a positive"),
])
def test_impossible_flags_are_refused_before_any_work(record, monkeypatch, capsys, argv, needle):
    _gpu(monkeypatch, False)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and "Traceback" not in err
    assert not record  # nothing ran


def test_cuda_on_a_cluster_is_left_to_rays_resource_check(record, monkeypatch):
    _gpu(monkeypatch, False)
    assert main(["encode", "--corpus", "c", "--out", "e", "--device", "cuda", "ray.address=127.0.0.1:6379"]) == 0
    assert record["encode"].encode.gpus_per_actor == 1


# ------------------------------------------------------------------ the spellings researchers bring along

@pytest.fixture()
def calls(monkeypatch):
    """The library functions retrieve, evaluate and compare call, replaced by recorders."""
    seen = {}

    def fake_retrieve(index, queries, out, cfg, **kw):
        seen["retrieve"] = {"index": index, "queries": queries, "out": out, "top_k": cfg.retrieve.top_k}
        return {}

    def fake_evaluate(run, qrels, cfg):
        seen["evaluate"] = {"run": run, "qrels": qrels, "rel_level": cfg.rel_level}
        return {"metrics": {"nDCG@10": 0.5}, "queries": {"evaluated": 1}}

    def fake_compare(runs, qrels, test=None, cfg=None, **kw):
        seen["compare"] = {"runs": dict(runs), "qrels": qrels, "rel_level": cfg.rel_level, "per_query": cfg.per_query}
        return {}

    monkeypatch.setattr("pipeline.index.retrieve.retrieve", fake_retrieve)
    monkeypatch.setattr("pipeline.eval.metrics.evaluate_files", fake_evaluate)
    monkeypatch.setattr("pipeline.eval.compare.compare_runs", fake_compare)
    monkeypatch.setattr("pipeline.eval.compare.format_comparison", lambda result: "")
    return seen


def test_retrieve_takes_pyserinis_topics_output_and_hits(calls):
    assert main(["retrieve", "--index", "i", "--topics", "q.tsv", "--output", "r.trec", "--hits", "1000"]) == 0
    assert calls["retrieve"] == {"index": "i", "queries": "q.tsv", "out": "r.trec", "top_k": 1000}
    assert main(["retrieve", "--index", "i", "--queries", "q.tsv", "--out", "r.trec"]) == 0
    assert calls["retrieve"]["top_k"] == 100  # our default stays ours


def test_retrieve_help_names_pyserinis_spellings_and_default(capsys):
    with pytest.raises(SystemExit):
        main(["retrieve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    # argparse writes the metavar after each spelling up to Python 3.12 and once after the last from 3.13 on
    for a, b, meta in (("--queries", "--topics", "QUERIES"), ("--out", "--output", "OUT"),
                       ("--top-k", "--hits", "TOP_K")):
        assert f"{a} {meta}, {b} {meta}" in out or f"{a}, {b} {meta}" in out
    assert "default 100, where pyserini's --hits defaults to 1000" in out


def test_evaluate_takes_qrels_and_run_positionally_in_trec_evals_order(calls, tmp_path):
    assert main(["evaluate", "q.trec", "r.trec"]) == 0
    assert calls["evaluate"] == {"run": "r.trec", "qrels": "q.trec", "rel_level": 1}
    # options and trailing overrides around them, as with every verb
    assert main(["evaluate", "q.trec", "r.trec", "--per-query", "eval.rel_level=2"]) == 0
    assert calls["evaluate"] == {"run": "r.trec", "qrels": "q.trec", "rel_level": 2}
    assert main(["evaluate", "--run", "r.trec", "--qrels", "q.trec", "eval.rel_level=3"]) == 0
    assert calls["evaluate"] == {"run": "r.trec", "qrels": "q.trec", "rel_level": 3}


@pytest.mark.parametrize("argv, needle", [
    (["evaluate", "q.trec"], "takes QRELS RUN positionally (trec_eval's order), got 1 file(s)"),
    (["evaluate", "q.trec", "r.trec", "x.trec"], "got 3 file(s)"),
    (["evaluate", "q.trec", "r.trec", "--run", "r.trec"], "either positionally"),
    (["evaluate"], "evaluate needs a run: evaluate QRELS RUN"),
])
def test_evaluate_positional_mistakes_are_one_error_line(calls, capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and "Traceback" not in err and "evaluate" not in calls


def test_evaluate_names_swapped_positionals(calls, capsys, tmp_path):
    run, qrels = tmp_path / "run.trec", tmp_path / "qrels.trec"
    run.write_text("q1 Q0 d1 1 2.5 tag\n")
    qrels.write_text("q1 0 d1 1\n")
    assert main(["evaluate", str(run), str(qrels)]) == 2
    err = capsys.readouterr().err
    assert "the first looks like a run and the second like qrels" in err and f"evaluate {qrels} {run}" in err
    assert main(["evaluate", str(qrels), str(run)]) == 0


def test_compare_takes_trailing_overrides_and_keeps_set_as_an_alias(calls, capsys):
    assert main(["compare", "a.trec", "b.trec", "--qrels", "q", "eval.rel_level=2"]) == 0
    assert calls["compare"] == {"runs": {"a.trec": "a.trec", "b.trec": "b.trec"}, "qrels": "q", "rel_level": 2,
                                "per_query": False}
    assert main(["compare", "a.trec", "b.trec", "--qrels", "q", "--set", "eval.rel_level=3"]) == 0
    assert calls["compare"]["rel_level"] == 3
    argv = ["compare", "--set", "eval.per_query=true", "a.trec", "eval.rel_level=2", "b.trec", "--qrels", "q"]
    assert main(argv) == 0
    assert (calls["compare"]["rel_level"], calls["compare"]["per_query"]) == (2, True)
    assert list(calls["compare"]["runs"]) == ["a.trec", "b.trec"]
    assert main(["compare", "a.trec", "--qrels", "q", "eval.rel_levle=2"]) == 2
    assert "did you mean eval.rel_level" in capsys.readouterr().err


def test_an_existing_file_named_like_an_override_is_a_run(calls, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bm25.k1=0.9").write_text("q1 Q0 d1 1 1.0 x\n")
    assert main(["compare", "a.trec", "bm25.k1=0.9", "--qrels", "q"]) == 0
    assert list(calls["compare"]["runs"]) == ["a.trec", "bm25.k1=0.9"]


def test_trailing_overrides_anywhere_after_the_verb(record):
    assert main(["encode", "encode.batch_size=3", "--corpus", "c", "--out", "e", "encode.num_actors=2"]) == 0
    enc = record["encode"].encode
    assert (enc.batch_size, enc.num_actors) == (3, 2)


def test_a_word_that_is_no_override_is_still_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["info", "runs/x", "stray"])
    assert e.value.code == 2 and "unrecognized arguments: stray" in capsys.readouterr().err


# ------------------------------------------------------------------ tune: a dotted key under space.*

def _sweep_file(tmp_path):
    import yaml

    base = {"model": {"name_or_path": "minilm"}, "data": {"corpus": "runs/c"},
            "loss": {"name": "dar", "n_perturb": 3},
            "train": {"max_steps": 20, "eval_every": 5, "num_workers": 1, "cpus_per_worker": 0.9},
            "validation": {"dev_split": 0.1, "metric": "MRR@10"}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": base, "output": str(tmp_path / "out"),
                                    "space": {"loss.n_perturb": {"grid": [3, 5, 7, 9]}},
                                    "search": {"grace_period": 5}}))
    return path


def test_tune_space_takes_a_dotted_training_key_from_the_command_line(tmp_path, capsys):
    import yaml

    from pipeline.errors import ConfigError
    from pipeline.tune.space import load_sweep_config

    path = _sweep_file(tmp_path)
    cfg = load_sweep_config(path, ["space.loss.n_perturb={grid:[3,5]}", "space.loss.dropout_p={grid: [0.1, 0.2]}"])
    assert {p.key: p.values for p in cfg.space} == {"loss.n_perturb": (3, 5), "loss.dropout_p": (0.1, 0.2)}
    with pytest.raises(ConfigError, match=r"space.loss.n_pertub.*did you mean loss.n_perturb"):
        load_sweep_config(path, ["space.loss.n_pertub={grid: [3, 5]}"])
    assert main(["config", "show", "--config", str(path), "space.loss.n_perturb={grid: [3, 5]}"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["space"] == {"loss.n_perturb": {"grid": [3, 5]}}
