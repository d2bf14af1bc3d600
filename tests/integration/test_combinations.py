"""Every user-facing value of the options that change a data path, composed with the next steps, as a
user runs them through the CLI (in this process, on the session's Ray, the tiny BERT, the bundled FAQ):

    encode.precision x encode.backend x encode.runner -> index -> retrieve -> Searcher -> evaluate

Each combination asserts its result, not only its exit code: what ran (precision, backend, runner) as
the summary and embeddings.json say it, the vectors against torch's fp32 ones, the index's record of
how queries are encoded, retrieve's run against the Searcher's hits, and evaluate's figure against the
run. The table reads the allowed values from the config dataclasses: a value added there and not
covered here fails `test_the_table_covers_every_value`.

The rows: the whole precision x backend product on the local runner, and on the Ray runner and
`auto` the rows that reach every precision and every backend (the runner only decides who runs the
encoder; the actor runs the same ShardEncoder, which resolves precision and backend itself), within
make test's budget: a Ray row costs an actor pool's start. Training methods, dev splits, resume and
ANCE's two refresher layouts with injected failures have their own end-to-end tests, named by
`test_every_training_method_is_exercised`.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import EncodeConfig
from pipeline.models.precision import cpu_has_bf16

pytestmark = pytest.mark.integration

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
BACKENDS = ("auto", "torch", "openvino")
RUNNERS = ("auto", "ray", "local")


def _allowed(name: str) -> tuple:
    return typing.get_args(typing.get_type_hints(EncodeConfig)[name])


ROWS = ([(p, b, "local") for p in PRECISIONS for b in BACKENDS]
        + [("auto", "auto", "ray"), ("fp32", "torch", "ray"), ("fp32", "openvino", "ray"), ("bf16", "openvino", "ray"),
           ("fp16", "torch", "ray"), ("int8", "auto", "ray"), ("int8", "torch", "ray")]
        + [("auto", "auto", "auto"), ("int8", "openvino", "auto")])


def test_the_table_covers_every_value():
    """A new encode option value needs its rows below (and its walk through the spine): every value of
    each option is in the table, the local runner walks the whole product, and every runner meets
    every precision and every backend."""
    assert set(_allowed("precision")) == set(PRECISIONS)
    assert set(_allowed("backend")) == set(BACKENDS)
    assert set(_allowed("runner")) == set(RUNNERS)
    assert {(p, b) for p, b, r in ROWS if r == "local"} == {(p, b) for p in PRECISIONS for b in BACKENDS}
    for runner in RUNNERS:
        assert {p for p, _, r in ROWS if r == runner} == set(PRECISIONS) or runner == "auto", runner
        assert {b for _, b, r in ROWS if r == runner} >= set(BACKENDS) - {"torch"} or runner == "auto", runner


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def expected(precision: str, backend: str) -> tuple[str, str] | str:
    """What a CPU-only encoder does with this pair: (backend used, precision computed in), or the
    refusal's message. OpenVINO computes bf16/fp16 only where the CPU has them natively (it says so).
    Written for both CPU kinds CI may run on: AVX2-only (everything fp32) and AVX512-BF16 (bf16)."""
    if precision == "int8":
        return "int8 runs in OpenVINO on a CPU" if backend == "torch" else ("openvino", "int8")
    native_bf16, native_fp16 = cpu_has_bf16(), bool(_cpu_flags() & {"avx512_fp16", "amx_fp16"})
    if backend == "torch":
        return "torch", {"auto": "bf16" if native_bf16 else "fp32"}.get(precision, precision)
    ov = {"auto": "bf16" if native_bf16 else "fp32", "fp32": "fp32", "bf16": "bf16" if native_bf16 else "fp32",
          # an f16 hint without native fp16 runs bf16 where the CPU has that (OpenVINO's CPU plugin), else f32
          "fp16": "fp16" if native_fp16 else "bf16" if native_bf16 else "fp32"}[precision]
    return "openvino", ov


def _export_cached(model_args: list[str]) -> bool:
    """Whether this session's export cache holds the model's export as these settings make it."""
    from pipeline.config import load_config
    from pipeline.index.encode import _resolved_model_cfg
    from pipeline.models.backends import export_cached

    return export_cached(_resolved_model_cfg(load_config(None, [f"model.name_or_path={model_args[1]}", *model_args[2:]]).model)[3], "doc")


@pytest.fixture(scope="module")
def spine(tmp_path_factory, tiny_model_dir, faq, ray_session):
    """The reference (torch fp32) vectors, and one spine walk per distinct result (shared by runners)."""
    from pipeline.cli import main

    root = tmp_path_factory.mktemp("combos")
    model = ["--model", str(tiny_model_dir), "model.pooling=mean", "model.normalize=true"]
    ref = root / "ref"
    assert main(["encode", "--corpus", str(faq), "--out", str(ref), *model, "encode.precision=fp32",
                 "encode.backend=torch", "encode.runner=local"]) == 0
    return {"root": root, "model": model, "ref": _vectors(ref), "walked": {}}


def _vectors(emb: Path) -> dict[str, np.ndarray]:
    from pipeline.index.shards import iter_shards

    return {p: v for pids, vecs in iter_shards(emb) for p, v in zip(pids, np.asarray(vecs, dtype=np.float32))}


def _cos(a: dict, b: dict) -> np.ndarray:
    keys = sorted(a)
    x, y = np.stack([a[k] for k in keys]), np.stack([b[k] for k in keys])
    return (x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)


def _walk(emb: Path, out: Path, faq: Path, capsys) -> dict:
    """index -> retrieve -> Searcher -> evaluate through the CLI, each result checked."""
    from pipeline.cli import main
    from pipeline.eval.metrics import evaluate_run
    from pipeline.config import EvalConfig
    from pipeline.data.readers import load_qrels, load_queries
    from pipeline.eval.runs import read_run
    from pipeline.info import info
    from pipeline.search import Searcher

    assert main(["index", "--embeddings", str(emb), "--out", str(out / "index")]) == 0
    meta = json.loads((out / "index" / "index.json").read_text())
    assert meta["query_precision"] == "fp32" and meta["model"]["digest"]
    assert "queries encoded in    fp32 by torch" in info(out / "index")
    assert main(["retrieve", "--index", str(out / "index"), "--queries", str(faq / "queries.tsv"),
                 "--out", str(out / "run.trec"), "--top-k", "10"]) == 0
    run = read_run(out / "run.trec")
    queries = load_queries(faq / "queries.tsv")
    assert set(run) == set(queries) and all(len(h) == 10 for h in run.values())
    hits = Searcher(out / "index", device="cpu").batch_search(list(queries.values()), k=10, qids=list(queries))
    for qid, ranked in hits.items():  # the Python API ranks as the CLI does, to the run's 6 decimals
        got = {d: s for d, s in ranked}
        assert set(got) == set(run[qid]) or max(abs(got.get(d, -9) - s) for d, s in run[qid].items()) < 2e-6, qid
        for d, s in run[qid].items():
            assert d not in got or abs(got[d] - s) < 2e-6
    capsys.readouterr()
    assert main(["evaluate", "--run", str(out / "run.trec"), "--qrels", str(faq / "qrels" / "test.trec"),
                 "--json", str(out / "metrics.json"), "--measures", "nDCG@10 RR@10"]) == 0
    reported = json.loads((out / "metrics.json").read_text())
    figures = reported.get("metrics", reported)
    direct = evaluate_run(run, load_qrels(faq / "qrels" / "test.trec"), EvalConfig(),
                          measures=["nDCG@10", "RR@10"])["metrics"]
    assert figures["nDCG@10"] == pytest.approx(direct["nDCG@10"], abs=1e-9)
    return {"run": run, "ndcg": direct["nDCG@10"]}


@pytest.mark.parametrize("precision, backend, runner", ROWS, ids=lambda v: str(v))
def test_encode_option_walks_the_spine(spine, faq, tmp_path, capsys, precision, backend, runner):
    from pipeline.cli import main
    from pipeline.config import load_config
    from pipeline.index.encode import resolve_runner

    want = expected(precision, backend)
    if backend == "auto" and not isinstance(want, str) and want[1] != "int8" and not _export_cached(spine["model"]):
        # the FAQ's 176 passages are too few to pay for making the export (index/encode.backend_by_cost): torch,
        # and it says why; once an explicit openvino row has made the export, auto runs OpenVINO too
        want = ("torch", want[1])
    emb = tmp_path / "emb"
    argv = ["encode", "--corpus", str(faq), "--out", str(emb), *spine["model"], f"encode.precision={precision}",
            f"encode.backend={backend}", f"encode.runner={runner}"]
    capsys.readouterr()
    rc = main(argv)
    out = capsys.readouterr()
    if isinstance(want, str):  # refused up front: one line, nothing written
        assert rc == 2 and want in out.err and len(out.err.strip().splitlines()) == 1, out.err
        assert not emb.exists()
        return
    assert rc == 0, out.err
    used_backend, used_precision = want
    meta = json.loads((emb / "embeddings.json").read_text())
    assert meta["complete"] and meta["backend_resolved"] == used_backend, meta
    assert meta["precision_resolved"] == used_precision, meta
    ran = resolve_runner(load_config(None, [f"encode.runner={runner}"]).encode, load_config(None, []).ray)
    assert (" in this process, no Ray (encode.runner=local)" in out.out) == (ran == "local"), out.out
    assert f"computed in {used_precision} by {used_backend}" in out.out
    if backend == "auto" and used_backend == "torch":
        assert "[encode] note: torch used: 176 passages to encode in" in out.out, out.out
    if used_backend == "openvino":
        assert meta["backend_checks"] and all(c["passed"] for c in meta["backend_checks"])
    vectors = _vectors(emb)
    cos = _cos(vectors, spine["ref"])
    floor = {"fp32": 0.99999, "bf16": 0.99, "fp16": 0.99, "int8": 0.95}[used_precision]
    assert cos.min() >= floor, (used_precision, float(cos.min()))
    # the runner changes who encodes, never the vectors: one spine walk per (backend, precision)
    key = (used_backend, used_precision)
    walked = spine["walked"]
    if key in walked:
        np.testing.assert_allclose(np.stack([vectors[k] for k in sorted(vectors)]),
                                   np.stack([walked[key]["vectors"][k] for k in sorted(vectors)]), atol=1e-5)
        return
    result = _walk(emb, tmp_path, faq, capsys)
    walked[key] = {"vectors": vectors, **result}
    if used_precision == "fp32":  # the same vectors (to 1e-5): the same ranking and figure as torch fp32's
        ref = walked.get(("torch", "fp32"))
        if ref is not None:
            assert result["ndcg"] == pytest.approx(ref["ndcg"], abs=1e-4)


TRAINING = {  # method -> the end-to-end tests that train it through the trainer
    "dpr": [("test_train.py", "test_training_reduces_loss_and_saves_loadable_model"),
            ("test_train.py", "test_kill_right_after_a_checkpoint_resumes_from_it_and_trains_no_batch_twice")],
    "dar": [("test_train.py", "test_kill_and_resume_matches_uninterrupted")],
    "ance": [("test_ance_refresher.py", "test_refresher_runs_beside_training_and_survives_a_kill"),
             ("test_ance_refresher.py", "test_a_refresher_that_always_fails_ends_the_run_with_its_error"),
             ("test_ance_refresher.py", "test_with_continue_every_report_line_says_the_negatives_are_stale"),
             ("test_ance_refresher.py", "test_an_external_refresher_killed_mid_run_ends_the_run_with_one_line")],
    "ance_dar": [("test_ance_refresher.py", "test_ance_dar_with_a_dev_split_killed_and_resumed_through_the_cli")],
    "rcl": [("test_rcl.py", "test_rcl_all_stages_then_reuse")],
    "arr_cl": [("test_arr.py", "test_cl_mll_then_arr_distillation")],
    "arr_mll": [("test_arr.py", "test_cl_mll_then_arr_distillation")],
    "arr": [("test_arr.py", "test_cl_mll_then_arr_distillation")],
    "margin_mse": [("../unit/test_distill.py", "test_a_tiny_distillation_run_trains_on_the_teachers_scores")],
    "distill_kl": [("../unit/test_distill.py", "test_a_tiny_distillation_run_trains_on_the_teachers_scores")],
}


def test_every_training_method_is_exercised():
    """Each registered training method has an end-to-end test through the trainer (dev splits, a kill and
    a resume, ANCE's refresher beside training and as its own job, each with a failure injected): a new
    method needs its row here, and the row must name a test that exists."""
    import ast

    from pipeline.train.methods import method_names

    missing = set(method_names()) - set(TRAINING)
    assert not missing, f"training methods without an end-to-end test row: {sorted(missing)}"
    here = Path(__file__).parent
    for method, tests in TRAINING.items():
        for test_file, name in tests:
            tree = ast.parse((here / test_file).read_text())
            fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
            assert fn is not None, f"{method}: {test_file}::{name} does not exist"


# every value of the keys #61 and #62 added, and the tests that take it through the steps after it
VALUES = {
    ("train", "data.source"): {
        "qrels": [("test_train.py", "test_training_reduces_loss_and_saves_loadable_model")],
        "dpr-json": [("../unit/test_training_data.py", "test_build_examples_dpr_json_reuse_and_rebuild")],
        "tevatron": [("../unit/test_training_files.py",
                      "test_a_tiny_run_from_each_training_file_trains_and_exports_a_model_sentence_transformers_opens")],
        "msmarco-triples": [("../unit/test_training_files.py",
                             "test_a_tiny_run_from_each_training_file_trains_and_exports_a_model_sentence_transformers_opens")],
        "msmarco-id-triples": [("../unit/test_training_files.py",
                                "test_msmarco_id_triples_read_through_the_corpus_and_queries_and_train")],
        "columns": [("../unit/test_training_files.py",
                     "test_a_tiny_run_from_each_training_file_trains_and_exports_a_model_sentence_transformers_opens")]},
    ("train", "data.teacher_format"): {
        "trec": [("../unit/test_distill.py", "test_a_tiny_distillation_run_trains_on_the_teachers_scores")],
        "hofstaetter": [("../unit/test_distill.py", "test_margin_mse_on_msmarco_id_triples_with_hofstaetters_scores")]},
    ("pipeline", "retrieve.runner"): {
        "local": [("test_sharded_retrieve.py", "test_a_run_over_four_parts_is_the_one_part_run_line_for_line")],
        "ray": [("test_sharded_search_cluster.py",
                 "test_search_actors_on_two_nodes_answer_as_one_part_and_survive_a_dead_actor")]},
    ("pipeline", "index.build_runner"): {
        "auto": [("test_sharded_retrieve.py", "test_a_run_over_four_parts_is_the_one_part_run_line_for_line")],
        "local": [("../unit/test_sharded_index.py",
                   "test_a_killed_build_keeps_its_finished_parts_and_a_rerun_builds_only_the_missing_ones")],
        "ray": [("test_sharded_search_cluster.py",
                 "test_search_actors_on_two_nodes_answer_as_one_part_and_survive_a_dead_actor")]},
}


def test_every_value_of_the_new_keys_is_taken_through_the_steps_after_it():
    """A value of data.source, data.teacher_format, retrieve.runner or index.build_runner without a test that runs
    it end to end (trains and exports, or builds, searches and writes a run) fails here; a new value needs its row."""
    import ast
    import dataclasses

    from pipeline.config import PipelineConfig
    from pipeline.train.config import TrainJobConfig

    here = Path(__file__).parent
    for (kind, key), rows in VALUES.items():
        section, name = key.split(".")
        root = TrainJobConfig if kind == "train" else PipelineConfig
        cls = typing.get_type_hints(root)[section]
        assert dataclasses.is_dataclass(cls), key
        assert set(typing.get_args(typing.get_type_hints(cls)[name])) == set(rows), key
        for value, tests in rows.items():
            for test_file, test_name in tests:
                tree = ast.parse((here / test_file).read_text())
                assert any(isinstance(n, ast.FunctionDef) and n.name == test_name for n in tree.body), \
                    f"{key}={value}: {test_file}::{test_name} does not exist"


AMPS = ("auto", "no", "bf16", "fp16")


def test_every_train_amp_value_trains_in_what_it_says_or_is_refused(tiny_model_dir, faq, tmp_path, capsys):
    """`train.amp` on this machine's CPU, through `pipeline train`: each value trains in the precision it
    resolves to (the summary line, summary.json and the checkpoint say which), or is refused before anything
    is written, naming why. Values that resolve alike share one run. The runs train in this process
    (train.runner=local: the loop Ray Train's workers run, which resolves and applies train.amp; the device
    check before it is the same for both runners)."""
    from pipeline.cli import main
    from pipeline.errors import PipelineError
    from pipeline.train.config import TrainConfig
    from pipeline.train.loop import resolve_amp

    assert set(typing.get_args(typing.get_type_hints(TrainConfig)["amp"])) == set(AMPS)
    ran: dict[str, dict] = {}
    for amp in AMPS:
        try:
            want = resolve_amp(amp, "cpu")
        except PipelineError as e:
            want = str(e)
        store = tmp_path / amp
        argv = ["train", "--config", "jobs/configs/dpr.yaml", f"model.name_or_path={tiny_model_dir}",
                "model.pooling=mean", "model.normalize=true", f"data.corpus={faq}", "validation.dev_split=0",
                f"train.storage_path={store}", "train.name=a", "train.max_steps=2", "train.num_workers=1",
                "train.cpus_per_worker=1", "train.runner=local", f"train.amp={amp}"]
        if want not in ("fp32", "bf16", "fp16"):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err.strip() == f"error: {want}" and not store.exists(), err
            continue
        if want in ran:
            continue
        capsys.readouterr()
        assert main(argv) == 0
        out = capsys.readouterr().out
        summary = json.loads((store / "a" / "summary.json").read_text())
        state = json.loads((store / "a" / "step-00000002" / "state.json").read_text())
        assert summary["precision"] == state["precision"] == want and f"trained in {want}," in out, out
        ran[want] = summary
    assert ran


ATTENTIONS = ("auto", "sdpa", "eager", "threshold-dropout")


def test_every_train_attention_value_trains_with_what_it_says_and_its_model_encodes(tiny_model_dir, faq, tmp_path,
                                                                                    capsys):
    """`train.attention` through `pipeline train` (local runner) and on to `pipeline encode`: each value trains
    with the attention it resolves to (summary.json and the checkpoint say which), and the exported model names
    none, so encode runs it with transformers' default attention like any model."""
    from pipeline.cli import main
    from pipeline.models.attention import THRESHOLD_DROPOUT
    from pipeline.train.config import TrainConfig

    assert set(typing.get_args(typing.get_type_hints(TrainConfig)["attention"])) == set(ATTENTIONS)
    for attention in ATTENTIONS:
        store = tmp_path / attention
        argv = ["train", "--config", "jobs/configs/dpr.yaml", f"model.name_or_path={tiny_model_dir}",
                "model.pooling=mean", f"data.corpus={faq}", "validation.dev_split=0", f"train.storage_path={store}",
                "train.name=a", "train.max_steps=2", "train.num_workers=1", "train.runner=local",
                f"train.attention={attention}"]
        assert main(argv) == 0
        summary = json.loads((store / "a" / "summary.json").read_text())
        state = json.loads((store / "a" / "step-00000002" / "state.json").read_text())
        want = THRESHOLD_DROPOUT if attention == "auto" else attention  # CPU workers
        assert summary["attention"] == state["attention"] == state["identity"]["attention"] == want
        saved = json.loads((store / "a" / "model" / "config.json").read_text())
        assert not [k for k in saved if "attn" in k], saved  # transformers picks its default on load
    capsys.readouterr()
    out = tmp_path / "emb"
    assert main(["encode", "--corpus", str(faq), "--out", str(out), "--model", str(tmp_path / "auto" / "a" / "model"),
                 "encode.runner=local"]) == 0
    assert json.loads((out / "embeddings.json").read_text())["complete"] is True
