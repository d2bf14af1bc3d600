"""Quick answers stay quick: `--help`, `--version` and a config error never import torch, transformers or
Ray (each verb imports its library only after its config has loaded; the config dataclasses, the
methods' loss blocks and sections included, import none of them). Each case runs in a fresh Python."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "ray")

SCRIPT = """
import sys
from pipeline.cli import main
try:
    rc = main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
sys.stdout.flush()
print("\\nRC", rc)
print("LOADED", *[m for m in %r if m in sys.modules])
""" % (HEAVY,)


def _run(argv: list[str], cwd) -> tuple[int, list[str], str]:
    p = subprocess.run([sys.executable, "-c", SCRIPT, *argv], capture_output=True, text=True, cwd=cwd, timeout=120)
    lines = p.stdout.splitlines()
    rc = next(int(ln.split()[1]) for ln in lines if ln.startswith("RC "))
    loaded = next(ln.split()[1:] for ln in lines if ln.startswith("LOADED"))
    return rc, loaded, p.stdout + p.stderr


@pytest.mark.parametrize("argv, rc, shown", [
    (["--help"], 0, "Dense retrieval on Ray"),
    (["--version"], 0, "pipeline "),
    (["encode", "--help"], 0, "encode.batch_size = 64"),
    (["train", "--help"], 0, "loss.n_perturb = 7"),          # every method's loss block and sections
    (["tune", "--help"], 0, "search.num_samples = 1"),
    (["evaluate", "--help"], 0, "eval.rel_level"),
    (["train", "--config", "nonexistent.yaml"], 2, "nonexistent.yaml: config file not found"),
    (["train", "train.batch_size=0"], 2, "train.batch_size"),
    (["train", "loss.name=ance", "ance.refresh_every=0"], 2, "ance.refresh_every"),
    (["train", "loss.name=nope"], 2, "not a registered method"),
    (["encode", "--corpus", "c", "--out", "e", "encode.batch_siz=3"], 2, "did you mean encode.batch_size"),
    (["retrieve", "--index", "i", "--topics", "q.tsv", "--output", "r.trec", "retrieve.top_kk=3"], 2, "retrieve.top_k"),
    (["evaluate", "q.trec", "r.trec", "eval.rel_levle=2"], 2, "eval.rel_level"),
    (["compare", "a.trec", "b.trec", "--qrels", "q", "eval.rel_levle=2"], 2, "eval.rel_level"),
    (["tune", "--config", "nonexistent.yaml"], 2, "config file not found"),
])
@pytest.mark.slow
def test_quick_answers_import_no_torch_transformers_or_ray(argv, rc, shown, tmp_path):
    got_rc, loaded, out = _run(argv, tmp_path)
    assert got_rc == rc and shown in out, out  # it answered what was asked (the check is not vacuous)
    assert loaded == [], f"pipeline {' '.join(argv)} imported {loaded}"
    assert list(tmp_path.iterdir()) == []  # and wrote nothing


def test_the_check_can_fail():
    """Importing the library the verbs call does load torch: the assertion above is about the CLI's order."""
    p = subprocess.run([sys.executable, "-c", "import sys, pipeline.train.methods as m; m.method_names(); "
                        "print('torch' in sys.modules)"], capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "True", p.stderr


@pytest.mark.slow
def test_pipeline_index_builds_an_index_without_torch_transformers_or_ray(tmp_path):
    """`pipeline index` is faiss over the vectors: it imports none of the encoder's libraries (torch alone was
    ~2.6 s of its 3.2 s on the FAQ's 176 vectors, an AVX2 EPYC; 0.6 s without)."""
    from test_outputs import make_embeddings

    make_embeddings(tmp_path / "emb")
    rc, loaded, out = _run(["index", "--embeddings", str(tmp_path / "emb"), "--out", str(tmp_path / "index")],
                           tmp_path)
    assert rc == 0 and (tmp_path / "index" / "index.faiss").stat().st_size > 0, out  # it built the index
    assert loaded == [], f"pipeline index imported {loaded}"


@pytest.mark.slow
def test_the_in_process_runners_train_and_encode_without_ray_installed(tiny_model_dir, faq, tmp_path):
    """`pipeline train` with one worker (train.runner auto: local) and `pipeline encode encode.runner=local` never
    import Ray (1.5-2 s of each process's start-up on a 2-core AVX2 EPYC; and the GPU machine has none): with a `ray`
    on the path that cannot be imported, both run to the end."""
    import os

    fake = tmp_path / "no-ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('Ray is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "no-ray"), os.environ.get("PYTHONPATH", "")])}
    for argv in (["train", f"data.corpus={faq}", f"model.name_or_path={tiny_model_dir}", "model.pooling=cls",
                  f"train.storage_path={tmp_path / 'runs'}", "train.name=t", "train.max_steps=2", "train.batch_size=8",
                  "train.eval_every=1", "validation.dev_split=0.1"],
                 ["encode", "--corpus", str(faq), "--out", str(tmp_path / "emb"), "--model", str(tmp_path / "runs" / "t" / "model"),
                  "encode.runner=local"]):
        p = subprocess.run([sys.executable, "-c", SCRIPT, *argv], capture_output=True, text=True, cwd=tmp_path,
                           timeout=300, env=env)
        assert "\nRC 0" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
        assert "ray" not in p.stdout.splitlines()[-1].split()[1:], p.stdout[-500:]
    assert (tmp_path / "runs" / "t" / "summary.json").exists() and list((tmp_path / "emb").glob("shard-*.npy"))
