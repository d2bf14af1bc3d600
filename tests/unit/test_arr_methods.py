"""ARR methods without Ray: examples, the m-per-author sampler, one step of each method."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from pipeline.data.authorship import SplitConfig, write_split
from pipeline.errors import ConfigError
from pipeline.train.config import load_train_config
from pipeline.train.methods import StepContext, check_frozen, get_method
from pipeline.train.trainer import resolve_job


def _records(n_authors=24, per=6):
    """12 prolific authors on topics 0-2 (the training candidates), 12 with 2-4 texts on topics 0-5."""
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    recs = []
    for a in range(n_authors):
        for k in range(per if a < n_authors // 2 else 2 + a % 3):
            t = (a + k) % 3 if a < n_authors // 2 else (a + k) % 6
            recs.append({"text": f"{words[a % 6]} writer {a} says {words[k % 6]} on topic{t}", "author": f"au{a:02d}",
                         "topic": f"topic{t}"})
    return recs


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("arr")
    src = d / "recs.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in _records()) + "\n")
    write_split(src, d / "split", SplitConfig(author_fraction=0.5, topic_fraction=0.5, train_fraction=1.0),
                progress=False)
    return d / "split"


def _job(name, split_dir, tmp_path, model, extra=()):
    return load_train_config(None, [f"loss.name={name}", f"authorship.split={split_dir}", f"model.name_or_path={model}",
                                    "model.pooling=mean", "train.batch_size=4", f"train.storage_path={tmp_path}",
                                    "train.name=t", *extra])


def test_sampler_b_over_m_authors_and_disjoint_authors_per_worker():
    from pipeline.train.batching import m_per_class_batches

    rows = [{"idx": i, "author": a} for i, a in enumerate([a for a in range(20) for _ in range(5)])]
    world, B, m = 2, 8, 2
    seen = {}
    for rank in range(world):
        mine = [r for r in rows if r["author"] % world == rank]
        batches = list(m_per_class_batches(mine, "author", m, B, 100, random.Random(rank)))
        assert batches
        for b in batches:
            c = Counter(r["author"] for r in b)
            assert len(b) == B and len(c) == B // m and set(c.values()) == {m}
        seen[rank] = {r["author"] for b in batches for r in b}
    assert not seen[0] & seen[1]


def test_build_examples_and_steps_per_epoch(split_dir, tmp_path, tiny_model_dir):
    job = _job("arr_cl", split_dir, tmp_path, tiny_model_dir)
    method = get_method("arr_cl")
    meta = method.build_examples(job, tmp_path / "ex", progress=False)
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "ex" / "part-00000.parquet")
    assert t.column_names == ["idx", "text", "author", "topic"] and meta["examples"] == t.num_rows
    assert len(meta["digest"]) == 64 and meta["authors"] == len(set(t.column("author").to_pylist()))
    for world in (1, 2):
        spe = method.steps_per_epoch(meta, world, 4)
        # it is the smallest number of batches the sampler gives any rank
        rows = t.to_pylist()
        for rank in range(world):
            got = list(method.batches([r for r in rows if r["author"] % world == rank], job, 0, rank, spe))
            assert len(got) == spe and all(len(b) == 4 for b in got)
    with pytest.raises(ConfigError, match="multiple"):
        method.steps_per_epoch(meta, 1, 5)
    # the same inputs: reused, same digest
    assert method.build_examples(job, tmp_path / "ex", progress=False)["digest"] == meta["digest"]


def _ctx(job, side=None):
    return StepContext(job=job, device=torch.device("cpu"), rank=0, world=1, step=0, rng=random.Random(0),
                       side=side or {})


def _one_step(method, job, model, rows, side=None):
    ctx = _ctx(job, side)
    out = method.forward(model, rows, ctx)
    return method.loss(method.assemble(out, ctx), job.loss)


def _rows(split_dir, job, method, tmp_path):
    method.build_examples(job, tmp_path / "ex", progress=False)
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "ex" / "part-00000.parquet").to_pylist()
    return next(iter(method.batches(rows, job, 0, 0, 1)))


def test_arr_cl_step(split_dir, tmp_path, tiny_model_dir):
    from pipeline.models import BiEncoder

    job = resolve_job(_job("arr_cl", split_dir, tmp_path, tiny_model_dir), progress=False)
    method = get_method("arr_cl")
    model = BiEncoder.load(job.model)
    loss, terms = _one_step(method, job, model, _rows(split_dir, job, method, tmp_path))
    assert torch.isfinite(loss) and float(terms["anchors"]) == 4
    loss.backward()
    assert any(p.grad is not None for p in model.parameters())


def test_arr_mll_step_trains_its_head(split_dir, tmp_path, tiny_model_dir):
    from pipeline.models import BiEncoder
    from pipeline.train.methods.arr import train_authors

    job = resolve_job(_job("arr_mll", split_dir, tmp_path, tiny_model_dir), progress=False)
    method = get_method("arr_mll")
    model = BiEncoder.load(job.model)
    model.heads = torch.nn.ModuleDict(method.heads(job, model))
    assert model.heads["classifier"].out_features == len(train_authors(split_dir))
    loss, terms = _one_step(method, job, model, _rows(split_dir, job, method, tmp_path))
    loss.backward()
    assert model.heads["classifier"].weight.grad is not None and "train_acc" in terms


def _capture_hidden(model):
    """A hook on the document tower keeping its last hidden state (gradient retained)."""
    seen = {}

    def keep(module, args, output):
        output.last_hidden_state.retain_grad()
        seen["hidden"] = output.last_hidden_state

    return seen, model.doc_encoder.register_forward_hook(keep)


def test_arr_mll_released_head_is_trained_on_the_first_token(split_dir, tmp_path, tiny_model_dir):
    """The default head is the released baseline's: BERT pooler (dense + tanh, from the tower's
    pretrained pooler) + dropout + linear with bias on hidden[:, 0], cross-entropy without τ."""
    from pipeline.models import BiEncoder
    from pipeline.train.methods.arr import ReleasedMLLHead, train_authors

    job = resolve_job(_job("arr_mll", split_dir, tmp_path, tiny_model_dir), progress=False)
    assert job.loss.mll_head == "released"
    method = get_method("arr_mll")
    model = BiEncoder.load(job.model)
    model.heads = torch.nn.ModuleDict(method.heads(job, model))
    head = model.heads["classifier"]
    assert isinstance(head, ReleasedMLLHead) and head.bias is not None
    assert head.out_features == len(train_authors(split_dir)) and head.in_features == model.doc_encoder.config.hidden_size
    assert torch.equal(head.dense.weight, model.doc_encoder.pooler.dense.weight)  # from the pretrained pooler
    assert head.dropout.p == model.doc_encoder.config.hidden_dropout_prob
    head_input = {}
    pre = head.register_forward_pre_hook(lambda module, args: head_input.update(x=args[0]))
    seen, hook = _capture_hidden(model)
    model.eval()  # dropout off: the logits can be recomputed
    rows = _rows(split_dir, job, method, tmp_path)
    ctx = _ctx(job)
    out = method.forward(model, rows, ctx)
    hook.remove()
    pre.remove()
    assert not model.doc_encoder._forward_hooks  # the method removed its own hook
    hidden = seen["hidden"]
    assert torch.equal(head_input["x"], hidden[:, 0].float())  # the head reads the first token
    loss, terms = method.loss(method.assemble(out, ctx), job.loss)
    logits = torch.tanh(hidden[:, 0] @ head.dense.weight.T + head.dense.bias) @ head.weight.T + head.bias
    labels = torch.tensor([r["author"] for r in rows])
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(logits, labels), atol=1e-6)  # no temperature
    loss.backward()
    # the gradient reaches the encoder through the first token only
    assert hidden.grad[:, 0].abs().sum() > 0 and torch.count_nonzero(hidden.grad[:, 1:]) == 0
    assert head.weight.grad is not None and head.bias.grad is not None and head.dense.weight.grad is not None
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.doc_encoder.encoder.parameters())
    assert "train_acc" in terms


def test_arr_mll_pooled_head_is_the_previous_computation(split_dir, tmp_path, tiny_model_dir):
    """`loss.mll_head: pooled`: a bias-free linear head on the pooled (normalised) vector, logits / τ."""
    from pipeline.models import BiEncoder

    job = resolve_job(_job("arr_mll", split_dir, tmp_path, tiny_model_dir, ["loss.mll_head=pooled"]), progress=False)
    method = get_method("arr_mll")
    model = BiEncoder.load(job.model)
    model.heads = torch.nn.ModuleDict(method.heads(job, model))
    head = model.heads["classifier"]
    assert type(head) is torch.nn.Linear and head.bias is None and head.in_features == model.dim
    model.eval()
    rows = _rows(split_dir, job, method, tmp_path)
    seen, hook = _capture_hidden(model)
    loss, _ = _one_step(method, job, model, rows)
    hook.remove()
    with torch.no_grad():
        tok = model.tokenize([r["text"] for r in rows], "doc")
        z = model(None, tok)[1]
    labels = torch.tensor([r["author"] for r in rows])
    want = torch.nn.functional.cross_entropy((z @ head.weight.T) / job.loss.tau, labels)
    assert job.loss.tau == 0.05 and torch.allclose(loss, want, atol=1e-5)
    loss.backward()
    assert torch.count_nonzero(seen["hidden"].grad[:, 1:]) > 0  # mean pooling: every token gets gradient


def test_arr_step_teacher_frozen_and_no_gradient_into_it(split_dir, tmp_path, tiny_model_dir):
    from pipeline.models import BiEncoder
    from pipeline.models.tiny import build_tiny_bert

    teacher_dir = build_tiny_bert(tmp_path / "g", seed=5)
    job = resolve_job(_job("arr", split_dir, tmp_path, tiny_model_dir, [f"authorship.teacher={teacher_dir}"]),
                      progress=False)
    method = get_method("arr")
    rows = _rows(split_dir, job, method, tmp_path)
    side = method.side_inputs(job, torch.device("cpu"))
    check_frozen(side)  # the loop's guard passes
    assert side["tfidf"].sha256 == json.loads((Path(split_dir) / "vectorizers" / "tfidf.json").read_text())["sha256"]
    model = BiEncoder.load(job.model)
    loss, terms = _one_step(method, job, model, rows, side)
    loss.backward()
    assert all(p.grad is None for p in side["teacher"].parameters())
    assert any(p.grad is not None for p in model.parameters())
    assert set(terms) == {"distill", "B", "agreement", "no_pair"} and 0 <= float(terms["B"]) <= 1
    # an unfrozen teacher is refused by the loop's guard
    side["teacher"].train()
    with pytest.raises(RuntimeError, match="frozen"):
        check_frozen(side)


def test_arr_needs_split_and_teacher(split_dir, tmp_path, tiny_model_dir):
    job = load_train_config(None, ["loss.name=arr_cl", f"model.name_or_path={tiny_model_dir}"])
    with pytest.raises(ConfigError, match="authorship.split"):
        get_method("arr_cl").build_examples(job, tmp_path / "x", progress=False)
    job = _job("arr", split_dir, tmp_path, tiny_model_dir)
    with pytest.raises(ConfigError, match="teacher"):
        get_method("arr").build_examples(job, tmp_path / "y", progress=False)
    with pytest.raises(ConfigError):
        load_train_config(None, ["loss.name=arr_cl", "loss.scaling=normalized"])  # an arr key under arr_cl
    # relative paths are made absolute where the config is read
    j = load_train_config(None, ["loss.name=arr_cl", "authorship.split=rel/split"])
    assert Path(j.section("authorship").split).is_absolute()
    assert replace(j.section("authorship"), m=2).split == j.section("authorship").split


def test_arr_mll_released_head_reads_every_row_of_a_batch_encoded_in_length_groups(split_dir, tmp_path,
                                                                                   tiny_model_dir):
    """A training batch of >= 2 x train.length_group_rows rows is encoded in length-sorted groups (one tower call
    each): the head must read each row's own first token, in the batch's order, not the last group's alone (which
    gave 16 logits for 64 labels on the fortunes split). Dropout off, so grouped and one-pass logits compare."""
    from pipeline.models import BiEncoder

    job = resolve_job(_job("arr_mll", split_dir, tmp_path, tiny_model_dir), progress=False)
    method = get_method("arr_mll")
    model = BiEncoder.load(job.model)
    model.heads = torch.nn.ModuleDict(method.heads(job, model))
    base_rows = _rows(split_dir, job, method, tmp_path)
    rows = [dict(r, text=r["text"] + " more" * (i % 7)) for i, r in enumerate(base_rows * 10)][:40]
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    logits = {}
    for group in (16, 0):
        model.length_group_rows = group
        out = method.forward(model, rows, _ctx(job))
        logits[group] = out["logits"]
        assert out["logits"].shape[0] == len(rows) == out["labels"].shape[0]
        if group:
            assert model.row_order is not None and not torch.equal(model.row_order, torch.arange(len(rows)))
    assert torch.allclose(logits[16], logits[0], atol=1e-5)
    loss, _ = method.loss(method.assemble(out, _ctx(job)), job.loss)
    assert torch.isfinite(loss)
