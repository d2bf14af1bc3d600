"""ARR losses: eq. 1–4 on hand-built batches, SupCon, the classifier loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.losses.arr import (ARRConfig, SupConConfig, arr_batch_loss, arr_distill, distill_loss, inbatch_probs,
                                 scale, supcon_loss, topic_bias)

# three unit vectors in 2-D: cosines cos(0)=1, cos(60°)=.5, cos(90°)=0, ...
V = torch.tensor([[1.0, 0.0], [0.5, math.sqrt(3) / 2], [0.0, 1.0]])


def _p_by_hand(vecs, tau):
    n = len(vecs)
    out = [[0.0] * n for _ in range(n)]
    for i in range(n):
        den = sum(math.exp(float(vecs[i] @ vecs[k]) / tau) for k in range(n) if k != i)
        for j in range(n):
            if j != i:
                out[i][j] = math.exp(float(vecs[i] @ vecs[j]) / tau) / den
    return torch.tensor(out)


def test_eq1_inbatch_probabilities():
    p = inbatch_probs(V @ V.T / 0.5)
    assert torch.allclose(p, _p_by_hand(V, 0.5), atol=1e-6)
    assert torch.all(p.diagonal() == 0) and torch.allclose(p.sum(-1), torch.ones(3))
    # local rows with an offset (rank 1 of a 2-rank batch holds rows 1..2)
    p2 = inbatch_probs(V[1:] @ V.T / 0.5, offset=1)
    assert torch.allclose(p2, _p_by_hand(V, 0.5)[1:], atol=1e-6)


def test_eq2_topic_bias_same_author_pairs():
    b = _p_by_hand(V, 0.5)
    authors = torch.tensor([7, 7, 3])
    B, pairs = topic_bias(b, authors)
    assert pairs == 2  # (0,1) and (1,0)
    assert math.isclose(float(B), (float(b[0, 1]) + float(b[1, 0])) / 2, rel_tol=1e-6)


def test_eq2_no_same_author_pair_is_defined():
    B, pairs = topic_bias(_p_by_hand(V, 0.5), torch.tensor([1, 2, 3]))
    assert pairs == 0 and float(B) == 0.0 and not torch.isnan(B)


def test_eq3_scaling_rows_sum_to_one_and_by_hand():
    p = _p_by_hand(V, 0.5)
    B = 0.3
    S = scale(p, B)
    assert torch.allclose(S.sum(-1), torch.ones(3), atol=1e-6)
    for i in range(3):
        den = sum(float(p[i, k]) ** 0.7 for k in range(3) if k != i)
        for j in range(3):
            want = 0.0 if i == j else float(p[i, j]) ** 0.7 / den
            assert math.isclose(float(S[i, j]), want, rel_tol=1e-5, abs_tol=1e-7)
    # B = 0 leaves p unchanged; a larger B flattens the rows (higher entropy)
    assert torch.allclose(scale(p, 0.0), p, atol=1e-6)
    ent = lambda m: float(-(m.clamp_min(1e-12).log() * m).sum())  # noqa: E731
    assert ent(scale(p, 0.8)) > ent(scale(p, 0.3)) > ent(p)
    # the released code's variant divides by (Σ_k p_ik)^(1−B) = 1: rows do not sum to 1
    R = scale(p, B, mode="released_code")
    assert torch.allclose(R, torch.where(torch.eye(3, dtype=torch.bool), torch.zeros(3, 3), p ** 0.7), atol=1e-6)
    assert not torch.allclose(R.sum(-1), torch.ones(3), atol=1e-3)


def test_eq4_distillation_by_hand():
    S = scale(_p_by_hand(V, 0.5), 0.3)
    W = torch.tensor([[0.0, 1.0], [1.0, 0.0], [math.sqrt(0.5), math.sqrt(0.5)]])
    f = _p_by_hand(W, 0.5)
    want = sum(-sum(float(S[i, j]) * math.log(float(f[i, j])) for j in range(3) if j != i) for i in range(3)) / 3
    log_f = torch.log_softmax((W @ W.T / 0.5).masked_fill(torch.eye(3, dtype=torch.bool), float("-inf")), -1)
    assert math.isclose(float(distill_loss(S, log_f)), want, rel_tol=1e-5)


def test_arr_full_batch_by_hand_and_no_gradient_into_teacher():
    torch.manual_seed(0)
    g = torch.randn(4, 8, requires_grad=True)  # a teacher output that *could* take gradients
    f = torch.randn(4, 8, requires_grad=True)
    h = torch.randn(4, 16)
    h_sim = F.normalize(h, dim=-1) @ F.normalize(h, dim=-1).T
    authors = torch.tensor([0, 0, 1, 1])
    out = arr_distill(f, f, g, h_sim, authors, 0, tau=0.1, tau_h=0.2)
    out["loss"].backward()
    assert g.grad is None and f.grad is not None and torch.isfinite(f.grad).all()
    # recompute eq. 1–4 independently
    gn, fn = F.normalize(g.detach(), dim=-1), F.normalize(f.detach(), dim=-1)
    pg, pf, pb = _p_by_hand(gn, 0.1), _p_by_hand(fn, 0.1), inbatch_probs(h_sim / 0.2)
    B = (pb[0, 1] + pb[1, 0] + pb[2, 3] + pb[3, 2]) / 4
    assert math.isclose(float(out["B"]), float(B), rel_tol=1e-5)
    S = scale(pg, B)
    want = -sum(float(S[i, j]) * math.log(float(pf[i, j])) for i in range(4) for j in range(4) if i != j) / 4
    assert math.isclose(float(out["loss"].detach()), want, rel_tol=1e-4)
    assert 0.0 <= float(out["agreement"]) <= 1.0


def test_arr_batch_without_pairs_is_plain_distillation():
    torch.manual_seed(1)
    g, f = torch.randn(3, 4), torch.randn(3, 4, requires_grad=True)
    h_sim = torch.eye(3)
    loss, terms = arr_batch_loss({"f": f, "f_all": f, "g_all": g, "h_sim": h_sim, "authors": torch.tensor([0, 1, 2]),
                                  "offset": 0}, ARRConfig(temperature=0.1))
    assert torch.isfinite(loss) and float(terms["B"]) == 0.0 and float(terms["no_pair"]) == 1.0
    loss.backward()
    assert torch.isfinite(f.grad).all()
    # student == teacher minimises the cross-entropy to the teacher's entropy (S = p_g when B = 0)
    pg = _p_by_hand(F.normalize(g, dim=-1), 0.1)
    ent = -sum(float(pg[i, j]) * math.log(float(pg[i, j])) for i in range(3) for j in range(3) if i != j) / 3
    same, _ = arr_batch_loss({"f": g, "f_all": g, "g_all": g, "h_sim": h_sim, "authors": torch.tensor([0, 1, 2]),
                              "offset": 0}, ARRConfig(temperature=0.1))
    assert math.isclose(float(same), ent, rel_tol=1e-5) and float(loss.detach()) > float(same)


def test_released_code_scaling_selectable():
    torch.manual_seed(2)
    g, f = torch.randn(4, 4), torch.randn(4, 4)
    batch = {"f": f, "f_all": f, "g_all": g, "h_sim": torch.ones(4, 4), "authors": torch.tensor([0, 0, 1, 1]),
             "offset": 0}
    a, _ = arr_batch_loss(batch, ARRConfig(temperature=0.1))
    b, _ = arr_batch_loss(batch, ARRConfig(temperature=0.1, scaling="released_code"))
    assert not math.isclose(float(a), float(b))


def test_supcon_by_hand():
    z = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]])
    labels = torch.tensor([0, 0, 1, 1])
    loss, anchors = supcon_loss(z, z, labels, 0, tau=0.07)
    p = _p_by_hand(z, 0.07)
    want = -(math.log(p[0, 1]) + math.log(p[1, 0]) + math.log(p[2, 3]) + math.log(p[3, 2])) / 4
    assert anchors == 4 and math.isclose(float(loss), want, rel_tol=1e-5)
    # anchors without a positive are left out; no positive at all gives a defined zero
    l2, a2 = supcon_loss(z, z, torch.tensor([0, 0, 1, 2]), 0, tau=0.07)
    assert a2 == 2 and math.isclose(float(l2), -(math.log(p[0, 1]) + math.log(p[1, 0])) / 2, rel_tol=1e-5)
    l3, a3 = supcon_loss(z, z, torch.tensor([0, 1, 2, 3]), 0, tau=0.07)
    assert a3 == 0 and float(l3) == 0.0


def test_supcon_local_rows_against_gathered_batch():
    torch.manual_seed(3)
    z = torch.randn(6, 5)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    full, _ = supcon_loss(z, z, labels, 0, 0.1)
    r0, _ = supcon_loss(z[:3], z, labels, 0, 0.1)
    r1, _ = supcon_loss(z[3:], z, labels, 3, 0.1)
    assert math.isclose(float(full), (float(r0) + float(r1)) / 2, rel_tol=1e-5)


def test_configs():
    assert SupConConfig().tau == 0.07
    with pytest.raises(Exception):
        ARRConfig(scaling="nope").validate()
