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
