"""Encoding guarantees on local Ray (tiny BERT, a few hundred passages): shards tied to the
part layout, `complete` only when every pid is there exactly once, progress durable
whatever the block layout, and every resource shape either runs or is refused up front."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from fixtures import SimulatedKill, assert_cpus_freed, kill_after, random_collection, watch_resume

from pipeline.config import load_config
from pipeline.data.ingest import ingest
from pipeline.errors import ResourceError
from pipeline.index import encode as encode_mod
from pipeline.index.encode import encode_corpus
from pipeline.index.shards import completed_shards, iter_shards

pytestmark = pytest.mark.integration

N = 300


@pytest.fixture(scope="module")
def collection(tmp_path_factory) -> Path:
    # lengths from 3 to 120 words: length sorting matters, order must come back
    path = tmp_path_factory.mktemp("enc") / "collection.tsv"
    random_collection(path, N, seed=1)
    return path


def _cfg(model_dir, *extra):
    return load_config(None, [f"model.name_or_path={model_dir}", "model.pooling=mean", "model.normalize=true",
                              "encode.batch_size=16", "encode.show_progress=false", *extra])


def _all_pids(emb) -> list[str]:
    return [p for ids, _ in iter_shards(emb) for p in ids]


def test_reingest_with_other_part_rows_is_reencoded_never_complete_with_missing_pids(
        ray_session, tiny_model_dir, collection, tmp_path, monkeypatch):
    """Issue 7: encode with 40-row parts, kill, re-ingest the same file with 100-row parts
    (same fingerprint), encode again: every pid exactly once, no shard of the old layout used."""
    corpus, emb = tmp_path / "corpus", tmp_path / "emb"
    ingest([collection], "msmarco", corpus, part_rows=40, progress=False)
    cfg = _cfg(tiny_model_dir, "encode.num_actors=1", "encode.cpus_per_actor=1")
    kill_after(monkeypatch, 3)
    with pytest.raises(SimulatedKill):
        encode_corpus(corpus, emb, cfg)
    old = completed_shards(emb)
    assert len(old) >= 3
    fp = json.loads((corpus / "manifest.json").read_text())["fingerprint"]

    ingest([collection], "msmarco", corpus, part_rows=100, overwrite=True, progress=False)
    assert json.loads((corpus / "manifest.json").read_text())["fingerprint"] == fp  # same corpus, new layout
    monkeypatch.setattr(encode_mod, "_report_shard", lambda name, rows: None)
    summary = encode_corpus(corpus, emb, cfg)
    # shard-00000 of the old layout (pids 0-39) is not shard-00000 of the new one (pids 0-99)
    assert summary["reused_shards"] == 0 and summary["encoded"] == N and summary["shards"] == 3
    pids = _all_pids(emb)
    assert sorted(pids, key=int) == [str(i) for i in range(N)]
    assert json.loads((emb / "embeddings.json").read_text())["complete"] is True
    assert set(completed_shards(emb)) == set(json.loads((emb / "embeddings.json").read_text())["shard_names"])

    # and the other way round after a complete encode: 100-row parts -> 40-row parts
    ingest([collection], "msmarco", corpus, part_rows=40, overwrite=True, progress=False)
    summary = encode_corpus(corpus, emb, cfg)
    assert summary["encoded"] == N and summary["shards"] == 8
    assert sorted(_all_pids(emb), key=int) == [str(i) for i in range(N)]
    assert len(list(emb.glob("shard-*.npy"))) == 8  # the 3 shards of the other layout are gone


def test_one_part_kill_keeps_finished_shards(ray_session, tiny_model_dir, collection, tmp_path, monkeypatch):
    """Issue 7: one part (one Ray block in the old design) encoded into 40-row shards: a kill
    after 2 shards keeps them, and the rerun encodes only the rest."""
    corpus, emb = tmp_path / "corpus", tmp_path / "emb"
    ingest([collection], "msmarco", corpus, part_rows=N, progress=False)
    cfg = _cfg(tiny_model_dir, "encode.num_actors=1", "encode.cpus_per_actor=2", "encode.shard_rows=40")
    kill_after(monkeypatch, 2)
    with pytest.raises(SimulatedKill):
        encode_corpus(corpus, emb, cfg)
    kept = completed_shards(emb)
    assert 2 <= len(kept) < 8
    assert not json.loads((emb / "embeddings.json").read_text())["complete"]

    monkeypatch.setattr(encode_mod, "_report_shard", lambda name, rows: None)
    found = watch_resume(monkeypatch)  # an actor may finish its shard after the kill: reuse what is there then
    summary = encode_corpus(corpus, emb, cfg)
    assert set(kept) <= set(found)
    assert summary["reused_shards"] == len(found) and summary["encoded"] == N - 40 * len(found)
    # the summary splits the wall time: start-up (Ray, actors, model loads) and encoding
    assert summary["startup_seconds"] >= 0 and summary["encoding_seconds"] > 0 and summary["encoding_rows_per_s"] > 0
    # and names the precision the actors computed in (`auto` resolved on this CPU), as embeddings.json does
    from pipeline.models.precision import resolve_precision

    want = resolve_precision(cfg.encode.precision, "cpu")
    assert summary["precision"] == want
    assert json.loads((emb / "embeddings.json").read_text())["precision_resolved"] == want
    pids = _all_pids(emb)
    assert pids == [str(i) for i in range(N)]  # corpus order, each once

    # the shards equal one plain in-process encoding of the corpus (order restored after sorting)
    from pipeline.models import BiEncoder

    model = BiEncoder.load(cfg.model)
    texts = [line.split("\t")[1] for line in collection.read_text().splitlines()]
    ref = model.embed(texts, "doc", precision="fp32", sort_by_length=False, batch_size=1)
    got = np.concatenate([np.asarray(v) for _, v in iter_shards(emb)])
    cos = (got * ref).sum(1)
    assert cos.min() > 0.999  # default precision may be bf16 here; order must match row by row

    # a complete shard damaged afterwards (its .npy cut short) is found and encoded again, alone
    npy = sorted(emb.glob("shard-*.npy"))[3]
    npy.write_bytes(npy.read_bytes()[:-64])
    summary = encode_corpus(corpus, emb, cfg)
    assert summary["encoded"] == 40 and summary["reused_shards"] == summary["shards"] - 1
    again = np.concatenate([np.asarray(v) for _, v in iter_shards(emb)])
    np.testing.assert_allclose(again, got, atol=1e-5)  # the same shard from the same model


def _run_with_deadline(fn, seconds: float):
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(seconds)
    assert not th.is_alive(), f"still running after {seconds}s: this shape hangs"
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_every_accepted_shape_runs_and_the_rest_is_refused_up_front(ray_session, tiny_model_dir, collection,
                                                                    tmp_path):
    """Issue 7: encode.cpus_per_actor=1.5 used to hang on 2 cores. Shapes that pack onto the
    2-CPU node run to the end; shapes that cannot are refused before any work."""
    corpus = tmp_path / "corpus"
    ingest([collection], "msmarco", corpus, part_rows=100, progress=False)
    for i, shape in enumerate([("encode.num_actors=1", "encode.cpus_per_actor=1.5"),
                               ("encode.num_actors=2", "encode.cpus_per_actor=1"),
                               ()]):  # automatic: the whole node
        cfg = _cfg(tiny_model_dir, "encode.shard_rows=100", *shape)
        summary = _run_with_deadline(lambda: encode_corpus(corpus, tmp_path / f"emb{i}", cfg), 120)
        assert summary["encoded"] == N
        assert sorted(_all_pids(tmp_path / f"emb{i}"), key=int) == [str(j) for j in range(N)]
    assert summary["actors"] == 1 and summary["cpus_per_actor"] == 2 and summary["torch_threads"] == 2

    for shape, message in ((("encode.num_actors=2", "encode.cpus_per_actor=1.5"), "at most 1 such actors fit"),
                           (("encode.cpus_per_actor=3",), "fits on no node"),
                           (("encode.num_actors=5", "encode.cpus_per_actor=0.5"), "at most 4"),
                           (("encode.gpus_per_actor=1",), "GPUs")):
        with pytest.raises(ResourceError, match=message) as err:
            encode_corpus(corpus, tmp_path / "refused", _cfg(tiny_model_dir, *shape))
        assert "encode.num_actors" in str(err.value)  # says what to set
        assert not list((tmp_path / "refused").glob("shard-*"))


def test_a_part_changed_under_the_run_is_an_error_not_a_wrong_shard(ray_session, tiny_model_dir, collection,
                                                                     tmp_path, monkeypatch):
    """The actor checks the pids it reads against the plan: a corpus changed between planning
    and encoding fails with a clear PipelineError (not a traceback), writes no shard for it,
    and never marks the set complete."""
    from pipeline.errors import PipelineError

    corpus, emb = tmp_path / "corpus", tmp_path / "emb"
    ingest([collection], "msmarco", corpus, part_rows=N, progress=False)
    real_plan = encode_mod.plan_shards

    def stale_plan(*a, **k):
        specs = real_plan(*a, **k)
        specs[1]["pids_sha256"] = "0" * 64  # as if the part held other pids when it was planned
        return specs

    monkeypatch.setattr(encode_mod, "plan_shards", stale_plan)
    cfg = _cfg(tiny_model_dir, "encode.num_actors=1", "encode.cpus_per_actor=1", "encode.shard_rows=100")
    with pytest.raises(PipelineError, match="not the ones planned") as info:
        encode_corpus(corpus, emb, cfg)
    assert "shard-00000-000000100" not in completed_shards(emb)
    # the error chains nothing of Ray's: a caller keeping it (as `info` does) does not keep the
    # actor pool alive, and every CPU is free again for the next encode
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert_cpus_freed()
    # never complete: incomplete where a shard finished first, else gone with the folder this run made
    meta = emb / "embeddings.json"
    assert not json.loads(meta.read_text())["complete"] if meta.exists() else not completed_shards(emb)


def test_a_disk_that_fills_keeps_the_finished_shards_and_the_rerun_resumes(
        ray_session, tiny_model_dir, collection, tmp_path, monkeypatch):
    """Encoding into a small tmpfs: a clear error when it fills, every finished shard kept (and
    complete), and once there is room the re-run reuses them and encodes only the rest."""
    import subprocess

    from pipeline.errors import PipelineError

    mnt = tmp_path / "small"
    mnt.mkdir()
    # 300 x 32 float32 = 38 KB of vectors + ids + markers: 24 KB fills part way
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        corpus, emb = tmp_path / "corpus", mnt / "emb"
        ingest([collection], "msmarco", corpus, part_rows=100, progress=False)
        cfg = _cfg(tiny_model_dir, "encode.num_actors=1", "encode.cpus_per_actor=1", "encode.shard_rows=20")
        with pytest.raises(PipelineError, match="No space left on device") as e:
            encode_corpus(corpus, emb, cfg)
        assert "Traceback" not in str(e.value)
        # the actor that hit the full disk left, though `e` (and its traceback) is kept
        assert_cpus_freed()
        kept = completed_shards(emb)
        assert kept, "no shard finished before the disk filled: make the tmpfs bigger"
        assert not (emb / "embeddings.json").exists() or not json.loads((emb / "embeddings.json").read_text()).get(
            "complete")
        subprocess.run(["mount", "-o", "remount,size=4m", str(mnt)], check=True)
        found = watch_resume(monkeypatch)
        encode_corpus(corpus, emb, cfg)
        assert set(found) == set(kept) and json.loads((emb / "embeddings.json").read_text())["complete"]
        pids = _all_pids(emb)
        assert len(pids) == len(set(pids)) == N
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_the_local_runner_writes_the_ray_runners_shards_and_resumes_exactly_after_a_kill(
        ray_session, tiny_model_dir, collection, tmp_path, monkeypatch):
    """encode.runner=local: one encoder in this process (no Ray start, no actor) writes the shards
    the Ray runner writes (same names, ids and vectors), and a killed local run resumes with exactly
    the shards complete at the kill (nothing runs on after it) and encodes only the rest."""
    import numpy as np

    corpus = tmp_path / "corpus"
    ingest([collection], "msmarco", corpus, part_rows=100, progress=False)
    shards = "encode.shard_rows=40"
    by_ray = encode_corpus(corpus, tmp_path / "ray", _cfg(tiny_model_dir, shards, "encode.num_actors=1",
                                                          "encode.cpus_per_actor=1"))
    cfg = _cfg(tiny_model_dir, shards, "encode.runner=local", "encode.torch_threads=1")
    kill_after(monkeypatch, 3)
    with pytest.raises(SimulatedKill):
        encode_corpus(corpus, tmp_path / "local", cfg)
    kept = completed_shards(tmp_path / "local")
    assert len(kept) == 3
    monkeypatch.setattr(encode_mod, "_report_shard", lambda name, rows: None)
    found = watch_resume(monkeypatch)
    local = encode_corpus(corpus, tmp_path / "local", cfg)
    assert set(found) == set(kept) and local["reused_shards"] == 3 and local["runner"] == "local"
    assert local["encoded"] == N - sum(m["rows"] for m in kept.values()) and local["startup_seconds"] >= 0
    assert by_ray["runner"] == "ray" and local["shards"] == by_ray["shards"]
    assert _all_pids(tmp_path / "local") == _all_pids(tmp_path / "ray")
    va = np.concatenate([v for _, v in iter_shards(tmp_path / "ray")])
    vb = np.concatenate([v for _, v in iter_shards(tmp_path / "local")])
    np.testing.assert_allclose(va, vb, rtol=0, atol=1e-6)
    assert set(completed_shards(tmp_path / "local")) == set(completed_shards(tmp_path / "ray"))


def test_the_local_runner_refuses_what_only_ray_does(tiny_model_dir, collection, tmp_path):
    from pipeline.errors import ConfigError

    corpus = tmp_path / "corpus"
    ingest([collection], "msmarco", corpus, progress=False)
    for extra in ("encode.num_actors=2", "encode.gpus_per_actor=1", "encode.tokenize=stage"):
        with pytest.raises(ConfigError, match=f"{extra.split('=')[0]}.*need encode.runner=ray"):
            encode_corpus(corpus, tmp_path / "emb", _cfg(tiny_model_dir, "encode.runner=local", extra))
        assert not (tmp_path / "emb").exists()


def test_the_openvino_backend_writes_torchs_vectors_and_says_so(ray_session, tiny_model_dir, collection, tmp_path,
                                                                monkeypatch, capsys):
    """encode.backend: the Ray actors and the local encoder with OpenVINO write the vectors torch writes
    (fp32: within 1e-5), and embeddings.json and the summary name the backend and precision used; the encode that
    made the model's export says what it cost, once, and the next one does not pay it."""
    import numpy as np

    import pipeline.index.encode as encode_mod

    pytest.importorskip("openvino")
    monkeypatch.setenv("PIPELINE_EXPORT_CACHE", str(tmp_path / "exports"))  # empty: a new machine
    # this small corpus counts as one that pays for the export (the cost rule has its own test below)
    monkeypatch.setattr(encode_mod, "EXPORT_FROM_PASSAGES", {"bf16": 1, "fp32": 1})
    corpus = tmp_path / "corpus"
    ingest([collection], "msmarco", corpus, part_rows=100, progress=False)
    common = ("encode.shard_rows=40", "encode.precision=fp32")
    ref = encode_corpus(corpus, tmp_path / "torch", _cfg(tiny_model_dir, *common, "encode.backend=torch",
                                                         "encode.runner=local"))
    assert ref["backend"] == "torch"
    va = np.concatenate([v for _, v in iter_shards(tmp_path / "torch")])
    made = "the model's OpenVINO export was made when these shards were encoded, once, in "
    for runner in ("local", "ray"):
        out = tmp_path / f"ov-{runner}"
        extra = ("encode.num_actors=1", "encode.cpus_per_actor=1") if runner == "ray" else ()
        capsys.readouterr()
        got = encode_corpus(corpus, out, _cfg(tiny_model_dir, *common, "encode.backend=auto",
                                              f"encode.runner={runner}", *extra))
        assert got["backend"] == "openvino" and got["precision"] == "fp32" and got["runner"] == runner
        said = capsys.readouterr().out
        if runner == "local":  # this process's first encode on an empty export cache made the export, and says so
            assert made in said and "a later encode of this model does not pay it" in said, said
        meta = json.loads((out / "embeddings.json").read_text())
        assert (meta["backend"], meta["backend_resolved"], meta["precision_resolved"]) == ("auto", "openvino", "fp32")
        assert all(m["backend"] == "openvino" for m in completed_shards(out).values())
        assert _all_pids(out) == _all_pids(tmp_path / "torch")
        np.testing.assert_allclose(np.concatenate([v for _, v in iter_shards(out)]), va, rtol=0, atol=1e-5)
    capsys.readouterr()
    again = encode_corpus(corpus, tmp_path / "ov-again", _cfg(tiny_model_dir, *common, "encode.runner=local"))
    assert again["backend"] == "openvino" and made not in capsys.readouterr().out  # read from the cache: not made again


def test_auto_makes_the_export_only_for_a_corpus_that_pays_for_it(tiny_model_dir, collection, tmp_path,
                                                                    monkeypatch, capsys):
    """encode.backend=auto on an empty export cache: a corpus with fewer passages to encode than pay for the
    model's OpenVINO export runs torch, says why and makes no export; one with enough makes it (and says what it
    cost); once it is cached, the small corpus runs OpenVINO too, with nothing to pay and no note."""
    import pipeline.index.encode as encode_mod

    pytest.importorskip("openvino")
    cache = tmp_path / "exports"
    monkeypatch.setenv("PIPELINE_EXPORT_CACHE", str(cache))  # empty: a new machine
    corpus = tmp_path / "corpus"
    ingest([collection], "msmarco", corpus, part_rows=100, progress=False)
    rows = json.loads((corpus / "manifest.json").read_text())["rows"]
    monkeypatch.setattr(encode_mod, "EXPORT_FROM_PASSAGES", {"bf16": rows + 1, "fp32": rows + 1})
    common = ("encode.shard_rows=40", "encode.precision=fp32", "encode.runner=local")
    capsys.readouterr()
    small = encode_corpus(corpus, tmp_path / "small", _cfg(tiny_model_dir, *common))
    said = capsys.readouterr().out
    assert small["backend"] == "torch", said
    assert (f"[encode] note: torch used: {rows:,} passages to encode in fp32 are fewer than the {rows + 1:,} from "
            "which the model's OpenVINO export") in said and "encode.backend=openvino makes it now" in said, said
    meta = json.loads((tmp_path / "small" / "embeddings.json").read_text())
    assert (meta["backend"], meta["backend_resolved"]) == ("auto", "torch") and "torch used" in meta["backend_notes"][0]
    assert not (cache / "openvino").exists()  # nothing exported
    monkeypatch.setattr(encode_mod, "EXPORT_FROM_PASSAGES", {"bf16": rows, "fp32": rows})  # now it pays
    big = encode_corpus(corpus, tmp_path / "big", _cfg(tiny_model_dir, *common))
    said = capsys.readouterr().out
    assert big["backend"] == "openvino" and "the model's OpenVINO export was made" in said and "torch used" not in said
    monkeypatch.setattr(encode_mod, "EXPORT_FROM_PASSAGES", {"bf16": rows + 1, "fp32": rows + 1})
    cached = encode_corpus(corpus, tmp_path / "cached", _cfg(tiny_model_dir, *common))
    said = capsys.readouterr().out
    assert cached["backend"] == "openvino" and "[encode] note" not in said, said  # cached: nothing to pay


def test_int8_is_an_opt_in_of_the_openvino_backend(tiny_model_dir, collection, tmp_path):
    """encode.precision=int8: refused with the torch backend before anything is written; otherwise the
    tower quantised on the corpus's first passages, said in embeddings.json, near the fp32 vectors."""
    import numpy as np

    from pipeline.errors import ConfigError

    pytest.importorskip("nncf")
    corpus = tmp_path / "corpus"
    ingest([collection], "msmarco", corpus, part_rows=100, progress=False)
    with pytest.raises(ConfigError, match="int8 runs in OpenVINO"):
        encode_corpus(corpus, tmp_path / "refused", _cfg(tiny_model_dir, "encode.precision=int8", "encode.backend=torch"))
    assert not (tmp_path / "refused").exists()
    common = ("encode.shard_rows=40", "encode.runner=local")
    ref = encode_corpus(corpus, tmp_path / "fp32", _cfg(tiny_model_dir, *common, "encode.precision=fp32"))
    got = encode_corpus(corpus, tmp_path / "int8", _cfg(tiny_model_dir, *common, "encode.precision=int8"))
    assert (got["backend"], got["precision"], ref["precision"]) == ("openvino", "int8", "fp32")
    meta = json.loads((tmp_path / "int8" / "embeddings.json").read_text())
    assert (meta["precision"], meta["precision_resolved"], meta["backend_resolved"]) == ("int8", "int8", "openvino")
    a = np.concatenate([v for _, v in iter_shards(tmp_path / "fp32")])
    b = np.concatenate([v for _, v in iter_shards(tmp_path / "int8")])
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert _all_pids(tmp_path / "int8") == _all_pids(tmp_path / "fp32") and cos.mean() >= 0.99
