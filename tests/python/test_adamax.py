"""FusedAdamax against torch.optim.Adamax (single-tensor path, foreach=False), bit for bit: Adamax has
no sqrt, so the fused step reproduces torch's for-loop exactly (lerp_, mul_, abs().add_(), maximum,
addcdiv_; shared/docs/algorithms-more.md §2.2). The scenarios are twin_checks.py's."""

from __future__ import annotations

import math

import fusedopt
import pytest
import twin_checks as checks
from conftest import assert_bitwise, make_params, run

import torch

T = torch.tensor

ADAMAX = checks.Twin(
    torch_cls=torch.optim.Adamax,
    fused_cls=fusedopt.FusedAdamax,
    base_kw=dict(lr=1e-2, weight_decay=1e-2),
    group_kw=[dict(lr=3e-3, betas=(0.8, 0.99)), dict(lr=2e-2, weight_decay=0.0, eps=1e-6)],
    bitwise=True,
    low_precision_kw=dict(eps=1e-3),  # fp16 holds it (1e-8 is subnormal there)
)

OPTION_SETS = {
    "default": dict(),
    "lr": dict(lr=1e-2),
    "weight_decay": dict(lr=1e-2, weight_decay=0.1),
    "maximize": dict(lr=1e-2, maximize=True),
    "weight_decay_maximize": dict(lr=1e-2, weight_decay=0.1, maximize=True),
    "betas_eps": dict(lr=2e-2, betas=(0.5, 0.9), eps=1e-3),
}


@pytest.mark.parametrize("case", list(OPTION_SETS))
def test_matches_torch_bit_for_bit_100_steps(case):
    checks.check_parity(ADAMAX, OPTION_SETS[case])


TENSOR_CASES = {
    "lr": (dict(lr=T(1e-2)), [dict(lr=T(3e-3), betas=(0.8, 0.99)), dict(lr=T(2e-2), weight_decay=0.0)]),
    "lr_betas": (dict(lr=T(1e-2), betas=(T(0.9), T(0.99))),
                 [dict(lr=T(3e-3), betas=(T(0.8), T(0.99))), dict(lr=T(2e-2), weight_decay=0.0)]),
}


@pytest.mark.parametrize("case", list(TENSOR_CASES))
def test_tensor_hyper_parameters_match_torch_closely(case):
    """With a tensor lr (or betas) torch computes clr = lr / (1 - beta1**step) as an f32 tensor op; the
    engine takes float(lr) and computes clr in double, rounded once, as for Python floats. clr may then
    differ in its last bit: equal within rtol 1e-5 after 100 steps."""
    kw, group_kw = TENSOR_CASES[case]
    checks.check_parity(ADAMAX, kw, group_kw, bitwise=False)


def test_one_step_by_hand():
    """Step 1 from zero state: m = (1 - b1) g, u = |g| + eps, p -= lr / (1 - b1) * m / u."""
    p = torch.nn.Parameter(T([1.0, -2.0, 0.5]))
    g = T([0.5, -0.25, 0.0])
    opt = fusedopt.FusedAdamax([p], lr=0.1, betas=(0.5, 0.9), eps=0.125)
    p.grad = g.clone()
    opt.step()
    m = 0.5 * g.double()
    u = g.double().abs() + 0.125
    want = T([1.0, -2.0, 0.5]).double() - 0.1 / 0.5 * m / u
    assert_bitwise(p.detach(), want.float(), "one step")
    assert_bitwise(opt.state[p]["exp_inf"], u.float(), "exp_inf")
    assert opt.state[p]["step"].dtype == torch.float32 and float(opt.state[p]["step"]) == 1.0


def test_nan_gradient_propagates_like_torch():
    """torch.maximum propagates NaN: a NaN gradient poisons exp_inf and the param of its element only."""
    ps = make_params(2, sizes=[(9,)])
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    ours, ref = fusedopt.FusedAdamax(ps, lr=1e-2), torch.optim.Adamax(qs, lr=1e-2, foreach=False)
    for t in range(3):
        g = torch.randn(9, generator=torch.Generator().manual_seed(t))
        if t == 1:
            g[4] = math.nan
            g[6] = math.inf
        ps[0].grad, qs[0].grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    for k in ("exp_avg", "exp_inf"):
        a, r = ours.state[ps[0]][k], ref.state[qs[0]][k]
        assert torch.equal(a.isnan(), r.isnan()) and torch.equal(a.nan_to_num(), r.nan_to_num()), k
    assert torch.equal(ps[0].isnan(), qs[0].isnan())
    assert torch.equal(ps[0].detach().nan_to_num(), qs[0].detach().nan_to_num())


def test_state_dict_round_trips_both_ways():
    checks.check_state_dict_round_trips(ADAMAX, ADAMAX.base_kw)


@pytest.mark.parametrize("kind", ["fusedopt", "torch"], ids=["fusedopt.GradScaler", "torch.amp.GradScaler"])
def test_grad_scaler_skips_and_follows_torch(kind):
    checks.check_grad_scaler(ADAMAX, kind)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_master_weights_follow_the_fp32_run(dtype):
    checks.check_master_weights(ADAMAX, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_params_stay_close_to_torchs_16_bit_run(dtype):
    checks.check_low_precision_default(ADAMAX, dtype)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_max_grad_norm_equals_clip_then_step(norm_type):
    checks.check_max_grad_norm(ADAMAX, norm_type)


def test_max_grad_norm_skips_a_non_finite_step():
    checks.check_max_grad_norm_skips_non_finite(ADAMAX)


def test_accumulation_equals_one_step_on_the_mean_gradient():
    checks.check_accumulation(ADAMAX)


def test_flatten_is_bit_identical():
    checks.check_flatten(ADAMAX)


def test_thread_count_does_not_change_results():
    checks.check_thread_count(ADAMAX)


def test_flags_and_sparse_gradients_like_torch():
    checks.check_flags_and_sparse(ADAMAX)


def test_constructor_errors_like_torch():
    checks.check_constructor_errors(ADAMAX, [
        dict(lr=-1.0), dict(eps=-1e-3), dict(betas=(1.0, 0.999)), dict(betas=(0.9, 1.0)), dict(betas=(-0.1, 0.9)),
        dict(weight_decay=-1e-2), dict(lr=T([1e-3, 1e-3])),
    ])


@pytest.mark.parametrize("key,value", [("lr", -1.0), ("lr", math.nan), ("eps", -1.0), ("betas", (1.0, 0.9)),
                                       ("betas", (0.9, 1.5)), ("weight_decay", -0.5)])
def test_invalid_group_value_mid_training_changes_nothing(key, value):
    checks.check_invalid_group_value_changes_nothing(ADAMAX, key, value)


def test_is_exported_and_its_engine_keys_are_torchs():
    assert "FusedAdamax" in fusedopt.__all__
    assert list(fusedopt._C.algorithms["adamax"]["state_names"])[:2] == ["exp_avg", "exp_inf"]
    p = torch.nn.Parameter(torch.ones(3))
    opt = fusedopt.FusedAdamax([p])
    p.grad = torch.ones(3)
    run(opt, [p], 1, grads=lambda ps, t: None)
    assert set(opt.state[p]) == {"step", "exp_avg", "exp_inf"}
