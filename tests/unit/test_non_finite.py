"""Nothing non-finite passes a step: a NaN or inf stops where it is made (a model's vectors, a shard,
a score, a loss), with one line naming where, and nothing built on it is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import random_embeddings

from pipeline.config import ModelConfig, load_config
from pipeline.errors import InputError, NonFiniteError, PipelineError
from pipeline.index.shards import plan_part, write_shard
from pipeline.models import BiEncoder


@pytest.fixture(scope="module")
def nan_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny BERT with one layer's weights NaN (what a diverged training run leaves)."""
    model = BiEncoder.load(ModelConfig(name_or_path=str(tiny_model_dir), pooling="mean", normalize=True))
    with torch.no_grad():
        model.doc_encoder.encoder.layer[0].output.dense.weight.fill_(float("nan"))
    out = tmp_path_factory.mktemp("nan_model") / "model"
    model.save(out)
    return out


def test_write_shard_refuses_non_finite_vectors(tmp_path):
    pids = [f"p{i}" for i in range(4)]
    spec = plan_part(0, "part-00000.parquet", pids, 4)[0]
    vecs = np.ones((4, 3), np.float32)
    vecs[2, 1] = np.nan
    with pytest.raises(NonFiniteError, match=r"passage p2 \(row 2\) is not finite"):
        write_shard(tmp_path, spec, pids, vecs)
    assert not list(tmp_path.iterdir())  # no vectors, ids or marker
    with np.errstate(over="ignore"):
        big = np.full((4, 3), 1e5, np.float32).astype(np.float16)  # 1e5 is beyond float16: inf
    with pytest.raises(NonFiniteError, match="float16's range"):
        write_shard(tmp_path, spec, pids, big)
    assert not list(tmp_path.iterdir())


def _plant(emb: Path, shard: str, row: int, value: float) -> str:
    arr = np.load(emb / f"{shard}.npy", mmap_mode="r+")
    arr[row, 0] = value
    arr.flush()
    return (emb / f"{shard}.pids.txt").read_text().splitlines()[row]


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat"])
def test_index_refuses_a_shard_with_nan_or_inf(faq, tmp_path, factory):
    from pipeline.index.faiss_index import build_index
    from pipeline.info import info

    emb = random_embeddings(faq, tmp_path / "emb", shard_rows=32, dim=8)
    pid = _plant(emb, "shard-00000-000000032", 5, np.nan)
    cfg = load_config(None, [f"index.factory={factory}", "index.train_sample=176"]).index
    with pytest.raises(InputError) as e:
        build_index(emb, tmp_path / "idx", cfg, progress=False)
    assert "shard-00000-000000032.npy" in str(e.value) and f"row 5 (passage {pid})" in str(e.value)
    assert not (tmp_path / "idx").exists()
    assert "DAMAGED" in info(emb) and f"passage {pid}" in info(emb)  # `pipeline info` no longer calls it complete
    _plant(emb, "shard-00000-000000032", 5, 0.5)
    pid = _plant(emb, "shard-00000-000000160", 1, -np.inf)
    with pytest.raises(InputError, match=rf"row 1 \(passage {pid}\) holds a non-finite value"):
        build_index(emb, tmp_path / "idx", cfg, progress=False)


def test_run_writer_refuses_nan_scores(tmp_path):
    from pipeline.eval.runs import RunWriter

    with pytest.raises(NonFiniteError, match="query q2"):
        with RunWriter(tmp_path / "run.trec", "t") as w:
            w.write(["q1", "q2"], ["a", "b"], np.array([[1.0, 0.5], [np.nan, 0.2]]), np.array([[0, 1], [0, 1]]))
    assert not (tmp_path / "run.trec").exists()


def test_a_nan_model_is_refused_by_embed_encode_retrieve_and_sts(nan_model_dir, tiny_model_dir, faq, tmp_path):
    from pipeline.eval.sts import evaluate_sts
    from pipeline.index.encode import encode_corpus
    from pipeline.index.faiss_index import build_index
    from pipeline.index.retrieve import retrieve

    model = BiEncoder.load(ModelConfig(name_or_path=str(nan_model_dir)))
    with pytest.raises(NonFiniteError, match=r"gives non-finite vectors .* for 3 of 3 queries"):
        model.embed(["a", "b c", "d e f"], "query")
    for backend in ("torch", "openvino"):  # never "openvino could not convert": the model is what is broken
        cfg = load_config(None, [f"model.name_or_path={nan_model_dir}", "encode.runner=local",
                                 f"encode.backend={backend}", "encode.precision=fp32"])
        with pytest.raises(NonFiniteError, match="non-finite vectors"):
            encode_corpus(faq, tmp_path / f"emb-{backend}", cfg)
        assert not (tmp_path / f"emb-{backend}").exists()  # nothing written: no folder, no embeddings.json
    # a good index searched with the broken model as its query tower: an error, and no run file
    good = load_config(None, [f"model.name_or_path={tiny_model_dir}", "model.pooling=mean", "model.normalize=true",
                              "encode.runner=local", "encode.backend=torch", "encode.precision=fp32"])
    encode_corpus(faq, tmp_path / "emb", good)
    build_index(tmp_path / "emb", tmp_path / "idx", good.index, progress=False)
    with pytest.raises(NonFiniteError):
        retrieve(tmp_path / "idx", faq / "queries.tsv", tmp_path / "run.trec", good,
                 model_cfg=ModelConfig(name_or_path=str(nan_model_dir)), progress=False)
    assert not (tmp_path / "run.trec").exists()
    pairs = tmp_path / "sts.tsv"
    pairs.write_text("a cat\ta dog\t4.0\nthe sun\tthe moon\t2.5\nred\tblue\t1.0\n")
    with pytest.raises(NonFiniteError):
        evaluate_sts(pairs, model)


def test_cli_encode_of_a_nan_model_is_one_line(nan_model_dir, faq, tmp_path):
    out = tmp_path / "emb"
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "encode", "--corpus", str(faq), "--out", str(out),
                        "--model", str(nan_model_dir), "encode.runner=local"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the model") and "non-finite vectors" in err[0], r.stderr
    assert "Traceback" not in r.stdout + r.stderr and not out.exists()


def test_check_finite_loss_names_the_step_and_the_term():
    from pipeline.train.loop import check_finite_loss

    check_finite_loss(torch.tensor(1.5), {"nll": torch.tensor(1.2), "mix": torch.tensor(0.3)}, 3, lambda: "kept")
    with pytest.raises(NonFiniteError, match=r"step 7: the loss went non-finite in mix \(nan\) \(nll 1.2\); "
                                             r"nothing of this step was applied. kept"):
        check_finite_loss(torch.tensor(float("nan")), {"nll": torch.tensor(1.2), "mix": torch.tensor(float("nan"))},
                          7, lambda: "kept")
    with pytest.raises(NonFiniteError, match=r"step 2: the loss went non-finite in loss \(inf\) \(nll 1.2\)"):
        check_finite_loss(torch.tensor(float("inf")), {"nll": torch.tensor(1.2)}, 2, lambda: "kept")
    assert issubclass(NonFiniteError, PipelineError)
