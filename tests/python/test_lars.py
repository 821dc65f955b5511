"""FusedLARS against tools/lars_reference.py's LarsReference (apex LARC around torch.optim.SGD, written from its
formulas), bit for bit: LARS has no sqrt but the norms', which both compute from the same squares in double and
round once to float32 (shared/docs/algorithms-more.md §3.2). The reference itself is checked against a literal
LARC (torch.norm in float32) around torch's own SGD, and against pytorch-optimizer's LARS where the two formulas
coincide. The shared scenarios are twin_checks.py's."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import fusedopt
import pytest
import twin_checks as checks
from conftest import (
    assert_bitwise,
    assert_close,
    assert_unchanged,
    clone_params,
    compare_opts,
    groups_of,
    make_params,
    run,
    set_fixed_grads,
    set_grads,
    snapshot,
)

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from lars_reference import LarcSGD, LarsReference  # noqa: E402

T = torch.tensor


def reference(params, foreach=None, **kw):
    """LarsReference, taking (and ignoring) the foreach flag the shared scenarios pass to torch.optim twins."""
    return LarsReference(params, **kw)


LARS = checks.Twin(
    torch_cls=reference,
    fused_cls=fusedopt.FusedLARS,
    base_kw=dict(lr=0.1, momentum=0.9, weight_decay=1e-2),
    group_kw=[dict(lr=0.02, weight_decay=0.0, clip=False, trust_coefficient=0.1),
              dict(lr=1e-3, momentum=0.5, dampening=0.1)],
    bitwise=True,
    counts_steps=False,
)

# On conftest's problem LARC's rate tc * ||p|| / (||g|| + wd * ||p|| + eps) is about 0.02: clip mode scales lr 0.1
# by about 0.2 and leaves lr 1e-3 as it is (min(rate / lr, 1) = 1).
OPTION_SETS = {
    "default": dict(lr=0.1),
    "momentum": dict(lr=0.1, momentum=0.9),
    "weight_decay": dict(lr=0.1, momentum=0.9, weight_decay=1e-2),
    "dampening": dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=1e-3),
    "nesterov": dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "clipped_to_lr": dict(lr=1e-3, momentum=0.9, weight_decay=1e-4),
    "scale_mode": dict(lr=1.0, momentum=0.9, clip=False, trust_coefficient=1e-3, weight_decay=1e-4),
    "eps_dominated": dict(lr=0.1, momentum=0.9, eps=1.0),
}


@pytest.mark.parametrize("case", list(OPTION_SETS))
def test_matches_the_reference_bit_for_bit_100_steps(case):
    group_kw = None
    if case == "nesterov":  # (Nesterov needs zero dampening in every group)
        group_kw = [LARS.group_kw[0], dict(lr=1e-3, momentum=0.5)]
    checks.check_parity(LARS, OPTION_SETS[case], group_kw)


def test_tensor_lr_matches_the_reference():
    """A 1-element tensor lr is read as float(lr), as the reference's Python arithmetic reads it."""
    checks.check_parity(LARS, dict(lr=T(0.1), momentum=0.9, weight_decay=1e-2),
                        [dict(lr=T(0.02), clip=False), dict(lr=T(1e-3))])


def test_one_step_by_hand():
    """||p|| = 5, ||g|| = 0.5, wd 0.1, tc 0.02, eps 0: rate = 0.02 * 5 / (0.5 + 0.5) = 0.1; clip at lr 1 keeps
    it; d = (g + 0.1 p) * 0.1 (two float32 roundings, then the multiply), p -= lr * d."""
    p = torch.nn.Parameter(T([3.0, -4.0]))
    g = T([0.3, 0.4])
    opt = fusedopt.FusedLARS([p], lr=1.0, weight_decay=0.1, eps=0.0)
    p.grad = g.clone()
    opt.step()
    rate = T(0.02) * T(5.0) / (T(0.5) + T(5.0) * 0.1)
    d = (g + 0.1 * T([3.0, -4.0])) * rate
    assert_bitwise(p.detach(), T([3.0, -4.0]) - d, "one step")
    assert not opt.state[p], "no momentum: no state, as torch.optim.SGD"
    assert torch.equal(p.grad, g), "the gradient was written"


def test_clip_mode_caps_the_effective_lr_at_lr():
    """clip=True: lr * min(rate / lr, 1) = min(rate, lr); clip=False: lr * rate. With rate 0.1 and lr 0.5 the
    clipped step is rate-sized, with lr 0.01 lr-sized; scale mode multiplies."""
    for lr, clip, factor in ((0.5, True, 0.1 / 0.5), (0.01, True, 1.0), (0.01, False, 0.1)):
        p = torch.nn.Parameter(T([3.0, -4.0]))
        opt = fusedopt.FusedLARS([p], lr=lr, clip=clip, weight_decay=0.1, eps=0.0)
        p.grad = T([0.3, 0.4])
        opt.step()
        rate = T(0.02) * T(5.0) / (T(0.5) + T(5.0) * 0.1)
        ratio = min(rate / lr, 1) if clip else rate
        want = T([3.0, -4.0]).add_((T([0.3, 0.4]) + 0.1 * T([3.0, -4.0])) * ratio, alpha=-lr)  # SGD's add_
        assert_bitwise(p.detach(), want, f"lr {lr} clip {clip}")
        assert math.isclose(float(ratio), factor, rel_tol=1e-6)


def test_zero_norm_tensors_take_plain_sgd_without_weight_decay():
    """LARC scales only where both norms are non-zero; elsewhere the gradient is left as it is and the weight
    decay is dropped for that step: an all-zero param takes torch.optim.SGD's step without decay (weight decay
    0.5 here), and a zero gradient moves a param by its momentum only (no decay: a fresh one does not move)."""
    zero_p = torch.nn.Parameter(torch.zeros(5))
    twin_p = torch.nn.Parameter(torch.zeros(5))
    zero_g = torch.nn.Parameter(T([1.0, -2.0, 3.0]))
    ours = fusedopt.FusedLARS([zero_p, zero_g], lr=0.1, momentum=0.9, weight_decay=0.5)
    sgd = torch.optim.SGD([twin_p], lr=0.1, momentum=0.9, foreach=False)
    g = torch.randn(5, generator=torch.Generator().manual_seed(0))
    for t in range(3):
        zero_p.grad = g.clone() if t == 0 else None  # ||p|| = 0 on its first step only
        twin_p.grad = g.clone() if t == 0 else None
        zero_g.grad = torch.zeros(3)
        ours.step()
        sgd.step()
    assert_bitwise(zero_p.detach(), twin_p.detach(), "zero param")
    assert_bitwise(ours.state[zero_p]["momentum_buffer"], sgd.state[twin_p]["momentum_buffer"], "its buffer")
    assert torch.equal(zero_g.detach(), T([1.0, -2.0, 3.0])), "a zero gradient decayed the param"
    assert torch.equal(ours.state[zero_g]["momentum_buffer"], torch.zeros(3))


def test_lr_zero_in_clip_mode_follows_larc():
    """LARC's pitfall, reproduced on purpose: at lr 0, adaptive_lr / lr = inf and min(inf, 1) = 1, so the
    momentum buffer takes the unscaled g + wd * p while the params stay. When a warm-up schedule then raises
    lr, the first steps move by that unscaled buffer (here about 1 / rate = 50 times what a trust-scaled buffer
    would hold). Scale mode has no division: its buffer takes the scaled gradient."""
    for clip in (True, False):
        p0 = make_params(3, sizes=[(64,), (8, 8)])
        ours, theirs = clone_params(p0), clone_params(p0)
        kw = dict(lr=0.0, momentum=0.9, weight_decay=0.01, clip=clip)
        fused, ref = fusedopt.FusedLARS(ours, **kw), LarsReference(theirs, **kw)
        for t in range(3):
            set_fixed_grads(ours, t)
            set_fixed_grads(theirs, t)
            fused.step()
            ref.step()
        compare_opts(fused, ref, f"lr 0, clip={clip}", bitwise=True)
        for p, q in zip(ours, p0):
            assert torch.equal(p.detach(), q.detach()), "lr 0 moved a param"
        p, g = ours[0], ours[0].grad
        buf = fused.state[p]["momentum_buffer"]
        if clip:
            assert buf.abs().mean() > 10 * (0.02 * p.norm() / g.norm()) * g.abs().mean()
        else:
            assert buf.abs().mean() < g.abs().mean()
    # trust_coefficient 0 at lr 0: adaptive_lr / lr = 0 / 0, NaN, in both
    for make in (fusedopt.FusedLARS, LarsReference):
        p = torch.nn.Parameter(T([1.0, 2.0]))
        opt = make([p], lr=0.0, trust_coefficient=0.0)
        p.grad = T([0.5, 0.5])
        opt.step()
        assert bool(p.isnan().all()), make.__name__


def test_reference_is_larc_around_torch_sgd():
    """LarsReference against LARC as written (tools/lars_reference.py's LarcSGD: torch.norm in float32, .grad
    overwritten) wrapped around torch.optim.SGD itself: equal but for the norms' last bits (fed back through 30 steps of the loss)."""

    for kw, lars_kw in ((dict(lr=0.1, momentum=0.9, weight_decay=1e-2), {}),
                        (dict(lr=1e-3, momentum=0.9, nesterov=True, weight_decay=1e-4), {}),
                        (dict(lr=1.0, momentum=0.9, dampening=0.1, weight_decay=1e-4),
                         dict(clip=False, trust_coefficient=1e-3))):
        p_ref = make_params(7)
        p_larc = clone_params(p_ref)
        ref = LarsReference(p_ref, **kw, **lars_kw)
        larc = LarcSGD(p_larc, **kw, **lars_kw)
        for t in range(30):
            set_grads(p_ref, t)
            set_grads(p_larc, t)
            ref.step()
            larc.step()
        for j, (a, r) in enumerate(zip(p_ref, p_larc)):
            assert_close(a.detach(), r.detach(), f"{kw} param {j}", rtol=1e-5)
            if r in larc.state:
                assert_close(ref.state[a]["momentum_buffer"], larc.state[r]["momentum_buffer"], f"buffer {j}",
                             rtol=1e-5, floor=0.1)  # (a running sum: elements cross zero)


def test_pytorch_optimizer_lars_agrees_where_its_formula_is_ours():
    """pytorch-optimizer 4.1.0's LARS computes lr * tc * ||p|| / (||g|| + wd ||p||) (no eps, no clip mode) on
    params of more than one dimension only, with a zero-initialized momentum buffer; with clip=False, eps=0, no
    dampening and 2-D and 3-D params it is our update."""
    pytorch_optimizer = pytest.importorskip("pytorch_optimizer")
    sizes = [(16, 8), (4, 3, 5), (33, 17)]
    kw = dict(lr=0.5, momentum=0.9, weight_decay=1e-3, trust_coefficient=0.02)
    p_ours, p_theirs = make_params(8, sizes=sizes), make_params(8, sizes=sizes)
    ours = fusedopt.FusedLARS(p_ours, clip=False, eps=0.0, **kw)
    theirs = pytorch_optimizer.LARS(p_theirs, foreach=False, **kw)
    for t in range(20):
        set_fixed_grads(p_ours, t)
        set_fixed_grads(p_theirs, t)  # (theirs scales these in place)
        ours.step()
        theirs.step()
    for j, (a, b) in enumerate(zip(p_ours, p_theirs)):
        assert_close(a.detach(), b.detach(), f"param {j}", rtol=1e-5)


def test_float64_params_take_the_reference_step():
    p_f = make_params(11, torch.float64, sizes=[(50,), (4, 6)])
    p_r = clone_params(p_f)
    kw = dict(lr=0.1, momentum=0.9, weight_decay=1e-2)
    fus, ref = fusedopt.FusedLARS(p_f, **kw), LarsReference(p_r, **kw)
    with pytest.warns(UserWarning, match="float64"):
        run(fus, p_f, 5)
    run(ref, p_r, 5)
    compare_opts(fus, ref, "float64", bitwise=True)


def test_state_dict_round_trips_both_ways():
    checks.check_state_dict_round_trips(LARS, LARS.base_kw)


@pytest.mark.parametrize("kind", ["fusedopt", "torch"], ids=["fusedopt.GradScaler", "torch.amp.GradScaler"])
def test_grad_scaler_skips_and_follows_the_reference(kind):
    checks.check_grad_scaler(LARS, kind)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_master_weights_follow_the_fp32_run(dtype):
    checks.check_master_weights(LARS, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_params_stay_close_to_the_references_16_bit_run(dtype):
    checks.check_low_precision_default(LARS, dtype)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_max_grad_norm_equals_clip_then_step(norm_type):
    checks.check_max_grad_norm(LARS, norm_type)


def test_max_grad_norm_skips_a_non_finite_step():
    checks.check_max_grad_norm_skips_non_finite(LARS)


def test_accumulation_equals_one_step_on_the_mean_gradient():
    checks.check_accumulation(LARS)


def test_flatten_is_bit_identical():
    checks.check_flatten(LARS)


def test_thread_count_does_not_change_results():
    checks.check_thread_count(LARS)


def test_nan_gradient_poisons_its_tensor_like_the_reference():
    """A NaN gradient makes ||g|| NaN; NaN != 0, so LARC scales by a NaN ratio: the whole tensor turns NaN (and
    only that tensor), in the reference as in the engine."""
    ps = make_params(2, sizes=[(9,), (5,)])
    qs = clone_params(ps)
    ours, ref = fusedopt.FusedLARS(ps, lr=0.1, momentum=0.9), LarsReference(qs, lr=0.1, momentum=0.9)
    for t in range(2):
        set_fixed_grads(ps, t)
        set_fixed_grads(qs, t)
        if t == 1:
            ps[0].grad[4] = math.nan
            qs[0].grad[4] = math.nan
        ours.step()
        ref.step()
    assert bool(ps[0].isnan().all()) and bool(qs[0].isnan().all())
    assert_bitwise(ps[1].detach(), qs[1].detach(), "the other tensor")


def test_constructor_errors_like_torch_sgd():
    checks.check_constructor_errors(LARS, [
        dict(lr=-1.0), dict(momentum=-0.5), dict(weight_decay=-1e-2), dict(nesterov=True),
        dict(momentum=0.9, dampening=0.5, nesterov=True),
    ])
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="Invalid trust_coefficient value: -0.02"):
        fusedopt.FusedLARS(p, trust_coefficient=-0.02)
    with pytest.raises(ValueError, match="Invalid epsilon value: -1e-08"):
        fusedopt.FusedLARS(p, eps=-1e-8)
    with pytest.raises(TypeError, match="maximize"):
        fusedopt.FusedLARS(p, maximize=True)


@pytest.mark.parametrize("key,value", [("lr", -1.0), ("lr", math.nan), ("momentum", -0.5), ("weight_decay", -0.5),
                                       ("trust_coefficient", -1.0), ("eps", -1.0), ("dampening", math.nan)])
def test_invalid_group_value_mid_training_changes_nothing(key, value):
    checks.check_invalid_group_value_changes_nothing(LARS, key, value)


def test_sparse_gradients_are_refused():
    q = torch.nn.Parameter(torch.zeros(4))
    q.grad = torch.zeros(4).to_sparse()
    with pytest.raises(RuntimeError, match="FusedLARS does not support sparse gradients"):
        fusedopt.FusedLARS([q]).step()


def test_rejected_step_changes_nothing():
    params = make_params(4)
    opt = fusedopt.FusedLARS(groups_of(params, group_kw=LARS.group_kw), **LARS.base_kw)
    run(opt, params, 3)
    snap = snapshot(opt)
    set_grads(params, 3)
    opt.param_groups[2]["nesterov"] = True  # with dampening 0.1: torch's Nesterov rule
    with pytest.raises(ValueError, match="Nesterov"):
        opt.step()
    assert_unchanged(opt, snap, "nesterov with dampening")


def test_is_exported_and_its_state_is_sgds():
    assert "FusedLARS" in fusedopt.__all__
    assert list(fusedopt._C.algorithms["lars"]["state_names"]) == ["momentum_buffer"]
    p = torch.nn.Parameter(torch.ones(3))
    opt = fusedopt.FusedLARS([p], momentum=0.9)
    assert opt.defaults == LarsReference([p], momentum=0.9).defaults
    assert opt.defaults == dict(lr=1e-3, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False,
                                trust_coefficient=0.02, clip=True, eps=1e-8)
    p.grad = torch.ones(3)
    opt.step()
    assert set(opt.state[p]) == {"momentum_buffer"}
