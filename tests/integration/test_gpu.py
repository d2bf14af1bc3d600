"""GPU paths against their CPU twins: encoder actors on a GPU (fp32 equal to CPU, bf16/fp16 close),
the Ray Train loop on a GPU worker (same losses as CPU within float noise), and a FAISS index built
on a GPU (same ranking as the CPU build). Skipped cleanly where there is no CUDA GPU (or, for the
index, no faiss-gpu); this project's own machines have none, so these run on a user's GPU box:

    .venv/bin/python -m pytest -q tests/integration/test_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import load_config

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.integration, pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]



def _cfg(model_dir, *extra):
    return load_config(None, [f"model.name_or_path={model_dir}", "model.pooling=mean", "model.normalize=true",
                              "model.doc_max_length=64", "encode.batch_size=32", "encode.show_progress=false",
                              *extra])


def _vectors(emb) -> dict[str, np.ndarray]:
    from pipeline.index.shards import iter_shards

    return {pid: vec for ids, vecs in iter_shards(emb) for pid, vec in zip(ids, vecs)}


def _min_cosine(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    ids = sorted(a)
    x, y = np.stack([a[i] for i in ids]), np.stack([b[i] for i in ids])
    cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    return float(cos.min())


def test_gpu_encoder_actors_match_cpu(ray_session, tiny_model_dir, faq, tmp_path):
    from pipeline.index.encode import encode_corpus

    cpu = tmp_path / "cpu"
    encode_corpus(faq, cpu, _cfg(tiny_model_dir, "encode.precision=fp32", "encode.gpus_per_actor=0"))
    ref = _vectors(cpu)
    checks = [("fp32", 0.99999), ("fp16", 0.9995)] + ([("bf16", 0.999)] if torch.cuda.is_bf16_supported() else [])
    for precision, floor in checks:
        out = tmp_path / f"gpu-{precision}"
        summary = encode_corpus(faq, out, _cfg(tiny_model_dir, f"encode.precision={precision}",
                                               "encode.gpus_per_actor=1", "encode.num_actors=1"))
        assert summary["rows"] == len(ref)
        assert _min_cosine(_vectors(out), ref) >= floor, precision


def test_training_on_a_gpu_worker_matches_cpu(ray_session, tiny_model_dir, faq, tmp_path):
    from pipeline.train.config import load_train_config
    from pipeline.train.trainer import train

    def job(name, *extra):
        return load_train_config(None, [
            f"model.name_or_path={tiny_model_dir}", "model.pooling=cls", "model.query_max_length=32",
            "model.doc_max_length=64", f"data.corpus={faq}", "train.num_workers=1", "train.cpus_per_worker=0.5",
            "train.batch_size=8", "train.max_steps=3", f"train.storage_path={tmp_path}", f"train.name={name}",
            "train.report_every=1", "optim.lr=1e-4", "train.seed=3", "train.amp=no", *extra])

    on_cpu = train(job("cpu"), progress=False)
    on_gpu = train(job("gpu", "train.use_gpu=true", "train.gpus_per_worker=1"), progress=False)
    assert on_gpu["steps"] == on_cpu["steps"] == 3
    assert (tmp_path / "gpu" / "model" / "modules.json").exists()
    cpu_loss = [h["loss"] for h in on_cpu["history"] if "loss" in h]
    gpu_loss = [h["loss"] for h in on_gpu["history"] if "loss" in h]
    assert np.allclose(gpu_loss, cpu_loss, rtol=1e-3, atol=1e-4), (gpu_loss, cpu_loss)


def test_faiss_gpu_index_ranks_as_the_cpu_index(ray_session, tiny_model_dir, faq, tmp_path):
    import faiss

    if not hasattr(faiss, "get_num_gpus") or faiss.get_num_gpus() == 0:
        pytest.skip("faiss has no GPU support here (pip install '.[gpu]' for faiss-gpu)")
    from pipeline.index.encode import encode_corpus
    from pipeline.index.faiss_index import build_index
    from pipeline.index.retrieve import retrieve

    emb = tmp_path / "emb"
    encode_corpus(faq, emb, _cfg(tiny_model_dir, "encode.precision=fp32"))
    runs = {}
    for where in ("no", "yes"):
        cfg = _cfg(tiny_model_dir, f"index.use_gpu={where}", "retrieve.top_k=10")
        build_index(emb, tmp_path / f"index-{where}", cfg.index, progress=False)
        run = tmp_path / f"run-{where}.trec"
        retrieve(tmp_path / f"index-{where}", faq / "queries.tsv", run, cfg, progress=False)
        runs[where] = [line.split()[:3] for line in run.read_text().splitlines()]
    assert runs["yes"] == runs["no"]
