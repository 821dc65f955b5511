"""FusedLion against lucidrains' lion-pytorch (bit for bit) and FusedLAMB against the pure-torch reference
written from apex FusedLAMB's formulas (tools/lamb_reference.py, itself cross-checked against
pytorch-optimizer's Lamb in test_lamb_reference.py)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import fusedopt
import pytest
from conftest import (
    assert_bitwise,
    assert_close,
    assert_unchanged,
    clone_params,
    compare_opts,
    groups_of,
    make_params,
    run,
    set_grads,
    snapshot,
)

import torch

lion_pytorch = pytest.importorskip("lion_pytorch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from lamb_reference import LambReference  # noqa: E402

LION_CASES = {
    "default": dict(lr=1e-3),
    "weight_decay": dict(lr=3e-3, weight_decay=0.1),
    "betas": dict(lr=3e-3, betas=(0.95, 0.98), weight_decay=0.01),
    "decoupled": dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
}
LAMB_CASES = {
    "default": dict(lr=1e-2),
    "no_bias_correction": dict(lr=1e-2, bias_correction=False),
    "l2_mode": dict(lr=1e-2, adam_w_mode=False, weight_decay=0.05),
    "no_grad_averaging": dict(lr=1e-2, grad_averaging=False),
    "no_weight_decay": dict(lr=1e-2, weight_decay=0.0),
    "nvlamb": dict(lr=1e-2, weight_decay=0.0, use_nvlamb=True),
    "clipping": dict(lr=1e-2, max_grad_norm=0.5),
    "no_clipping": dict(lr=1e-2, max_grad_norm=1e9),
    # bc1 and bc2 are exactly 1 from step 13 on (groups 0 and 2), where the engine leaves their
    # divisions out
    "late_steps": dict(lr=1e-2, betas=(0.25, 0.25)),
}
LION_GROUPS = [dict(lr=3e-3, weight_decay=0.02), dict(lr=1e-2, betas=(0.8, 0.9))]
LAMB_GROUPS = [dict(lr=5e-3, weight_decay=0.1, betas=(0.8, 0.99)), dict(lr=2e-2, weight_decay=0.0)]


@pytest.mark.parametrize("case", list(LION_CASES))
@pytest.mark.parametrize("threads", [1, 2])
def test_lion_matches_lion_pytorch_bit_for_bit(case, threads):
    torch.set_num_threads(threads)
    kw = LION_CASES[case]
    params = make_params(1)
    ref_params = clone_params(params)
    fused = fusedopt.FusedLion(groups_of(params, group_kw=LION_GROUPS), **kw)
    ref = lion_pytorch.Lion(groups_of(ref_params, group_kw=LION_GROUPS), **kw)
    for t in range(15):  # some params skip steps or start late (conftest.has_grad)
        set_grads(params, t)
        set_grads(ref_params, t)
        fused.step()
        ref.step()
    compare_opts(fused, ref, case, bitwise=True)


def test_lion_sign_is_right_at_every_magnitude():
    """DeepSpeed's AVX Lion masks with the bits of -1.0 instead of the sign bit: its update is right only
    for |c| in [2, 4). Momentum-gradient mixes from 1e-30 to 1e30 must all move by exactly lr."""
    magnitudes = torch.logspace(-30, 30, 61)
    g = torch.cat([magnitudes, -magnitudes, torch.zeros(3)])
    p = torch.nn.Parameter(torch.zeros_like(g))
    opt = fusedopt.FusedLion([p], lr=0.25)
    p.grad = g.clone()
    opt.step()
    want = torch.cat([torch.full((61,), -0.25), torch.full((61,), 0.25), torch.zeros(3)])
    assert_bitwise(p.detach(), want, "one step from zero momentum")


def test_lion_state_dict_round_trips_with_lion_pytorch():
    params = make_params(2)
    ref_params = clone_params(params)
    ref = lion_pytorch.Lion(ref_params, lr=1e-3, weight_decay=0.1)
    run(ref, ref_params, 4)
    assert set(ref.state[ref_params[0]]) == {"exp_avg"}
    fused = fusedopt.FusedLion(params, lr=1e-3, weight_decay=0.1)
    for p, r in zip(params, ref_params):
        p.data.copy_(r.detach())
    fused.load_state_dict(copy.deepcopy(ref.state_dict()))  # (torch would share the tensors)
    run(fused, params, 3, start=4)
    run(ref, ref_params, 3, start=4)
    compare_opts(fused, ref, "after loading lion-pytorch's state", bitwise=True)
    back = lion_pytorch.Lion(clone_params(params), lr=1e-3, weight_decay=0.1)
    back.load_state_dict(fused.state_dict())  # and the other way


def test_lion_rejects_what_lion_pytorch_asserts():
    p = [torch.nn.Parameter(torch.zeros(3))]
    for kw in (dict(lr=0.0), dict(lr=-1.0)):
        with pytest.raises(ValueError, match="learning rate"):
            fusedopt.FusedLion(p, **kw)
    with pytest.raises(ValueError, match="beta parameter at index 1: 1.5"):
        fusedopt.FusedLion(p, betas=(0.9, 1.5))


@pytest.mark.parametrize("case", list(LAMB_CASES))
def test_lamb_matches_the_reference(case, ieee_sqrt):
    """With an IEEE sqrt in torch (the engine's), only the order of the norms' additions differs."""
    kw = LAMB_CASES[case]
    params = make_params(3)
    ref_params = clone_params(params)
    fused = fusedopt.FusedLAMB(groups_of(params, group_kw=LAMB_GROUPS), **kw)
    ref = LambReference(groups_of(ref_params, group_kw=LAMB_GROUPS), **kw)
    for t in range(15):
        set_grads(params, t)
        set_grads(ref_params, t)
        fused.step()
        ref.step()
    compare_opts(fused, ref, case, rtol=2e-6)


def test_lamb_is_bit_identical_for_any_thread_count():
    runs = []
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        params = make_params(4, sizes=[(70000,), (33, 17), (5,)])
        opt = fusedopt.FusedLAMB(params, lr=1e-2)
        run(opt, params, 5, skip=lambda t, i: True)
        runs.append([p.detach().clone() for p in params] + [opt.state[p]["exp_avg_sq"].clone() for p in params])
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert_bitwise(b, a, "threads")


def test_lamb_trust_ratio_by_hand():
    """One step, one tensor: p -= lr * ‖p‖/‖u‖ * u with u = m̂ / (sqrt(v̂) + eps) + wd p (bias-corrected)."""
    p0 = torch.tensor([3.0, -4.0])
    g = torch.tensor([0.1, 0.2])
    p = torch.nn.Parameter(p0.clone())
    opt = fusedopt.FusedLAMB([p], lr=0.1, weight_decay=0.5, max_grad_norm=1e9)
    p.grad = g.clone()
    opt.step()
    u = (g.double() / (g.double().abs() + 1e-6)) + 0.5 * p0.double()  # m̂ = g, sqrt(v̂) = |g| on step 1
    want = p0.double() - 0.1 * (p0.double().norm() / u.norm()) * u
    assert_close(p.detach(), want.float(), "trust-ratio step", rtol=1e-6)


def test_lamb_clips_by_apex_rule():
    """Global norm G = 5 over two groups > max_grad_norm 1: gradients scaled by 1/5 before the moments."""
    a, b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
    opt = fusedopt.FusedLAMB([{"params": [a]}, {"params": [b]}], lr=0.1, weight_decay=0.0, max_grad_norm=1.0,
                             bias_correction=False, betas=(0.5, 0.5))
    a.grad, b.grad = torch.tensor([3.0]), torch.tensor([4.0])
    opt.step()
    assert opt.state[a]["exp_avg"].item() == pytest.approx(0.5 * 0.6, rel=1e-6)
    assert opt.state[b]["exp_avg"].item() == pytest.approx(0.5 * 0.8, rel=1e-6)
    assert opt.last_grad_norm == pytest.approx(5.0)


def test_lamb_skips_non_finite_gradients_and_keeps_everything():
    params = make_params(5)
    opt = fusedopt.FusedLAMB(params, lr=1e-2)
    run(opt, params, 2, skip=lambda t, i: True)
    snap = snapshot(opt)
    set_grads(params, 2, skip=lambda t, i: True)
    params[2].grad[5] = float("inf")
    opt.step()
    assert_unchanged(opt, snap, "a step with an Inf gradient")


def test_lamb_arguments_are_apex_fusedlambs():
    p = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(RuntimeError, match="does not support the AMSGrad variant"):
        fusedopt.FusedLAMB(p, amsgrad=True)
    with pytest.raises(ValueError, match="beta parameter at index 0: 1.0"):
        fusedopt.FusedLAMB(p, betas=(1.0, 0.999))
    opt = fusedopt.FusedLAMB(p, max_grad_norm=2.0)
    assert opt.param_groups[0]["eps"] == 1e-6 and opt.param_groups[0]["weight_decay"] == 0.01
    assert opt.param_groups[0]["max_grad_norm"] == 2.0
    p[0].grad = torch.ones(3)
    opt.zero_grad()  # set_grad_none=True, apex's default
    assert p[0].grad is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lamb_and_lion_run_16_bit_params_with_master_weights(dtype):
    """16-bit params with f32 masters follow the f32 run closely (the params are its rounding)."""
    for make in (lambda ps, **k: fusedopt.FusedLAMB(ps, lr=1e-2, **k), lambda ps, **k: fusedopt.FusedLion(ps, lr=1e-3, **k)):
        full = make_params(6)
        low = [torch.nn.Parameter(p.detach().to(dtype)) for p in full]
        a, b = make(full), make(low, master_weights=True)
        for t in range(5):
            set_grads(full, t, skip=lambda t, i: True)
            for p, q in zip(low, full):
                p.grad = q.grad.to(dtype)
            a.step()
            b.step()
        for p, q in zip(low, full):
            master = b.state[p]["master_param"]
            assert_close(master, q.detach(), "master", rtol=2e-2)
            assert torch.equal(p.detach(), master.to(dtype))
