"""pipeline.train.optim: the warmup + linear-decay schedule and LAMB, against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.train.config import OptimConfig
from pipeline.train.optim import Lamb, build_optimizer, warmup_linear, warmup_steps


def _lrs(warmup, total, steps):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = warmup_linear(opt, warmup, total)
    out = [sched.get_last_lr()[0]]  # the lr used by optimizer step 0
    for _ in range(steps):
        opt.step()
        sched.step()
        out.append(sched.get_last_lr()[0])
    return out


def test_warmup_linear_by_hand():
    # warmup 2, total 6. Warmup: factor (step + 1) / warmup, so the first update is not wasted at lr 0:
    #   step 0: 1/2, step 1: 2/2.  Decay: (total - step) / (total - warmup):
    #   step 2: 4/4, step 3: 3/4, step 4: 2/4, step 5: 1/4, step 6: 0, and it stays 0 after `total`.
    assert _lrs(2, 6, 7) == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0])


def test_warmup_linear_without_warmup():
    # step s: (4 - s) / 4
    assert _lrs(0, 4, 4) == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])


def test_warmup_linear_scales_the_base_lr():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2e-5)
    sched = warmup_linear(opt, 4, 10)
    assert opt.param_groups[0]["lr"] == pytest.approx(2e-5 / 4)
    for _ in range(3):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(2e-5)


def test_warmup_steps():
    assert warmup_steps(OptimConfig(warmup_steps=5, warmup_ratio=0.5), 100) == 5
    assert warmup_steps(OptimConfig(warmup_ratio=0.1), 25) == 3  # ceil(2.5)
    assert warmup_steps(OptimConfig(warmup_ratio=0.0), 25) == 0
    assert warmup_steps(OptimConfig(), 25) == 3  # default: 10 % warmup (docs/METHODS.md §1)


# --------------------------------------------------------------------------- LAMB


def test_lamb_one_step_by_hand():
    lr, b1, b2, eps, wd = 0.1, 0.9, 0.999, 1e-6, 0.01
    p = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))  # ||w|| = 5
    opt = Lamb([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    p.grad = torch.tensor([1.0, -2.0], dtype=torch.float64)
    opt.step()
    # m = (1-b1) g = [0.1, -0.2]          -> m̂ = m / (1 - b1) = [1, -2]
    # v = (1-b2) g² = [0.001, 0.004]      -> v̂ = v / (1 - b2) = [1, 4]
    # r = m̂ / (sqrt(v̂) + eps) = [1/(1+eps), -2/(2+eps)]
    # u = r + wd w = [1/(1+eps) + 0.03, -2/(2+eps) + 0.04]
    u = [1 / (1 + eps) + 0.03, -2 / (2 + eps) + 0.04]
    trust = 5.0 / math.hypot(*u)  # ||w|| / ||u||
    want = [3.0 - lr * trust * u[0], 4.0 - lr * trust * u[1]]
    assert p.detach().tolist() == pytest.approx(want, rel=1e-12)
    st = opt.state[p]
    assert st["step"] == 1
    assert st["m"].tolist() == pytest.approx([0.1, -0.2], rel=1e-12)
    assert st["v"].tolist() == pytest.approx([0.001, 0.004], rel=1e-12)
    # the step length is lr * ||w|| whatever the gradient's scale: LAMB's layer-wise trust ratio
    assert (torch.tensor([3.0, 4.0], dtype=torch.float64) - p.detach()).norm().item() == pytest.approx(lr * 5.0)


def test_lamb_second_step_bias_correction():
    lr, b1, b2, eps, wd = 0.05, 0.8, 0.9, 1e-8, 0.0
    w = [1.0, -2.0, 0.5]
    g1, g2 = [0.3, 0.1, -0.2], [-0.1, 0.4, 0.2]
    p = torch.nn.Parameter(torch.tensor(w, dtype=torch.float64))
    opt = Lamb([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    m, v = [0.0] * 3, [0.0] * 3
    for t, g in enumerate((g1, g2), 1):
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g)]
        u = [(mi / (1 - b1 ** t)) / (math.sqrt(vi / (1 - b2 ** t)) + eps) for mi, vi in zip(m, v)]
        trust = math.sqrt(sum(x * x for x in w)) / math.sqrt(sum(x * x for x in u))
        w = [wi - lr * trust * ui for wi, ui in zip(w, u)]
        assert p.detach().tolist() == pytest.approx(w, rel=1e-10)


def test_lamb_trust_ratio_is_one_for_zero_weights_and_skips_gradless():
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    frozen = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    opt = Lamb([p, frozen], lr=0.1, eps=0.0)
    p.grad = torch.tensor([2.0, -3.0], dtype=torch.float64)
    opt.step()
    # ||w|| = 0 -> trust 1: w = -lr * m̂/sqrt(v̂) = -lr * sign(g)
    assert p.detach().tolist() == pytest.approx([-0.1, 0.1], rel=1e-12)
    assert frozen.detach().tolist() == [1.0, 1.0] and frozen not in opt.state


def test_build_optimizer():
    a = torch.nn.Parameter(torch.ones(2))
    b = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    lamb = build_optimizer([a, b], OptimConfig(name="lamb", lr=1e-3, weight_decay=0.1, eps=1e-6))
    assert isinstance(lamb, Lamb)
    assert lamb.param_groups[0]["params"] == [a]
    assert lamb.param_groups[0]["weight_decay"] == 0.1 and lamb.param_groups[0]["eps"] == 1e-6
    adamw = build_optimizer([a, b], OptimConfig(lr=2e-5))
    assert isinstance(adamw, torch.optim.AdamW) and adamw.param_groups[0]["lr"] == 2e-5
    assert adamw.param_groups[0]["params"] == [a]


def test_build_optimizer_does_not_decay_bias_and_layernorm():
    import torch

    from pipeline.train.config import OptimConfig
    from pipeline.train.optim import build_optimizer

    layer = torch.nn.Linear(2, 2)
    norm = torch.nn.LayerNorm(2)
    named = [("dense.weight", layer.weight), ("dense.bias", layer.bias), ("LayerNorm.weight", norm.weight)]
    opt = build_optimizer(named, OptimConfig(weight_decay=0.01))
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {id(layer.weight)}


def test_adamw_is_torchs_fused_kernel_and_steps_as_the_default_one():
    import torch

    from pipeline.train.config import OptimConfig
    from pipeline.train.optim import build_optimizer

    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(7, 5)), torch.nn.Parameter(torch.randn(5))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt = build_optimizer([("w", a[0]), ("bias", a[1])], OptimConfig(weight_decay=0.01))
    assert opt.defaults.get("fused") is True
    ref = torch.optim.AdamW([{"params": [b[0]]}, {"params": [b[1]], "weight_decay": 0.0}], lr=opt.defaults["lr"],
                            weight_decay=0.01)
    for _ in range(3):
        for p, q in zip(a, b):
            g = torch.randn_like(p)
            p.grad, q.grad = g, g.clone()
        opt.step()
        ref.step()
    for p, q in zip(a, b):
        assert torch.allclose(p, q, atol=1e-6)
