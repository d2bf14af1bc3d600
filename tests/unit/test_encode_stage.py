"""Tokenising off the model's path, without Ray: the CPU stage's arrays give the same shards as
tokenising in the actor; padding from the flat arrays matches the tokenizer's own; the shape
rule leaves the stage its CPUs; SDPA attention is what the loader gets; shards on URIs."""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipeline.config import EncodeConfig, ModelConfig
from pipeline.errors import ResourceError
from pipeline.index.encode import resolve_shape, resolve_tokenize
from pipeline.index.encode_workers import ShardEncoder, TokenizeSpec, tokenize_shards
from pipeline.index.shards import (completed_shards, iter_shards, load_meta, location, npy_shape, plan_part, remove_shard,
                                   shard_shapes, stray_files, verify_shards, write_json, write_shard)
from pipeline.models import BiEncoder
from pipeline.models.tokens import padded_batch, tokenize_sorted
from pipeline.storage_io import remove

WORDS = "list dict tuple set loop class module import thread memory".split()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from pipeline.models.tiny import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return BiEncoder.load(ModelConfig(name_or_path=str(tiny_dir), pooling="mean", normalize=True))


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 80))) for _ in range(n)]


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batches_from_the_flat_arrays_equal_the_tokenizers_padding(tiny, side):
    tok = tiny.doc_tokenizer
    old = tok.padding_side
    tok.padding_side = side
    try:
        texts = _texts(13)
        toks = tokenize_sorted(tok, texts, "", 64)
        assert toks["ids"].dtype == np.int32 and toks["lengths"].tolist() == sorted(toks["lengths"], reverse=True)
        offsets = np.concatenate([[0], np.cumsum(toks["lengths"])])
        for s, e in ((0, 5), (5, 10), (10, 13)):
            got = padded_batch(toks, offsets, s, e, tok.pad_token_id, left=side == "left")
            ref = tok([texts[i] for i in toks["order"][s:e]], padding=True, truncation=True, max_length=64,
                      return_tensors="np")
            for k in ("input_ids", "attention_mask", "token_type_ids"):
                np.testing.assert_array_equal(got[k], ref[k], err_msg=f"{k} rows {s}-{e} ({side} padding)")
    finally:
        tok.padding_side = old


def test_embed_tokens_is_embed_in_input_order(tiny):
    texts = _texts(30)
    tok, prefix, max_len = tiny.token_spec("doc")
    toks = tokenize_sorted(tok, texts, prefix, max_len)
    got = tiny.embed_tokens(toks, "doc", batch_size=7, precision="fp32")
    one_by_one = np.concatenate([tiny.embed([t], "doc", precision="fp32") for t in texts])
    np.testing.assert_allclose(got, one_by_one, atol=1e-5)


def _part(tmp_path, n=40):
    texts = _texts(n, seed=3)
    table = pa.table({"pid": [f"p{i}" for i in range(n)], "title": [""] * n, "text": texts})
    path = tmp_path / "part-00000.parquet"
    pq.write_table(table, path, row_group_size=16)
    specs = plan_part(0, "part-00000.parquet", table.column("pid").to_pylist(), 15)
    for s in specs:
        s["path"] = str(path)
    return specs


def _batch(spec: dict) -> dict:
    from pipeline.index.encode_workers import SPEC_KEYS

    return {k: np.array([spec[k]]) for k in SPEC_KEYS}


def test_the_tokenising_stage_gives_the_same_shards_as_tokenising_in_the_actor(tiny, tiny_dir, tmp_path):
    """The stage's output (after a pickle round trip, as Ray ships it) makes the actor write the
    very same vectors and ids as an actor that reads and tokenises the slice itself."""
    specs = _part(tmp_path)
    model_cfg = {"name_or_path": str(tiny_dir), "pooling": "mean", "normalize": True}
    tok, prefix, max_len = tiny.token_spec("doc")
    spec = pickle.loads(pickle.dumps(TokenizeSpec(tok, prefix, max_len, " ")))
    threads = torch.get_num_threads()
    try:
        outs = {}
        for mode in ("actor", "stage"):
            out = tmp_path / mode
            out.mkdir()  # encode_corpus makes the folder before the actors start
            enc = ShardEncoder(model_cfg, " ", 1, "fp32", 4, "float32", str(out))
            for s in specs:
                batch = _batch(s)
                if mode == "stage":
                    batch = pickle.loads(pickle.dumps(tokenize_shards(batch, spec)))
                    assert set(batch) >= {"ids", "lengths", "order", "pids"}
                receipt = enc(batch)
                assert set(receipt) == {"name", "rows", "seconds"} and receipt["rows"].tolist() == [s["end"] - s["start"]]
            write_json(out / "embeddings.json", {"shard_names": [s["name"] for s in specs], "complete": True})
            assert verify_shards(out, specs, 40) == []
            outs[mode] = list(iter_shards(out))
            assert {json.loads((out / f"{s['name']}.done").read_text())["tokenize"] for s in specs} == {mode}
    finally:
        torch.set_num_threads(threads)
    for (pa_, va), (ps, vs) in zip(outs["actor"], outs["stage"]):
        assert pa_ == ps
        np.testing.assert_array_equal(np.asarray(va), np.asarray(vs))
    assert [p for ids, _ in outs["stage"] for p in ids] == [f"p{i}" for i in range(40)]


def test_the_stage_checks_the_pids_before_tokenising(tiny, tmp_path):
    from pipeline.errors import PipelineError

    spec = _part(tmp_path)[1]
    spec["pids_sha256"] = "0" * 64
    tok, prefix, max_len = tiny.token_spec("doc")
    with pytest.raises(PipelineError, match="not the ones planned"):
        tokenize_shards(_batch(spec), TokenizeSpec(tok, prefix, max_len, " "))


# ---------------------------------------------------------------------- shapes with a tokenising stage


@pytest.mark.parametrize("cfg, nodes, gpus, mode, expected", [
    (EncodeConfig(), [2.0], 0, "actor", (1, 2.0, 2)),                              # CPU default: in the actor
    (EncodeConfig(tokenize="stage"), [2.0], 0, "stage", (1, 1.5, 2)),             # the stage keeps 0.5 CPU
    (EncodeConfig(tokenize="stage"), [1.0, 1.0], 0, "stage", (2, 0.5, 1)),        # one actor per node
    (EncodeConfig(tokenize="stage", cpus_per_actor=0.5), [2.0], 0, "stage", (3, 0.5, 1)),
    (EncodeConfig(gpus_per_actor=1.0), [8.0, 8.0], 4, "stage", (4, 1.0, 1)),     # GPU default: a stage
    (EncodeConfig(gpus_per_actor=1.0, tokenize="actor"), [8.0], 1, "actor", (1, 1.0, 1)),
])
def test_a_tokenising_stage_gets_its_cpus_on_every_node(cfg, nodes, gpus, mode, expected):
    assert resolve_tokenize(cfg) == mode
    actors, cpus, threads = resolve_shape(cfg, nodes, gpus)
    assert (actors, cpus, threads) == expected
    if mode == "stage":  # wherever Ray puts the actors, some node keeps room for one tokenising task
        assert actors * cpus <= sum(nodes) - len(nodes) * cfg.tokenize_cpus + 1e-9


@pytest.mark.parametrize("cfg, nodes, message", [
    (EncodeConfig(tokenize="stage", num_actors=2, cpus_per_actor=1.0), [2.0], "at most 1 such actors fit"),
    (EncodeConfig(tokenize="stage", cpus_per_actor=2.0), [2.0], "fits on no node"),
    (EncodeConfig(tokenize="stage", tokenize_cpus=1.0), [1.0, 1.0], "leaves no CPU"),
])
def test_shapes_that_starve_the_stage_are_refused(cfg, nodes, message):
    with pytest.raises(ResourceError, match=message) as err:
        resolve_shape(cfg, nodes, 0)
    assert "encode.tokenize" in str(err.value)


def test_the_loader_uses_sdpa_attention(tiny):
    """transformers 5.x picks SDPA by default for BERT (falling back to eager only where SDPA
    cannot run); BiEncoder.load keeps that."""
    assert tiny.doc_encoder.config._attn_implementation == "sdpa"


# ---------------------------------------------------------------------- shards on storage URIs


def _write_all(out, specs, pids, vecs):
    for s in specs:
        write_shard(out, s, pids[s["start"]:s["end"]], vecs[s["start"]:s["end"]], precision="fp32")


def test_shards_on_an_object_store_are_complete_or_absent(tmp_path):
    from s3_emulator import make_bucket, uri

    out = uri(make_bucket(), "emb")
    pids = [str(i) for i in range(10)]
    specs = plan_part(0, "part-00000.parquet", pids, 4)
    vecs = np.arange(30, dtype=np.float32).reshape(10, 3)
    _write_all(out, specs[:2], pids, vecs)
    assert verify_shards(out, specs, 10) == ["shard-00000-000000008 missing"]
    _write_all(out, specs[2:], pids, vecs)
    write_json(location(out) / "embeddings.json",
               {"shard_names": [s["name"] for s in specs], "complete": True, "dim": 3})
    assert verify_shards(out, specs, 10) == [] and set(completed_shards(out)) == {s["name"] for s in specs}
    assert load_meta(out)["complete"] is True
    got = list(iter_shards(out))
    assert [p for ids, _ in got for p in ids] == pids
    np.testing.assert_array_equal(np.concatenate([v for _, v in got]), vecs)
    assert [(n, k, sh) for n, k, sh in shard_shapes(out)] == [(s["name"], s["end"] - s["start"],
                                                               (s["end"] - s["start"], 3)) for s in specs]
    # a shard without its marker is ignored and swept as a stray; removal takes the marker first
    remove_shard(out, specs[1]["name"])
    assert verify_shards(out, specs, 10) == ["shard-00000-000000004 missing"]
    keep = {specs[0]["name"], specs[2]["name"]}
    assert stray_files(out, keep) == []
    (location(out) / "shard-00000-000000004.npy").write_bytes(b"half")
    assert [p.name for p in stray_files(out, keep)] == ["shard-00000-000000004.npy"]
    # a marker's writer killed inside `atomic_path` leaves a folder; removing what is already gone is no error
    tmp_dir = location(out) / ".tmp-shard-00000-000000004.done-999999-0badc0de"
    tmp_dir.mkdir()
    (tmp_dir / "shard-00000-000000004.done").write_text("{")
    strays = stray_files(out, keep)
    assert sorted(p.name for p in strays) == [tmp_dir.name, "shard-00000-000000004.npy"]
    for p in strays + strays:
        remove(p)
    assert stray_files(out, keep) == [] and set(completed_shards(out)) == keep


def test_shards_on_a_file_uri_are_a_local_folder(tmp_path):
    pids = [str(i) for i in range(6)]
    specs = plan_part(0, "part-00000.parquet", pids, 4)
    (tmp_path / "emb").mkdir()
    _write_all(f"file://{tmp_path}/emb", specs, pids, np.ones((6, 2), np.float32))
    assert sorted(p.name for p in (tmp_path / "emb").glob("*.done")) == [f"{s['name']}.done" for s in specs]
    assert npy_shape(tmp_path / "emb" / f"{specs[0]['name']}.npy") == (4, 2)
    assert not list((tmp_path / "emb").glob(".tmp-*"))
    # a killed marker writer's temporary folder, on a local folder too
    stray = tmp_path / "emb" / f".tmp-{specs[0]['name']}.done-999999-0badc0de"
    stray.mkdir()
    (stray / f"{specs[0]['name']}.done").write_text("{")
    found = stray_files(tmp_path / "emb", {s["name"] for s in specs})
    assert found == [stray]
    remove(found[0])
    remove(found[0])
    assert not stray.exists() and set(completed_shards(tmp_path / "emb")) == {s["name"] for s in specs}


def test_an_encoder_built_outside_ray_starts_no_ray(tiny_dir, tmp_path):
    # ShardEncoder used in-process (tests, a plain loop) must not start a Ray node as a side effect
    import ray

    if ray.is_initialized():  # the session's Ray (integration tests ran first in this process)
        pytest.skip("Ray already runs in this test process")
    enc = ShardEncoder({"name_or_path": str(tiny_dir), "pooling": "mean", "normalize": True}, " ", 1, "fp32", 4,
                       "float32", str(tmp_path))
    assert enc.node is None and not ray.is_initialized()


def test_the_runner_is_local_unless_something_asks_for_ray(monkeypatch):
    """encode.runner=auto: one CPU encoder in the command's own process, unless a cluster (ray.address,
    RAY_ADDRESS), a Ray already running here (Tune, recipes), several or GPU actors, a tokenising stage
    or a CUDA device asks for Ray; an explicit runner is kept."""
    import sys
    import types

    import torch

    from pipeline.config import EncodeConfig, RayConfig
    from pipeline.index.encode import resolve_runner

    running = types.SimpleNamespace(is_initialized=lambda: False)
    monkeypatch.setitem(sys.modules, "ray", running)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    auto, ray_cfg = EncodeConfig(), RayConfig()
    assert resolve_runner(auto, ray_cfg) == "local"
    assert resolve_runner(EncodeConfig(runner="ray"), ray_cfg) == "ray"
    assert resolve_runner(auto, RayConfig(address="auto")) == "ray"
    for enc in (EncodeConfig(num_actors=2), EncodeConfig(gpus_per_actor=1), EncodeConfig(tokenize="stage")):
        assert resolve_runner(enc, ray_cfg) == "ray"
    assert resolve_runner(EncodeConfig(num_actors=1, cpus_per_actor=1), ray_cfg) == "local"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert resolve_runner(auto, ray_cfg) == "ray"
    monkeypatch.delenv("RAY_ADDRESS")
    running.is_initialized = lambda: True
    assert resolve_runner(auto, ray_cfg) == "ray"
    running.is_initialized = lambda: False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_runner(auto, ray_cfg) == "ray"
