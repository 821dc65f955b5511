"""FusedRprop against torch.optim.Rprop (single-tensor path, foreach=False), bit for bit: Rprop has no sqrt,
and the fused step reproduces torch's for-loop exactly: sign = grad.mul(prev).sign(), its three masked fills
(> 0 -> etaplus, < 0 -> etaminus, == 0 -> 1) in torch's order, step_size.mul_(sign).clamp_(min, max), the
gradient zeroed where sign == etaminus, param.addcmul_(grad.sign(), step_size, value=-1) and prev.copy_(grad).
On a tensor's first step prev is 0, so the factor is 1 and step_size is only clamped. The scenarios are
twin_checks.py's."""

from __future__ import annotations

import copy
import math

import fusedopt
import pytest
import twin_checks as checks
from conftest import assert_bitwise, make_params, run

import torch

T = torch.tensor

RPROP = checks.Twin(
    torch_cls=torch.optim.Rprop,
    fused_cls=fusedopt.FusedRprop,
    base_kw=dict(lr=1e-2),
    group_kw=[dict(lr=3e-3, etas=(0.3, 1.5)), dict(lr=2e-2, step_sizes=(1e-4, 0.05))],
    bitwise=True,
)

OPTION_SETS = {
    "default": dict(),
    "lr": dict(lr=3e-2),
    "etas": dict(lr=1e-2, etas=(0.25, 1.75)),
    "step_sizes": dict(lr=1e-2, step_sizes=(1e-3, 2e-2)),
    "lr_above_max": dict(lr=100.0, step_sizes=(1e-6, 0.5)),  # clamped to the max on the first step
    "lr_below_min": dict(lr=1e-8),  # raised to the min on the first step
    "maximize": dict(lr=1e-2, maximize=True),
}


@pytest.mark.parametrize("case", list(OPTION_SETS))
def test_matches_torch_bit_for_bit_100_steps(case):
    checks.check_parity(RPROP, OPTION_SETS[case])


# Python floats torch rounds to f32 when it fills `sign` with them: etaminus to 0 (the negatives then become 1
# at the next fill, and nothing equals etaminus), etaminus or etaplus to 1 (then sign == etaminus also holds
# where the factor is 1, and those gradients are zeroed too).
EDGE_ETAS = {
    "etaminus_rounds_to_0": (1e-50, 1.2),
    "etaminus_rounds_to_1": (1.0 - 1e-10, 1.2),
    "etaplus_rounds_to_1": (0.5, 1.0 + 1e-10),
}


@pytest.mark.parametrize("case", list(EDGE_ETAS))
def test_etas_that_round_to_0_or_1_select_as_torch(case):
    checks.check_parity(RPROP, dict(lr=1e-2, etas=EDGE_ETAS[case]), steps=30)


def test_tensor_lr_matches_torch_bit_for_bit():
    """A tensor lr only fills the new step_size (full_like(grad, lr)): the same f32 value as a float's."""
    checks.check_parity(RPROP, dict(lr=T(1e-2)), [dict(lr=T(3e-3), etas=(0.3, 1.5)), dict(lr=T(2e-2))])


def test_two_steps_by_hand():
    """Step 1: prev = 0, so every factor is 1: step_size = clamp(lr), p -= sign(g)·step_size, prev = g. Step 2:
    where g·prev > 0 the step grows by etaplus, where < 0 it shrinks by etaminus and that gradient counts as 0
    (p stays, prev becomes 0), where == 0 it stays."""
    p = torch.nn.Parameter(T([1.0, -2.0, 0.5, 0.25]))
    opt = fusedopt.FusedRprop([p], lr=0.125, etas=(0.5, 2.0), step_sizes=(1e-3, 0.375))
    p.grad = T([0.5, -0.25, 0.0, 3.0])
    opt.step()
    assert_bitwise(p.detach(), T([0.875, -1.875, 0.5, 0.125]), "param after step 1")
    assert_bitwise(opt.state[p]["step_size"], T([0.125] * 4), "step_size after step 1")
    assert_bitwise(opt.state[p]["prev"], T([0.5, -0.25, 0.0, 3.0]), "prev after step 1")
    p.grad = T([2.0, 1.0, -1.0, 0.5])
    opt.step()
    # element 0: same sign, 0.25; 1: flipped, 0.0625, no move; 2: prev 0, factor 1; 3: same sign, 0.25
    assert_bitwise(opt.state[p]["step_size"], T([0.25, 0.0625, 0.125, 0.25]), "step_size after step 2")
    assert_bitwise(p.detach(), T([0.625, -1.875, 0.625, -0.125]), "param after step 2")
    assert_bitwise(opt.state[p]["prev"], T([2.0, 0.0, -1.0, 0.5]), "prev after step 2")
    p.grad = T([1.0, 1.0, -1.0, 0.5])
    opt.step()
    # element 0 grows to 0.5, clamped to 0.375; element 1 had prev 0: factor 1
    assert_bitwise(opt.state[p]["step_size"], T([0.375, 0.0625, 0.25, 0.375]), "step_size after step 3")
    assert float(opt.state[p]["step"]) == 3.0


def test_special_gradients_like_torch():
    """Zeros, NaN and ±Inf gradients: sign() of a NaN product is 0 in torch (factor 1), a NaN gradient's own sign
    too (the param stays, prev becomes NaN), Inf gradients step like large ones."""
    ps = [torch.nn.Parameter(torch.randn(40, generator=torch.Generator().manual_seed(3)))]
    qs = [torch.nn.Parameter(ps[0].detach().clone())]
    ours, ref = fusedopt.FusedRprop(ps), torch.optim.Rprop(qs, foreach=False)
    for t in range(6):
        g = torch.randn(40, generator=torch.Generator().manual_seed(10 + t))
        g[::7] = 0.0
        if t in (1, 3):
            g[3], g[11], g[19] = math.nan, math.inf, -math.inf
        ps[0].grad, qs[0].grad = g.clone(), g.clone()
        ours.step()
        ref.step()
        checks.compare_opts(ours, ref, f"step {t + 1}", bitwise=True)


def test_complex_params_step_their_real_and_imaginary_parts_as_torch():
    """A complex64 param is fused as its real view; its step_size starts at lr for both parts, as torch's
    full_like(grad, complex(lr, lr))."""
    g = torch.Generator().manual_seed(5)
    p = torch.nn.Parameter(torch.randn(17, dtype=torch.complex64, generator=g))
    q = torch.nn.Parameter(p.detach().clone())
    ours, ref = fusedopt.FusedRprop([p], lr=0.05), torch.optim.Rprop([q], lr=0.05, foreach=False)
    for t in range(8):
        grad = torch.randn(17, dtype=torch.complex64, generator=torch.Generator().manual_seed(20 + t))
        p.grad, q.grad = grad.clone(), grad.clone()
        ours.step()
        ref.step()
    assert_bitwise(torch.view_as_real(p.detach()), torch.view_as_real(q.detach()), "param")
    for key in ("prev", "step_size"):
        assert ours.state[p][key].dtype == torch.complex64
        assert_bitwise(torch.view_as_real(ours.state[p][key]), torch.view_as_real(ref.state[q][key]), key)


def test_state_dict_round_trips_both_ways():
    checks.check_state_dict_round_trips(RPROP, RPROP.base_kw)


def test_state_dict_keys_and_types_are_torchs():
    ps = make_params(0, sizes=[(10,), (3,)])
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    ours, ref = fusedopt.FusedRprop(ps), torch.optim.Rprop(qs, foreach=False)
    assert ours.state_dict()["state"] == ref.state_dict()["state"] == {}
    run(ours, ps, 1)
    run(ref, qs, 1)
    for a, b in zip(ours.state_dict()["state"].values(), ref.state_dict()["state"].values()):
        assert set(a) == set(b) == {"step", "prev", "step_size"}
        assert a["step"].dtype == b["step"].dtype == torch.float32 and a["step"].shape == ()
    back = torch.optim.Rprop([torch.nn.Parameter(p.detach().clone()) for p in ps], foreach=False)
    back.load_state_dict(copy.deepcopy(ours.state_dict()))
    run(back, list(back.param_groups[0]["params"]), 2)


def test_each_group_starts_its_step_sizes_at_its_own_lr():
    ps = make_params(1)
    opt = fusedopt.FusedRprop(checks.groups_of(ps, group_kw=RPROP.group_kw), lr=1e-2)
    run(opt, ps, 1, skip=lambda t, i: True)
    for group in opt.param_groups:
        for p in group["params"]:
            assert torch.equal(opt.state[p]["step_size"], torch.full_like(p, group["lr"]))


@pytest.mark.parametrize("kind", ["fusedopt", "torch"], ids=["fusedopt.GradScaler", "torch.amp.GradScaler"])
def test_grad_scaler_skips_and_follows_torch(kind):
    checks.check_grad_scaler(RPROP, kind)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_master_weights_follow_the_fp32_run(dtype):
    checks.check_master_weights(RPROP, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_params_stay_close_to_torchs_16_bit_run(dtype):
    checks.check_low_precision_default(RPROP, dtype)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_max_grad_norm_equals_clip_then_step(norm_type):
    checks.check_max_grad_norm(RPROP, norm_type)


def test_max_grad_norm_skips_a_non_finite_step():
    checks.check_max_grad_norm_skips_non_finite(RPROP)


def test_accumulation_equals_one_step_on_the_mean_gradient():
    checks.check_accumulation(RPROP)


def test_flatten_is_bit_identical():
    checks.check_flatten(RPROP)


def test_thread_count_does_not_change_results():
    checks.check_thread_count(RPROP)


def test_flags_and_sparse_gradients_like_torch():
    checks.check_flags_and_sparse(RPROP)


def test_constructor_errors_like_torch():
    checks.check_constructor_errors(RPROP, [
        dict(lr=-1.0), dict(etas=(0.0, 1.2)), dict(etas=(1.0, 1.2)), dict(etas=(0.5, 1.0)),
        dict(etas=(-0.5, 1.2)), dict(lr=T([1e-3, 1e-3])),
    ])


@pytest.mark.parametrize("key,value", [("lr", -1.0), ("lr", math.nan), ("etas", (1.0, 1.2)), ("etas", (0.5, 0.9)),
                                       ("etas", (0.0, 1.2)), ("etas", (math.nan, 1.2))])
def test_invalid_group_value_mid_training_changes_nothing(key, value):
    checks.check_invalid_group_value_changes_nothing(RPROP, key, value)


def test_is_exported_and_its_engine_keys_are_torchs():
    assert "FusedRprop" in fusedopt.__all__
    entry = fusedopt._C.algorithms["rprop"]
    assert list(entry["state_names"])[:2] == ["prev", "step_size"]
    assert list(entry["scalar_names"]) == []
    ps = make_params(1, sizes=[(3,)])
    opt = fusedopt.FusedRprop(ps, etas=(0.4, 1.3), step_sizes=(1e-5, 10.0), maximize=True)
    run(opt, ps, 1)
    assert set(opt.state[ps[0]]) == {"step", "prev", "step_size"}
    assert opt.param_groups[0]["etas"] == (0.4, 1.3) and opt.param_groups[0]["step_sizes"] == (1e-5, 10.0)
