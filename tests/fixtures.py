"""Builders the tests share (pytest fixtures built from them live in conftest.py): small corpora in
the real formats, the small training job the trainer tests run, and the resume spy.

    random_collection   an MS MARCO `collection.tsv` of seeded random texts (returns the texts)
    dpr_job             the small DPR training job of the trainer tests (tiny BERT, 2 workers)
    kill_after          an encode whose driver dies as the n-th shard receipt arrives
    watch_resume        what a resumed `encode_corpus` found on disk when it started
    random_embeddings   a complete embedding set of an ingested corpus, seeded random vectors, as
                        `pipeline encode` lays it out (no model, no Ray)
    files_holding       the files under some folders that hold a planted secret (run folders, Ray's logs)
"""

from __future__ import annotations

import atexit
import json
import random
import shutil
import tempfile
from pathlib import Path

from pipeline.index import encode as encode_mod
from pipeline.train.config import load_train_config

GREEK = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def random_collection(path: Path, n: int, seed: int = 0, words=GREEK, min_words: int = 3,
                      max_words: int = 120) -> list[str]:
    """Write `n` passages `i<TAB>text` (ids 0..n-1), each min_words..max_words seeded random words."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(min_words, max_words))) for _ in range(n)]
    path.write_text("".join(f"{i}\t{t}\n" for i, t in enumerate(texts)), encoding="utf-8")
    return texts


def dpr_job(model_dir, corpus, storage, name: str, *extra: str):
    """DPR on `corpus` with the tiny BERT: 2 workers x batch 8, reports every step, seed 3."""
    return load_train_config(None, [
        f"model.name_or_path={model_dir}", "model.pooling=cls", "model.query_max_length=32",
        "model.doc_max_length=64", f"data.corpus={corpus}", "train.num_workers=2", "train.cpus_per_worker=0.5",
        "train.batch_size=8", f"train.storage_path={storage}", f"train.name={name}", "train.report_every=1",
        "optim.lr=1e-4", "train.seed=3", *extra])


class SimulatedKill(Exception):
    """What `kill_after` raises in the driver (unless told to raise something else)."""


def kill_after(monkeypatch, n: int, error: type[BaseException] = SimulatedKill, check=None) -> list[str]:
    """Make the driver of the next encode_corpus die when the n-th shard receipt arrives; returns
    the names of the receipts seen. `check(name)` runs on every receipt first."""
    seen: list[str] = []

    def report(name, rows):
        seen.append(name)
        if check is not None:
            check(name)
        if len(seen) == n:
            raise error(f"simulated kill after {n} shards")

    monkeypatch.setattr(encode_mod, "_report_shard", report)
    return seen


def watch_resume(monkeypatch) -> dict:
    """A dict that holds, after the next encode_corpus call, the completed shards it found.

    A killed encode's actors may still finish the shard they hold after the driver gave up (Ray
    stops them asynchronously), so the shards a test reads right after the kill are a lower bound
    of what the re-run finds. The guarantee under test is that the re-run reuses exactly the
    shards complete when it starts and encodes exactly the rest; this spy records that set."""
    found: dict = {}
    real = encode_mod.completed_shards
    calls = []

    def spy(out_dir):
        done = real(out_dir)
        if not calls:  # the first look is the resume decision (later ones read the finished shards)
            found.update(done)
        calls.append(out_dir)
        return done

    monkeypatch.setattr(encode_mod, "completed_shards", spy)
    return found


def assert_cpus_freed(within: float = 30.0) -> None:
    """Every CPU of the session's Ray is free again within `within` s: a failed run's actors left
    (else the next encode's pool can never be placed and waits for them forever)."""
    import time

    import ray

    deadline = time.time() + within
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"] and time.time() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == ray.cluster_resources()["CPU"], \
        f"{within:.0f} s after the failed encode its actors still hold CPUs: {ray.available_resources()}"


def random_embeddings(corpus: Path, out: Path, shard_rows: int = 4, dim: int = 8, seed: int = 0) -> Path:
    """Shards (`shard_rows` per shard) of seeded random float32 vectors for every passage of the
    ingested `corpus`, and a complete embeddings.json naming a made-up model."""
    import numpy as np
    import pyarrow.parquet as pq

    from pipeline.data.manifest import load_manifest
    from pipeline.index.encode import plan_shards
    from pipeline.index.shards import write_shard

    manifest = load_manifest(corpus)
    out.mkdir()
    specs = plan_shards(corpus, manifest, shard_rows)
    rng = np.random.default_rng(seed)
    for s in specs:
        pids = pq.read_table(corpus / s["part"], columns=["pid"]).column("pid").to_pylist()[s["start"]:s["end"]]
        write_shard(out, s, pids, rng.standard_normal((len(pids), dim)).astype("float32"))
    (out / "embeddings.json").write_text(json.dumps({
        "corpus": str(corpus), "corpus_fingerprint": manifest["fingerprint"], "variant": manifest["variant"],
        "title_join": manifest["title_join"], "rows": manifest["rows"], "parts": len(manifest["parts"]),
        "model": {"path": "/models/x"}, "model_config": {}, "dim": dim, "dtype": "float32", "precision": "fp32",
        "shard_rows": shard_rows, "shards": len(specs), "shard_names": [s["name"] for s in specs], "complete": True}))
    return out


def files_holding(roots, secrets) -> list[str]:
    """Every file under `roots` whose bytes contain one of `secrets` (as given, or percent-encoded)."""
    from urllib.parse import quote

    needles = {n.encode() for s in secrets for n in (s, quote(s, safe=""))}
    found = []
    for root in roots:
        for path in Path(root).rglob("*"):
            try:
                if path.is_file() and not path.is_symlink():
                    data = path.read_bytes()
                    found += [f"{path}: {n.decode()}" for n in needles if n in data]
            except OSError:
                continue  # a socket, or a file removed meanwhile
    return found


# a tower's probe texts and loaders, shared by the OpenVINO backend and export-cache tests
TOWER_TEXTS = [f"passage {i} about " + "dense retrieval " * (i % 13) for i in range(40)]


def tower_model(path, **kw):
    """A BiEncoder of `path` in eval mode with documents cut at 64 tokens."""
    from pipeline.config import ModelConfig
    from pipeline.models import BiEncoder

    return BiEncoder.load(ModelConfig(name_or_path=str(path), doc_max_length=64, **kw)).eval()


def tower_tokens(model, texts=TOWER_TEXTS):
    """`texts` tokenised as the model's document tower reads them (length-sorted batches)."""
    from pipeline.models.tokens import tokenize_sorted

    tok, prefix, max_len = model.token_spec("doc")
    return tokenize_sorted(tok, texts, prefix, max_len)


def short_temp_dir(prefix: str) -> Path:
    """A folder for a Ray of a test's own: short, under /tmp (unix socket paths in it must stay short), removed
    when the test session ends."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def relative_difference(a: dict, b: dict) -> float:
    """||a - b|| / ||a|| over every tensor of two state dicts (a tensor whose gradient is 0 in exact arithmetic, such
    as attention's key bias, holds float noise: compared within the whole, not alone)."""
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a)
    den = sum(float(a[k].double().pow(2).sum()) for k in a)
    return (num / den) ** 0.5
