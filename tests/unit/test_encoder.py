"""BiEncoder: offline loading, pooling detection, separate towers, prefixes, save/load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.config import ModelConfig
from pipeline.errors import ConfigError
from pipeline.models import BiEncoder
from pipeline.models.heads import pool
from pipeline.models.tiny import build_tiny_bert


@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    root = tmp_path_factory.mktemp("towers")
    return build_tiny_bert(root / "a", seed=0), build_tiny_bert(root / "b", seed=1)


def test_minilm_package_declares_mean_pooling_and_normalisation():
    model = BiEncoder.load(ModelConfig(name_or_path="minilm"))
    assert (model.pooling, model.normalize, model.dim) == ("mean", True, 384)


def test_plain_bert_defaults_to_cls_without_normalisation(towers):
    model = BiEncoder.load(ModelConfig(name_or_path=str(towers[0])))
    assert (model.pooling, model.normalize, model.shared) == ("cls", False, True)


def test_missing_directory_is_a_config_error_not_a_download(tmp_path):
    with pytest.raises(ConfigError, match="nothing is downloaded"):
        BiEncoder.load(ModelConfig(name_or_path=str(tmp_path / "nope")))
    with pytest.raises(ConfigError):
        BiEncoder.load(ModelConfig(name_or_path="bert-base-uncased"))  # a hub id is refused too


def test_mean_pooling_ignores_padding():
    hidden = torch.tensor([[[1.0, 1.0], [3.0, 3.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert torch.equal(pool(hidden, mask, "mean"), torch.tensor([[2.0, 2.0]]))
    assert torch.equal(pool(hidden, mask, "cls"), torch.tensor([[1.0, 1.0]]))


def test_every_pooling_mode_by_hand():
    # two texts: right padding in the first, none in the second
    hidden = torch.tensor([[[1.0, -2.0], [3.0, 4.0], [100.0, 100.0]],
                           [[2.0, 0.0], [0.0, 2.0], [4.0, -4.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    expect = {
        "cls": [[1.0, -2.0], [2.0, 0.0]],
        "mean": [[2.0, 1.0], [2.0, -2 / 3]],
        "max": [[3.0, 4.0], [4.0, 2.0]],
        "lasttoken": [[3.0, 4.0], [4.0, -4.0]],
        "weightedmean": [[(1 + 6) / 3, (-2 + 8) / 3], [(2 + 0 + 12) / 6, (0 + 4 - 12) / 6]],
        "mean_sqrt_len_tokens": [[4 / 2 ** 0.5, 2 / 2 ** 0.5], [6 / 3 ** 0.5, -2 / 3 ** 0.5]],
    }
    for mode, want in expect.items():
        torch.testing.assert_close(pool(hidden, mask, mode), torch.tensor(want), msg=mode)
    with pytest.raises(ConfigError, match="pooling 'median'"):
        pool(hidden, mask, "median")


def test_prompt_tokens_can_be_left_out_of_pooling():
    from pipeline.models.heads import Head

    hidden = torch.tensor([[[9.0], [9.0], [1.0], [3.0], [0.0]]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    head = Head("mean", False, include_prompt=False)
    assert head(hidden, mask, prompt_length=2).item() == 2.0  # mean of 1 and 3
    assert Head("mean", False)(hidden, mask, prompt_length=2).item() == 5.5  # prompt included


def test_separate_towers_save_and_load_round_trip(towers, tmp_path):
    cfg = ModelConfig(name_or_path=str(towers[0]), query_name_or_path=str(towers[1]), pooling="mean",
                      normalize=True, query_prefix="query: ", doc_prefix="passage: ")
    model = BiEncoder.load(cfg)
    assert not model.shared and model.query_encoder is not model.doc_encoder
    q, d = model.embed(["how to sort"], "query"), model.embed(["how to sort"], "doc")
    assert not np.allclose(q, d)  # different towers and prefixes
    assert np.allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    model.save(tmp_path / "saved")
    again = BiEncoder.load(ModelConfig(name_or_path=str(tmp_path / "saved"), query_prefix="query: ",
                                       doc_prefix="passage: "))
    assert not again.shared and (again.pooling, again.normalize) == ("mean", True)
    np.testing.assert_allclose(again.embed(["how to sort"], "query"), q, atol=1e-6)
    np.testing.assert_allclose(again.embed(["how to sort"], "doc"), d, atol=1e-6)


def test_prefix_and_max_length_reach_the_tokenizer(towers):
    model = BiEncoder.load(ModelConfig(name_or_path=str(towers[0]), query_prefix="query: ", query_max_length=5,
                                       doc_max_length=7))
    q = model.tokenize(["a b c d e f g h i j"], "query")
    d = model.tokenize(["a b c d e f g h i j"], "doc")
    assert q["input_ids"].shape[1] == 5 and d["input_ids"].shape[1] == 7
    assert model.query_tokenizer.decode(q["input_ids"][0]).split()[1] == "query"


def test_max_lengths_default_to_the_models_own_limit(towers):
    minilm = BiEncoder.load(ModelConfig(name_or_path="minilm"))
    assert (minilm.cfg.query_max_length, minilm.cfg.doc_max_length) == (256, 256)  # sentence_bert_config.json
    plain = BiEncoder.load(ModelConfig(name_or_path=str(towers[0])))
    assert (plain.cfg.query_max_length, plain.cfg.doc_max_length) == (64, 256)
    explicit = BiEncoder.load(ModelConfig(name_or_path="minilm", query_max_length=32))
    assert explicit.cfg.query_max_length == 32


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_length_groups_give_the_whole_batchs_vectors_and_gradients(tiny_model_dir, pooling):
    """train.length_group_rows: a training batch encoded in length-sorted groups, each cut to its own
    longest row, gives every row the vector (and the model the gradient) the one padded batch gives."""
    model = BiEncoder.load(ModelConfig(name_or_path=str(tiny_model_dir), pooling=pooling, normalize=True,
                                       doc_max_length=64))
    model.train()
    for m in model.modules():  # dropout off: the two ways must see the same network
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    texts = [("word " * n).strip() for n in (40, 3, 17, 9, 60, 1, 25, 5, 33, 12, 2, 48)]
    batch = model.tokenize(texts, "doc")
    results = []
    for rows in (0, 4, 3):  # one batch; 3 groups of 4; 4 groups of 3
        model.length_group_rows = rows
        model.zero_grad()
        vecs = model.encode_docs(batch)
        (vecs * torch.arange(vecs.shape[1], dtype=vecs.dtype)).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((vecs.detach(), grads))
    (ref, ref_grads), *grouped = results
    for vecs, grads in grouped:
        torch.testing.assert_close(vecs, ref, rtol=1e-5, atol=1e-5)
        assert grads.keys() == ref_grads.keys()
        for n in grads:
            torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-4, atol=1e-5)
    model.length_group_rows = 4
    model.eval()  # outside training (inference, validation) the batch is never split
    with torch.no_grad():
        torch.testing.assert_close(model.encode_docs(batch), ref, rtol=1e-5, atol=1e-5)
