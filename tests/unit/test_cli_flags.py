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
