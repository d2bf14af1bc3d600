"""The trainer platform: method registry and per-method config blocks, faithful defaults,
the DAR mix term by hand (released grouping), DAR and the loop's gathered layout through a
2-process gloo group, window reduction, checkpoint choice, versioned negatives, samplers."""

from __future__ import annotations

import math
import os
import random

import pytest
from subprocs import free_port
import torch

from pipeline.errors import ConfigError, PipelineError
from pipeline.losses import DARConfig, LossConfig, resolve_similarity
from pipeline.losses.base import scores
from pipeline.losses.dar import dar_loss, mix_loss
from pipeline.train.config import OptimConfig, load_train_config
from pipeline.train.methods import StepContext, check_frozen, freeze, get_method, method_names


# --------------------------------------------------------------------------- registry and config


def test_registry_has_dpr_and_dar_and_names_the_known_ones():
    assert {"dpr", "dar"} <= set(method_names())
    assert get_method("dar").config_cls is DARConfig and get_method("dpr").config_cls is LossConfig
    with pytest.raises(ConfigError, match="registered: .*dar.*dpr"):
        get_method("nope")


def test_each_method_parses_its_own_loss_block():
    job = load_train_config(None, ["loss.name=dar", "loss.n_perturb=3"])
    assert isinstance(job.loss, DARConfig) and job.loss.n_perturb == 3
    with pytest.raises(ConfigError, match="loss.n_perturb"):
        load_train_config(None, ["loss.name=dpr", "loss.n_perturb=3"])  # a DAR key under DPR is refused
    with pytest.raises(ConfigError, match="not a registered method"):
        load_train_config(None, ["loss.name=dra"])
    with pytest.raises(ConfigError, match="train.batch_size"):
        load_train_config(None, ["train.batch_size=0"])


def test_code_defaults_equal_methods_md():
    d = DARConfig()
    assert (d.n_perturb, d.dropout_p, d.mix_weight, d.mix_scale) == (7, 0.1, 0.1, 10.0)
    assert d.mix_grouping == "drop_positive" and d.mix_hard_negatives and not d.mix_detach_negatives
    o = OptimConfig()
    assert o.lr == 2e-5 and o.grad_clip == 2.0 and o.warmup_ratio > 0  # DPR B.3: warmup + linear decay
    job = load_train_config(None, [])
    assert job.loss.similarity == "auto" and job.train.batch_size == 32


def test_similarity_follows_the_model():
    cos = resolve_similarity(LossConfig(), model_normalizes=True)
    assert (cos.similarity, cos.temperature) == ("cos", 0.05)
    dot = resolve_similarity(LossConfig(), model_normalizes=False)
    assert (dot.similarity, dot.temperature) == ("dot", 1.0)
    explicit = resolve_similarity(DARConfig(similarity="cos", temperature=0.1), model_normalizes=False)
    assert (explicit.similarity, explicit.temperature, explicit.n_perturb) == ("cos", 0.1, 7)
    with pytest.raises(ValueError, match="auto"):
        scores(torch.zeros(1, 2), torch.zeros(1, 2), LossConfig())


def test_cosine_training_of_an_unnormalised_model_makes_it_normalise(tiny_model_dir):
    from pipeline.train.trainer import resolve_job

    job = load_train_config(None, [f"model.name_or_path={tiny_model_dir}", "model.pooling=cls",
                                   "loss.similarity=cos"])
    resolved = resolve_job(job, progress=False)
    assert resolved.model.normalize is True and resolved.loss.temperature == 0.05
    auto = resolve_job(load_train_config(None, [f"model.name_or_path={tiny_model_dir}", "model.pooling=cls"]),
                       progress=False)
    assert auto.loss.similarity == "dot" and auto.loss.temperature == 1.0 and not auto.model.normalize


# --------------------------------------------------------------------------- the DAR mix term by hand


def _bce(z, lam):
    return math.log1p(math.exp(z)) - lam * z  # BCE(σ(z), λ)


def test_mix_drop_positive_by_hand_b3_with_hard_negatives():
    # B = G = 3 queries, 1 hard negative column: N = 4 columns. Rows are arbitrary (non-symmetric).
    s = torch.tensor([[5.0, 1.0, 2.0, 0.5],
                      [3.0, 4.0, -1.0, 2.0],
                      [0.0, 6.0, 1.5, -2.0]], dtype=torch.float64)
    pos_idx = torch.tensor([0, 1, 2])
    lam = torch.tensor([[0.1, 0.7, 0.4], [0.9, 0.2, 0.6], [0.3, 0.5, 0.8]], dtype=torch.float64)
    cfg = DARConfig(similarity="dot")  # default: drop_positive, hard negatives mixed, /10
    # negatives of each row once its positive is removed, in column order
    negs = [[1.0, 2.0, 0.5], [3.0, -1.0, 2.0], [0.0, 6.0, -2.0]]
    pos = [5.0, 4.0, 1.5]
    want = 0.0
    for k in range(3):
        mu = (sum(pos) + sum(negs[i][k] for i in range(3))) / 6
        want += sum(_bce((lam[i, k].item() * pos[i] + (1 - lam[i, k].item()) * negs[i][k] - mu) / 10,
                         lam[i, k].item()) for i in range(3)) / 3
    want /= 3
    assert mix_loss(s, pos_idx, 3, lam, cfg).item() == pytest.approx(want, abs=1e-12)
    # in-batch only: the hard-negative column is never used, K = G - 1 = 2
    ib = DARConfig(similarity="dot", mix_hard_negatives=False)
    negs_ib = [[1.0, 2.0], [3.0, -1.0], [0.0, 6.0]]
    want_ib = 0.0
    for k in range(2):
        mu = (sum(pos) + sum(negs_ib[i][k] for i in range(3))) / 6
        want_ib += sum(_bce((lam[i, k].item() * pos[i] + (1 - lam[i, k].item()) * negs_ib[i][k] - mu) / 10,
                            lam[i, k].item()) for i in range(3)) / 3
    assert mix_loss(s, pos_idx, 3, lam[:, :2], ib).item() == pytest.approx(want_ib / 2, abs=1e-12)


def test_mix_groupings_differ_and_dar_draws_the_right_lambda_shape():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, 6, generator=g, dtype=torch.float64)
    docs = torch.randn(4 + 4, 6, generator=g, dtype=torch.float64)
    a, _ = dar_loss(q, docs, torch.arange(4), DARConfig(similarity="dot", n_perturb=0, mix_weight=1.0),
                    generator=torch.Generator().manual_seed(1), n_pos=4)
    b, _ = dar_loss(q, docs, torch.arange(4), DARConfig(similarity="dot", n_perturb=0, mix_weight=1.0,
                                                        mix_grouping="shift"),
                    generator=torch.Generator().manual_seed(1), n_pos=4)
    assert not torch.allclose(a, b)
    # drop_positive with hard negatives: every document column but the positive gets mixed
    docs.requires_grad_()
    loss, _ = dar_loss(q, docs, torch.arange(4), DARConfig(similarity="dot", n_perturb=0, mix_weight=1.0),
                       generator=torch.Generator().manual_seed(1), n_pos=4)
    (grad,) = torch.autograd.grad(loss, docs)
    assert (grad[4:].abs().sum(1) > 0).all()


# --------------------------------------------------------------------------- 2-process gloo: DAR + the loop's layout

WORLD, LOCAL_B, HARD, DIM = 2, 2, 1, 5


def _tensors():
    g = torch.Generator().manual_seed(99)
    return (torch.randn(WORLD * LOCAL_B, DIM, generator=g, dtype=torch.float64),
            torch.randn(WORLD * LOCAL_B, DIM, generator=g, dtype=torch.float64),
            torch.randn(WORLD * LOCAL_B * HARD, DIM, generator=g, dtype=torch.float64))


DAR_CFG = DARConfig(similarity="dot", n_perturb=2, dropout_p=0.2, mix_weight=0.3, mix_scale=4.0)


def _gloo_dar_worker(rank, world, port, out_dir):
    import torch.distributed as dist

    from pipeline.train.config import load_train_config

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        Qg, Pg, Hg = (torch.nn.Parameter(t) for t in _tensors())
        lo, hi = rank * LOCAL_B, (rank + 1) * LOCAL_B
        out = {"q": Qg[lo:hi], "pos": Pg[lo:hi], "hard": Hg[lo * HARD:hi * HARD]}
        method = get_method("dar")
        ctx = StepContext(job=load_train_config(None, []), device=torch.device("cpu"), rank=rank, world=world,
                          step=0, rng=random.Random(0))
        batch = method.assemble(out, ctx)  # the loop's wiring: gather + layout
        loss, _ = method.loss(batch, DAR_CFG, training=True, generator=torch.Generator().manual_seed(7))
        loss.backward()
        torch.save({"loss": loss.detach(), "docs": batch["docs"].detach(), "pos_idx": batch["pos_idx"],
                    "n_pos": batch["n_pos"], "gQ": Qg.grad, "gP": Pg.grad, "gH": Hg.grad},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_dar_and_the_gathered_layout_through_two_process_gloo(tmp_path):
    import torch.multiprocessing as mp

    mp.start_processes(_gloo_dar_worker, args=(WORLD, free_port(), str(tmp_path)), nprocs=WORLD, join=True,
                       start_method="fork")
    res = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    Qg, Pg, Hg = (t.requires_grad_() for t in _tensors())
    docs = torch.cat([Pg, Hg])
    for r, out in enumerate(res):  # rank >= 1 sees its positives at G-offset columns, all hard negatives after G
        assert out["n_pos"] == WORLD * LOCAL_B
        assert torch.equal(out["pos_idx"], torch.arange(LOCAL_B) + r * LOCAL_B)
        assert torch.equal(out["docs"], docs.detach())
    # reference: each rank's loss is DAR of its own queries against the global documents, same draws
    total = 0.0
    for r in range(WORLD):
        lo, hi = r * LOCAL_B, (r + 1) * LOCAL_B
        ref, _ = dar_loss(Qg[lo:hi], docs, torch.arange(lo, hi), DAR_CFG,
                          generator=torch.Generator().manual_seed(7), n_pos=WORLD * LOCAL_B)
        assert res[r]["loss"].item() == pytest.approx(ref.item(), rel=1e-12)
        total = total + ref
    (total / WORLD).backward()  # DDP averages the per-rank gradients
    for name, ref in (("gQ", Qg.grad), ("gP", Pg.grad), ("gH", Hg.grad)):
        avg = sum(r[name] for r in res) / WORLD
        assert torch.allclose(avg, ref, atol=1e-10), name


# --------------------------------------------------------------------------- loop helpers


def test_reduce_window_averages_terms_and_sums_counters():
    from pipeline.train.loop import reduce_window

    out = reduce_window([{"loss": 4.0, "nll": 2.0, "fallback": 1.0}, {"loss": 2.0, "nll": 1.0}], [2, 2],
                        {"fallback"})
    assert out == {"loss": 1.5, "nll": 0.75, "fallback": 1.0}


def test_choose_checkpoint_takes_the_newest_complete(tmp_path):
    from pipeline.models.checkpoint import finalize_checkpoint
    from pipeline.train.loop import choose_checkpoint

    for step in (4, 6):
        d = tmp_path / f"step-{step:08d}"
        d.mkdir()
        (d / "x.bin").write_bytes(b"abc")
        finalize_checkpoint(d, {"step": step})
    s4, s6 = str(tmp_path / "step-00000004"), str(tmp_path / "step-00000006")
    assert choose_checkpoint(s4, s6) == s6  # Ray's snapshot lags the driver's newest: the newest wins
    assert choose_checkpoint(s6, s4) == s6  # a restart inside fit() is newer than the driver's choice
    assert choose_checkpoint(None, s4) == s4 and choose_checkpoint(None, None) is None
    (tmp_path / "step-00000006" / "x.bin").write_bytes(b"abcd")  # half-copied: not complete
    assert choose_checkpoint(s4, s6) == s4


def test_side_models_must_be_frozen():
    lin = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="frozen"):
        check_frozen({"teacher": lin})
    check_frozen({"teacher": freeze(lin), "table": {"a": 1}})


def test_progress_line_is_readable():
    from pipeline.train.trainer import format_progress

    lines = format_progress("dar", {"step": 12, "total": 48, "loss": 0.5, "nll": 0.4, "mix": 0.6, "lr": 3e-5,
                                    "steps_per_s": 1.25, "eta_s": 95, "val_RR@10": 0.8, "val_metric": 0.8},
                            ("nll", "mix"))
    assert lines[0] == ("[train] dar step 12/48 (25%)  loss 0.5000 (nll 0.4000, mix 0.6000)  lr 3.00e-05  "
                        "1.25 steps/s  ETA 1:35")
    assert lines[1] == "[train] dar step 12 validation: RR@10 0.8000"


# --------------------------------------------------------------------------- versioned negatives


def _corpus(tmp_path):
    from pipeline.data.ingest import ingest

    src = tmp_path / "collection.tsv"
    src.write_text("".join(f"{i}\tpassage number {i}\n" for i in range(10)))
    out = tmp_path / "corpus"
    ingest([src], "msmarco", out, progress=False)
    return out


def test_versions_publish_marker_last_and_keep(tmp_path):
    from pipeline.data.negatives import MARKER, VersionedNegatives, list_versions, publish_version, version_dir

    corpus = _corpus(tmp_path)
    root = tmp_path / "negs"
    prov = VersionedNegatives(root, corpus)
    assert prov.latest_version() is None
    publish_version(root, 1, {"q1": ["3", "4"], "q2": ["5"]}, {"checkpoint_step": 10, "dev_metric": 0.3})
    # a half-written version (no marker) is never listed or read
    half = version_dir(root, 2)
    half.mkdir()
    (half / "negatives.parquet").write_bytes(b"partial")
    assert list_versions(root) == [1] and prov.latest_version() == 1
    with pytest.raises(PipelineError, match="incomplete"):
        prov.load(2)
    v1 = prov.load(1)
    assert v1.get("q1") == ["passage number 3", "passage number 4"] and v1.meta["checkpoint_step"] == 10
    assert v1.get("nope") is None
    import shutil

    shutil.rmtree(half)
    for v in (2, 3, 4):
        publish_version(root, v, {"q1": ["6"]}, {"checkpoint_step": 10 * v}, keep=2)
    assert list_versions(root) == [3, 4] and (version_dir(root, 4) / MARKER).exists()
    with pytest.raises(PipelineError, match="already exists"):
        publish_version(root, 4, {"q1": ["6"]}, {})
    publish_version(root, 5, {"q1": ["999"]}, {})
    with pytest.raises(PipelineError, match="not in"):
        prov.load(5)


def test_pair_method_takes_negatives_from_the_version():
    from pipeline.data.negatives import NegativesVersion

    method = get_method("dpr")
    job = load_train_config(None, ["data.hard_negatives=1"])
    version = NegativesVersion(3, {}, {"q1": ["fresh negative"]})
    ctx = StepContext(job=job, device=torch.device("cpu"), rank=0, world=1, step=0, rng=random.Random(0),
                      negatives=version)
    assert method.negatives_for({"idx": 0, "qid": "q1", "negatives": ["old"]}, ctx) == ["fresh negative"]
    assert method.negatives_for({"idx": 1, "qid": "q9", "negatives": ["old"]}, ctx) == ["old"]
    assert ctx.stats == {"negatives_from_version": 1, "negatives_fallback": 1}


# --------------------------------------------------------------------------- samplers


def test_m_per_class_batches():
    from pipeline.train.batching import m_per_class_batches

    rows = [{"idx": i, "author": f"a{i % 7}"} for i in range(70)]
    batches = list(m_per_class_batches(rows, "author", 2, 8, 100, random.Random(0)))
    assert batches
    seen = set()
    for b in batches:
        assert len(b) == 8
        authors = [r["author"] for r in b]
        assert sorted(set(authors)) == sorted(set(authors)) and all(authors.count(a) == 2 for a in set(authors))
        assert len(set(authors)) == 4  # B/m classes x m rows
        for r in b:
            assert r["idx"] not in seen
            seen.add(r["idx"])
    again = list(m_per_class_batches(rows, "author", 2, 8, 100, random.Random(0)))
    assert [[r["idx"] for r in b] for b in again] == [[r["idx"] for r in b] for b in batches]
    with pytest.raises(ValueError):
        list(m_per_class_batches(rows, "author", 3, 8, 1, random.Random(0)))


def test_shipped_training_configs_load():
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parents[2] / "jobs" / "configs").glob("*.yaml"))
    train_cfgs = [p for p in configs if p.name.split(".")[0] in ("dpr", "dar", "dpr_nq", "dar_nq")]
    assert len(train_cfgs) == 4
    for p in train_cfgs:
        job = load_train_config(p)
        assert job.loss.name in method_names()
    nq = load_train_config(configs[0].parent / "dar_nq.yaml")
    assert (nq.loss.similarity, nq.loss.temperature, nq.model.pooling, nq.train.epochs) == ("dot", 1.0, "cls", 25)
    # the DAR paper's main table: in-batch negatives only (appendix B.1); Table 6 adds one BM25 negative
    assert nq.train.batch_size * nq.train.num_workers == 32 and nq.data.hard_negatives == 0
    assert load_train_config(configs[0].parent / "dar_nq_hn.yaml").data.hard_negatives == 1


def test_method_sections_are_typed_and_round_trip(monkeypatch):
    from dataclasses import dataclass

    from pipeline.train import methods as registry
    from pipeline.train.config import dump_job, job_from_dict, job_to_dict
    from pipeline.train.methods.pairs import DPR

    @dataclass(frozen=True)
    class Extra:
        lambdas: tuple[float, ...] = (0.01, 0.02)
        patience: int = 3

    class WithSection(DPR):
        name = "with_section_test"
        sections = {"extra": Extra}

    monkeypatch.setitem(registry.METHODS, "with_section_test", WithSection())
    job = load_train_config(None, ["loss.name=with_section_test", "extra.patience=5"])
    assert job.section("extra") == Extra(patience=5)
    with pytest.raises(ConfigError, match="extra.nope"):
        load_train_config(None, ["loss.name=with_section_test", "extra.nope=1"])
    with pytest.raises(ConfigError, match="extra"):
        load_train_config(None, ["loss.name=dpr", "extra.patience=5"])  # not DPR's section
    flat = job_to_dict(job)
    assert flat["extra"] == {"lambdas": [0.01, 0.02], "patience": 5} and "sections" not in flat
    assert job_from_dict(flat) == job
    import yaml

    assert job_from_dict(yaml.safe_load(dump_job(job))) == job


def test_train_amp_is_honoured_on_every_device_or_refused_with_a_reason():
    """`train.amp` was ignored off CUDA (bf16 trained in fp32 without a word): now auto follows the
    CPU's native bf16, an explicit bf16 is honoured where native and refused where emulated, fp16 is
    refused on a CPU, and the autocast really runs in bf16."""
    from pipeline.train.loop import _amp, resolve_amp

    native, avx2 = "flags : avx2 avx512f avx512_bf16", "flags : avx2 fma"
    assert resolve_amp("auto", "cpu", native) == "bf16" and resolve_amp("auto", "cpu", avx2) == "fp32"
    assert resolve_amp("bf16", "cpu", native) == "bf16" and resolve_amp("no", "cpu", native) == "fp32"
    with pytest.raises(PipelineError, match="no native bf16 .* emulated and slower than fp32"):
        resolve_amp("bf16", "cpu", avx2)
    with pytest.raises(PipelineError, match="train.amp=fp16 needs GPU workers"):
        resolve_amp("fp16", "cpu", native)
    job = load_train_config(None, ["train.amp=no"])
    autocast, scaler, used = _amp(job, torch.device("cpu"))
    assert used == "fp32" and scaler is None
    import pipeline.models.precision as prec

    real = prec.cpu_has_bf16
    prec.cpu_has_bf16 = lambda cpuinfo=None: True  # as on an AMX / AVX512-BF16 CPU
    try:
        autocast, scaler, used = _amp(load_train_config(None, ["train.amp=auto"]), torch.device("cpu"))
    finally:
        prec.cpu_has_bf16 = real
    assert used == "bf16" and scaler is None
    with autocast():
        y = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert y.dtype == torch.bfloat16


def test_every_method_trains_a_step_under_cpu_bf16_autocast(tiny_model_dir, faq, tmp_path):
    """A pair method's forward, gather layout and loss under CPU bf16 autocast: a finite loss in fp32
    and gradients for the towers (what train.amp=auto does on a CPU with native bf16)."""
    from pipeline.models import BiEncoder
    from pipeline.config import ModelConfig
    from pipeline.train.methods import StepContext

    for name in ("dpr", "dar"):
        job = load_train_config(None, [f"loss.name={name}", f"data.corpus={faq}", "loss.similarity=cos",
                                       f"model.name_or_path={tiny_model_dir}"])
        method = get_method(name)
        model = BiEncoder.load(ModelConfig(name_or_path=str(tiny_model_dir), pooling="mean", normalize=True))
        rows = [{"idx": i, "qid": f"q{i}", "query": f"query {i}", "positive": f"passage {i} text",
                 "negatives": []} for i in range(4)]
        ctx = StepContext(job=job, device=torch.device("cpu"), rank=0, world=1, step=0, rng=random.Random(0),
                          side={}, negatives=None)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = method.forward(model, rows, ctx)
        loss, terms = method.loss(method.assemble(out, ctx), job.loss, training=True)
        assert loss.dtype == torch.float32 and torch.isfinite(loss), name
        loss.backward()
        assert any(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters()), name
