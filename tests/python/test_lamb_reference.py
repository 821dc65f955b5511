"""tools/lamb_reference.py's LambReference (the reference of the LAMB golden vectors) against an independent LAMB.

pytorch-optimizer's Lamb (4.1.0, single-tensor path) computes the same update where the options coincide: no bias
correction (with adam_debias=True; otherwise it divides the step size by 1 - beta1^t), the weight decay added to
the update (weight_decouple=False: our adam_w_mode=True), grad averaging, no clipping (pre_norm=False), and the
trust ratio min(||p||, 10) / (||u|| + eps), which is ours (||p|| / ||u||) for ||p|| < 10 and a small eps. It
applies the trust ratio even with weight_decay=0, where ours (apex's rule) does only with use_nvlamb=True. The
clipping branch and the bias corrections are checked against hand computations.
"""

from __future__ import annotations

import math
import pathlib
import sys

import pytest
from conftest import assert_close

import torch

pytorch_optimizer = pytest.importorskip("pytorch_optimizer")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tools"))
from lamb_reference import LambReference  # noqa: E402

SHAPES = [(1,), (7,), (33,), (16, 8), (4, 3, 5)]
STEPS = 10
EPS = 1e-8


def make_params(seed=0, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g) * scale) for s in SHAPES]


def clone(params):
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def set_grads(params, step, seed=77):
    """Grads that do not depend on the params, so both runs see the same grads."""
    for i, p in enumerate(params):
        g = torch.Generator().manual_seed(seed * 1009 + step * 31 + i)
        p.grad = torch.randn(p.shape, generator=g) + 0.2


def theirs(params, **kw):
    args = dict(
        lr=1e-2,
        betas=(0.9, 0.999),
        weight_decouple=False,
        adam=False,
        pre_norm=False,
        eps=EPS,
        foreach=False,
        grad_averaging=True,
        adam_debias=True,  # step size lr, not lr / (1 - beta1^t)
    )
    args.update(kw)
    return pytorch_optimizer.Lamb(params, **args)


def ours(params, **kw):
    args = dict(lr=1e-2, betas=(0.9, 0.999), eps=EPS, bias_correction=False, adam_w_mode=True, max_grad_norm=1e9)
    args.update(kw)
    return LambReference(params, **args)


def run_both(a, pa, b, pb, steps=STEPS):
    for step in range(steps):
        set_grads(pa, step)
        set_grads(pb, step)
        a.step()
        b.step()
        for p in pa:
            assert p.detach().norm() < 10, "pytorch-optimizer clamps ||p|| at 10"


def compare(pa, pb, a, b, what):
    for i, (x, y) in enumerate(zip(pa, pb)):
        assert_close(x.detach(), y.detach(), f"{what} param {i}", rtol=1e-5)
        for key in ("exp_avg", "exp_avg_sq"):
            assert_close(a.state[x][key], b.state[y][key], f"{what} param {i} {key}", rtol=1e-5, floor=0.1)


@pytest.mark.parametrize("wd", [0.01, 0.1])
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.8, 0.99)])
def test_matches_pytorch_optimizer_with_weight_decay(wd, betas):
    pa = make_params()
    pb = clone(pa)
    a, b = ours(pa, weight_decay=wd, betas=betas), theirs(pb, weight_decay=wd, betas=betas)
    run_both(a, pa, b, pb)
    compare(pa, pb, a, b, f"wd={wd} betas={betas}")
    moved = max((x.detach() - y).abs().max().item() for x, y in zip(pa, make_params()))
    assert moved > 1e-2


def test_nvlamb_without_weight_decay_matches_pytorch_optimizer():
    pa = make_params(1)
    pb = clone(pa)
    a, b = ours(pa, weight_decay=0.0, use_nvlamb=True), theirs(pb, weight_decay=0.0)
    run_both(a, pa, b, pb)
    compare(pa, pb, a, b, "nvlamb wd=0")


def test_no_trust_ratio_without_weight_decay():
    """wd=0 and no use_nvlamb (apex rule): a plain Adam step of size lr, without bias correction."""
    pa = make_params(2)
    pb = clone(pa)
    a, b = ours(pa, weight_decay=0.0), theirs(pb, weight_decay=0.0, adam=True)  # adam=True: trust ratio 1
    run_both(a, pa, b, pb)
    compare(pa, pb, a, b, "wd=0")

    # The same by hand, in float64.
    ps = [p.detach().double() for p in make_params(2)]
    ms = [torch.zeros_like(p) for p in ps]
    vs = [torch.zeros_like(p) for p in ps]
    grads = clone(make_params(2))
    for step in range(STEPS):
        set_grads(grads, step)
        for p, m, v, q in zip(ps, ms, vs, grads):
            g = q.grad.double()
            m.mul_(0.9).add_(0.1 * g)
            v.mul_(0.999).add_(0.001 * g * g)
            p.sub_(1e-2 * m / (v.sqrt() + EPS))
    for i, (x, p) in enumerate(zip(pa, ps)):
        assert_close(x.detach().double(), p, f"hand Adam param {i}", rtol=1e-5)


def test_differs_from_pytorch_optimizer_without_weight_decay():
    """The apex rule really drops the trust ratio at wd=0 (pytorch-optimizer keeps it)."""
    pa = make_params(3)
    pb = clone(pa)
    a, b = ours(pa, weight_decay=0.0), theirs(pb, weight_decay=0.0)
    run_both(a, pa, b, pb, steps=1)
    assert any((x - y).abs().max() > 1e-4 for x, y in zip(pa, pb))


def lamb_step_by_hand(p, sg, lr, eps, wd, t=1, b1=0.9, b2=0.999):
    """One step from zero moments, in double, with bias correction and AdamW-mode decay."""
    m = (1 - b1) * sg
    v = (1 - b2) * sg * sg
    u = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps) + wd * p
    ratio = lr * p.norm().item() / u.norm().item()
    return p - ratio * u, m, v


@pytest.mark.parametrize("max_grad_norm", [1.0, 4.0, 5.0, 9.0, 0.0])
def test_clipping_by_hand(max_grad_norm):
    """G is global (over both groups); the coefficient max/G applies only when G > max; max=0 zeroes the grads."""
    p1 = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    p2 = torch.nn.Parameter(torch.tensor([0.25]))
    g1, g2 = torch.tensor([3.0, 0.0, 2.0]), torch.tensor([math.sqrt(12.0)])  # G = sqrt(9 + 4 + 12) = 5
    p1.grad, p2.grad = g1.clone(), g2.clone()
    lr, eps, wd = 0.1, 0.5, 0.01  # a large eps: the step-1 update then depends on the gradient's scale
    opt = LambReference(
        [{"params": [p1]}, {"params": [p2], "lr": 0.2}], lr=lr, eps=eps, weight_decay=wd, max_grad_norm=max_grad_norm
    )
    start = [p1.detach().clone(), p2.detach().clone()]
    opt.step()
    coef = max_grad_norm / 5.0 if 5.0 > max_grad_norm else 1.0
    for p, g, p0, group_lr in ((p1, g1, start[0], lr), (p2, g2, start[1], 0.2)):
        want_p, want_m, want_v = lamb_step_by_hand(p0.double(), g.double() * coef, group_lr, eps, wd)
        st = opt.state[p]
        assert st["step"].dtype == torch.float32 and st["step"].dim() == 0 and st["step"].item() == 1.0
        assert_close(st["exp_avg"].double(), want_m, f"max={max_grad_norm} exp_avg", rtol=1e-6)
        assert_close(st["exp_avg_sq"].double(), want_v, f"max={max_grad_norm} exp_avg_sq", rtol=1e-6)
        assert_close(p.detach().double(), want_p, f"max={max_grad_norm} param", rtol=1e-6)
        assert torch.equal(p.grad, g), ".grad must be left as it was"
    if max_grad_norm == 0.0:
        assert not opt.state[p1]["exp_avg"].any()


def test_clipping_coefficient_is_one_float32_multiply():
    p = torch.nn.Parameter(torch.zeros(64))
    g = torch.linspace(-1, 1, 64)
    p.grad = g.clone()
    opt = LambReference([p], max_grad_norm=0.3, weight_decay=0.0)
    opt.step()
    G = math.sqrt((g.double() ** 2).sum().item())
    coef = torch.tensor(0.3, dtype=torch.float32) / torch.tensor(G, dtype=torch.float32)
    want = (g * coef).mul(0.1)  # exp_avg after one step from zero: 0 * 0.9 + 0.1 * sg (fma: 0 + 0.1 * sg)
    assert torch.equal(opt.state[p]["exp_avg"], torch.zeros(64).mul(0.9).add(g * coef, alpha=0.1))
    assert_close(opt.state[p]["exp_avg"], want, "exp_avg", rtol=1e-6)


def test_bias_correction_and_grad_averaging_by_hand():
    """Two steps without decay: bc = 1 - b**t, and grad_averaging=False uses b3 = 1 for the first moment."""
    for grad_averaging in (True, False):
        p = torch.nn.Parameter(torch.tensor([0.5, -1.5, 2.0]))
        opt = LambReference([p], lr=0.01, eps=1e-3, weight_decay=0.0, grad_averaging=grad_averaging)
        x = p.detach().double().clone()
        m = torch.zeros(3, dtype=torch.float64)
        v = torch.zeros(3, dtype=torch.float64)
        b3 = 0.1 if grad_averaging else 1.0
        for t, gl in enumerate(([0.1, -0.2, 0.3], [-0.05, 0.4, 0.1]), start=1):
            g = torch.tensor(gl)
            p.grad = g.clone()
            opt.step()
            m = 0.9 * m + b3 * g.double()
            v = 0.999 * v + 0.001 * g.double() ** 2
            x = x - 0.01 * (m / (1 - 0.9**t)) / ((v / (1 - 0.999**t)).sqrt() + 1e-3)
        assert_close(p.detach().double(), x, f"grad_averaging={grad_averaging}", rtol=1e-6)
        assert opt.state[p]["step"].item() == 2.0


def test_l2_mode_adds_decay_to_the_gradient():
    """adam_w_mode=False: sg = g + wd * p enters the moments; the update has no separate decay term."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    p.grad = torch.tensor([0.1, 0.2])
    opt = LambReference([p], lr=0.01, eps=1e-6, weight_decay=0.5, adam_w_mode=False)
    opt.step()
    sg = torch.tensor([0.1, 0.2], dtype=torch.float64) + 0.5 * torch.tensor([1.0, -2.0], dtype=torch.float64)
    assert_close(opt.state[p]["exp_avg"].double(), 0.1 * sg, "exp_avg", rtol=1e-6)
    u = sg / (sg.abs() + 1e-6)
    x0 = torch.tensor([1.0, -2.0], dtype=torch.float64)
    want = x0 - 0.01 * (x0.norm() / u.norm()) * u
    assert_close(p.detach().double(), want, "param", rtol=1e-6)


def test_step_counts_only_steps_with_a_grad():
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    opt = LambReference([a, b])
    for t in range(5):
        a.grad = torch.full((2,), 0.1)
        b.grad = torch.full((3,), 0.2) if t % 2 == 0 else None
        opt.step()
    assert opt.state[a]["step"].item() == 5.0 and opt.state[b]["step"].item() == 3.0
    assert opt.defaults["max_grad_norm"] == 1.0 and opt.param_groups[0]["max_grad_norm"] == 1.0


@pytest.mark.parametrize(
    "kw, name",
    [
        (dict(lr=-1e-3), "lr"),
        (dict(eps=-1.0), "eps"),
        (dict(betas=(1.0, 0.999)), r"betas\[0\]"),
        (dict(betas=(0.9, -0.1)), r"betas\[1\]"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(max_grad_norm=-1.0), "max_grad_norm"),
    ],
)
def test_invalid_arguments(kw, name):
    value = next(iter(kw.values()))
    shown = str(value[0] if name == r"betas\[0\]" else value[1]) if isinstance(value, tuple) else str(value)
    with pytest.raises(ValueError, match=rf"{name}: {shown}"):
        LambReference([torch.nn.Parameter(torch.ones(1))], **kw)
