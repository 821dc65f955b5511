"""FusedRAdam against torch.optim.RAdam (single-tensor path, foreach=False; shared/docs/algorithms-more.md
§2.4): whether a step is rectified (rho_t > 5) depends only on the step, so the engine takes one branch
per tensor, chosen on the host. The rectified step takes a square root, and the f32 sqrt of torch 2.13's
CPU wheel is not correctly rounded (§0): against torch as it is the results agree within a relative
bound, with an IEEE sqrt substituted in torch (conftest.ieee_sqrt) bit for bit. The unrectified steps
(1-5 with the default betas) have no sqrt and match torch as it is, bit for bit. The scenarios are
twin_checks.py's."""

from __future__ import annotations

import dataclasses
import math

import fusedopt
import pytest
import twin_checks as checks
from conftest import assert_bitwise, make_params, run

import torch

T = torch.tensor

RADAM = checks.Twin(
    torch_cls=torch.optim.RAdam,
    fused_cls=fusedopt.FusedRAdam,
    base_kw=dict(lr=1e-2, weight_decay=1e-2),
    group_kw=[dict(lr=3e-3, betas=(0.8, 0.99)), dict(lr=2e-2, weight_decay=0.0, eps=1e-6)],
    bitwise=False,
    rtol=1e-5,
    low_precision_kw=dict(eps=1e-3),  # fp16 holds it (1e-8 is subnormal there)
)
EXACT = dataclasses.replace(RADAM, bitwise=True)  # with the ieee_sqrt fixture

OPTION_SETS = {
    "default": dict(),
    "lr": dict(lr=1e-2),
    "weight_decay": dict(lr=1e-2, weight_decay=0.1),
    "decoupled_weight_decay": dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
    "maximize": dict(lr=1e-2, maximize=True),
    "weight_decay_maximize": dict(lr=1e-2, weight_decay=0.1, maximize=True),
    "never_rectified": dict(lr=1e-2, betas=(0.9, 0.6)),  # rho_inf = 4 <= 5
    "betas_eps": dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6),
}


@pytest.mark.parametrize("case", list(OPTION_SETS))
def test_matches_torch_within_its_sqrt_rounding_100_steps(case):
    checks.check_parity(RADAM, OPTION_SETS[case])


@pytest.mark.parametrize("case", list(OPTION_SETS))
def test_bit_for_bit_with_ieee_sqrt(case, ieee_sqrt):
    checks.check_parity(EXACT, OPTION_SETS[case], steps=60)


@pytest.mark.parametrize("case", ["never_rectified", "weight_decay_maximize"])
def test_unrectified_steps_are_bit_for_bit_with_torchs_own_sqrt(case):
    """Without rectification no sqrt is taken: bit for bit with torch as it is (5 steps of the default
    betas; every step of betas whose rho_inf is at most 5)."""
    steps = 100 if case == "never_rectified" else 5
    groups = [dict(lr=3e-3), dict(lr=2e-2, weight_decay=0.0)]  # no betas of their own
    checks.check_parity(EXACT, OPTION_SETS[case], groups, steps=steps)


TENSOR_CASES = {
    "lr": (dict(lr=T(1e-2)), [dict(lr=T(3e-3), betas=(0.8, 0.99)), dict(lr=T(2e-2), weight_decay=0.0)]),
    "lr_decoupled": (dict(lr=T(1e-2), weight_decay=0.1, decoupled_weight_decay=True),
                     [dict(lr=T(3e-3)), dict(lr=T(2e-2), weight_decay=0.0)]),
}


@pytest.mark.parametrize("case", list(TENSOR_CASES))
def test_tensor_lr_matches_torch(case):
    """A tensor lr stays a 0-d f32 tensor in torch's step, so 1 - lr * weight_decay is an f32 tensor op
    (the engine: double, rounded once): equal within rtol 1e-5."""
    kw, group_kw = TENSOR_CASES[case]
    checks.check_parity(RADAM, kw, group_kw)


def test_rectification_starts_at_step_6():
    """beta2 = 0.999: steps 1-5 are p -= lr * m_hat (bit for bit with torch as it is), step 6 is the first
    rectified one (within torch's sqrt rounding)."""
    ps = make_params(2, sizes=[(300,)])
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    ours, ref = fusedopt.FusedRAdam(ps, lr=1e-2), torch.optim.RAdam(qs, lr=1e-2, foreach=False)
    for t in range(6):
        g = torch.randn(300, generator=torch.Generator().manual_seed(t))
        ps[0].grad, qs[0].grad = g.clone(), g.clone()
        before = ps[0].detach().clone()
        m_hat_before = ours.state[ps[0]]["exp_avg"].clone() if t else None
        ours.step()
        ref.step()
        if t < 5:
            assert_bitwise(ps[0].detach(), qs[0].detach(), f"step {t + 1}")
            m_hat = ours.state[ps[0]]["exp_avg"] / (1 - 0.9 ** (t + 1))
            assert_bitwise(ps[0].detach(), before - m_hat * 1e-2, f"step {t + 1}: p - lr * m_hat")
        else:
            assert m_hat_before is not None
            torch.testing.assert_close(ps[0].detach(), qs[0].detach(), rtol=1e-6, atol=1e-7)
            m_hat = ours.state[ps[0]]["exp_avg"] / (1 - 0.9 ** (t + 1))
            assert not torch.equal(ps[0].detach(), before - m_hat * 1e-2), "step 6 was not rectified"


def test_state_dict_round_trips_both_ways(ieee_sqrt):
    checks.check_state_dict_round_trips(EXACT, EXACT.base_kw)


def test_state_dict_round_trips_with_torchs_sqrt():
    checks.check_state_dict_round_trips(RADAM, dict(RADAM.base_kw, decoupled_weight_decay=True))


@pytest.mark.parametrize("kind", ["fusedopt", "torch"], ids=["fusedopt.GradScaler", "torch.amp.GradScaler"])
def test_grad_scaler_skips_and_follows_torch(kind, ieee_sqrt):
    checks.check_grad_scaler(EXACT, kind)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_master_weights_follow_the_fp32_run(dtype):
    checks.check_master_weights(RADAM, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_params_stay_close_to_torchs_16_bit_run(dtype):
    checks.check_low_precision_default(RADAM, dtype)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_max_grad_norm_equals_clip_then_step(norm_type):
    checks.check_max_grad_norm(RADAM, norm_type)


def test_max_grad_norm_skips_a_non_finite_step():
    checks.check_max_grad_norm_skips_non_finite(RADAM)


def test_accumulation_equals_one_step_on_the_mean_gradient():
    checks.check_accumulation(RADAM)


def test_flatten_is_bit_identical(ieee_sqrt):
    checks.check_flatten(EXACT)


def test_thread_count_does_not_change_results():
    checks.check_thread_count(RADAM)


def test_flags_and_sparse_gradients_like_torch():
    checks.check_flags_and_sparse(RADAM)


def test_constructor_errors_like_torch():
    checks.check_constructor_errors(RADAM, [
        dict(lr=-1.0), dict(eps=-1e-3), dict(betas=(1.0, 0.999)), dict(betas=(0.9, 1.0)), dict(betas=(-0.1, 0.9)),
        dict(weight_decay=-1e-2), dict(lr=T([1e-3, 1e-3])),
    ])


@pytest.mark.parametrize("key,value", [("lr", -1.0), ("lr", math.nan), ("eps", -1.0), ("betas", (1.0, 0.9)),
                                       ("betas", (0.9, 1.5)), ("weight_decay", -0.5)])
def test_invalid_group_value_mid_training_changes_nothing(key, value):
    checks.check_invalid_group_value_changes_nothing(RADAM, key, value)


def test_is_exported_and_its_engine_keys_are_torchs():
    assert "FusedRAdam" in fusedopt.__all__
    assert list(fusedopt._C.algorithms["radam"]["state_names"])[:2] == ["exp_avg", "exp_avg_sq"]
    ps = make_params(1, sizes=[(3,)])
    opt = fusedopt.FusedRAdam(ps, decoupled_weight_decay=True, weight_decay=0.1)
    run(opt, ps, 1)
    assert set(opt.state[ps[0]]) == {"step", "exp_avg", "exp_avg_sq"}
    assert opt.param_groups[0]["decoupled_weight_decay"] is True
