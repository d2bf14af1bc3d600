"""ARR losses: eq. 1–4 on hand-built batches, SupCon, the classifier loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.errors import ConfigError
from pipeline.losses.arr import (ARRConfig, MLLConfig, SupConConfig, arr_batch_loss, arr_distill, distill_loss,
                                 inbatch_probs, mll_batch_loss, released_code_scale, scale, supcon_loss,
                                 teacher_targets, topic_bias)

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
    # teacher_targets(scores) is the same eq. 3 from the teacher's scores
    assert torch.allclose(teacher_targets(V @ V.T / 0.5, B), S, atol=1e-6)


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


def _released_step(g, f, h_sim, authors, tau, eps=1e-12):
    """The released code's ARR step (jitkapat/TopicReg, authorship/ensemble_modules.py,
    DistanceRegularizedEncoderCL.step), transcribed line by line on given teacher vectors g,
    student vectors f and TF-IDF cosine similarities h_sim (the one τ for G, H and F, as there).
    -> (loss, S after its self-mask, B)."""
    def numerical_stability(d):
        row_max, _ = torch.max(d, dim=1, keepdim=True)
        return d - row_max.detach()

    def distances_to_prob(d, logits_mask):
        exp_d = torch.exp(d)
        return torch.div(exp_d, torch.sum(exp_d * logits_mask, 1).unsqueeze(1))

    labels = authors.contiguous().view(-1, 1)
    batch_size = labels.shape[0]
    mask = torch.eq(labels, labels.T).float()
    logits_mask = torch.scatter(torch.ones_like(mask), 1, torch.arange(batch_size).view(-1, 1), 0)
    mask = mask * logits_mask
    gn = F.normalize(g)
    teacher_score = numerical_stability(torch.div(torch.matmul(gn, gn.T), tau))
    teacher_score = distances_to_prob(teacher_score, logits_mask)
    bias = numerical_stability(torch.div(h_sim, tau))
    bias = distances_to_prob(bias, logits_mask)
    B = (bias * mask).sum() / (mask.sum() + eps)
    S = torch.div(teacher_score ** (1 - B), torch.sum(teacher_score, 1).unsqueeze(1) ** (1 - B))
    fn = F.normalize(f)
    student_score = distances_to_prob(numerical_stability(torch.div(torch.matmul(fn, fn.T), tau)), logits_mask)
    P = torch.log(student_score)
    S = logits_mask * S
    P = logits_mask * P
    loss = torch.mean(-torch.sum(S * P, 1))
    return loss, S, B


@pytest.mark.parametrize("seed, tau", [(2, 0.1), (7, 0.5), (11, 0.05)])
def test_released_code_scaling_is_the_released_computation(seed, tau):
    """scaling: released_code against the transcription of the released step on random batches:
    the self column stays in the teacher's probabilities and in the row sum."""
    torch.manual_seed(seed)
    N, D = 8, 16
    g, f = torch.randn(N, D), torch.randn(N, D)
    h = torch.rand(N, 32)
    h_sim = F.normalize(h, dim=-1) @ F.normalize(h, dim=-1).T
    authors = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    want_loss, want_S, want_B = _released_step(g, f, h_sim, authors, tau)
    out = arr_distill(f, f, g, h_sim, authors, 0, tau=tau, tau_h=tau, scaling="released_code")
    assert torch.allclose(out["B"], want_B, rtol=1e-5, atol=1e-7)
    assert torch.allclose(out["S"], want_S, rtol=1e-4, atol=1e-7)
    assert torch.allclose(out["loss"], want_loss, rtol=1e-4, atol=1e-6)
    loss, terms = arr_batch_loss({"f": f, "f_all": f, "g_all": g, "h_sim": h_sim, "authors": authors, "offset": 0},
                                 ARRConfig(temperature=tau, scaling="released_code"))
    assert torch.allclose(loss, want_loss, rtol=1e-4, atol=1e-6) and torch.allclose(terms["B"], want_B, rtol=1e-5)
    # rows held by rank 1 of 2 (offset 4) are the same rows of the whole batch
    half = arr_distill(f[4:], f, g, h_sim, authors, 4, tau=tau, tau_h=tau, scaling="released_code")
    assert torch.allclose(half["S"], want_S[4:], rtol=1e-4, atol=1e-7)
    # ... and they are not eq. 3's normalised rows (the self column is in the sum)
    normalized = arr_distill(f, f, g, h_sim, authors, 0, tau=tau, tau_h=tau)
    assert torch.allclose(normalized["S"].sum(-1), torch.ones(N), atol=1e-5)
    assert not torch.allclose(out["S"], normalized["S"], atol=1e-4)


def test_released_code_scale_by_hand_and_finite_where_exp_overflows():
    s = V @ V.T / 0.5
    B = 0.3
    S = released_code_scale(s, B)
    for i in range(3):
        p = [math.exp(float(s[i, j])) / sum(math.exp(float(s[i, k])) for k in range(3) if k != i) for j in range(3)]
        for j in range(3):
            want = 0.0 if i == j else p[j] ** 0.7 / sum(p) ** 0.7   # the self column in p and in the sum
            assert math.isclose(float(S[i, j]), want, rel_tol=1e-5, abs_tol=1e-7)
    assert torch.allclose(teacher_targets(s, B, mode="released_code"), S)
    # τ = 0.001: exp(s / τ) overflows float32 (the released code would give inf/nan); log space does not
    tiny = released_code_scale(V @ V.T / 0.001, B)
    assert torch.isfinite(tiny).all() and float(tiny.sum()) < 1e-6
    with pytest.raises(ValueError, match="unknown scaling"):
        teacher_targets(s, B, mode="nope")


def test_mll_heads_loss():
    torch.manual_seed(4)
    logits, labels = torch.randn(6, 5), torch.tensor([0, 1, 2, 3, 4, 0])
    released, terms = mll_batch_loss({"logits": logits, "labels": labels}, MLLConfig())  # default: released
    assert MLLConfig().mll_head == "released"
    assert torch.allclose(released, F.cross_entropy(logits, labels))  # no temperature
    pooled, _ = mll_batch_loss({"logits": logits, "labels": labels}, MLLConfig(mll_head="pooled", temperature=0.05))
    assert torch.allclose(pooled, F.cross_entropy(logits / 0.05, labels))  # the old computation
    assert float(terms["train_acc"]) == float((logits.argmax(-1) == labels).float().mean())


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
    assert ARRConfig().scaling == "normalized"
    with pytest.raises(ConfigError, match="loss.scaling"):
        ARRConfig(scaling="nope").validate()
    with pytest.raises(ConfigError, match="loss.mll_head"):
        MLLConfig(mll_head="cls").validate()
    from pipeline.train.config import load_train_config

    with pytest.raises(ConfigError, match="loss.mll_head"):
        load_train_config(None, ["loss.name=arr_mll", "loss.mll_head=cls"])
    assert load_train_config(None, ["loss.name=arr_mll"]).loss.mll_head == "released"
    assert load_train_config(None, ["loss.name=arr_mll", "loss.mll_head=pooled"]).loss.mll_head == "pooled"
