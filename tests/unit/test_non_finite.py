"""Nothing non-finite passes a step: a NaN or inf stops where it is made (a model's vectors, a shard,
a score, a loss), with one line naming where, and nothing built on it is written."""

from __future__ import annotations

import json
import re
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


@pytest.mark.slow
def test_cli_encode_of_a_nan_model_is_one_line(nan_model_dir, faq, tmp_path):
    out = tmp_path / "emb"
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "encode", "--corpus", str(faq), "--out", str(out),
                        "--model", str(nan_model_dir), "encode.runner=local"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the model") and "non-finite vectors" in err[0], r.stderr
    assert "Traceback" not in r.stdout + r.stderr and not out.exists()


@pytest.mark.slow
def test_the_up_front_model_check_runs_once_per_model_and_texts(tiny_model_dir, faq, tmp_path, monkeypatch):
    """encode's check of the model's vectors on the corpus's first passages (a torch pass) is remembered once
    it passed: an encode again of the same corpus with the same model skips it; other settings (another model
    digest, another pooling) check again, and a memo holding another key is not taken for this one."""
    from pipeline.index import encode as encode_mod

    monkeypatch.setenv("PIPELINE_EXPORT_CACHE", str(tmp_path / "cache"))
    seen = []
    real = BiEncoder.embed
    monkeypatch.setattr(BiEncoder, "embed", lambda self, texts, side, **kw: seen.append(len(texts)) or
                        real(self, texts, side, **kw))
    base = [f"model.name_or_path={tiny_model_dir}", "encode.runner=local", "encode.backend=torch",
            "encode.precision=fp32"]
    encode_mod.encode_corpus(faq, tmp_path / "a", load_config(None, base))
    encode_mod.encode_corpus(faq, tmp_path / "b", load_config(None, base))
    assert seen == [8]  # the second encode took the first one's pass
    encode_mod.encode_corpus(faq, tmp_path / "c", load_config(None, base + ["model.pooling=max"]))
    assert seen == [8, 8]  # other settings: checked again
    memos = sorted((tmp_path / "cache" / "model-checks").glob("*.json"))
    assert len(memos) == 2
    for memo in memos:  # a memo whose key is not this one's (a tampered or colliding file): checked again
        memo.write_text(json.dumps({"key": "another", "passed": True}))
    encode_mod.encode_corpus(faq, tmp_path / "d", load_config(None, base))
    assert seen == [8, 8, 8]
    monkeypatch.setenv("PIPELINE_EXPORT_CACHE", str(faq / "manifest.json"))  # a file: no memo, checked each time
    encode_mod.encode_corpus(faq, tmp_path / "e", load_config(None, base))
    encode_mod.encode_corpus(faq, tmp_path / "f", load_config(None, base))
    assert seen == [8, 8, 8, 8, 8]


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


# ----------------------------------------------------------------- overflowing vectors, damaged reuse

def test_first_bad_row_finds_nan_inf_and_components_beyond_the_bound():
    from pipeline.index.shards import MAX_COMPONENT, NON_FINITE, first_bad_row

    ok = np.ones((10, 4), np.float32)
    ok[3, 1], ok[4, 2] = MAX_COMPONENT, -MAX_COMPONENT  # the bound itself is a usable value
    assert first_bad_row(ok) is None and first_bad_row(ok, block_bytes=16) is None
    for value, what in ((np.nan, NON_FINITE), (-np.inf, NON_FINITE), (3e38, "magnitude 3e+38"),
                        (-2e15, "magnitude 2e+15")):
        v = ok.copy()
        v[7, 3] = value
        for block in (16, 64 * 2**20):  # the bad row alone in its block, or among others
            row, said = first_bad_row(v, block_bytes=block)
            assert row == 7 and what in said, (value, said)
    with np.errstate(over="ignore"):
        half = np.full((3, 2), 7e4, np.float32).astype(np.float16)  # beyond float16: inf, not let through
    assert first_bad_row(half) == (0, NON_FINITE)


def test_write_shard_refuses_an_overflowing_vector(tmp_path):
    pids = [f"p{i}" for i in range(4)]
    spec = plan_part(0, "part-00000.parquet", pids, 4)[0]
    vecs = np.ones((4, 3), np.float32)
    vecs[1, 2] = 3e38  # finite, but its squared norm (and most inner products) overflow float32
    with pytest.raises(NonFiniteError, match=r"passage p1 \(row 1\) holds a component of magnitude 3e\+38, "
                                             r"beyond ±1e\+15 .*the shard is not written"):
        write_shard(tmp_path, spec, pids, vecs)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat"])
def test_index_refuses_a_shard_with_an_overflowing_vector(faq, tmp_path, factory):
    from pipeline.index.faiss_index import build_index
    from pipeline.info import info

    emb = random_embeddings(faq, tmp_path / "emb", shard_rows=32, dim=8)
    pid = _plant(emb, "shard-00000-000000064", 9, 3e38)
    cfg = load_config(None, [f"index.factory={factory}", "index.train_sample=176"]).index
    with pytest.raises(InputError) as e:
        build_index(emb, tmp_path / "idx", cfg, progress=False)
    msg = str(e.value)
    assert msg.startswith(f"{emb / 'shard-00000-000000064.npy'}: row 9 (passage {pid}) holds a component of "
                          "magnitude 3e+38"), msg
    assert "run `pipeline encode` again into this folder" in msg and "\n" not in msg
    assert not (tmp_path / "idx").exists()
    assert "DAMAGED" in info(emb) and f"passage {pid}" in info(emb)


def _encode_cli(model_dir, corpus, out, capsys) -> subprocess.CompletedProcess:
    """`pipeline encode` through the CLI's main in this process (the subprocess is not what is tested: a
    process of its own cost ~10 s of imports a run), its status and what it printed."""
    from pipeline.cli import main

    capsys.readouterr()
    rc = main(["encode", "--corpus", str(corpus), "--out", str(out), "--model", str(model_dir), "encode.runner=local",
               "encode.backend=torch", "encode.precision=fp32", "encode.shard_rows=48"])
    got = capsys.readouterr()
    return subprocess.CompletedProcess(["pipeline", "encode"], rc, got.out, got.err)


@pytest.mark.slow
def test_encode_again_reencodes_shards_damaged_after_completion(tiny_model_dir, faq, tmp_path, capsys):
    """A complete set whose shards were damaged since (a NaN, a finite 3e38) is not "already
    complete": a re-run names each damaged shard in one line, encodes those again (the vectors the
    first run wrote) and reuses the others untouched; the set then indexes."""
    from pipeline.index.faiss_index import build_index

    out = tmp_path / "emb"
    r = _encode_cli(tiny_model_dir, faq, out, capsys)
    assert r.returncode == 0, r.stdout + r.stderr
    names = json.loads((out / "embeddings.json").read_text())["shard_names"]
    assert len(names) >= 3
    first = {n: np.load(out / f"{n}.npy") for n in names}
    nan_pid = _plant(out, names[0], 3, np.nan)
    big_pid = _plant(out, names[2], 7, 3e38)
    kept = {n: (out / f"{n}.npy").stat().st_mtime_ns for n in names if n not in (names[0], names[2])}
    r = _encode_cli(tiny_model_dir, faq, out, capsys)
    assert r.returncode == 0, r.stdout + r.stderr
    again = [ln for ln in r.stdout.splitlines() if "encoding this shard again" in ln]
    assert again == [f"[encode] {names[0]}.npy row 3 (passage {nan_pid}) holds a non-finite value (NaN or inf): "
                     "encoding this shard again",
                     f"[encode] {names[2]}.npy row 7 (passage {big_pid}) holds a component of magnitude 3e+38, "
                     "beyond ±1e+15 (its scores would overflow float32): encoding this shard again"], r.stdout
    assert f"{len(names) - 2} shards already complete" in r.stdout, r.stdout
    for n in names:
        np.testing.assert_allclose(np.load(out / f"{n}.npy"), first[n], rtol=0, atol=1e-5)
    assert {n: (out / f"{n}.npy").stat().st_mtime_ns for n in kept} == kept  # the sound shards: reused as they are
    assert json.loads((out / "embeddings.json").read_text())["complete"] is True
    build_index(out, tmp_path / "idx", load_config(None, []).index, progress=False)
    r = _encode_cli(tiny_model_dir, faq, out, capsys)  # now sound: nothing to do
    assert r.returncode == 0 and f"{len(names)} shards already complete" in r.stdout, r.stdout + r.stderr


class _HugeQueryModel:
    """A query tower whose vector for query number `bad` holds `value` (what a broken export could give)."""

    dim = 8

    def __init__(self, bad: int, value: float):
        self.bad, self.value = bad, value

    def embed(self, texts, side, **_):
        v = np.full((len(texts), self.dim), 0.1, np.float32)
        if self.bad < len(texts):
            v[self.bad, 0] = self.value
        return v

    def to(self, *_):
        return self

    def eval(self):
        return self


@pytest.mark.parametrize("value", [3e38, np.nan])
def test_retrieve_and_searcher_refuse_an_overflowing_or_nan_query_vector(faq, tmp_path, value):
    from pipeline.data.readers import load_queries
    from pipeline.index.faiss_index import build_index
    from pipeline.index.retrieve import retrieve
    from pipeline.search import Searcher

    emb = random_embeddings(faq, tmp_path / "emb", shard_rows=32, dim=8)
    cfg = load_config(None, [])
    build_index(emb, tmp_path / "idx", cfg.index, progress=False)
    qid = list(load_queries(faq / "queries.tsv", "auto"))[2]
    what = re.escape("a component of magnitude 3e+38" if value == 3e38 else "a non-finite value (NaN or inf)")
    with pytest.raises(NonFiniteError, match=rf"^query {qid}: its vector holds {what}"):
        retrieve(tmp_path / "idx", faq / "queries.tsv", tmp_path / "run.trec", cfg, model=_HugeQueryModel(2, value),
                 progress=False)
    assert not (tmp_path / "run.trec").exists()
    searcher = Searcher(tmp_path / "idx", model=_HugeQueryModel(1, value), device="cpu")
    with pytest.raises(NonFiniteError, match=rf"^query #1: its vector holds {what}"):
        searcher.batch_search(["a", "b", "c"], k=5)
    with pytest.raises(NonFiniteError, match=rf"^query qb: its vector holds {what}"):
        searcher.batch_search(["a", "b"], k=5, qids=["qa", "qb"])
    vectors = np.full((3, 8), 0.1, np.float32)
    vectors[2, 5] = value
    with pytest.raises(NonFiniteError, match=rf"^query vector 2: its vector holds {what}"):
        searcher.search_vectors(vectors, k=5)
    assert len(searcher.search_vectors(vectors[:2], k=5)[1]) == 5


def test_a_model_with_overflowing_vectors_is_refused_by_encode_and_retrieve(tiny_model_dir, faq, tmp_path):
    """Finite vectors beyond ±1e15 (an unnormalised model whose last LayerNorm was scaled by 1e30):
    encode writes nothing, retrieve names the query and writes no run."""
    from pipeline.index.encode import encode_corpus
    from pipeline.index.faiss_index import build_index
    from pipeline.index.retrieve import retrieve

    model = BiEncoder.load(ModelConfig(name_or_path=str(tiny_model_dir), pooling="mean", normalize=False))
    with torch.no_grad():
        model.doc_encoder.encoder.layer[-1].output.LayerNorm.weight.mul_(1e30)
    huge_dir = tmp_path / "huge"
    model.save(huge_dir)
    huge = BiEncoder.load(ModelConfig(name_or_path=str(huge_dir)))
    v = huge.embed(["a", "b c"], "doc")
    assert np.isfinite(v).all() and np.abs(v).max() > 1e15  # what check_finite alone lets through
    cfg = load_config(None, [f"model.name_or_path={huge_dir}", "encode.runner=local", "encode.backend=torch",
                             "encode.precision=fp32"])
    with pytest.raises(NonFiniteError, match=rf"the model {re.escape(str(huge_dir))} gives vectors no index can "
                                             r"score: the vector of the corpus's passage 1 \(of its first 8\) holds "
                                             r"a component of magnitude"):
        encode_corpus(faq, tmp_path / "emb-huge", cfg)
    assert not (tmp_path / "emb-huge").exists()
    emb = random_embeddings(faq, tmp_path / "emb", shard_rows=32, dim=huge.dim)
    build_index(emb, tmp_path / "idx", cfg.index, progress=False)
    with pytest.raises(NonFiniteError, match=r"^query \S+: its vector holds a component of magnitude"):
        retrieve(tmp_path / "idx", faq / "queries.tsv", tmp_path / "run.trec", cfg,
                 model_cfg=ModelConfig(name_or_path=str(huge_dir)), progress=False)
    assert not (tmp_path / "run.trec").exists()
