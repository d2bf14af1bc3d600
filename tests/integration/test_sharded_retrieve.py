"""`pipeline retrieve` over a Flat index in several parts gives the one-part index's run line for line (the same
passages in the same order, scores to 1e-5), through the README's commands: encode, index (index.shards=4),
retrieve (retrieve.runner=local, one part loaded at a time), evaluate."""

from __future__ import annotations

import pytest

from pipeline.cli import main

pytestmark = pytest.mark.integration


def test_a_run_over_four_parts_is_the_one_part_run_line_for_line(faq, tiny_model_dir, tmp_path, capsys):
    emb = tmp_path / "emb"
    assert main(["encode", "--corpus", str(faq), "--out", str(emb), "--model", str(tiny_model_dir),
                 "encode.runner=local", "encode.backend=torch", "encode.shard_rows=40"]) == 0
    runs = {}
    for name, extra in (("one", []), ("four", ["index.shards=4"])):
        assert main(["index", "--embeddings", str(emb), "--out", str(tmp_path / name), *extra]) == 0
        run = tmp_path / f"{name}.trec"
        assert main(["retrieve", "--index", str(tmp_path / name), "--queries", str(faq / "queries.tsv"),
                     "--out", str(run), "--top-k", "50", "retrieve.runner=local"]) == 0
        runs[name] = [line.split() for line in run.read_text().splitlines()]
    out = capsys.readouterr().out
    assert "4 parts (index.shards=4)" in out
    assert len(runs["one"]) == len(runs["four"]) > 0
    for a, b in zip(runs["one"], runs["four"]):
        assert a[:4] == b[:4] and abs(float(a[4]) - float(b[4])) <= 1e-5
