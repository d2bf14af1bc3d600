"""index/validate: validation inside training encodes as `pipeline encode` would (lengths, precision,
backend) and says which encoder ran, at what rate and why."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.config import ModelConfig
from pipeline.index import validate as validate_mod
from pipeline.index.validate import Validator
from pipeline.models import BiEncoder
from pipeline.models.precision import resolve_precision

TEXTS = [f"passage {i} about " + "dense retrieval " * (i % 13) for i in range(24)]


def _model(path, **kw) -> BiEncoder:
    return BiEncoder.load(ModelConfig(name_or_path=str(path), pooling="mean", normalize=True, **kw)).eval()


def _nudged(model: BiEncoder, seed: int = 0) -> BiEncoder:
    """The model as training leaves it: its weights no longer its folder's."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def test_validation_scores_the_texts_the_exported_model_sees(tiny_model_dir, faq):
    """Training's shorter lengths (doc 16 tokens here) are not what the export declares: validation
    encodes at the declared lengths, so its figure is the exported model's, whatever training truncated to."""
    trained = _model(tiny_model_dir, query_max_length=8, doc_max_length=16)
    exported = _model(tiny_model_dir)  # what encode/retrieve load: the declared lengths
    assert exported.cfg.doc_max_length > 16
    v = Validator(str(faq), qrels=str(faq / "qrels" / "test.trec"), metric="nDCG@10", backend="torch")
    got, want = v(trained), v(exported)
    assert got["val_nDCG@10"] == want["val_nDCG@10"] and got["val_RR@10"] == want["val_RR@10"]
    assert trained.cfg.doc_max_length == 16  # the training lengths are back after validation
    truncated = trained.embed(["word " * 200], "doc")
    with trained.inference_lengths():
        full = trained.embed(["word " * 200], "doc")
    assert not np.allclose(truncated, full)  # (the lengths do change what is scored)


def test_the_encoder_plan_follows_encode_and_says_why(tiny_model_dir, faq, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_EXPORT_CACHE", str(tmp_path / "cache"))  # no graph of this architecture kept
    model = _model(tiny_model_dir)
    want = resolve_precision("auto", "cpu")  # bf16 where the CPU computes it natively, else fp32
    v = Validator(str(faq), qrels=str(faq / "qrels" / "test.trec"))
    least = "250" if want == "bf16" else "1,000"  # OpenVINO pays off sooner in bf16 (bench/batching.py)
    backend, precision, why = v.encoder_plan(model, "cpu", 176)
    assert (backend, precision) == ("torch", want) and f"176 passages < {least}" in why
    pytest.importorskip("openvino")
    assert v.encoder_plan(model, "cpu", 5_000) == ("openvino", want, None)
    # one worker's share of several: the figure is per worker, and fp32 waits for more passages
    assert v.encoder_plan(model, "cpu", 200, workers=2)[2].startswith(f"200 passages per worker < {least}: ")
    fp32 = Validator(str(faq), precision="fp32")
    assert fp32.encoder_plan(model, "cpu", 700) == ("torch", "fp32", "700 passages < 1,000: converting the model "
                                                    "for OpenVINO costs more than it saves on so few in fp32")
    assert fp32.encoder_plan(model, "cpu", 1_000)[0] == "openvino"
    if want == "bf16":
        assert v.encoder_plan(model, "cpu", 700) == ("openvino", "bf16", None)
    assert Validator(str(faq), precision="fp32", backend="torch").encoder_plan(model, "cpu", 5_000) == \
        ("torch", "fp32", None)
    assert Validator(str(faq), backend="openvino").encoder_plan(model, "cpu", 10)[0] == "openvino"
    gpu = v.encoder_plan(model, "cuda", 5_000) if torch.cuda.is_available() else ("torch", None, "a GPU")
    assert gpu[0] == "torch" and "GPU" in gpu[2]
    # a run of this architecture kept its graph: nothing to convert, so OpenVINO pays off on fewer passages
    from pipeline.models import backends, openvino_graph

    monkeypatch.setattr(backends, "graph_cached", lambda *a, **k: True)
    if want == "bf16":
        assert v.encoder_plan(model, "cpu", 176) == ("openvino", "bf16", None)
        assert v.encoder_plan(model, "cpu", 60, workers=2)[2] == (
            "60 passages per worker < 64: writing the weights into the cached OpenVINO graph costs more than it "
            "saves on so few")
    assert fp32.encoder_plan(model, "cpu", 700)[0] == "openvino"
    assert fp32.encoder_plan(model, "cpu", 200)[2].startswith("200 passages < 250: writing the weights into")


@pytest.mark.slow
def test_openvino_validation_scores_the_trained_weights_and_keeps_one_graph_per_architecture(tiny_model_dir, faq,
                                                                                            tmp_path, monkeypatch):
    """The model being trained is encoded with its weights as they are (not its folder's, which encode's export
    cache is keyed by): converted once, its weights written in at every validation. The export cache gets one
    graph for the architecture (no export per validation), and the next run of that architecture (another
    Validator, other weights) converts nothing; every figure is torch's."""
    pytest.importorskip("openvino")
    from pipeline.models.backends import tower_runner

    cache = tmp_path / "cache"
    monkeypatch.setenv("PIPELINE_EXPORT_CACHE", str(cache))
    model = _nudged(_model(tiny_model_dir))
    ref = model.embed(TEXTS, "doc", precision="fp32")
    used, runner, precision, note = tower_runner(model, "doc", "openvino", "fp32", 1, keep=False, option="validation")
    assert (used, precision, note) == ("openvino", "fp32", None) and runner.check["passed"]
    np.testing.assert_allclose(model.embed(TEXTS, "doc", precision="fp32", runner=runner), ref, atol=1e-5)
    assert not cache.exists() or not any(cache.rglob("*.xml"))  # a one-off conversion keeps nothing
    monkeypatch.setattr(validate_mod, "OPENVINO_MIN_PASSAGES", 100)  # the FAQ's 176 passages go to OpenVINO
    monkeypatch.setattr(validate_mod, "OPENVINO_MIN_PASSAGES_FP32", 100)
    monkeypatch.setattr(validate_mod, "OPENVINO_MIN_PASSAGES_FP32_CACHED", 100)
    mk = lambda **kw: Validator(str(faq), qrels=str(faq / "qrels" / "test.trec"), metric="nDCG@10",  # noqa: E731
                                precision="fp32", **kw)
    v, torch_v = mk(), mk(backend="torch")
    got = v(model)
    assert got["validation_encoder"] == ("openvino fp32 (converted for OpenVINO at this validation, this step's "
                                         "weights written in)")
    assert got["validation_rate"] > 0
    torch_run = torch_v(model)
    assert torch_run["validation_encoder"].startswith("torch fp32")
    assert abs(got["val_nDCG@10"] - torch_run["val_nDCG@10"]) <= 0.002
    # later validations: the first one's conversion with the weights training has moved since written in
    for seed in (1, 2):
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
        got, torch_run = v(model), torch_v(model)
        assert got["validation_encoder"] == "openvino fp32 (converted at the first validation, this step's weights written in)"
        assert abs(got["val_nDCG@10"] - torch_run["val_nDCG@10"]) <= 0.002
        assert abs(got["val_RR@10"] - torch_run["val_RR@10"]) <= 0.002
    import pickle

    assert pickle.loads(pickle.dumps(v))._refreshable is None  # a Validator sent to a worker carries no conversion
    graphs = sorted(p.parent.name for p in cache.rglob("tower.xml"))
    assert len(graphs) == 1 and not (cache / "openvino").exists()  # one graph, no per-weights export
    # the next run of this architecture (other weights): read from the cache, its weights written in
    other = _nudged(_model(tiny_model_dir), seed=5)
    again = mk()(other)
    assert again["validation_encoder"] == ("openvino fp32 (the converted graph of this architecture read from the "
                                           "export cache, this step's weights written in)"), again["validation_encoder"]
    assert abs(again["val_nDCG@10"] - torch_v(other)["val_nDCG@10"]) <= 0.002
    assert sorted(p.parent.name for p in cache.rglob("tower.xml")) == graphs


@pytest.mark.slow
def test_a_freshly_initialised_model_is_refreshed_and_a_folded_weight_is_converted_at_every_validation(
        tiny_model_dir, faq, tmp_path, monkeypatch):
    """A freshly initialised model (layer norms exactly 1 and 0, which the converter drops for those values)
    validates through its graph and is refreshed after training moves those weights (the graph is built for
    random weights). A tower whose output uses a constant computed from a weight cannot be refreshed: every
    validation converts the model as it is, says why, and scores the weights as they are."""
    pytest.importorskip("openvino")
    from pipeline.models import backends, openvino_graph

    monkeypatch.setenv("PIPELINE_EXPORT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(validate_mod, "OPENVINO_MIN_PASSAGES", 100)
    monkeypatch.setattr(validate_mod, "OPENVINO_MIN_PASSAGES_FP32", 100)
    monkeypatch.setattr(validate_mod, "OPENVINO_MIN_PASSAGES_FP32_CACHED", 100)
    qrels = str(faq / "qrels" / "test.trec")
    torch_v = Validator(str(faq), qrels=qrels, metric="nDCG@10", precision="fp32", backend="torch")
    fresh = _model(tiny_model_dir)
    v = Validator(str(faq), qrels=qrels, metric="nDCG@10", precision="fp32")
    v(fresh)
    _nudged(fresh)
    got = v(fresh)
    assert got["validation_encoder"] == "openvino fp32 (converted at the first validation, this step's weights written in)"
    assert abs(got["val_nDCG@10"] - torch_v(fresh)["val_nDCG@10"]) <= 0.002
    model = _nudged(_model(tiny_model_dir))
    real_encode = model.encode_docs
    # the converter folds the sum of one weight matrix into one number
    monkeypatch.setattr(model, "encode_docs", lambda b: real_encode(b) + 0.01 * next(model.parameters()).sum())
    monkeypatch.setattr(openvino_graph, "graph_key", lambda *a: "a-tower-of-its-own")  # not the graph kept above
    conversions = []
    real_convert = openvino_graph.convert_tower
    monkeypatch.setattr(openvino_graph, "convert_tower", lambda *a, **k: conversions.append(1) or real_convert(*a, **k))
    v = Validator(str(faq), qrels=qrels, metric="nDCG@10", precision="fp32")
    for seed in (1, 2):
        got = v(model)
        assert got["validation_encoder"].startswith("openvino fp32 (converted at every validation: with this model's "
                                                    "weights written in, its graph gave a minimum cosine of"), got
        assert "computed from the weights" in got["validation_encoder"]
        assert abs(got["val_nDCG@10"] - torch_v(model)["val_nDCG@10"]) <= 0.002
        _nudged(model, seed=seed)
    assert len(conversions) == 3  # the first: the graph for random weights, then the model as it is; one per later


@pytest.mark.slow
def test_every_validation_option_value_encodes_what_it_says(tiny_model_dir, faq):
    """validation.precision x validation.backend, every value the config allows (read from the dataclass, so
    a new value fails here until it is covered): each validation runs and names the encoder it used, its
    figure within 0.002 of torch fp32 for the fp32 paths (bf16/fp16 round; the tiny model's scores are
    near-tied, so they are only held to a valid figure), or it is refused with one line naming the key."""
    import typing

    from pipeline.errors import PipelineError
    from pipeline.train.config import ValidationConfig

    hints = typing.get_type_hints(ValidationConfig)
    precisions, backends = typing.get_args(hints["precision"]), typing.get_args(hints["backend"])
    assert set(precisions) == {"auto", "fp32", "bf16", "fp16"} and set(backends) == {"auto", "torch", "openvino"}
    model = _nudged(_model(tiny_model_dir))
    qrels = str(faq / "qrels" / "test.trec")
    ref = Validator(str(faq), qrels=qrels, metric="nDCG@10", precision="fp32", backend="torch")(model)
    seen = {}
    for precision in precisions:
        for backend in backends:
            v = Validator(str(faq), qrels=qrels, metric="nDCG@10", precision=precision, backend=backend)
            want_backend, want_precision, _ = v.encoder_plan(model, "cpu", 176)
            try:
                got = v(model)
            except PipelineError as e:  # refused: one line naming the option
                assert backend == "openvino" and "validation.backend" in str(e) and "\n" not in str(e), e
                seen[precision, backend] = "refused"
                continue
            used = got["validation_encoder"]
            ran_backend, ran_precision = used.split()[:2]
            if want_backend == "torch":
                assert (ran_backend, ran_precision) == ("torch", want_precision), (precision, backend, used)
            else:  # OpenVINO says what its plugin computes in (an f16 hint runs bf16 or f32 on a CPU), or
                assert ran_backend == "openvino" or used.startswith(f"torch {want_precision} ("), used  # why not
                assert ran_precision in ("fp32", "bf16", "fp16"), used
            assert 0.0 <= got["val_nDCG@10"] <= 1.0 and got["validation_rate"] > 0
            if ran_precision == "fp32":
                assert abs(got["val_nDCG@10"] - ref["val_nDCG@10"]) <= 0.002, (precision, backend, got, ref)
            seen[precision, backend] = used
    assert len(seen) == len(precisions) * len(backends)
    print(seen)


def _fake_group(world: int):
    """all_gather for `world` ranks run as threads of this process: each gets every rank's object in rank order."""
    import threading

    barrier, box = threading.Barrier(world, timeout=120), [None] * world

    def for_rank(rank: int):
        def all_gather(obj):
            box[rank] = obj
            barrier.wait()
            out = list(box)
            barrier.wait()  # nobody overwrites a slot before every rank has read this round
            return out
        return all_gather
    return for_rank


def _run_ranks(validators, models, world: int) -> list:
    """Each rank's return value (or the exception it raised), the ranks run side by side as threads."""
    import threading

    group, results = _fake_group(world), [None] * world

    def run(rank):
        try:
            results[rank] = validators[rank](models[rank], part=(rank, world, group(rank)))
        except Exception as e:  # noqa: BLE001 - the test inspects it
            results[rank] = e
    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return results


def test_shares_cover_every_row_once_in_order():
    """Queries split by count (sizes within one), passages by their work: every row once, in rank order,
    and no rank's work above an equal part by more than one row's."""
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 5, 176, 1001):
        for world in (1, 2, 3, 4, 7):
            bounds = validate_mod._balanced(np.ones(n), world)
            assert [i for lo, hi in bounds for i in range(lo, hi)] == list(range(n))
            assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1
            work = rng.integers(64, 1100, n).astype(float)
            bounds = validate_mod._balanced(work, world)
            assert len(bounds) == world
            assert [i for lo, hi in bounds for i in range(lo, hi)] == list(range(n))
            if n:
                assert max(work[lo:hi].sum() for lo, hi in bounds) <= work.sum() / world + work.max()
    # a long first passage: the rest goes to the other rank
    assert validate_mod._balanced(np.array([10.0] + [1.0] * 10), 2) == [(0, 1), (1, 11)]


def test_a_passages_work_is_the_tokens_the_model_encodes_of_it(tiny_model_dir):
    """Shares are cut by tokens, title and truncation included: characters miscount them (the FAQ's second
    half has 9 % more tokens than its first for the same characters); read in chunks, the same figures."""
    import pyarrow as pa

    model = _model(tiny_model_dir)
    titles, bodies = ["", "a title", "", ""], ["short", "word " * 10, "word " * 3000, "x" * 60]
    corpus = pa.table({"pid": ["0", "1", "2", "3"], "title": titles, "text": bodies})
    with model.inference_lengths():
        tok, _, max_len = model.token_spec("doc")
        want = [len(tok(f"{t} {b}".strip(), truncation=True, max_length=max_len)["input_ids"])
                for t, b in zip(titles, bodies)]
        for chunk in (1, 3, 8192):
            work = validate_mod.passage_work(model, corpus, "{title} {text}", chunk=chunk)
            assert work.tolist() == [w + 16 for w in want], chunk
        assert validate_mod.passage_work(model, corpus.slice(0, 0), "{title} {text}").shape == (0,)
    assert want[2] == max_len and want[1] > want[0]


def test_every_rank_encodes_its_share_and_rank_0_scores_all_of_them(tiny_model_dir, faq, tmp_path, monkeypatch):
    """Three workers (uneven shares of 176 passages and 11 queries): rank 0's figures are exactly the
    single-worker ones, the other ranks return nothing, and the line says how many workers encoded."""
    import copy

    monkeypatch.setenv("PIPELINE_EXPORT_CACHE", str(tmp_path / "cache"))  # no graph kept: the threshold to convert

    model = _nudged(_model(tiny_model_dir))
    mk = lambda: Validator(str(faq), qrels=str(faq / "qrels" / "test.trec"), metric="nDCG@10",  # noqa: E731
                           precision="fp32")  # backend auto: torch for so few passages, and why
    alone = mk()(model)
    world = 3
    counted, real = [], validate_mod.passage_work
    monkeypatch.setattr(validate_mod, "passage_work", lambda *a, **k: counted.append(1) or real(*a, **k))
    validators, models = [mk() for _ in range(world)], [copy.deepcopy(model) for _ in range(world)]
    for _ in range(2):
        got = _run_ranks(validators, models, world)
    assert len(counted) == world  # the shares' cut: once per rank and run, not at every validation
    assert not any(isinstance(r, Exception) for r in got), got
    assert got[1] == {} and got[2] == {}
    for k in ("val_nDCG@10", "val_RR@10", "val_R@100", "val_metric"):
        assert got[0][k] == pytest.approx(alone[k], abs=1e-12), k
    from pipeline.models.backends import openvino_available

    why = "59 passages per worker < 1,000" if openvino_available() else "OpenVINO is not installed"
    assert got[0]["validation_encoder"].startswith(f"torch fp32 on 3 workers ({why}"), got[0]
    assert got[0]["validation_rate"] > 0


def test_a_rank_that_fails_makes_every_rank_raise_naming_it(tiny_model_dir, faq):
    """No rank waits for a share that never comes: the failure reaches every rank at the next exchange."""
    import copy

    model = _model(tiny_model_dir)
    broken = copy.deepcopy(model)

    def fail(*a, **k):
        raise ValueError("out of memory on this worker")
    broken.embed = fail
    mk = lambda: Validator(str(faq), qrels=str(faq / "qrels" / "test.trec"), backend="torch")  # noqa: E731
    got = _run_ranks([mk(), mk()], [model, broken], 2)
    assert isinstance(got[1], ValueError) and "out of memory" in str(got[1])
    assert isinstance(got[0], RuntimeError), got[0]
    assert "validation failed on rank 1: ValueError: out of memory on this worker (this is rank 0)" in str(got[0])


@pytest.mark.slow
def test_every_rank_converts_its_own_openvino_tower_and_the_figures_hold(tiny_model_dir, faq):
    """validation.backend=openvino on 2 workers: each rank converts the model it holds (then refreshes it),
    and rank 0's figures are the single-worker OpenVINO figures, at both validations."""
    pytest.importorskip("openvino")
    import copy

    model = _nudged(_model(tiny_model_dir))
    mk = lambda: Validator(str(faq), qrels=str(faq / "qrels" / "test.trec"), metric="nDCG@10",  # noqa: E731
                           precision="fp32", backend="openvino")
    alone = mk()
    validators, models = [mk(), mk()], [copy.deepcopy(model), copy.deepcopy(model)]
    for n in range(2):
        want = alone(model)
        got = _run_ranks(validators, models, 2)
        assert not any(isinstance(r, Exception) for r in got), got
        assert got[1] == {}
        assert got[0]["validation_encoder"].startswith("openvino fp32 on 2 workers ("), got[0]["validation_encoder"]
        for k in ("val_nDCG@10", "val_RR@10", "val_R@100"):
            assert got[0][k] == pytest.approx(want[k], abs=2e-3), (n, k)
        for m in (model, *models):  # the next step's weights, the same on every rank
            _nudged(m)
    assert all(v._refreshable is not None and v._refreshable.uses == 2 for v in validators)
