"""`train.attention=threshold-dropout` (models/attention.py): the towers' attention with its dropout mask
drawn from 16-bit lanes. What must hold: the same attention as SDPA outside training (bit for bit), in
training exactly softmax(q k^T s + mask) with each probability kept with probability K / 65536 and scaled
by 65536 / K (forward and gradients equal a hand-written reference given the same lanes), unbiased, governed
by torch's seed; a saved model names no attention; the setting resolves as documented and joins a
run's identity."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pipeline.errors import ConfigError
from pipeline.models.attention import (THRESHOLD_DROPOUT, dropout_lanes, keep_threshold, resolve_attention,
                                       threshold_dropout_attention, use_attention)


class _Module(torch.nn.Module):
    is_causal = False


def _qkv(b=2, h=3, t=7, d=8, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=g, requires_grad=requires_grad) for _ in range(3)]


def _padding_mask(b=2, t=7):
    """[b, 1, t, t] bool, True = attend: the second example's last two tokens are padding."""
    keys = torch.ones(b, t, dtype=torch.bool)
    keys[1, -2:] = False
    return keys[:, None, None, :].expand(b, 1, t, t)


def test_keep_threshold_is_the_rate_to_one_lane():
    assert keep_threshold(0.1) == 58982 and abs(keep_threshold(0.1) / 65536 - 0.9) < 1 / 131072
    assert keep_threshold(0.0) == 65536 and keep_threshold(0.5) == 32768 and keep_threshold(0.999999) == 1


def test_lanes_are_uniform_in_every_position_of_a_word_and_follow_torch_seed():
    torch.manual_seed(3)
    a = dropout_lanes(400_003)
    torch.manual_seed(3)
    assert torch.equal(a, dropout_lanes(400_003)) and a.dtype == torch.int16 and a.numel() == 400_003
    keep = keep_threshold(0.1) - 32768
    n = a.numel() // 4 * 4
    for lane in range(4):  # each of a word's four lanes, including the one holding the sign bit
        kept = (a[:n].view(-1, 4)[:, lane] < keep).double().mean().item()
        sd = math.sqrt(0.9 * 0.1 / (n // 4))
        assert abs(kept - keep_threshold(0.1) / 65536) < 6 * sd, (lane, kept)
    assert a.min().item() < -32000 and a.max().item() > 32000


def test_outside_training_it_is_sdpa_bit_for_bit():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = _qkv()
    m = _Module().eval()  # a model in eval mode passes dropout 0 (BERT: `0.0 if not self.training`)
    for mask in (None, _padding_mask()):
        ours, _ = threshold_dropout_attention(m, q, k, v, mask, scaling=0.3, dropout=0.0)
        ref, _ = sdpa_attention_forward(m, q, k, v, mask, scaling=0.3, dropout=0.0)
        assert torch.equal(ours, ref)
    m.train()  # dropout 0 in training: the same
    assert torch.equal(threshold_dropout_attention(m, q, k, v, None, scaling=0.3, dropout=0.0)[0],
                       sdpa_attention_forward(m, q, k, v, None, scaling=0.3, dropout=0.0)[0])


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_training_forward_and_gradients_equal_the_hand_written_attention_with_the_same_lanes(mask_kind):
    p, scaling = 0.25, 0.35
    bool_mask = _padding_mask()
    mask = {"none": None, "bool": bool_mask,
            "additive": torch.zeros(bool_mask.shape).masked_fill(~bool_mask, torch.finfo(torch.float32).min)}[mask_kind]
    q, k, v = _qkv(requires_grad=True)
    torch.manual_seed(11)
    out, weights = threshold_dropout_attention(_Module().train(), q, k, v, mask, scaling=scaling, dropout=p)
    assert weights is None and out.shape == (2, 7, 3, 8)
    out.pow(2).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]

    q2, k2, v2 = _qkv(requires_grad=True)
    torch.manual_seed(11)
    lanes = dropout_lanes(2 * 3 * 7 * 7).view(2, 3, 7, 7)
    scores = (q2 @ k2.transpose(-1, -2)) * scaling
    if mask_kind != "none":
        scores = scores.masked_fill(~bool_mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    kept = (lanes.int() + 32768 < keep_threshold(p)).float()
    ref = ((probs * kept * (65536 / keep_threshold(p))) @ v2).transpose(1, 2)
    assert 0.55 < kept.mean().item() < 0.95  # some dropped, most kept
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    ref.pow(2).sum().backward()
    for ours, theirs in zip(grads, (q2.grad, k2.grad, v2.grad)):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_dropout_keeps_the_expectation_and_bf16_inputs_come_back_in_bf16():
    q, k, v = _qkv(b=1, h=1, t=5, d=4)
    m = _Module().train()
    torch.manual_seed(0)
    draws = threshold_dropout_attention(m, *(t.expand(4000, -1, -1, -1) for t in (q, k, v)), None, dropout=0.1)[0]
    mean = draws.mean(dim=0, keepdim=True)  # 4000 examples, each its own masks
    exact = torch.softmax((q @ k.transpose(-1, -2)) * 0.5, -1) @ v
    torch.testing.assert_close(mean, exact.transpose(1, 2), atol=0.02, rtol=0.0)
    out, _ = threshold_dropout_attention(m, q.bfloat16(), k.bfloat16(), v.bfloat16(), None, dropout=0.1)
    assert out.dtype == torch.bfloat16


def test_resolve_attention():
    assert resolve_attention("auto", "cpu") == THRESHOLD_DROPOUT
    assert resolve_attention("auto", "cuda") is None  # a GPU's fused SDPA draws dropout inside
    assert resolve_attention("sdpa", "cpu") == "sdpa" and resolve_attention("eager", "cuda") == "eager"
    # auto resuming: the checkpoint's, or the towers' own for a checkpoint made before it was recorded
    assert resolve_attention("auto", "cpu", checkpoint="sdpa", resuming=True) == "sdpa"
    assert resolve_attention("auto", "cpu", checkpoint=None, resuming=True) is None
    with pytest.raises(ConfigError, match="train.attention='flash'"):
        resolve_attention("flash", "cpu")


def test_a_tower_trains_with_it_and_its_saved_model_names_no_attention(tiny_model_dir, tmp_path):
    from transformers import AutoModel

    tower = AutoModel.from_pretrained(str(tiny_model_dir))
    assert tower.config._attn_implementation == "sdpa"
    assert use_attention([tower, tower], THRESHOLD_DROPOUT) == THRESHOLD_DROPOUT
    ids = torch.randint(1000, 2000, (2, 9))
    tower.eval()
    with torch.no_grad():
        a = tower(input_ids=ids).last_hidden_state
    tower.train()
    torch.manual_seed(0)
    b = tower(input_ids=ids).last_hidden_state
    torch.manual_seed(0)
    assert torch.equal(b, tower(input_ids=ids).last_hidden_state) and not torch.allclose(a, b)
    tower.save_pretrained(tmp_path / "saved")
    assert not any("attn" in key for key in json.loads((tmp_path / "saved" / "config.json").read_text()))
    again = AutoModel.from_pretrained(str(tmp_path / "saved")).eval()
    assert again.config._attn_implementation == "sdpa"
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids).last_hidden_state, a)
    # auto leaves a tower whose own attention is not SDPA as it is; an explicit value is set
    eager = AutoModel.from_pretrained(str(tiny_model_dir), attn_implementation="eager")
    assert use_attention([eager], THRESHOLD_DROPOUT, asked="auto") == "eager"
    assert use_attention([eager], THRESHOLD_DROPOUT, asked=THRESHOLD_DROPOUT) == THRESHOLD_DROPOUT
    assert use_attention([eager], None) == THRESHOLD_DROPOUT  # None keeps what the tower has
