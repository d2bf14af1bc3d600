"""pipeline.storage on real object-store protocols on 127.0.0.1 (S3: moto's server; GCS:
gcp-storage-emulator, reached as gs://anonymous@…) and on local paths."""

from __future__ import annotations

import json
from types import SimpleNamespace

import gcs_emulator
import pytest
import s3_emulator
from s3_emulator import uri

from pipeline import storage
from pipeline.errors import ConfigError
from pipeline.models.checkpoint import finalize_checkpoint, latest_checkpoint, list_checkpoints, read_state


@pytest.fixture(scope="module", params=["s3", "gs"])
def store(request):
    """One bucket on each emulated object store: `.uri(prefix)`, `.scheme`."""
    emu = {"s3": s3_emulator, "gs": gcs_emulator}[request.param]
    bucket = emu.make_bucket()
    return SimpleNamespace(scheme=request.param, bucket=bucket, emu=emu,
                           uri=lambda prefix="", _b=bucket: emu.uri(_b, prefix))


def test_resolve_kinds(tmp_path):
    assert storage.resolve(str(tmp_path / "x")) == tmp_path / "x"
    assert storage.resolve(f"file://{tmp_path}/y") == tmp_path / "y"
    r = storage.resolve(uri("bkt", "a/b"))
    assert isinstance(r, storage.RemotePath) and r.path == "bkt/a/b" and r.name == "b"
    child = r / "c" / "d.json"
    assert child.path == "bkt/a/b/c/d.json" and str(child).startswith("s3://bkt/a/b/c/d.json?endpoint_override=")
    assert child.parent.parent == r
    with pytest.raises(ConfigError, match="nosuch://b"):
        storage.resolve("nosuch://b/x")
    g = storage.resolve("gs://anonymous@bkt/a/b?scheme=http&endpoint_override=127.0.0.1:1")
    assert g.path == "bkt/a/b" and str(g / "c").startswith("gs://anonymous@bkt/a/b/c?scheme=http")
    with pytest.raises(ConfigError, match="credentials in a storage URI") as info:
        storage.resolve("s3://AKIAXXXX:hunter2@bkt/runs")
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("query", ["secret_key=hunter2", "access_key=hunter2&region=us-east-1",
                                   "region=us-east-1&session_token=hunter2", "access_token=hunter2",
                                   "password=hunter2", "SECRET_ACCESS_KEY=hunter2"])
def test_credentials_in_a_uri_query_are_refused_with_the_value_redacted(query):
    with pytest.raises(ConfigError, match="credentials in a storage URI") as info:
        storage.resolve(f"s3://bkt/runs?{query}")
    assert "hunter2" not in str(info.value) and "=***" in str(info.value)


def test_redact_hides_every_credential_of_a_uri_in_a_message():
    r = storage.redact
    assert r("s3://b/x?secret_key=SEK: failed") == "s3://b/x?secret_key=***: failed"
    assert r("gs://me:pw@b/x?a=1&token=T&region=r.") == "gs://***@b/x?a=1&token=***&region=r."
    kept = "s3://anonymous@b/x?endpoint_override=127.0.0.1:9000&scheme=http, /local/path, key=v"
    assert r(kept) == kept


def test_cli_never_prints_a_uri_credential_and_ingest_names_its_local_output(tmp_path, capsys):
    from pipeline.cli import main

    src = tmp_path / "c.tsv"
    src.write_text("1\tone\n")
    assert main(["ingest", str(src), "--format", "msmarco", "--out", "s3://bkt/c?secret_key=hunter2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out s3://bkt/c?secret_key=***: ingest writes a corpus folder on a local or shared")
    assert "hunter2" not in err and "Traceback" not in err
    assert main(["ingest", str(src), "--format", "msmarco", "--out", f"file://{tmp_path}/corpus"]) == 0
    assert (tmp_path / "corpus" / "manifest.json").is_file()
    capsys.readouterr()
    for argv in (["index", "--embeddings", "s3://bkt/e?secret_key=hunter2", "--out", str(tmp_path / "i")],
                 ["encode", "--corpus", str(tmp_path / "corpus"), "--out", "s3://u:hunter2@bkt/e"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "hunter2" not in err and "credentials in a storage URI" in err, err


def test_remote_reads_writes_listing_and_pickling(store, tmp_path):
    import pickle

    root = storage.resolve(store.uri("t1"))
    assert not root.exists() and list(root.iterdir()) == []
    storage.write_json_atomic(root / "a" / "x.json", {"k": 1})
    (root / "b.txt").write_text("hi")
    assert storage.read_json(root / "a" / "x.json") == {"k": 1}
    assert sorted(c.name for c in root.iterdir()) == ["a", "b.txt"]
    assert (root / "a").is_dir() and (root / "b.txt").is_file() and (root / "b.txt").stat().st_size == 2
    with pytest.raises(FileNotFoundError):
        (root / "missing").read_text()
    again = pickle.loads(pickle.dumps(root / "b.txt"))  # a worker re-makes the filesystem from the URI
    assert again.read_text() == "hi"

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(b"\0" * 1000)
    (src / "DONE").write_text("ok\n")
    storage.upload_dir(src, root / "up", marker="DONE")
    assert (root / "up").file_sizes() == {"sub/w.bin": 1000, "DONE": 3}
    back = storage.download_dir(root / "up", tmp_path / "back")
    assert (back / "sub" / "w.bin").read_bytes() == b"\0" * 1000
    storage.copy_dir(root / "up", root / "up2")
    assert (root / "up2").file_sizes() == (root / "up").file_sizes()
    storage.rmtree(root / "up2")
    assert not (root / "up2").exists()


def test_checkpoint_listing_on_object_stores_trusts_only_complete_ones(store, tmp_path):
    run = storage.resolve(store.uri("run"))
    for step in (2, 4):
        d = tmp_path / f"step-{step:08d}"
        (d / "model").mkdir(parents=True)
        (d / "model" / "w.bin").write_bytes(b"x" * step)
        finalize_checkpoint(d, {"step": step})
        storage.upload_dir(d, run / d.name, marker="state.json")
    # step 6: state.json uploaded but one listed file missing (an upload cut short)
    d = tmp_path / "step-00000006"
    (d / "model").mkdir(parents=True)
    (d / "model" / "w.bin").write_bytes(b"y")
    finalize_checkpoint(d, {"step": 6})
    (run / d.name / "state.json").write_bytes((d / "state.json").read_bytes())
    assert [s for s, _ in list_checkpoints(run)] == [2, 4]
    assert latest_checkpoint(run).name == "step-00000004" and read_state(run / "step-00000004")["step"] == 4
    assert read_state(run / "step-00000006") is None


def test_check_writable_ok_and_clear_failures(store, tmp_path):
    storage.check_writable(store.uri("probe/here"))
    assert list(storage.resolve(store.uri("probe/here")).iterdir()) == []  # the probe is gone
    at = "anonymous@" if store.scheme == "gs" else ""
    with pytest.raises(ConfigError, match=rf"storage {store.scheme}://{at}no-such-bucket/x.*bucket does not exist"):
        storage.check_writable(store.emu.uri("no-such-bucket", "x"))
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if __import__("os").getuid() != 0:  # root writes anywhere
            with pytest.raises(ConfigError, match=str(ro)):
                storage.check_writable(str(ro))
    finally:
        ro.chmod(0o700)
    storage.check_writable(str(tmp_path / "new" / "dir"))  # local: made if missing
    assert json.loads(json.dumps({"ok": True}))


def test_node_probe_reports_unshared_storage(tmp_path):
    """What a node says when it cannot see the driver's probe (a per-machine local path)."""
    msg = storage._probe_task(str(tmp_path), ".shared-probe-missing")
    assert "does not see the probe the driver wrote" in msg and str(tmp_path) in msg
    (tmp_path / ".shared-probe-x").write_bytes(b".shared-probe-x")
    assert storage._probe_task(str(tmp_path), ".shared-probe-x") is None


def test_trainer_resume_resolution_on_a_uri(store, tmp_path):
    """train.resume=auto|never|<URI of a checkpoint> against checkpoints on an object store."""
    from pipeline.errors import PipelineError
    from pipeline.train.config import load_train_config
    from pipeline.train.trainer import resolve_resume

    run = storage.resolve(store.uri("resume/run"))
    d = tmp_path / "step-00000003"
    (d / "model").mkdir(parents=True)
    (d / "model" / "w.bin").write_bytes(b"w")
    finalize_checkpoint(d, {"step": 3})
    storage.upload_dir(d, run / d.name, marker="state.json")
    auto = resolve_resume(load_train_config(None, ["train.resume=auto"]), run)
    assert isinstance(auto, storage.RemotePath) and auto.name == "step-00000003"
    with pytest.raises(PipelineError, match="already has checkpoints"):
        resolve_resume(load_train_config(None, ["train.resume=never"]), run)
    explicit = resolve_resume(load_train_config(None, [f"train.resume={run / d.name}"]), run)
    assert read_state(explicit)["step"] == 3
    with pytest.raises(PipelineError, match="not a complete checkpoint"):
        resolve_resume(load_train_config(None, [f"train.resume={run / 'step-00000009'}"]), run)


@pytest.mark.parametrize("uri", [
    "s3://bkt/emb?x-amz-security-token=hunter2",
    "s3://bkt/emb?X-Amz-Signature=hunter2&X-Amz-Credential=hunter2",
    "s3://bkt/emb?secret%5Fkey=hunter2",                      # percent-encoded name
    "s3://bkt/emb?Secret%5FAccess%5FKey=hunter2&region=us",
    "s3://bkt/emb?endpoint_override=u:hunter2@127.0.0.1:9000",  # a user:password inside a value
    "s3://bkt/emb?endpoint_override=u%3Ahunter2%40host",
    "s3://bkt/emb?sas_token=hunter2", "gs://bkt/e?private_key_id=hunter2", "s3://bkt/e?client_secret=hunter2",
    "s3://bkt/e?api_key=hunter2", "s3://bkt/e?passwd=hunter2", "s3://bkt/e?auth=hunter2",
])
def test_every_spelling_of_a_credential_is_refused_and_never_printed(uri, tmp_path, capsys):
    """Redaction works on the decoded query: any option whose name contains token, secret, key,
    signature, credential or password, and a user:password@ inside a value, in every command's error."""
    from pipeline.cli import main

    with pytest.raises(ConfigError, match="credentials in a storage URI") as info:
        storage.resolve(uri)
    assert "hunter2" not in str(info.value)
    assert "hunter2" not in storage.redact(f"failed: {uri}, retry")
    corpus = tmp_path / "c"
    (tmp_path / "c.tsv").write_text("1\tone\n")
    assert main(["ingest", str(tmp_path / "c.tsv"), "--format", "msmarco", "--out", str(corpus)]) == 0
    capsys.readouterr()
    for argv in (["encode", "--corpus", str(corpus), "--out", uri],
                 ["train", "--config", "jobs/configs/dpr.yaml", f"train.storage_path={uri}"],
                 ["index", "--embeddings", uri, "--out", str(tmp_path / "i")]):
        assert main(argv) == 2
        out = capsys.readouterr()
        assert "hunter2" not in out.err + out.out and out.err.startswith("error: "), out.err


SECRET = "se/cr3t+V4lue"  # a `/` and a `+`, as in unencoded AWS secret keys


@pytest.mark.parametrize("uri", [
    f"s3://bkt/runs?secret_key={SECRET}",
    f"s3://bkt/runs?region=us-east-1;secret_key={SECRET}",                      # `;` separates options too
    f"s3://bkt/runs?region=us-east-1&x=1;secret_key={SECRET}",
    f"s3://bkt/runs?region=us-east-1&prefix=a%26secret_key%3D{SECRET}",         # hidden in another option's value
    f"s3://bkt/runs?prefix=a%3Bsecret_key%3D{SECRET}",
    f"s3://bkt/runs?prefix=a%2526secret_key%253D{SECRET}",                      # double encoded
    f"s3://bkt/runs?%73ecret_key%3D{SECRET}",                                   # the `=` encoded: no name at all
    f"s3://bkt/runs?region=us-east-1#secret_key={SECRET}",                      # a fragment
    f"s3://bkt/runs?region=us-east-1%23secret_key%3D{SECRET}",
    f"s3://bkt/model/v1#access_key={SECRET}",                                   # a fragment after a path, no `?`
    f"s3://user:{SECRET}@bucket/path",                                          # user:se/cret@ (a `/` in it)
    f"s3://AKIAXXXX:abc/def+{SECRET}@bucket/path?region=us-east-1",
    f"s3://bkt/runs?endpoint_override=u:{SECRET}@127.0.0.1:9000",               # user:pass/word@ inside a value
    f"s3://bkt/runs;secret_key={SECRET}",                                       # `;` options in the path
    f"s3://bkt/runs%3Bsecret_key%3D{SECRET}/x",
    f"s3://bkt/runs?SECRET_KEY={SECRET}",
    f"s3://bkt/runs?X-Amz-Signature={SECRET}&X-Amz-Date=20250101T000000Z",
])
def test_no_spelling_of_a_credential_passes_or_shows(uri):
    """Options split on `&` and `;`, a `#fragment` read as options, names and values percent-decoded
    until they stop changing: an encoded separator or a `/` in a password hides nothing."""
    with pytest.raises(ConfigError, match="credentials in a storage URI") as info:
        storage.resolve(uri)
    assert SECRET not in str(info.value) and "V4lue" not in str(info.value)
    shown = storage.redact(f"done: {uri} -> 3 files.")
    assert SECRET not in shown and "V4lue" not in shown and "cr3t" not in shown, shown
    assert shown.startswith("done: s3://") and shown.endswith(" -> 3 files.")


def test_redact_keeps_what_is_no_credential():
    r = storage.redact
    for text in ("s3://bkt/model@v2 written", "s3://bkt/x?region=us-east-1;scheme=http, done",
                 "s3://bkt/table/partition_key=3/a;b/part-0.parquet",
                 "gs://anonymous@bkt/a?scheme=http&endpoint_override=127.0.0.1:9023.",
                 "s3://bkt/x?prefix=a%26b%3Dc"):
        assert r(text) == text
    assert r(f"s3://bkt/x?region=r;secret_key={SECRET}#frag") == "s3://bkt/x?region=r;secret_key=***#frag"
    assert r(f"s3://AKIA:{SECRET}@b/p") == "s3://***@b/p"
    assert r(f"s3://b/runs;region=r;secret_key={SECRET}/x") == "s3://b/runs;region=r;secret_key=***"
    assert r(f"s3://b/runs%3Bsecret_key%3D{SECRET}/x?region=r") == "s3://b/***?region=r"
    assert r("s3://bkt/x?a=1%26token%3DT&region=r") == "s3://bkt/x?a=***&region=r"  # masked whole


def test_a_path_with_an_at_sign_is_a_path_and_a_plain_fragment_is_refused():
    r = storage.resolve(uri("bkt", "model@v2"))  # no `:` before the `@`: not a user
    assert r.path == "bkt/model@v2" and r.user == "" and r.name == "model@v2"
    assert storage.resolve("gs://anonymous@bkt/a@b?scheme=http&endpoint_override=127.0.0.1:1").path == "bkt/a@b"
    assert storage.resolve(uri("bkt", "t/partition_key=3/a;b")).path == "bkt/t/partition_key=3/a;b"
    with pytest.raises(ConfigError, match="not in a #fragment"):
        storage.resolve("s3://bkt/x#part")
