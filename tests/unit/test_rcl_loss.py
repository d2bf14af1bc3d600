"""RCL loss (docs/METHODS.md §3, reconstruction): eq. 1 / 2 / 3 against hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.losses.dpr import dpr_loss
from pipeline.losses.rcl import RCLConfig, batch_entropy, contrastive_loss, rcl_batch_loss, rcl_loss


def _cfg(**kw):
    return RCLConfig(similarity="cos", temperature=kw.pop("temperature", 0.5), **kw)


def _ce_row(row, target):
    return -(row[target] - math.log(sum(math.exp(v) for v in row)))


def _entropy_row(row):
    z = sum(math.exp(v) for v in row)
    p = [math.exp(v) / z for v in row]
    return -sum(pi * math.log(pi) for pi in p)


# Orthonormal-ish 2-D vectors so every cosine is known by hand.
Q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])          # cos with X below: [[1, 0], [0.6, 0.8]]
X = torch.tensor([[3.0, 0.0], [0.6, 0.8]])
POS = torch.tensor([0, 1])
TAU = 0.5
COS = [[1.0, 0.6], [0.0, 0.8]]                      # cos(q_i, x_j)


def test_eq1_by_hand():
    want = (_ce_row([c / TAU for c in COS[0]], 0) + _ce_row([c / TAU for c in COS[1]], 1)) / 2
    got = contrastive_loss(Q, X, POS, _cfg())
    assert float(got) == pytest.approx(want, rel=1e-6)


def test_eq2_entropy_by_hand():
    rows = [[c / TAU for c in r] for r in COS]
    h = (_entropy_row(rows[0]) + _entropy_row(rows[1])) / 2
    cl = (_ce_row(rows[0], 0) + _ce_row(rows[1], 1)) / 2
    for lam in (0.03, -0.02):
        loss, terms = rcl_loss(Q, X, POS, _cfg(entropy_lambda=lam))
        assert float(terms["entropy"]) == pytest.approx(h, rel=1e-6)
        assert float(terms["cl"]) == pytest.approx(cl, rel=1e-6)
        assert float(loss) == pytest.approx(cl + lam * h, rel=1e-6)
    # the entropy of a uniform row is log N
    assert float(batch_entropy(torch.zeros(3, 5))) == pytest.approx(math.log(5))


def test_eq3_regulators_by_hand_sum_and_mean():
    # one entropy model: its frozen query and document vectors
    rq = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])     # (K=1, B, D)
    rx = torch.tensor([[[1.0, 1.0], [0.0, 1.0]]])     # (K=1, N, D)
    s = 1 / math.sqrt(2)
    # L_CL(q, x̃): cos(q_i, rx_j): q0=(1,0): [s, 0]; q1=(0,1): [s, 1]
    a = (_ce_row([s / TAU, 0.0], 0) + _ce_row([s / TAU, 1 / TAU], 1)) / 2
    # L_CL(q̃, x): rq0=(0,1) vs X: [0, 0.8]; rq1=(1,0): [1, 0.6]
    b = (_ce_row([0.0, 0.8 / TAU], 0) + _ce_row([1 / TAU, 0.6 / TAU], 1)) / 2
    cl = (_ce_row([c / TAU for c in COS[0]], 0) + _ce_row([c / TAU for c in COS[1]], 1)) / 2
    loss, terms = rcl_loss(Q, X, POS, _cfg(regulator_weight=0.5), rq, rx)
    assert float(terms["regulator"]) == pytest.approx(a + b, rel=1e-6)
    assert float(loss) == pytest.approx(cl + 0.5 * (a + b), rel=1e-6)
    # two identical entropy models: sum doubles, mean stays the per-term mean
    rq2, rx2 = rq.repeat(2, 1, 1), rx.repeat(2, 1, 1)
    _, t_sum = rcl_loss(Q, X, POS, _cfg(), rq2, rx2)
    loss_mean, t_mean = rcl_loss(Q, X, POS, _cfg(regulator_reduce="mean"), rq2, rx2)
    assert float(t_sum["regulator"]) == pytest.approx(2 * (a + b), rel=1e-6)
    assert float(t_mean["regulator"]) == pytest.approx((a + b) / 2, rel=1e-6)
    assert float(loss_mean) == pytest.approx(cl + (a + b) / 2, rel=1e-6)


def test_no_lambda_no_regulators_is_the_plain_contrastive_loss():
    g = torch.Generator().manual_seed(0)
    q, docs = torch.randn(8, 16, generator=g), torch.randn(12, 16, generator=g)  # 4 hard negatives
    pos = torch.arange(8)
    cfg = _cfg(temperature=0.05)
    plain, _ = dpr_loss(q, docs, pos, cfg)
    for batch in ({"q": q, "docs": docs, "pos_idx": pos, "n_pos": 8},
                  {"q": q, "docs": docs, "pos_idx": pos, "n_pos": 8,
                   "reg_q": torch.zeros(0, 8, 16), "reg_docs": torch.zeros(0, 12, 16)}):
        loss, terms = rcl_batch_loss(batch, cfg)
        assert torch.equal(loss, plain)
        assert float(terms["regulator"]) == 0.0


def test_gradients_reach_only_q_and_x():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(4, 8, generator=g, requires_grad=True)
    x = torch.randn(4, 8, generator=g, requires_grad=True)
    # regulator tensors that *claim* to need gradients: the loss must still treat them as frozen
    rq = torch.randn(3, 4, 8, generator=g, requires_grad=True)
    rx = torch.randn(3, 4, 8, generator=g, requires_grad=True)
    loss, terms = rcl_loss(q, x, torch.arange(4), _cfg(entropy_lambda=0.02), rq, rx)
    loss.backward()
    assert q.grad is not None and q.grad.abs().sum() > 0
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert rq.grad is None and rx.grad is None
    assert float(terms["regulator"]) > 0


def test_misaligned_regulators_are_refused():
    with pytest.raises(ValueError, match="reg_docs"):
        rcl_loss(Q, X, POS, _cfg(), torch.zeros(1, 2, 2), torch.zeros(1, 3, 2))
