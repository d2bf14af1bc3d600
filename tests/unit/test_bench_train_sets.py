"""bench/train.py --vs-st's training sets and padding count: the padding it reports for `pipeline train` is
the padding the encoder computes in training, the built-in long set is made of the shipped FAQ alone at the
asked lengths, and a --max-pairs subset keeps the first judgements (bench/profile_train_step.py shares them)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench_train():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("train")
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from pipeline.config import ModelConfig
    from pipeline.models import BiEncoder

    return BiEncoder.load(ModelConfig(name_or_path=str(tiny_model_dir), pooling="mean", doc_max_length=64))


def _computed_tokens(model, texts: list[str], group_rows: int) -> tuple[list[int], int]:
    """(real lengths, padded tokens the towers ran on) of one training forward of `texts` as documents."""
    seen = []
    forward_one = model._forward_one

    def spy(tower, batch, head, prompt_length):
        seen.append(batch["input_ids"].numel())
        return forward_one(tower, batch, head, prompt_length)

    model.length_group_rows = group_rows
    model.train()
    model._forward_one = spy
    try:
        tok = model.tokenize(texts, "doc")
        with torch.no_grad():
            model.encode_docs(tok)
    finally:
        del model._forward_one
        model.eval()
    return tok["attention_mask"].sum(1).tolist(), sum(seen)


@pytest.mark.parametrize("rows,group_rows", [(12, 2), (12, 4), (12, 5), (7, 4), (12, 0)])
def test_group_padding_is_what_the_encoder_computes(bench_train, tiny, rows, group_rows):
    words = "retrieval dense passage query index vector model train encoder shard corpus".split()
    texts = [" ".join(words[: 1 + (i * 7) % len(words)] * (1 + i % 3)) for i in range(rows)]
    lengths, computed = _computed_tokens(tiny, texts, group_rows)
    assert len(set(lengths)) > 2  # varied lengths: grouping changes the count
    assert bench_train.group_padding(lengths, group_rows) == computed
    if group_rows == 0 or rows < 2 * group_rows:
        assert computed == rows * max(lengths)  # one padded batch, as sentence-transformers pads it


def test_long_faq_is_the_shipped_faq_at_the_asked_lengths(bench_train, tmp_path):
    from transformers import AutoTokenizer

    from pipeline.data.bundled import python_faq_dir
    from pipeline.models.loading import resolve_model_path

    model_dir = str(resolve_model_path("minilm"))
    folder = bench_train.long_faq(tmp_path / "long", model_dir, 200, 256)
    src = python_faq_dir()
    faq = [json.loads(line) for line in (src / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    docs = [json.loads(line) for line in (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [d["_id"] for d in docs] == [d["_id"] for d in faq]
    tok = AutoTokenizer.from_pretrained(model_dir)
    lengths = [len(tok(d["text"], verbose=False)["input_ids"]) for d in docs]
    assert min(lengths) >= 198 and max(lengths) <= 258  # cut at a token boundary: a word piece may retokenise
    for mine, theirs in zip(docs, faq):
        answer = theirs["text"]
        assert mine["text"].startswith(answer[:len(mine["text"])])  # its own answer first (cut inside it if long)
    assert (folder / "queries.jsonl").read_bytes() == (src / "queries.jsonl").read_bytes()
    for split in ("train", "test", "all"):
        assert (folder / "qrels" / f"{split}.tsv").read_bytes() == (src / "qrels" / f"{split}.tsv").read_bytes()


def test_beir_subset_keeps_the_first_judgements(bench_train, tmp_path):
    from pipeline.data.bundled import python_faq_dir

    src = python_faq_dir()
    sub = bench_train.beir_subset(src, tmp_path / "sub", 5)
    lines = (src / "qrels" / "train.tsv").read_text(encoding="utf-8").splitlines()
    assert (sub / "qrels" / "train.tsv").read_text(encoding="utf-8").splitlines() == lines[:6]  # header + 5
    assert (sub / "qrels" / "test.tsv").read_bytes() == (src / "qrels" / "test.tsv").read_bytes()
    assert (sub / "corpus.jsonl").is_symlink() and (sub / "corpus.jsonl").resolve() == (src / "corpus.jsonl").resolve()
    assert (src / "qrels" / "train.tsv").read_text(encoding="utf-8").splitlines() == lines  # the source untouched
