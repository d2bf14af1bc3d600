"""Output paths: nothing a user has is lost, the tool's own output is replaced only when asked,
and a replacement is atomic (the old output stays readable until the new one is complete).

Table-driven CLI cases assert the exit code, the message and that the tree is byte-for-byte
unchanged; the atomic-replacement cases simulate kills between the renames.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pipeline import io_utils
from pipeline.cli import main
from pipeline.io_utils import OutputError, atomic_path, check_output, recover_stale, write_json_atomic

DATA = Path(__file__).parent.parent / "data"
REPO = Path(__file__).resolve().parents[2]


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` (and `root` itself) with its bytes (None for folders)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        out[rel + "/"] = None
        for f in filenames:
            p = Path(dirpath) / f
            out[os.path.join(rel, f)] = p.read_bytes()
    return out


# ------------------------------------------------------------------ fixtures building tool outputs

def make_index(d: Path) -> None:
    d.mkdir(parents=True)
    (d / "index.json").write_text(json.dumps({"factory": "Flat", "ntotal": 1, "dim": 2}))
    (d / "index.faiss").write_bytes(b"x")
    (d / "pids.txt").write_text("p1\n")


def make_run(p: Path) -> None:
    p.write_text("q1 Q0 d1 1 1.0 t\n")
    Path(str(p) + ".meta.json").write_text(json.dumps({"n_queries": 1, "top_k": 1}))


def make_metrics(p: Path) -> None:
    p.write_text(json.dumps({"metrics": {"RR@10": 1.0}, "queries": {"evaluated": 1}}))


def make_embeddings(d: Path, n: int = 30, dim: int = 8, complete: bool = True) -> Path:
    """A small complete embedding set in the layout `pipeline encode` writes."""
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    np.save(d / "shard-00000.npy", vecs)
    (d / "shard-00000.pids.txt").write_text("".join(f"p{i}\n" for i in range(n)))
    (d / "shard-00000.done").write_text(json.dumps({"rows": n, "dim": dim, "dtype": "float32", "part": "x"}))
    (d / "embeddings.json").write_text(json.dumps({
        "rows": n, "dim": dim, "parts": 1, "complete": complete, "corpus_fingerprint": "fp", "variant": "custom",
        "title_join": "none", "model": {"path": "m"}, "model_config": {"name_or_path": "m"}, "corpus": "c"}))
    return d


# ------------------------------------------------------------------ check_output, table-driven

def _user_dir(p: Path) -> None:
    p.mkdir()
    (p / "notes.txt").write_text("mine")
    (p / "sub").mkdir()
    (p / "sub" / "data.bin").write_bytes(b"\x00\x01")


def _index_plus_user_file(p: Path) -> None:
    make_index(p)
    (p / "notes.txt").write_text("mine")


CASES = [
    # kind, build(path), overwrite, expected: None = ok/new, True = replaces own, or message part
    ("index", None, False, None),
    ("index", lambda p: p.mkdir(), False, None),  # an empty folder is as good as nothing
    ("index", _user_dir, False, "is not a FAISS index"),
    ("index", _user_dir, True, "is not a FAISS index"),
    ("index", lambda p: p.write_text("x"), True, "is a file, not a folder"),
    ("index", make_index, False, "--overwrite"),
    ("index", make_index, True, True),
    ("index", _index_plus_user_file, True, "notes.txt"),
    ("run", None, False, None),
    ("run", lambda p: p.mkdir(), True, "is a directory"),
    ("run", lambda p: p.write_text("my notes"), True, "is not a TREC run"),
    ("run", make_run, False, "--overwrite"),
    ("run", make_run, True, True),
    ("run", lambda p: Path(str(p) + ".meta.json").mkdir(), True, "is a directory"),
    ("metrics", None, False, None),
    ("metrics", lambda p: p.mkdir(), True, "is a directory"),
    ("metrics", lambda p: p.write_text('{"a": 1}'), True, "is not a metrics JSON"),
    ("metrics", make_metrics, False, "--overwrite"),
    ("metrics", make_metrics, True, True),
]


@pytest.mark.parametrize("kind,build,overwrite,expected", CASES)
def test_check_output(tmp_path, kind, build, overwrite, expected):
    path = tmp_path / "out"
    if build:
        build(path)
    before = snapshot(tmp_path)
    if isinstance(expected, str):
        with pytest.raises(OutputError, match=expected.replace("-", r"\-")):
            check_output(path, kind, overwrite)
    else:
        assert check_output(path, kind, overwrite) is bool(expected)
    assert snapshot(tmp_path) == before  # nothing written or deleted


def test_check_output_parent_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="not a directory"):
        check_output(tmp_path / "f" / "run.trec", "run")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_check_output_read_only_parent(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(OutputError, match="cannot write"):
            check_output(ro / "run.trec", "run")
    finally:
        ro.chmod(0o700)


# ------------------------------------------------------------------ the CLI: exit 2, message, nothing touched

def _cli_cases(tmp_path: Path):
    emb = make_embeddings(tmp_path / "emb")
    run_args = ["--run", str(DATA / "python_faq_minilm_top20.trec"), "--qrels", str(DATA / "python_faq_all.qrels")]
    return [
        (["index", "--embeddings", str(emb), "--out"], _user_dir, "is not a FAISS index"),
        (["index", "--embeddings", str(emb), "--overwrite", "--out"], _user_dir, "is not a FAISS index"),
        (["index", "--embeddings", str(emb), "--out"], make_index, "--overwrite"),
        (["index", "--embeddings", str(emb), "--out"], lambda p: p.write_text("x"), "is a file"),
        (["retrieve", "--index", str(tmp_path / "noindex"), "--queries", "q.tsv", "--out"], lambda p: p.mkdir(),
         "is a directory"),
        (["retrieve", "--index", str(tmp_path / "noindex"), "--queries", "q.tsv", "--out"], make_run, "--overwrite"),
        (["retrieve", "--index", str(tmp_path / "noindex"), "--queries", "q.tsv", "--overwrite", "--out"],
         lambda p: p.write_text("mine"), "is not a TREC run"),
        (["evaluate", *run_args, "--json"], lambda p: p.mkdir(), "is a directory"),
        (["evaluate", *run_args, "--json"], _user_dir, "is a directory"),
        (["evaluate", *run_args, "--json"], make_metrics, "--overwrite"),
        (["evaluate", *run_args, "--overwrite", "--json"], lambda p: p.write_text("notes"), "is not a metrics JSON"),
        # encode --out: a folder of its own (new, empty, or embeddings this tool wrote), nothing else
        (["encode", "--corpus", str(tmp_path / "nocorpus"), "--out"], _user_dir, "holds no embeddings but notes.txt, sub"),
        (["encode", "--corpus", str(tmp_path / "nocorpus"), "--out"], make_index, "holds a FAISS index"),
        (["encode", "--corpus", str(tmp_path / "nocorpus"), "--out"], _make_corpus, "holds an ingested corpus"),
        (["encode", "--corpus", str(tmp_path / "nocorpus"), "--out"], lambda p: p.write_text("x"), "is a file"),
        (["encode", "--corpus", str(tmp_path / "nocorpus"), "--out"],
         lambda p: (make_embeddings(p), (p / "notes.txt").write_text("mine")), "holds embeddings, but also notes.txt"),
    ]


def _make_corpus(p: Path) -> None:
    from pipeline.data.ingest import ingest

    src = p.parent / "collection.tsv"
    src.write_text("1\tone\n2\ttwo\n")
    ingest([src], "msmarco", p, progress=False)


@pytest.mark.parametrize("i", range(16))
def test_cli_refuses_output_paths(tmp_path, capsys, i):
    args, build, message = _cli_cases(tmp_path)[i]
    out = tmp_path / "target"
    build(out)
    before = snapshot(tmp_path)
    rc = main(args + [str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert str(out) in err
    assert snapshot(tmp_path) == before


def test_cli_index_again_keeps_the_same_index_and_refuses_another_without_overwrite(tmp_path, capsys):
    emb = make_embeddings(tmp_path / "emb")
    args = ["index", "--embeddings", str(emb), "--out", str(tmp_path / "idx")]
    assert main(args) == 0
    first = snapshot(tmp_path / "idx")
    capsys.readouterr()
    assert main(args) == 0 and "[index] unchanged" in capsys.readouterr().out  # run again as it was run
    assert snapshot(tmp_path / "idx") == first
    assert main(args + ["--factory", "HNSW8"]) == 2  # another request: refused before any work
    assert "a different one (factory 'Flat' there, 'HNSW8' asked now)" in capsys.readouterr().err
    vecs = np.load(emb / "shard-00000.npy")
    np.save(emb / "shard-00000.npy", vecs[::-1].copy())  # the embeddings changed under the same path
    assert main(args) == 2 and "other vectors or ids" in capsys.readouterr().err
    assert snapshot(tmp_path / "idx") == first
    assert main(args + ["--overwrite"]) == 0 and snapshot(tmp_path / "idx") != first
    assert sorted(os.listdir(tmp_path)) == ["emb", "idx"]  # no temporaries left


def test_cli_evaluate_json_again(tmp_path, capsys):
    out = tmp_path / "m.json"
    args = ["evaluate", "--run", str(DATA / "python_faq_minilm_top20.trec"), "--qrels",
            str(DATA / "python_faq_all.qrels"), "--json", str(out)]
    assert main(args) == 0
    before = out.read_bytes()
    assert main(args) == 0 and "[evaluate] unchanged" in capsys.readouterr().out and out.read_bytes() == before
    assert main(args + ["--measures", "nDCG@10"]) == 2 and "--overwrite" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main(args + ["--measures", "nDCG@10", "--overwrite"]) == 0 and out.read_bytes() != before
    assert sorted(os.listdir(tmp_path)) == ["m.json"]


def test_retrieve_again_keeps_the_same_run_and_refuses_another(built_index, tmp_path, capsys):
    from pipeline.config import load_config
    from pipeline.errors import PipelineError
    from pipeline.index.retrieve import retrieve

    class Model:  # a query model of the index's 8 dimensions; `shift` changes what it gives
        dim, shift = 8, 0.0

        def embed(self, texts, side, batch_size, precision=None):
            rng = np.random.default_rng([len(t) for t in texts])
            return rng.standard_normal((len(texts), 8)).astype(np.float32) + self.shift

    q = tmp_path / "q.tsv"
    q.write_text("q1\thello\nq2\tworld, again\n")
    run, cfg, model = tmp_path / "run.trec", load_config(None, []), Model()
    meta = retrieve(built_index, q, run, cfg, model=model, progress=False, overwrite=False)
    before = run.read_bytes(), (tmp_path / "run.trec.meta.json").read_bytes()
    assert retrieve(built_index, q, run, cfg, model=model, overwrite=False) == meta  # run again as it was run
    assert "[retrieve] unchanged" in capsys.readouterr().out
    assert (run.read_bytes(), (tmp_path / "run.trec.meta.json").read_bytes()) == before
    with pytest.raises(PipelineError, match=r"a different one \(top_k 100 there, 5 asked now\)"):
        retrieve(built_index, q, run, load_config(None, ["retrieve.top_k=5"]), model=model, overwrite=False)
    model.shift = 3.0
    with pytest.raises(PipelineError, match="a different one \\(other lines"):
        retrieve(built_index, q, run, cfg, model=model, overwrite=False)
    assert (run.read_bytes(), (tmp_path / "run.trec.meta.json").read_bytes()) == before
    assert sorted(os.listdir(tmp_path)) == ["emb", "idx", "q.tsv", "run.trec", "run.trec.meta.json"]


# ------------------------------------------------------------------ index error messages

def _index_err(tmp_path, capsys, emb, *extra):
    rc = main(["index", "--embeddings", str(emb), "--out", str(tmp_path / "idx"), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and "Traceback" not in err, err
    assert not (tmp_path / "idx").exists()
    return err


def test_ivf_with_more_lists_than_vectors(tmp_path, capsys):
    emb = make_embeddings(tmp_path / "emb", n=30)
    err = _index_err(tmp_path, capsys, emb, "--factory", "IVF64,Flat")
    assert "64 inverted lists" in err and "30 vectors" in err


def test_pq_that_cannot_train_is_a_message(tmp_path, capsys):
    emb = make_embeddings(tmp_path / "emb", n=30)
    err = _index_err(tmp_path, capsys, emb, "--factory", "PQ2x8")
    assert "cannot be trained" in err or "training" in err


@pytest.mark.parametrize("damage,message", [
    (lambda d: (d / "embeddings.json").write_text(json.dumps({**json.loads((d / "embeddings.json").read_text()),
                                                               "complete": False})), "not complete"),
    (lambda d: (d / "shard-00000.done").unlink(), "incomplete"),
    (lambda d: (d / "shard-00000.npy").unlink(), "shard-00000.npy"),
    (lambda d: (d / "shard-00000.npy").write_bytes((d / "shard-00000.npy").read_bytes()[:100]), "truncated"),
    # the header intact, the last rows cut off: named as such (not numpy's "mmap length is greater…")
    (lambda d: (d / "shard-00000.npy").write_bytes((d / "shard-00000.npy").read_bytes()[:-40]),
     "shard-00000.npy: truncated or corrupt vectors ("),
    (lambda d: (d / "shard-00000.npy").write_bytes((d / "shard-00000.npy").read_bytes()[:-40]),
     "run `pipeline encode` again (it re-encodes this shard)"),
    (lambda d: (d / "shard-00000.pids.txt").unlink(), "pids.txt"),
    (lambda d: (d / "embeddings.json").write_text("{"), "not valid JSON"),
    (lambda d: (d / "embeddings.json").unlink(), "no embeddings here"),
])
def test_incomplete_embeddings(tmp_path, capsys, damage, message):
    emb = make_embeddings(tmp_path / "emb")
    damage(emb)
    err = _index_err(tmp_path, capsys, emb)
    assert message in err and str(emb) in err


@pytest.fixture()
def built_index(tmp_path):
    from pipeline.config import IndexConfig
    from pipeline.index.faiss_index import build_index

    emb = make_embeddings(tmp_path / "emb")
    build_index(emb, tmp_path / "idx", IndexConfig(), progress=False)
    return tmp_path / "idx"


@pytest.mark.parametrize("damage,message", [
    (lambda d: (d / "index.faiss").write_bytes((d / "index.faiss").read_bytes()[:50]), "corrupt or truncated"),
    (lambda d: (d / "index.faiss").write_bytes(b"garbage" * 20), "corrupt or truncated"),
    (lambda d: (d / "index.faiss").unlink(), "missing"),
    (lambda d: (d / "pids.txt").write_text("only-one\n"), "ids for"),
    (lambda d: (d / "index.json").write_text("{oops"), "unreadable index metadata"),
])
def test_damaged_index_is_a_message(built_index, capsys, damage, message):
    damage(built_index)
    rc = main(["retrieve", "--index", str(built_index), "--queries", str(DATA / "python_faq_all.qrels"),
               "--out", str(built_index.parent / "run.trec")])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, err
    assert not (built_index.parent / "run.trec").exists()


@pytest.mark.parametrize("k", ["-1", "0"])
def test_top_k_must_be_positive(tmp_path, capsys, k):
    rc = main(["retrieve", "--index", str(tmp_path), "--queries", "q", "--out", str(tmp_path / "r"), "--top-k", k])
    err = capsys.readouterr().err
    assert rc == 2 and "top_k" in err and "Traceback" not in err


def test_query_model_dimension_differs(built_index, tmp_path):
    from pipeline.config import load_config
    from pipeline.errors import PipelineError
    from pipeline.index.retrieve import retrieve

    class Model:  # an 8-dim index, a 4-dim query model
        dim = 4

        def embed(self, texts, side, batch_size):
            return np.zeros((len(texts), 4), np.float32)

    q = tmp_path / "q.tsv"
    q.write_text("q1\thello\n")
    with pytest.raises(PipelineError, match="4-dimensional .* 8-dimensional"):
        retrieve(built_index, q, tmp_path / "run.trec", load_config(None, []), model=Model(), progress=False)
    assert not (tmp_path / "run.trec").exists()


# ------------------------------------------------------------------ atomic replacement

def _write_dir(path: Path, tag: str) -> None:
    with atomic_path(path) as tmp:
        tmp.mkdir()
        (tmp / "a.txt").write_text(tag)
        (tmp / "b.txt").write_text(tag * 2)


def _temps(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.startswith((".tmp-", ".old-")))


@pytest.mark.parametrize("exchange", [True, False])
def test_directory_replacement(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(io_utils, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    _write_dir(out, "old")
    _write_dir(out, "new")
    assert (out / "a.txt").read_text() == "new" and (out / "b.txt").read_text() == "newnew"
    assert _temps(tmp_path) == []


def test_failed_build_keeps_old_output(tmp_path):
    out = tmp_path / "out"
    _write_dir(out, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(out) as tmp:
            tmp.mkdir()
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("killed mid-build")
    assert (out / "a.txt").read_text() == "old" and _temps(tmp_path) == []


def test_second_rename_failing_is_undone(tmp_path, monkeypatch):
    """Fallback path: the first rename (old aside) succeeds, the second raises: the old comes back."""
    monkeypatch.setattr(io_utils, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    _write_dir(out, "old")
    real, calls = os.replace, []

    def flaky(a, b):
        calls.append((a, b))
        if len(calls) == 2:
            raise OSError("disk on fire")
        return real(a, b)

    monkeypatch.setattr(io_utils.os, "replace", flaky)
    with pytest.raises(OSError, match="disk on fire"):
        _write_dir(out, "new")
    monkeypatch.setattr(io_utils.os, "replace", real)
    assert (out / "a.txt").read_text() == "old" and _temps(tmp_path) == []


KILLER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from pipeline import io_utils
    mode = sys.argv[2]
    if mode != "exchange":
        io_utils._exchange = lambda a, b: False
    real = os.replace
    n = [0]
    def dying(a, b):
        n[0] += 1
        if mode == "between" and n[0] == 2:
            os._exit(9)          # killed between the two renames
        return real(a, b)
    io_utils.os.replace = dying
    if mode == "after":          # killed after the swap, before the old copy is removed
        io_utils.remove_path = lambda p: os._exit(9)
    if mode == "exchange":
        io_utils.remove_path = lambda p: os._exit(9)
    with io_utils.atomic_path(Path(sys.argv[1])) as tmp:
        tmp.mkdir()
        (tmp / "a.txt").write_text("new")
        if mode == "build":
            os._exit(9)          # killed while building
""")


@pytest.mark.parametrize("mode,expect", [("between", "old"), ("after", "new"), ("exchange", "new"),
                                         ("build", "old")])
def test_kill_then_next_run_recovers(tmp_path, capsys, mode, expect):
    """A writer killed at each point: the path always holds a complete output, and the next
    write of that path cleans (or restores) the killed writer's temporaries and says so."""
    out = tmp_path / "out"
    _write_dir(out, "old")
    script = tmp_path / "killer.py"
    script.write_text(KILLER.format(repo=str(REPO)))
    rc = subprocess.run([sys.executable, str(script), str(out), mode]).returncode
    assert rc == 9
    assert _temps(tmp_path), "the kill should leave a temporary behind"
    if mode == "between":
        assert not out.exists()  # the window the recovery exists for
    else:
        assert (out / "a.txt").read_text() == expect  # readable right after the kill
    actions = recover_stale(out)
    assert actions and "[cleanup]" in capsys.readouterr().err
    assert (out / "a.txt").read_text() == expect and _temps(tmp_path) == []
    _write_dir(out, "next")
    assert (out / "a.txt").read_text() == "next" and _temps(tmp_path) == []


def test_live_writers_temporaries_are_left_alone(tmp_path):
    out = tmp_path / "out"
    live = tmp_path / f".tmp-out-{os.getppid()}-0123abcd"
    live.mkdir()
    other = tmp_path / ".tmp-out-x-999999-0123abcd"  # a different output's temporary ("out-x")
    other.mkdir()
    write_json_atomic(out, {"a": 1})
    assert live.exists() and other.exists()


def test_file_and_directory_never_swap(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "keep").write_text("x")
    with pytest.raises(OutputError, match="is a directory"):
        write_json_atomic(d, {"a": 1})
    assert (d / "keep").read_text() == "x"
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(OutputError, match="is a file"):
        _write_dir(f, "new")
    assert f.read_text() == "x" and _temps(tmp_path) == []


def test_unwritable_place_is_a_message(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="cannot write here"):
        write_json_atomic(tmp_path / "f" / "sub" / "m.json", {"a": 1})
    assert (tmp_path / "f").read_text() == "x"


def _can_mount_private(d: Path) -> bool:
    import shutil as sh

    if os.geteuid() != 0 or not sh.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro tmpfs {d}"], capture_output=True)
    return r.returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["index", "retrieve", "evaluate"])
def test_read_only_filesystem_is_a_message(tmp_path, verb):
    """Outputs on a read-only filesystem (a private read-only tmpfs mount): exit 2, one line."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if not _can_mount_private(ro):
        pytest.skip("needs root and unshare to mount a read-only filesystem")
    emb = make_embeddings(tmp_path / "emb")
    args = {"index": ["index", "--embeddings", str(emb), "--out", str(ro / "idx")],
            "retrieve": ["retrieve", "--index", str(tmp_path), "--queries", "q", "--out", str(ro / "run.trec")],
            "evaluate": ["evaluate", "--run", str(DATA / "python_faq_minilm_top20.trec"),
                         "--qrels", str(DATA / "python_faq_all.qrels"), "--json", str(ro / "m.json")]}[verb]
    cmd = f"mount -t tmpfs -o ro tmpfs {ro} && exec {sys.executable} -m pipeline.cli " + " ".join(args)
    r = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert "read-only filesystem" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_index_on_a_disk_that_fills_is_a_message_and_keeps_the_old_index(tmp_path):
    """A private 256 KiB tmpfs: an index of 200 vectors fits; replacing it with one of 20,000
    (1.3 MB) fills the disk. Exit 2 with the OS's reason, the old index still complete, and no
    temporary left on the full disk."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not _can_mount_private(mnt):
        pytest.skip("needs root and unshare to mount a small filesystem")
    small = make_embeddings(tmp_path / "small", n=200, dim=16)
    big = make_embeddings(tmp_path / "big", n=20_000, dim=16)
    cli = f"{sys.executable} -m pipeline.cli index --out {mnt / 'idx'} --embeddings"
    check = ("import json, os, sys; from pipeline.index.faiss_index import LoadedIndex; "
             f"print(json.dumps({{'ntotal': LoadedIndex({str(mnt / 'idx')!r}).index.ntotal, "
             f"'left': sorted(os.listdir({str(mnt)!r}))}}))")
    cmd = (f"mount -t tmpfs -o size=256k tmpfs {mnt} && {cli} {small} >/dev/null 2>&1 && "
           f"{cli} {big} --overwrite 2>&1; echo EXIT=$?; {sys.executable} -c \"{check}\"")
    r = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, cwd=REPO)
    out = r.stdout.strip().splitlines()
    assert "EXIT=2" in out, r.stdout + r.stderr
    message = out[out.index("EXIT=2") - 1]
    assert message.startswith("error: ") and "No space left on device" in message and "existing index is kept" \
        in message, message
    assert "Traceback" not in r.stdout + r.stderr
    assert json.loads(out[-1]) == {"ntotal": 200, "left": ["idx"]}


def test_a_shard_on_a_disk_that_fills_raises_the_os_reason_and_leaves_no_part(tmp_path):
    """np.save into a real file writes with C's fwrite, whose short write numpy reports as
    "65536 requested and 51168 written" (errno None): the shard writer goes through `write`, so a
    full disk says ENOSPC, and the shard that did not fit leaves nothing (no .npy, no marker)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not _can_mount_private(mnt):
        pytest.skip("needs root and unshare to mount a small filesystem")
    code = textwrap.dedent(f"""
        import json, os
        import numpy as np
        from pipeline.index import shards
        v = np.random.default_rng(0).random((2048, 32), dtype=np.float32)
        done = []
        for k in range(4):  # 256 KiB of vectors a shard on a 600 KiB disk: the third does not fit
            pids = [f"{{k}}-{{i}}" for i in range(2048)]
            spec = {{"name": f"shard-00000-{{k:09d}}", "start": 0, "end": 2048, "part": "x", "part_index": 0,
                    "part_rows": 2048, "pids_sha256": shards.pids_digest(pids)}}
            try:
                shards.write_shard({str(mnt)!r}, spec, pids, v)
                done.append(spec["name"])
            except OSError as e:
                print(json.dumps({{"done": done, "errno": e.errno, "strerror": e.strerror,
                                  "left": sorted(os.listdir({str(mnt)!r})),
                                  "complete": sorted(shards.completed_shards({str(mnt)!r}))}}))
                break
    """)
    (tmp_path / "fill.py").write_text(code)
    cmd = f"mount -t tmpfs -o size=600k tmpfs {mnt} && {sys.executable} {tmp_path / 'fill.py'}"
    r = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, cwd=REPO)
    got = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else r.stderr
    assert got["errno"] == 28 and got["strerror"] == "No space left on device", got
    assert len(got["done"]) == 2 and got["complete"] == got["done"]
    assert got["left"] == sorted(f"{n}{ext}" for n in got["done"] for ext in (".done", ".npy", ".pids.txt"))


def test_reader_and_checker_recover_a_killed_replacement(tmp_path, capsys):
    """Fallback path killed between its renames: the index is aside as .old-*; the next
    reader finds it (restored), and the next `pipeline index` without --overwrite finds the
    restored output is this tool's index, the same one it builds: kept."""
    from pipeline.config import IndexConfig
    from pipeline.index.faiss_index import LoadedIndex, build_index

    emb = make_embeddings(tmp_path / "emb")
    idx = tmp_path / "idx"
    build_index(emb, idx, IndexConfig(), progress=False)
    aside = tmp_path / ".old-idx-999999999-0123abcd"  # a pid that cannot be alive
    os.replace(idx, aside)
    assert LoadedIndex(idx).index.ntotal == 30
    assert "restored the previous output" in capsys.readouterr().err
    os.replace(idx, aside)
    assert main(["index", "--embeddings", str(emb), "--out", str(idx)]) == 0
    assert "unchanged" in capsys.readouterr().out and (idx / "index.json").exists() and not aside.exists()


def test_index_refuses_vectors_of_a_corpus_reingested_with_other_content(tmp_path, capsys):
    """embeddings.json records the corpus and its fingerprint; `index` compares them with the
    corpus at that path now (ingest warns when it replaces a corpus; index refuses the stale vectors)."""
    from pipeline.data.ingest import ingest

    src = tmp_path / "collection.tsv"
    src.write_text("".join(f"p{i}\tpassage {i}\n" for i in range(30)))
    corpus = tmp_path / "corpus"
    ingest([src], "msmarco", corpus, progress=False, variant="custom")
    emb = make_embeddings(tmp_path / "emb")
    meta = json.loads((emb / "embeddings.json").read_text())
    meta.update(corpus=str(corpus), corpus_fingerprint=json.loads((corpus / "manifest.json").read_text())["fingerprint"])
    (emb / "embeddings.json").write_text(json.dumps(meta))
    assert main(["index", "--embeddings", str(emb), "--out", str(tmp_path / "idx")]) == 0

    src.write_text("".join(f"p{i}\tanother text {i}\n" for i in range(30)))  # same ids and count, other content
    ingest([src], "msmarco", corpus, progress=False, variant="custom", overwrite=True)
    before = snapshot(tmp_path)
    assert main(["index", "--embeddings", str(emb), "--out", str(tmp_path / "idx2")]) == 2
    err = capsys.readouterr().err
    assert f"error: {emb / 'embeddings.json'}: these vectors were encoded from the corpus at {corpus}" in err
    assert "re-ingested with other content" in err and "Traceback" not in err
    assert snapshot(tmp_path) == before
