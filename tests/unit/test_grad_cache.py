"""Gradient caching (#62, train/grad_cache.py): a cached step is the uncached step when its chunks are the
length groups the uncached step encodes (dropout on, its masks replayed), checked on the gradients of one step
and on the weights after 3 steps of DPR and DAR; chunks that split those groups still train; the setting is
part of the run's identity and refused for methods it does not serve."""

from __future__ import annotations

import contextlib

import pytest
import torch
from fixtures import dpr_job, relative_difference

from pipeline.errors import ConfigError, PipelineError


def test_one_cached_step_has_the_uncached_steps_gradients_with_dropout_on(tiny_model_dir):
    from pipeline.config import ModelConfig
    from pipeline.losses.configs import LossConfig
    from pipeline.losses.dpr import dpr_batch_loss
    from pipeline.models import BiEncoder
    from pipeline.train.grad_cache import GradCache, recording

    def grads(cached: bool):
        torch.manual_seed(0)
        m = BiEncoder.load(ModelConfig(name_or_path=str(tiny_model_dir), pooling="mean", normalize=True))
        m.length_group_rows = 16
        m.train()
        qt = m.tokenize([f"query {i} " + "word " * (i % 7) for i in range(32)], "query")
        dt = m.tokenize([f"doc {i} " + "text " * (i % 13) for i in range(32)], "doc")
        torch.manual_seed(1)
        cache = GradCache(16, 16, "cpu")
        with (recording(m, cache) if cached else contextlib.nullcontext()):
            q, d = m(qt, dt)
        loss, _ = dpr_batch_loss({"q": q, "docs": d, "pos_idx": torch.arange(32), "n_pos": 32},
                                 LossConfig(similarity="cos", temperature=0.05))
        loss.backward()
        if cached:
            cache.replay(m, contextlib.nullcontext, 1)
        return loss.item(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    (la, a), (lb, b) = grads(False), grads(True)
    assert la == lb and a.keys() == b.keys() and relative_difference(a, b) < 1e-5
    assert any(float(g.abs().max()) > 0 for g in a.values())


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["dpr", "dar"])
def test_three_cached_steps_end_where_three_uncached_steps_end(loss, tiny_model_dir, faq, tmp_path):
    from safetensors.torch import load_file

    from pipeline.train.trainer import train

    def run(name, *extra):
        job = dpr_job(tiny_model_dir, faq, tmp_path, name, "train.num_workers=1", "train.runner=local",
                      "train.batch_size=32", "train.max_steps=3", "train.amp=no", "train.length_group_rows=16",
                      f"loss.name={loss}", *extra)
        done = train(job, progress=False)
        return done, load_file(str(tmp_path / name / "model" / "model.safetensors"))

    plain, a = run("plain")
    cached, b = run("cached", "train.grad_cache=true", "train.grad_cache_query_chunk=16",
                    "train.grad_cache_doc_chunk=16")
    assert [h["loss"] for h in plain["history"]] == pytest.approx([h["loss"] for h in cached["history"]], rel=1e-6)
    assert relative_difference(a, b) <= 1e-5
    other, c = run("chunks-of-8", "train.grad_cache=true", "train.grad_cache_query_chunk=8",
                   "train.grad_cache_doc_chunk=8")  # other groups: other dropout draws, the same method
    assert other["steps"] == 3 and relative_difference(a, c) > 1e-5
    # the setting is part of the run's identity: a resume that turns it off is refused
    with pytest.raises(PipelineError, match=r"train.grad_cache"):
        run("cached")


def test_gradient_caching_is_refused_for_a_method_it_does_not_serve(tiny_model_dir, faq, tmp_path):
    from pipeline.train.trainer import train

    job = dpr_job(tiny_model_dir, faq, tmp_path, "rcl", "train.num_workers=1", "train.runner=local",
                  "train.grad_cache=true", "loss.name=rcl")
    with pytest.raises(ConfigError, match="train.grad_cache: for the in-batch methods"):
        train(job, progress=False)
