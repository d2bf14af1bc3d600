"""Encoding pieces without Ray: length-sorted batches with order restored, precision choice,
bf16 against fp32 on real text, shard planning/verification, the resource-shape rule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipeline.config import EncodeConfig, ModelConfig
from pipeline.errors import ConfigError, ResourceError
from pipeline.index.encode import resolve_shape
from pipeline.index.encode_workers import read_slice
from pipeline.index.shards import (completed_shards, pids_digest, plan_part, verify_shards, write_shard)
from pipeline.models import BiEncoder
from pipeline.models.precision import cpu_has_bf16, resolve_precision
from pipeline.models.tokens import CPU_BATCH_TOKENS, CPU_BATCH_TOKENS_ONE_THREAD, batch_bounds, length_order

FAQ = Path(__file__).resolve().parents[2] / "pipeline" / "resources" / "python_faq" / "corpus.jsonl"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from pipeline.models.tiny import build_tiny_bert

    return BiEncoder.load(ModelConfig(name_or_path=str(build_tiny_bert(tmp_path_factory.mktemp("tiny"))),
                                      pooling="mean", normalize=True))


def _texts(n: int = 24) -> list[str]:
    rng = np.random.default_rng(0)
    words = "list dict tuple set loop class module import thread memory".split()
    return [" ".join(rng.choice(words, size=int(rng.integers(1, 90)))) for _ in range(n)]


def test_length_order_is_longest_first_and_stable():
    assert length_order([3, 9, 3, 1, 9]).tolist() == [1, 4, 0, 2, 3]


def test_sorted_batches_give_the_same_vectors_in_input_order(tiny):
    texts = _texts()
    one_by_one = np.concatenate([tiny.embed([t], "doc", precision="fp32") for t in texts])
    for kwargs in ({}, {"sort_by_length": False}, {"window": 7}, {"batch_size": 5, "window": 13}):
        got = tiny.embed(texts, "doc", precision="fp32", **kwargs)
        np.testing.assert_allclose(got, one_by_one, atol=1e-5, err_msg=str(kwargs))
    q = tiny.embed(texts[:9], "query", batch_size=4)
    np.testing.assert_allclose(q, np.concatenate([tiny.embed([t], "query") for t in texts[:9]]), atol=1e-5)
    assert tiny.embed([], "doc").shape == (0, tiny.dim)


def test_each_batch_pads_only_to_its_own_longest_text(tiny, monkeypatch):
    texts = _texts(64)
    lengths = [len(tiny.doc_tokenizer(t, truncation=True, max_length=tiny.cfg.doc_max_length)["input_ids"])
               for t in texts]
    widths: list[tuple[int, int]] = []
    real = tiny.encode_docs

    def spy(batch):
        widths.append((batch["input_ids"].shape[1], int(batch["attention_mask"].sum(1).max())))
        return real(batch)

    monkeypatch.setattr(tiny, "encode_docs", spy)
    tiny.embed(texts, "doc", batch_size=8)
    assert all(w == longest for w, longest in widths)  # no batch wider than its own longest text
    padded_sorted = sum(w * 8 for w, _ in widths)
    assert [w for w, _ in widths] == sorted((w for w, _ in widths), reverse=True)  # longest batches first
    widths.clear()
    tiny.embed(texts, "doc", batch_size=8, sort_by_length=False)
    padded_unsorted = sum(w * 8 for w, _ in widths)
    assert padded_sorted < 0.8 * padded_unsorted
    assert padded_sorted >= sum(lengths)


@pytest.mark.parametrize("seed", range(20))
def test_batch_bounds_keep_both_caps_and_fill_each_batch(seed):
    rng = np.random.default_rng(seed)
    lengths = np.sort(rng.integers(1, 300, size=int(rng.integers(0, 200))))[::-1]
    rows, budget = int(rng.integers(1, 70)), int(rng.choice([0, 1, 64, 512, 4096]))
    bounds = batch_bounds(lengths, rows, budget)
    assert [s for s, _ in bounds] == [0] + [e for _, e in bounds[:-1]]  # contiguous, in order
    assert (bounds[-1][1] if bounds else 0) == len(lengths)  # every row once
    for s, e in bounds:
        assert 1 <= e - s <= rows
        width = int(lengths[s:e].max())
        assert not budget or e - s == 1 or (e - s) * width <= budget  # one row always fits
        if e < len(lengths) and e - s < rows:  # stopped early only where the next row would break the cap
            assert budget and (e - s + 1) * max(width, int(lengths[e])) > budget
    if not budget:
        assert bounds == [(s, min(len(lengths), s + rows)) for s in range(0, len(lengths), rows)]


def test_a_cpu_batch_stops_at_its_padded_token_cap_and_vectors_do_not_change(tiny, monkeypatch):
    texts = _texts(64)
    rows_only = tiny.embed(texts, "doc", batch_size=64, max_tokens=0)
    shapes: list[tuple[int, int]] = []
    real = tiny.encode_docs

    def spy(batch):
        shapes.append(tuple(batch["input_ids"].shape))
        return real(batch)

    monkeypatch.setattr(tiny, "encode_docs", spy)
    capped = tiny.embed(texts, "doc", batch_size=64, max_tokens=256)
    assert len(shapes) > 1 and all(b == 1 or b * w <= 256 for b, w in shapes)
    assert sum(b for b, _ in shapes) == len(texts)
    np.testing.assert_allclose(capped, rows_only, atol=1e-5)
    # on a CPU the default cap follows the threads that run the batches: half on one thread (bench/batching.py)
    kept = torch.get_num_threads()
    try:
        for threads, cap in ((1, CPU_BATCH_TOKENS_ONE_THREAD), (2, CPU_BATCH_TOKENS)):
            torch.set_num_threads(threads)
            shapes.clear()
            tiny.embed(texts, "doc", batch_size=64)
            assert all(b * w <= cap for b, w in shapes) and max(b * w for b, w in shapes) > cap // 2, (threads, shapes)
        # a runner (OpenVINO's tower) runs on its own threads: its cap is theirs, whatever torch's are
        widths: list[tuple[int, int]] = []

        class OneThreadRunner:
            threads = 1

            def __call__(self, batch):
                widths.append(batch["input_ids"].shape)
                return np.ones((len(batch["input_ids"]), tiny.dim), dtype=np.float32)
        tiny.embed(texts, "doc", batch_size=64, runner=OneThreadRunner())
        assert all(b * w <= CPU_BATCH_TOKENS_ONE_THREAD for b, w in widths) and len(widths) > len(shapes)
    finally:
        torch.set_num_threads(kept)


@pytest.mark.parametrize("flags, expected", [
    ("flags\t\t: fpu vme avx2 avx512f avx512_bf16 amx_tile", "bf16"),
    ("flags\t\t: fpu vme amx_bf16 amx_tile", "bf16"),
    ("flags\t\t: fpu vme avx2 avx512f", "fp32"),
    ("", "fp32"),
])
def test_auto_precision_follows_the_cpu_flags(flags, expected):
    cpuinfo = f"processor\t: 0\n{flags}\n"
    assert resolve_precision("auto", "cpu", cpuinfo=cpuinfo) == expected
    assert cpu_has_bf16(cpuinfo) is (expected == "bf16")
    for explicit in ("fp32", "bf16", "fp16"):
        assert resolve_precision(explicit, "cpu", cpuinfo=cpuinfo) == explicit


@pytest.mark.parametrize("cap, bf16, vnni", [
    ("AVX2", False, False), ("avx512_core", False, False), ("AVX512_CORE_VNNI", False, True),
    ("AVX512_CORE_BF16", True, True), ("AVX512_CORE_AMX", True, True), ("ALL", True, True),
    ("no-such-level", True, True), (None, True, True)])
def test_auto_precision_follows_onednn_isa_cap(monkeypatch, cap, bf16, vnni):
    """An AVX512-BF16 CPU with its oneDNN kernels capped below AVX512_CORE_BF16 (ONEDNN_MAX_CPU_ISA, which
    torch and OpenVINO honour) has no native bf16: auto is fp32 there (OpenVINO refuses a bf16 graph)."""
    from pipeline.models.precision import cpu_has_vnni

    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    cpuinfo = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16\n"
    assert cpu_has_bf16(cpuinfo) is bf16 and cpu_has_vnni(cpuinfo) is vnni
    assert resolve_precision("auto", "cpu", cpuinfo=cpuinfo) == ("bf16" if bf16 else "fp32")


def test_unknown_precision_is_a_config_error():
    with pytest.raises(ConfigError, match="precision"):
        resolve_precision("int8", "cpu")


@pytest.mark.slow
def test_bf16_vectors_match_fp32_on_real_text():
    """MiniLM on 50 real FAQ answers: bf16 autocast keeps cosine >= 0.9999 to fp32."""
    docs = [json.loads(line) for line in FAQ.read_text(encoding="utf-8").splitlines()[:50]]
    texts = [d["text"] for d in docs]
    model = BiEncoder.load(ModelConfig(name_or_path="minilm"))
    threads = torch.get_num_threads()
    try:
        fp32 = model.embed(texts, "doc", batch_size=16, precision="fp32")
        bf16 = model.embed(texts, "doc", batch_size=16, precision="bf16")
    finally:
        torch.set_num_threads(threads)
    assert bf16.dtype == np.float32  # stored as float32 whatever the compute precision
    cos = (fp32 * bf16).sum(1) / np.linalg.norm(fp32, axis=1) / np.linalg.norm(bf16, axis=1)
    assert cos.min() >= 0.9999
    assert np.abs(fp32 - bf16).max() > 0  # bf16 really ran


# ---------------------------------------------------------------------- shards


def test_plan_part_slices_and_ties_each_shard_to_its_pids():
    pids = [str(i) for i in range(10)]
    specs = plan_part(3, "corpus/part-00003.parquet", pids, 4)
    assert [(s["start"], s["end"]) for s in specs] == [(0, 4), (4, 8), (8, 10)]
    assert specs[0]["name"] == "shard-00003-000000000" and specs[2]["name"] == "shard-00003-000000008"
    assert specs[1]["pids_sha256"] == pids_digest(pids[4:8]) and specs[1]["part_rows"] == 10
    # the same pids in another part layout give other shards
    other = plan_part(3, "corpus/part-00003.parquet", pids[:8], 4)
    assert other[1]["pids_sha256"] == specs[1]["pids_sha256"] and other[1]["part_rows"] != specs[1]["part_rows"]


def test_verify_shards_finds_missing_wrong_and_foreign_shards(tmp_path):
    pids = [str(i) for i in range(10)]
    specs = plan_part(0, "corpus/part-00000.parquet", pids, 4)
    vecs = np.ones((10, 3), np.float32)
    with pytest.raises(ValueError, match="not the ones planned"):
        write_shard(tmp_path, specs[0], ["0", "1", "2", "99"], vecs[:4])
    for s in specs[:2]:
        write_shard(tmp_path, s, pids[s["start"]:s["end"]], vecs[s["start"]:s["end"]])
    assert verify_shards(tmp_path, specs, 10) == ["shard-00000-000000008 missing"]
    write_shard(tmp_path, specs[2], pids[8:], vecs[8:])
    assert verify_shards(tmp_path, specs, 10) == []
    assert verify_shards(tmp_path, specs, 12) == ["shards hold 10 rows, the manifest 12"]
    assert set(completed_shards(tmp_path)) == {s["name"] for s in specs}
    assert not list(tmp_path.glob(".tmp-*"))

    (tmp_path / "shard-00000-000000004.pids.txt").write_text("4\n5\n6\n66\n")
    assert verify_shards(tmp_path, specs, 10) == ["shard-00000-000000004.pids.txt does not hold the planned pids"]
    relaid = plan_part(0, "corpus/part-00000.parquet", pids + ["10", "11"], 4)
    assert "made from another part layout" in verify_shards(tmp_path, relaid, 12)[0]


def test_read_slice_reads_across_row_groups(tmp_path):
    table = pa.table({"pid": [str(i) for i in range(25)], "title": [""] * 25, "text": [f"t{i}" for i in range(25)]})
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=10)
    for start, end in ((0, 25), (8, 12), (10, 20), (19, 25), (24, 25)):
        got = read_slice(str(tmp_path / "p.parquet"), start, end).column("pid").to_pylist()
        assert got == [str(i) for i in range(start, end)]


# ---------------------------------------------------------------------- resource shapes


@pytest.mark.parametrize("cfg, nodes, gpus, expected", [
    (EncodeConfig(), [2.0], 0, (1, 2.0, 2)),                                  # automatic: the whole node
    (EncodeConfig(), [4.0, 2.0], 0, (3, 2.0, 2)),                             # smallest node's CPUs per actor
    (EncodeConfig(cpus_per_actor=0.5), [2.0], 0, (4, 0.5, 1)),
    (EncodeConfig(num_actors=1, cpus_per_actor=1.5), [2.0], 0, (1, 1.5, 2)),  # hung before: read task starved
    (EncodeConfig(num_actors=2, cpus_per_actor=1.0, torch_threads=3), [2.0], 0, (2, 1.0, 3)),
    (EncodeConfig(gpus_per_actor=1.0), [8.0, 8.0], 4, (4, 1.0, 1)),
])
def test_shapes_that_pack_onto_the_nodes_run(cfg, nodes, gpus, expected):
    assert resolve_shape(cfg, nodes, gpus) == expected


@pytest.mark.parametrize("cfg, nodes, gpus, message", [
    (EncodeConfig(num_actors=2, cpus_per_actor=1.5), [2.0], 0, "at most 1 such actors fit"),
    (EncodeConfig(num_actors=2, cpus_per_actor=1.5), [1.0, 1.0, 1.0], 0, "fits on no node"),
    (EncodeConfig(num_actors=3, cpus_per_actor=1.0), [2.0], 0, "at most 2"),
    (EncodeConfig(num_actors=2, gpus_per_actor=1.0), [8.0], 1, "GPUs"),
])
def test_shapes_that_cannot_run_are_refused_with_what_to_set(cfg, nodes, gpus, message):
    with pytest.raises(ResourceError, match=message) as err:
        resolve_shape(cfg, nodes, gpus)
    assert "encode.num_actors=" in str(err.value) and "encode.cpus_per_actor=" in str(err.value)


@pytest.mark.parametrize("override", ["num_actors=0", "num_actors=-1", "cpus_per_actor=0", "batch_size=0",
                                      "shard_rows=0", "precision=int4", "gpus_per_actor=-1"])
def test_bad_encode_values_are_config_errors(override):
    from pipeline.config import load_config

    with pytest.raises(ConfigError, match=f"encode.{override.split('=')[0]}"):
        load_config(None, [f"encode.{override}"])


def test_a_workers_pipeline_error_reaches_the_driver_as_one():
    from pipeline.errors import PipelineError
    from pipeline.errors import worker_error

    class Wrapped(Exception):  # what Ray hands the driver: the cause only as text
        pass

    text = ("ray::MapWorker(MapBatches(ShardEncoder)).submit() (pid=1)\n  File \"encode.py\", line 103\n"
            "pipeline.errors.PipelineError: shard-00000-000000100: the pids read from part rows 100-200 are not "
            "the ones planned\n\nThe above exception was the direct cause of the following exception:\n"
            "ray.exceptions.UserCodeException: UDF failed to process a data block.")
    err = worker_error(Wrapped(text))
    assert isinstance(err, PipelineError) and str(err).startswith("shard-00000-000000100: the pids read")
    chained = RuntimeError("outer")
    chained.__cause__ = PipelineError("inner reason")
    assert str(worker_error(chained)) == "inner reason"
    assert worker_error(RuntimeError("a plain bug")) is None
