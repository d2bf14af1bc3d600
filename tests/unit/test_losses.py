"""pipeline.losses: DPR NLL by hand, DAR (docs/METHODS.md §2) against loop-based references,
the one-document-encoder-pass property, and the cross-worker gather (2-process gloo).

Layout convention of every loss: docs = [G positives of the global batch | hard negatives],
pos_idx the column of each local query's positive, n_pos = G.
"""

from __future__ import annotations

import math
import os

import pytest
from subprocs import free_port
import torch

from pipeline.losses import DARConfig, LossConfig, get_loss
from pipeline.losses import dar as dar_mod
from pipeline.losses.base import scores
from pipeline.losses.dar import dar_loss, mix_loss
from pipeline.losses.dist import gather_docs, gather_with_grad
from pipeline.losses.dpr import dpr_loss

DOT = LossConfig(name="dpr", similarity="dot")
# The cyclic-shift grouping over in-batch positives only (a named option since the released
# drop-positive grouping became the default); the reference `ref_mix` is written for it.
SHIFT = dict(mix_grouping="shift", mix_hard_negatives=False)
COS = LossConfig(name="dpr", similarity="cos", temperature=0.5)

# --------------------------------------------------------------------------- tiny hand case
# q0 = (1, 0), q1 = (0, 2); positives d0 = (2, 0), d1 = (1, 1); hard negatives h0 = (0, 1), h1 = (-1, 0)
Q = [[1.0, 0.0], [0.0, 2.0]]
P = [[2.0, 0.0], [1.0, 1.0]]
H = [[0.0, 1.0], [-1.0, 0.0]]
E = math.e
S2 = math.sqrt(2.0)


def _t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def test_registry():
    assert get_loss("dpr") is dpr_loss and get_loss("dar") is dar_loss
    with pytest.raises(KeyError):
        get_loss("nope")


def test_dpr_nll_dot_in_batch_by_hand():
    # scores: s(q0,d0)=2, s(q0,d1)=1 ; s(q1,d0)=0, s(q1,d1)=2
    # nll_0 = -log(e^2 / (e^2 + e^1)) = log(1 + e^-1)
    # nll_1 = -log(e^2 / (e^0 + e^2)) = log(1 + e^-2)
    expected = (math.log(1 + E ** -1) + math.log(1 + E ** -2)) / 2
    loss, terms = dpr_loss(_t(Q), _t(P), torch.tensor([0, 1]), DOT)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert terms["nll"].item() == pytest.approx(expected, abs=1e-12)


def test_dpr_nll_dot_with_hard_negatives_by_hand():
    # docs = [d0, d1 | h0, h1]; s(q0, .) = [2, 1, 0, -1]; s(q1, .) = [0, 2, 2, 0]
    # nll_0 = log(e^2 + e^1 + e^0 + e^-1) - 2 = log(1 + e^-1 + e^-2 + e^-3)
    # nll_1 = log(e^0 + e^2 + e^2 + e^0) - 2 = log(2 + 2 e^-2)
    expected = (math.log(1 + E ** -1 + E ** -2 + E ** -3) + math.log(2 + 2 * E ** -2)) / 2
    loss, _ = dpr_loss(_t(Q), _t(P + H), torch.tensor([0, 1]), DOT)
    assert loss.item() == pytest.approx(expected, abs=1e-12)


def test_dpr_nll_cos_temperature_by_hand():
    # unit vectors: q0=(1,0), q1=(0,1), d0=(1,0), d1=(1,1)/√2; τ = 0.5 -> scores x2
    # s(q0, .) = [2, √2] ; s(q1, .) = [0, √2]
    # nll_0 = log(e^2 + e^√2) - 2 ; nll_1 = log(e^0 + e^√2) - √2
    expected = ((math.log(E ** 2 + E ** S2) - 2) + (math.log(1 + E ** S2) - S2)) / 2
    loss, _ = dpr_loss(_t(Q), _t(P), torch.tensor([0, 1]), COS)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    # with hard negatives: cos(q0,h0)=0, cos(q0,h1)=-1, cos(q1,h0)=1, cos(q1,h1)=0; /τ
    # s(q0, .) = [2, √2, 0, -2] ; s(q1, .) = [0, √2, 2, 0]
    expected_h = ((math.log(E ** 2 + E ** S2 + 1 + E ** -2) - 2) + (math.log(1 + E ** S2 + E ** 2 + 1) - S2)) / 2
    loss_h, _ = dpr_loss(_t(Q), _t(P + H), torch.tensor([0, 1]), COS)
    assert loss_h.item() == pytest.approx(expected_h, abs=1e-12)


def test_dpr_pos_idx_selects_the_column():
    # a non-trivial pos_idx (as on rank 1 of 2): query 0's positive is column 1
    # s(q0, .) = [2, 1] -> nll = log(e^2 + e^1) - 1 = log(1 + e)
    loss, _ = dpr_loss(_t(Q[:1]), _t(P), torch.tensor([1]), DOT)
    assert loss.item() == pytest.approx(math.log(1 + E), abs=1e-12)


# --------------------------------------------------------------------------- references for DAR


def _s(qv, dv, cfg):
    """s(q, d) for one pair, written out."""
    dot = (qv * dv).sum()
    if cfg.similarity == "cos":
        dot = dot / (qv.norm() * dv.norm())
    return dot / cfg.tau


def ref_nll(q, docs, pos_idx, cfg):
    total = 0.0
    for i in range(q.shape[0]):
        row = torch.stack([_s(q[i], docs[j], cfg) for j in range(docs.shape[0])])
        total = total + (torch.logsumexp(row, 0) - row[int(pos_idx[i])])
    return total / q.shape[0]


def _s_mixed_vector(qv, dp, dn, lam, cfg, detach_neg=False):
    """cos(q, λ d_p + (1-λ) d_n) / τ written out: mix the vectors, normalise the mix, score it.
    With detach_neg, d_n and q̂·d_n are constants (the gradient reaches q and d_p only)."""
    qh = qv / qv.norm()
    m = lam * dp + (1 - lam) * (dn.detach() if detach_neg else dn)
    if not detach_neg:
        return (qh * (m / m.norm())).sum() / cfg.tau
    return (lam * (qh * dp).sum() + (1 - lam) * (qh * dn).sum().detach()) / m.norm() / cfg.tau


def ref_mix(q, docs, pos_idx, G, lam, cfg, detach_neg=False):
    """docs/METHODS.md §2: for each shift k=1..G-1, negative of query i is column (pos_idx[i]+k) % G;
    μ_k = mean of the 2B scores {s(q_i,d_i)} ∪ {s(q_i,d_neg)}; z = (s_mix - μ_k)/scale with
    s_mix = λ s_pos + (1-λ) s_neg under dot (= the mixed vector's score) and the mixed vector's
    cosine under cos; BCE(σ(z), λ); mean over i, then mean over k."""
    B = q.shape[0]
    per_k = []
    for k in range(1, G):
        pos = [_s(q[i], docs[int(pos_idx[i])], cfg) for i in range(B)]
        neg = [_s(q[i], docs[(int(pos_idx[i]) + k) % G], cfg) for i in range(B)]
        if detach_neg:
            neg = [n.detach() for n in neg]
        mu = (sum(pos) + sum(neg)) / (2 * B)
        bces = []
        for i in range(B):
            lam_ik = lam[i, k - 1]
            if cfg.similarity == "cos":
                s_mix = _s_mixed_vector(q[i], docs[int(pos_idx[i])], docs[(int(pos_idx[i]) + k) % G], lam_ik, cfg,
                                        detach_neg)
            else:
                s_mix = lam_ik * pos[i] + (1 - lam_ik) * neg[i]
            z = (s_mix - mu) / cfg.mix_scale
            sig = 1 / (1 + torch.exp(-z))
            bces.append(-(lam_ik * torch.log(sig) + (1 - lam_ik) * torch.log(1 - sig)))
        per_k.append(sum(bces) / B)
    return sum(per_k) / (G - 1)


def _rand_case(B=3, G=None, n_hard=2, D=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    G = G or B
    q = torch.randn(B, D, generator=g, dtype=dtype).requires_grad_()
    docs = torch.randn(G + n_hard, D, generator=g, dtype=dtype).requires_grad_()
    return q, docs


def _grads(loss, *ts):
    return torch.autograd.grad(loss, ts)


# --------------------------------------------------------------------------- DAR identities


@pytest.mark.parametrize("sim", ["dot", "cos"])
def test_dar_with_no_copies_and_no_mix_is_dpr_exactly(sim):
    q, docs = _rand_case(B=4, n_hard=3)
    pos_idx = torch.arange(4)
    cfg = DARConfig(name="dar", similarity=sim, temperature=0.3, n_perturb=0, mix_weight=0.0)
    l_dar, terms = dar_loss(q, docs, pos_idx, cfg, training=True, n_pos=4)
    l_dpr, _ = dpr_loss(q, docs, pos_idx, cfg)
    assert torch.equal(l_dar, l_dpr)
    assert terms["mix"].item() == 0.0
    for a, b in zip(_grads(l_dar, q, docs), _grads(l_dpr, q, docs)):
        assert torch.equal(a, b)


def test_dar_validation_is_plain_nll_and_touches_no_rng():
    q, docs = _rand_case(B=4, n_hard=2)
    pos_idx = torch.arange(4)
    cfg = DARConfig(name="dar", similarity="dot", n_perturb=7, mix_weight=0.5)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a, ta = dar_loss(q, docs, pos_idx, cfg, training=False, n_pos=4)
    b, _ = dar_loss(q, docs, pos_idx, cfg, training=False, n_pos=4)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, b)
    assert torch.equal(a, dpr_loss(q, docs, pos_idx, cfg)[0])
    assert ta["mix"].item() == 0.0
    # while training is random (and does move the RNG)
    c, _ = dar_loss(q, docs, pos_idx, cfg, training=True, n_pos=4)
    assert not torch.equal(torch.get_rng_state(), state)
    assert not torch.allclose(a, c)


def test_dar_generator_leaves_global_rng_alone_and_is_reproducible():
    q, docs = _rand_case(B=3)
    cfg = DARConfig(name="dar", similarity="dot", n_perturb=3, mix_weight=0.5)
    state = torch.get_rng_state()
    a, _ = dar_loss(q, docs, torch.arange(3), cfg, generator=torch.Generator().manual_seed(5), n_pos=3)
    b, _ = dar_loss(q, docs, torch.arange(3), cfg, generator=torch.Generator().manual_seed(5), n_pos=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, b)


# --------------------------------------------------------------------------- mix term


@pytest.mark.parametrize("sim", ["dot", "cos"])
def test_mix_loss_matches_loop_reference(sim):
    cfg = DARConfig(name="dar", **SHIFT, similarity=sim, temperature=0.7, mix_scale=10.0)
    q, docs = _rand_case(B=4, n_hard=2, seed=1)
    pos_idx = torch.arange(4)
    lam = torch.rand((4, 3), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    vectors = {"q": q, "docs": docs} if sim == "cos" else {}  # cos scores the mixed vectors
    got = mix_loss(scores(q, docs, cfg), pos_idx, 4, lam, cfg, **vectors)
    want = ref_mix(q, docs, pos_idx, 4, lam, cfg)
    assert got.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-12)
    for a, b in zip(_grads(got, q, docs), _grads(want, q, docs)):
        assert torch.allclose(a, b, atol=1e-12)


def _mix_by_hand(q, docs, pos_idx, lam, cfg, vector_form):
    """The default grouping (drop_positive, hard negatives mixed) written out. vector_form: the
    mixed vector λ d_i + (1-λ) d_k is normalised and scored; else the two scores are mixed."""
    B, N = q.shape[0], docs.shape[0]
    cols = [[c for c in range(N) if c != int(pos_idx[i])] for i in range(B)]
    K = N - 1
    total = 0.0
    for k in range(K):
        pos = [_s(q[i], docs[int(pos_idx[i])], cfg) for i in range(B)]
        neg = [_s(q[i], docs[cols[i][k]], cfg) for i in range(B)]
        mu = (sum(pos) + sum(neg)) / (2 * B)
        for i in range(B):
            lam_ik = lam[i, k]
            if vector_form:
                m = lam_ik * docs[int(pos_idx[i])] + (1 - lam_ik) * docs[cols[i][k]]
                s_mix = (q[i] / q[i].norm() * (m / m.norm())).sum() / cfg.tau if cfg.similarity == "cos" \
                    else (q[i] * m).sum() / cfg.tau
            else:
                s_mix = lam_ik * pos[i] + (1 - lam_ik) * neg[i]
            z = (s_mix - mu) / cfg.mix_scale
            sig = 1 / (1 + torch.exp(-z))
            total = total - (lam_ik * torch.log(sig) + (1 - lam_ik) * torch.log(1 - sig)) / B
    return total / K


def test_mix_cos_scores_the_normalised_mixed_vector():
    """Under cos the mix term is cos(q_i, λ d_i + (1-λ) d_k)/τ: the mixed vector normalised, then scored."""
    cfg = DARConfig(name="dar", similarity="cos", temperature=0.2, mix_scale=3.0)  # default grouping
    q, docs = _rand_case(B=3, n_hard=2, D=6, seed=21)
    pos_idx = torch.arange(3)
    lam = torch.rand((3, 4), generator=torch.Generator().manual_seed(22), dtype=torch.float64)
    got = mix_loss(scores(q, docs, cfg), pos_idx, 3, lam, cfg, q=q, docs=docs)
    want = _mix_by_hand(q, docs, pos_idx, lam, cfg, vector_form=True)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for a, b in zip(_grads(got, q, docs), _grads(want, q, docs)):
        assert torch.allclose(a, b, atol=1e-12)
    # the per-entry mixed scores, against F.normalize of the mixed vector
    neg_cols = dar_mod.mix_columns(pos_idx, 3, docs.shape[0], cfg)
    mixed = dar_mod.mixed_cos_scores(q, docs, pos_idx, neg_cols, lam, cfg)
    for i in range(3):
        for k in range(4):
            m = lam[i, k] * docs[i] + (1 - lam[i, k]) * docs[neg_cols[i, k]]
            s = torch.nn.functional.normalize(q[i], dim=0) @ torch.nn.functional.normalize(m, dim=0) / cfg.tau
            assert mixed[i, k].item() == pytest.approx(s.item(), rel=1e-12)
    # the scale of a document cancels under cos (1/(1-p) of inverted dropout, too)
    assert mix_loss(scores(q, 3.0 * docs, cfg), pos_idx, 3, lam, cfg, q=q, docs=3.0 * docs).item() == \
        pytest.approx(got.item(), rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mix_cos_is_not_score_mixing(seed):
    """Fails on the score-mixing form under cos: on random vectors the two forms differ, and the
    code gives the vector form."""
    cfg = DARConfig(name="dar", similarity="cos", temperature=0.1)
    q, docs = _rand_case(B=4, n_hard=2, D=8, seed=30 + seed)
    pos_idx = torch.arange(4)
    lam = torch.rand((4, 5), generator=torch.Generator().manual_seed(40 + seed), dtype=torch.float64)
    got = mix_loss(scores(q, docs, cfg), pos_idx, 4, lam, cfg, q=q, docs=docs).item()
    vector_form = _mix_by_hand(q, docs, pos_idx, lam, cfg, vector_form=True).item()
    score_form = _mix_by_hand(q, docs, pos_idx, lam, cfg, vector_form=False).item()
    assert abs(vector_form - score_form) > 1e-3 * abs(score_form)  # the forms differ under cos
    assert got == pytest.approx(vector_form, rel=1e-12)
    assert got != pytest.approx(score_form, rel=1e-6)
    # entry by entry: cos of the mix differs from the mix of the cosines
    s = scores(q, docs, cfg)
    neg_cols = dar_mod.mix_columns(pos_idx, 4, docs.shape[0], cfg)
    mixed = dar_mod.mixed_cos_scores(q, docs, pos_idx, neg_cols, lam, cfg)
    score_mixed = lam * s[torch.arange(4), pos_idx].unsqueeze(1) + (1 - lam) * s.gather(1, neg_cols)
    assert ((mixed - score_mixed).abs() > 1e-6).float().mean() > 0.9


def test_mix_cos_needs_the_vectors():
    cfg = DARConfig(name="dar", similarity="cos")
    q, docs = _rand_case(B=2, n_hard=0)
    with pytest.raises(ValueError, match="pass q and docs"):
        mix_loss(scores(q, docs, cfg), torch.arange(2), 2, torch.rand(2, 1, dtype=torch.float64), cfg)


def test_mix_dot_vector_and_score_forms_agree():
    """Under dot, scoring the mixed vector equals mixing the scores (s is linear): both forms agree."""
    cfg = DARConfig(name="dar", similarity="dot", temperature=0.7, mix_scale=5.0)
    q, docs = _rand_case(B=3, n_hard=3, D=7, seed=50)
    pos_idx = torch.arange(3)
    lam = torch.rand((3, 5), generator=torch.Generator().manual_seed(51), dtype=torch.float64)
    got = mix_loss(scores(q, docs, cfg), pos_idx, 3, lam, cfg)
    assert torch.equal(got, mix_loss(scores(q, docs, cfg), pos_idx, 3, lam, cfg, q=q, docs=docs))  # vectors unused
    vector_form = _mix_by_hand(q, docs, pos_idx, lam, cfg, vector_form=True)
    score_form = _mix_by_hand(q, docs, pos_idx, lam, cfg, vector_form=False)
    assert vector_form.item() == pytest.approx(score_form.item(), rel=1e-12)
    assert got.item() == pytest.approx(vector_form.item(), rel=1e-12)
    for a, b in zip(_grads(got, q, docs), _grads(vector_form, q, docs)):
        assert torch.allclose(a, b, atol=1e-12)


@pytest.mark.parametrize("detach", [False, True])
def test_mix_cos_detach_negatives_cuts_the_negative(detach):
    """Under cos with mix_detach_negatives: the gradient reaches q and the positives only."""
    cfg = DARConfig(name="dar", similarity="cos", **SHIFT, temperature=0.3, mix_detach_negatives=detach)
    q, docs = _rand_case(B=3, n_hard=0, D=5, seed=60)
    lam = torch.rand((3, 2), generator=torch.Generator().manual_seed(61), dtype=torch.float64)
    got = mix_loss(scores(q, docs, cfg), torch.arange(3), 3, lam, cfg, q=q, docs=docs)
    want = ref_mix(q, docs, torch.arange(3), 3, lam, cfg, detach_neg=detach)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for a, b in zip(_grads(got, q, docs), _grads(want, q, docs)):
        assert torch.allclose(a, b, atol=1e-12)
    # one query (positive docs[0], mix negatives docs[1], docs[2]): with detach, its negatives get no gradient
    q1 = q[:1].detach().requires_grad_()
    d1 = docs.detach().clone().requires_grad_()
    m = mix_loss(scores(q1, d1, cfg), torch.tensor([0]), 3, lam[:1], cfg, q=q1, docs=d1)
    (g,) = torch.autograd.grad(m, d1)
    assert (g[0].abs().sum() > 0).item()
    assert (torch.count_nonzero(g[1:]) == 0) == detach


def test_dar_cos_dropout_rescaling_cancels():
    """Under cos, the 1/(1-p) of inverted dropout cancels: DAR equals the reference built from the
    unscaled masked copies d * mask. Under dot it does not."""
    B, G, n_hard, D, n, p = 3, 3, 2, 6, 3, 0.3
    q, docs = _rand_case(B=B, G=G, n_hard=n_hard, D=D, seed=70)
    pos_idx = torch.arange(B)
    for sim in ("cos", "dot"):
        cfg = DARConfig(name="dar", **SHIFT, similarity=sim, temperature=0.5, n_perturb=n, dropout_p=p,
                        mix_weight=0.3, mix_scale=4.0)
        torch.manual_seed(7)
        loss, _ = dar_loss(q, docs, pos_idx, cfg, n_pos=G)
        torch.manual_seed(7)
        masks = [torch.rand(docs.shape) for _ in range(n)]
        copies = [docs] + [docs * (u >= p).to(docs.dtype) for u in masks]  # no 1/(1-p)
        total = 0.0
        for dm in copies:
            lam = torch.rand((B, G - 1), dtype=torch.float64)
            total = total + 0.7 * ref_nll(q, dm, pos_idx, cfg) + 0.3 * ref_mix(q, dm, pos_idx, G, lam, cfg)
        want = total / (n + 1)
        if sim == "cos":
            assert loss.item() == pytest.approx(want.item(), rel=1e-10)
        else:
            assert loss.item() != pytest.approx(want.item(), rel=1e-6)


def test_mix_loss_sharded_queries_use_shifts_over_global_positives():
    # rank 1 of 2 with B=2 local queries: G=4 global positives, pos_idx = [2, 3]
    cfg = DARConfig(name="dar", similarity="dot", **SHIFT, mix_scale=3.0)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 6, generator=g, dtype=torch.float64, requires_grad=True)
    docs = torch.randn(7, 6, generator=g, dtype=torch.float64, requires_grad=True)
    pos_idx = torch.tensor([2, 3])
    lam = torch.rand((2, 3), generator=g, dtype=torch.float64)
    got = mix_loss(scores(q, docs, cfg), pos_idx, 4, lam, cfg)
    want = ref_mix(q, docs, pos_idx, 4, lam, cfg)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


def test_mix_loss_fixed_lambda_hand_value():
    # B=2, G=2, one shift. s = [[2, 1], [0, 2]] (Q·P above), scale 1, λ = [[0.25], [0.5]]
    # k=1: pos = [2, 2], neg = [1, 0]; μ = (2+2+1+0)/4 = 1.25
    # z_0 = 0.25*2 + 0.75*1 - 1.25 = 0 ; z_1 = 0.5*2 + 0.5*0 - 1.25 = -0.25
    # BCE(σ(z), λ) = log(1+e^z) - λ z : 0: log 2 ; 1: log(1+e^-0.25) + 0.125
    cfg = DARConfig(name="dar", similarity="dot", mix_scale=1.0)
    s = torch.tensor([[2.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    lam = torch.tensor([[0.25], [0.5]], dtype=torch.float64)
    expected = (math.log(2) + math.log(1 + math.exp(-0.25)) + 0.125) / 2
    assert mix_loss(s, torch.tensor([0, 1]), 2, lam, cfg).item() == pytest.approx(expected, abs=1e-12)


def test_mix_detach_negatives_switch():
    q, docs = _rand_case(B=4, n_hard=0, seed=4)
    pos_idx = torch.arange(4)
    lam = torch.rand((4, 3), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    det = DARConfig(name="dar", similarity="dot", **SHIFT, mix_detach_negatives=True)
    flow = DARConfig(name="dar", similarity="dot", **SHIFT, mix_detach_negatives=False)
    l_det = mix_loss(scores(q, docs, det), pos_idx, 4, lam, det)
    l_flow = mix_loss(scores(q, docs, flow), pos_idx, 4, lam, flow)
    assert l_det.item() == pytest.approx(l_flow.item(), rel=1e-12)  # same value, different gradient
    g_det = _grads(l_det, q, docs)
    g_flow = _grads(l_flow, q, docs)
    r_det = _grads(ref_mix(q, docs, pos_idx, 4, lam, det, detach_neg=True), q, docs)
    r_flow = _grads(ref_mix(q, docs, pos_idx, 4, lam, flow, detach_neg=False), q, docs)
    for a, b in zip(g_det, r_det):
        assert torch.allclose(a, b, atol=1e-12)
    for a, b in zip(g_flow, r_flow):
        assert torch.allclose(a, b, atol=1e-12)
    assert not torch.allclose(g_det[1], g_flow[1], atol=1e-6)
    # through dar_loss too (mix only, no copies): same switch, same effect
    for cfg, ref in ((det, r_det), (flow, r_flow)):
        cfg = DARConfig(name="dar", similarity="dot", **SHIFT, n_perturb=0, mix_weight=1.0, mix_detach_negatives=cfg.mix_detach_negatives)
        torch.manual_seed(0)
        loss, _ = dar_loss(q, docs, pos_idx, cfg, n_pos=4)
        torch.manual_seed(0)
        lam0 = torch.rand((4, 3), dtype=torch.float64)
        want = ref_mix(q, docs, pos_idx, 4, lam0, cfg, detach_neg=cfg.mix_detach_negatives)
        assert loss.item() == pytest.approx(want.item(), rel=1e-12)
        for a, b in zip(_grads(loss, q, docs), _grads(want, q, docs)):
            assert torch.allclose(a, b, atol=1e-12)


def test_hard_negatives_beyond_g_are_never_mix_negatives():
    cfg = DARConfig(name="dar", similarity="dot", **SHIFT, n_perturb=2, mix_weight=0.5)
    q, docs = _rand_case(B=3, n_hard=4, seed=5)
    pos_idx = torch.arange(3)
    lam = torch.rand((3, 2), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    docs2 = docs.detach().clone()
    docs2[3:] = torch.randn(4, docs.shape[1], generator=torch.Generator().manual_seed(77), dtype=torch.float64) * 5
    m1 = mix_loss(scores(q, docs, cfg), pos_idx, 3, lam, cfg)
    m2 = mix_loss(scores(q, docs2, cfg), pos_idx, 3, lam, cfg)
    assert torch.equal(m1, m2)
    assert not torch.allclose(dpr_loss(q, docs, pos_idx, cfg)[0], dpr_loss(q, docs2, pos_idx, cfg)[0])
    # mix only: the hard negatives get no gradient at all
    g = torch.autograd.grad(m1, docs)[0]
    assert torch.count_nonzero(g[3:]) == 0 and (g[:3].abs().sum(1) > 0).all()
    # in the full loss: same draws -> same averaged mix term, different NLL
    torch.manual_seed(11)
    _, t1 = dar_loss(q, docs, pos_idx, cfg, n_pos=3)
    torch.manual_seed(11)
    _, t2 = dar_loss(q, docs2, pos_idx, cfg, n_pos=3)
    assert torch.allclose(t1["mix"], t2["mix"], rtol=0, atol=1e-12)
    assert not torch.allclose(t1["nll"], t2["nll"])


def test_mix_needs_two_positives():
    s = torch.zeros(1, 3)
    assert mix_loss(s, torch.tensor([0]), 1, torch.zeros(1, 0), DARConfig()).item() == 0.0


# --------------------------------------------------------------------------- full DAR vs reference


@pytest.mark.parametrize("sim,n,w,detach", [("dot", 3, 0.1, False), ("cos", 2, 0.4, True), ("dot", 4, 0.0, False),
                                            ("dot", 2, 1.0, False)])
def test_full_dar_equals_reference_with_same_draws(sim, n, w, detach):
    B, G, n_hard, D = 3, 3, 3, 8
    cfg = DARConfig(name="dar", **SHIFT, similarity=sim, temperature=0.5, n_perturb=n, dropout_p=0.25,
                     mix_weight=w, mix_scale=4.0, mix_detach_negatives=detach)
    q, docs = _rand_case(B=B, G=G, n_hard=n_hard, D=D, seed=6)
    pos_idx = torch.arange(B)
    torch.manual_seed(2024)
    loss, terms = dar_loss(q, docs, pos_idx, cfg, training=True, n_pos=G)
    after_impl = torch.get_rng_state()

    # reference, drawing in the implementation's order: n masks, then one λ per copy
    torch.manual_seed(2024)
    masks = [torch.rand(docs.shape) for _ in range(n)]
    copies = [docs] + [docs * (u >= cfg.dropout_p).to(docs.dtype) / (1 - cfg.dropout_p) for u in masks]
    total = 0.0
    nll_sum = mix_sum = 0.0
    for dm in copies:
        nll = ref_nll(q, dm, pos_idx, cfg)
        if w > 0:
            lam = torch.rand((B, G - 1), dtype=torch.float64)
            mix = ref_mix(q, dm, pos_idx, G, lam, cfg, detach_neg=detach)
        else:
            mix = torch.zeros((), dtype=torch.float64)
        total = total + (1 - w) * nll + w * mix
        nll_sum, mix_sum = nll_sum + nll.item(), mix_sum + mix.item()
    want = total / (n + 1)
    assert torch.equal(torch.get_rng_state(), after_impl)  # the same draws were consumed
    assert loss.item() == pytest.approx(want.item(), rel=1e-10)
    assert terms["nll"].item() == pytest.approx(nll_sum / (n + 1), rel=1e-10)
    assert terms["mix"].item() == pytest.approx(mix_sum / (n + 1), rel=1e-10, abs=1e-14)
    for a, b in zip(_grads(loss, q, docs), _grads(want, q, docs)):
        assert torch.allclose(a, b, atol=1e-10)


def test_perturbed_copies_change_the_gradient():
    """With n > 0 the perturbed copies contribute: the gradient differs from DPR's."""
    q, docs = _rand_case(B=4, n_hard=0, seed=8)
    cfg = DARConfig(name="dar", similarity="dot", n_perturb=5, mix_weight=0.0, dropout_p=0.3)
    torch.manual_seed(0)
    l_dar, _ = dar_loss(q, docs, torch.arange(4), cfg, n_pos=4)
    l_dpr, _ = dpr_loss(q, docs, torch.arange(4), cfg)
    g_dar, g_dpr = torch.autograd.grad(l_dar, docs)[0], torch.autograd.grad(l_dpr, docs)[0]
    assert not torch.allclose(g_dar, g_dpr, atol=1e-6)
    assert (g_dar.abs().sum(1) > 0).all()


def test_mix_only_loss_still_trains_positives_and_in_batch_negatives():
    """mix_weight = 1: the NLL term is absent, yet every in-batch document gets a gradient."""
    q, docs = _rand_case(B=4, n_hard=2, seed=9)
    cfg = DARConfig(name="dar", similarity="dot", **SHIFT, n_perturb=3, mix_weight=1.0)
    torch.manual_seed(1)
    loss, terms = dar_loss(q, docs, torch.arange(4), cfg, n_pos=4)
    assert terms["nll"].item() > 0  # still reported
    loss.backward()
    assert (docs.grad[:4].abs().sum(1) > 0).all()
    assert torch.count_nonzero(docs.grad[4:]) == 0  # hard negatives only ever enter the NLL
    assert (q.grad.abs().sum(1) > 0).all()


def test_dropout_masks_are_bernoulli_p_with_rescaling(monkeypatch):
    """Capture the perturbed document matrices: ≈p of the entries zeroed, the rest scaled by 1/(1-p)."""
    seen = []
    real = dar_mod.scores

    def spy(q, d, cfg):
        seen.append(d.detach().clone())
        return real(q, d, cfg)

    monkeypatch.setattr(dar_mod, "scores", spy)
    p, n = 0.1, 3
    docs = torch.ones(64, 1000)
    q = torch.randn(4, 1000)
    torch.manual_seed(0)
    dar_loss(q, docs, torch.arange(4), DARConfig(name="dar", similarity="dot", n_perturb=n, dropout_p=p, mix_weight=0.1), n_pos=4)
    assert len(seen) == n + 1
    assert torch.equal(seen[0], docs)  # the clean copy
    for d in seen[1:]:
        zero = d == 0
        frac = zero.float().mean().item()
        assert abs(frac - p) < 0.01  # sd = sqrt(p(1-p)/64000) ≈ 0.0012
        assert torch.allclose(d[~zero], torch.full_like(d[~zero], 1 / (1 - p)))
    assert not torch.equal(seen[1], seen[2])  # independent masks


# --------------------------------------------------------------------------- one encoder pass per step


@pytest.fixture(scope="module")
def tiny_biencoder(tmp_path_factory):
    from pipeline.config import ModelConfig
    from pipeline.models import BiEncoder
    from pipeline.models.tiny import build_tiny_bert

    d = build_tiny_bert(tmp_path_factory.mktemp("tiny_bert_losses"))
    # separate towers so a hook on the document tower counts document passes only
    return BiEncoder.load(ModelConfig(name_or_path=str(d), query_name_or_path=str(d), pooling="mean"))


def test_document_encoder_runs_once_per_dar_step(tiny_biencoder):
    model = tiny_biencoder
    assert model.doc_encoder is not model.query_encoder
    calls = []
    h = model.doc_encoder.register_forward_hook(lambda mod, args, kwargs, out: calls.append(kwargs["input_ids"].shape[0]),
                                                with_kwargs=True)
    try:
        model.train()
        q_tok = model.tokenize(["what is a cat", "who wrote hamlet"], "query")
        d_tok = model.tokenize(["cats are small felines", "hamlet is by shakespeare",
                                "dogs bark", "paris is in france"], "doc")
        q, d = model(q_tok, d_tok)
        all_docs, pos_idx, G = gather_docs(d[:2], d[2:])
        loss, _ = dar_loss(q, all_docs, pos_idx, DARConfig(name="dar", similarity="dot", n_perturb=7, mix_weight=0.1),
                           training=True, n_pos=G)
        loss.backward()
    finally:
        h.remove()
    assert calls == [4]  # one pass over all 4 documents, despite 7 perturbed copies and the mix term
    emb = model.doc_encoder.get_input_embeddings().weight.grad
    assert emb is not None and torch.count_nonzero(emb) > 0
    model.zero_grad(set_to_none=True)


# --------------------------------------------------------------------------- gathering


def test_gather_docs_without_process_group():
    pos = torch.randn(3, 4)
    hard = torch.randn(6, 4)
    docs, pos_idx, G = gather_docs(pos, hard)
    assert torch.equal(docs, torch.cat([pos, hard]))
    assert torch.equal(pos_idx, torch.arange(3)) and G == 3
    docs, pos_idx, G = gather_docs(pos, None)
    assert torch.equal(docs, pos) and G == 3
    assert gather_with_grad(pos) is pos


GLOBAL_B, LOCAL_B, HARD, DIM = 4, 2, 2, 5


def _global_tensors():
    g = torch.Generator().manual_seed(1234)
    Qg = torch.randn(GLOBAL_B, DIM, generator=g, dtype=torch.float64)
    Pg = torch.randn(GLOBAL_B, DIM, generator=g, dtype=torch.float64)
    Hg = torch.randn(GLOBAL_B * HARD, DIM, generator=g, dtype=torch.float64)
    return Qg, Pg, Hg


def _gloo_worker(rank, world, port, out_dir):
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        Qg, Pg, Hg = (torch.nn.Parameter(t) for t in _global_tensors())
        lo, hi = rank * LOCAL_B, (rank + 1) * LOCAL_B
        q, pos, hard = Qg[lo:hi], Pg[lo:hi], Hg[lo * HARD:hi * HARD]
        docs, pos_idx, G = gather_docs(pos, hard)
        loss, _ = dpr_loss(q, docs, pos_idx, LossConfig(name="dpr", similarity="dot"), n_pos=G)
        loss.backward()
        torch.save({"loss": loss.detach(), "docs": docs.detach(), "pos_idx": pos_idx, "G": G,
                    "gQ": Qg.grad, "gP": Pg.grad, "gH": Hg.grad}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_gather_with_grad_two_process_gloo_matches_global_loss(tmp_path):
    import torch.multiprocessing as mp

    world = 2
    # fork: the children inherit the imported torch (spawn would re-import it, seconds on a small machine)
    mp.start_processes(_gloo_worker, args=(world, free_port(), str(tmp_path)), nprocs=world, join=True,
                       start_method="fork")
    res = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]

    Qg, Pg, Hg = (t.requires_grad_() for t in _global_tensors())
    # layout check: [global positives, rank-major | all hard negatives, rank-major]
    for r, out in enumerate(res):
        assert out["G"] == GLOBAL_B
        assert torch.equal(out["pos_idx"], torch.arange(LOCAL_B) + r * LOCAL_B)
        assert torch.equal(out["docs"], torch.cat([Pg, Hg]).detach())
    # the global mean loss over all queries, one process
    loss, _ = dpr_loss(Qg, torch.cat([Pg, Hg]), torch.arange(GLOBAL_B), LossConfig(name="dpr", similarity="dot"))
    loss.backward()
    assert (res[0]["loss"] + res[1]["loss"]).item() / world == pytest.approx(loss.item(), abs=1e-12)
    # DDP averages the per-rank gradients
    for name, ref in (("gQ", Qg.grad), ("gP", Pg.grad), ("gH", Hg.grad)):
        avg = sum(r[name] for r in res) / world
        assert torch.allclose(avg, ref, atol=1e-6), name
        assert torch.count_nonzero(ref) > 0
    # gradients travel back to the owner: rank r's own rows carry d(L_0 + L_1)/d rows (= world x the
    # global-mean gradient), rows owned by the other rank get nothing locally
    for r, out in enumerate(res):
        own = slice(r * LOCAL_B, (r + 1) * LOCAL_B)
        assert torch.allclose(out["gP"][own], world * Pg.grad[own], atol=1e-6)
        other = torch.ones(GLOBAL_B, dtype=torch.bool)
        other[own] = False
        assert torch.count_nonzero(out["gP"][other]) == 0
