"""ANCE on an object store (moto's S3 server on 127.0.0.1): checkpoints read from, and negatives
versions published to, s3:// URIs; the trainer's provider polls them. Without Ray."""

from __future__ import annotations

import pytest
from s3_emulator import make_bucket, uri

from pipeline import storage



def _upload_checkpoint(tmp_path, run, step, model, cut: bool = False):
    """A checkpoint as Ray would persist it; `cut`: state.json there but a listed file missing."""
    from pipeline.models.checkpoint import finalize_checkpoint

    d = tmp_path / f"step-{step:08d}"
    model.save(d / "model")
    finalize_checkpoint(d, {"step": step})
    if cut:
        (d / "model" / "model.safetensors").unlink()
    storage.upload_dir(d, run / d.name, marker="state.json")


def test_versions_on_s3_publish_list_load_prune(faq):
    from pipeline.data.negatives import MARKER, VersionedNegatives, list_versions, publish_version, version_dir
    from pipeline.errors import PipelineError

    import pyarrow.parquet as pq

    from pipeline.data.manifest import load_manifest

    part = load_manifest(faq)["parts"][0]["file"]
    p = pq.read_table(faq / part, columns=["pid"])["pid"].to_pylist()[:4]
    root = uri(make_bucket(), "run/negatives")
    prov = VersionedNegatives(root, faq)
    assert prov.latest_version() is None
    publish_version(root, 1, {"q1": [p[0], p[1]], "q2": [p[2]]}, {"checkpoint_step": 10})
    # a half-published version (data, no marker) is never listed or loaded
    half = version_dir(root, 2)
    (half / "meta.json").write_text("{}")
    assert list_versions(root) == [1] and prov.latest_version() == 1
    with pytest.raises(PipelineError, match="incomplete"):
        prov.load(2)
    v = prov.load(1)
    assert v.meta["checkpoint_step"] == 10 and len(v.get("q1")) == 2
    for n in (2, 3, 4):  # 2 replaces the half-written folder; only the newest 2 stay
        publish_version(root, n, {"q1": [p[3]]}, {"checkpoint_step": 10 * n}, keep=2)
    assert list_versions(root) == [3, 4] and not version_dir(root, 1).exists()
    assert (version_dir(root, 4) / MARKER).exists()
    with pytest.raises(PipelineError, match="never overwritten"):
        publish_version(root, 4, {"q1": [p[3]]}, {})
    import pickle

    assert pickle.loads(pickle.dumps(prov)).load(4).get("q1")  # what a Ray worker gets


@pytest.mark.slow
def test_refresher_reads_s3_checkpoints_and_publishes_s3_versions(tmp_path, tiny_model_dir, faq):
    from pipeline.config import ModelConfig
    from pipeline.data.negatives import RefresherConfig, VersionedNegatives, list_versions
    from pipeline.data.readers import load_qrels
    from pipeline.errors import PipelineError
    from pipeline.index.refresher import Refresh
    from pipeline.models import BiEncoder

    run = storage.resolve(uri(make_bucket(), "runs/ance"))
    with pytest.raises(PipelineError, match="not a training run"):
        Refresh(run, RefresherConfig(top_k=30, negatives=5), faq)
    (run / "config.yaml").write_text("{}\n")
    model = BiEncoder.load(ModelConfig(name_or_path=str(tiny_model_dir), pooling="mean", normalize=True))
    _upload_checkpoint(tmp_path, run, 2, model)
    _upload_checkpoint(tmp_path, run, 4, model, cut=True)  # incomplete upload: ignored
    cfg = RefresherConfig(top_k=30, negatives=5, precision="fp32", keep_versions=2)
    r = Refresh(str(run), cfg, faq)
    rec = r.step_once()
    assert rec["version"] == 1 and rec["checkpoint_step"] == 2
    assert r.step_once() is None
    assert list_versions(run / "negatives") == [1]
    judged = load_qrels(faq / "qrels" / "train.trec")
    v1 = VersionedNegatives(str(run / "negatives"), faq).load(1)
    assert len(v1) == len(judged) and v1.meta["checkpoint_step"] == 2
    some = sorted(judged)[0]
    assert v1.get(some) and all(isinstance(t, str) and t for t in v1.get(some))
    _upload_checkpoint(tmp_path / "b", run, 6, model)
    assert r.step_once()["version"] == 2
    again = Refresh(str(run), cfg, faq)  # a restarted refresher resumes after its last version, from S3
    assert (again.version, again.last_step) == (2, 6) and again.step_once() is None
