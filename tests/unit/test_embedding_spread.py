"""scripts/embedding_spread.py: the mean cosine between random passage pairs, checked on vectors whose answer
is known by hand."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from pipeline.index.shards import plan_part, write_shard


def _script():
    spec = importlib.util.spec_from_file_location(
        "embedding_spread", Path(__file__).resolve().parents[2] / "scripts" / "embedding_spread.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _embeddings(folder: Path, vectors: np.ndarray) -> Path:
    folder.mkdir(parents=True)
    pids = [f"p{i}" for i in range(len(vectors))]
    specs = plan_part(0, "corpus/part-00000.parquet", pids, 3)
    for s in specs:
        write_shard(folder, s, pids[s["start"]:s["end"]], vectors[s["start"]:s["end"]])
    (folder / "embeddings.json").write_text(json.dumps({"complete": True, "shard_names": [s["name"] for s in specs]}))
    return folder


def test_orthogonal_passages_spread_evenly_and_identical_ones_coincide(tmp_path, capsys):
    mod = _script()
    # 4 orthogonal directions (lengths differ: cosine ignores them): every pair's cosine is 0, and the mean of
    # the 4 unit vectors has length |(1,1,1,1)/4| = 0.5
    even = _embeddings(tmp_path / "even", np.diag([1.0, 2.0, 3.0, 0.5]).astype(np.float32))
    s = mod.spread(even, pairs=500, seed=0)
    assert s["passages"] == 4 and abs(s["mean"]) < 1e-6 and abs(s["mean_vector"] - 0.5) < 1e-6
    same = _embeddings(tmp_path / "same", np.tile(np.array([[3.0, 4.0]], np.float32), (5, 1)))
    s = mod.spread(same, pairs=500, seed=0)
    assert abs(s["mean"] - 1) < 1e-6 and s["sd"] < 1e-6 and abs(s["mean_vector"] - 1) < 1e-6
    assert mod.main([str(even), str(same)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("even: 4 passages, mean cosine 0.000 (sd 0.000), mean unit vector 0.500")
    assert out[1].endswith("same: 5 passages, mean cosine 1.000 (sd 0.000), mean unit vector 1.000")


def test_effects_folder_measures_finished_runs_only_and_a_missing_set_is_one_error_line(tmp_path, capsys):
    mod = _script()
    work = tmp_path / "effects-x"
    for arm, seed, done in (("dpr", 0, True), ("dpr", 1, False), ("dpr", "0.replaced-20261129-151514", True),
                            ("zero-shot", "once", True)):
        run = work / "arms" / arm / f"seed-{seed}" if seed != "once" else work / "arms" / arm / "once"
        _embeddings(run / "emb", np.eye(3, dtype=np.float32))
        if done:
            (run / "done.json").write_text("{}")
    assert [name for name, _ in mod.effects_folders(work)] == ["dpr/seed-0", "zero-shot/once"]
    assert mod.main([str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
