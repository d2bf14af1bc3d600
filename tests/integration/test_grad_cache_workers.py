"""Gradient caching with two Ray Train workers (#62): the representations gathered across the workers go into
the loss, each worker replays its own chunks, and the parameters' gradients are averaged as DDP averages them, so
3 cached steps end where 3 uncached steps end (DPR and DAR, dropout on, fp32)."""

from __future__ import annotations

import pytest
from fixtures import dpr_job, relative_difference

from pipeline.train.trainer import train

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("loss", ["dpr", "dar"])
def test_two_workers_cached_steps_end_where_uncached_steps_end(ray_session, loss, tiny_model_dir, faq, tmp_path):
    from safetensors.torch import load_file

    def run(name, *extra):
        job = dpr_job(tiny_model_dir, faq, tmp_path, name, "train.runner=ray", "train.batch_size=16",
                      "train.max_steps=3", "train.amp=no", "train.length_group_rows=8", "train.torch_threads=1",
                      f"loss.name={loss}", *extra)
        done = train(job, progress=False)
        return done, load_file(str(tmp_path / name / "model" / "model.safetensors"))

    plain, a = run("plain")
    cached, b = run("cached", "train.grad_cache=true", "train.grad_cache_query_chunk=8",
                    "train.grad_cache_doc_chunk=8")
    assert plain["world_size"] == cached["world_size"] == 2
    assert [h["loss"] for h in plain["history"]] == pytest.approx([h["loss"] for h in cached["history"]], rel=1e-6)
    assert relative_difference(a, b) <= 1e-5
