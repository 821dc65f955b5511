"""FusedAdadelta against torch.optim.Adadelta (single-tensor path, foreach=False;
shared/docs/algorithms-more.md §2.1). Adadelta takes two square roots per element, and the f32 sqrt
of torch 2.13's CPU wheel is not correctly rounded (about 1 value in 5 is 1 ulp off; §0), so against
torch as it is the results agree within a relative bound; with an IEEE sqrt substituted in torch
(conftest.ieee_sqrt) they agree bit for bit, which shows that sqrt is the only difference. The
scenarios are twin_checks.py's."""

from __future__ import annotations

import dataclasses
import math

import fusedopt
import pytest
import twin_checks as checks
from conftest import assert_close, make_params, run

import torch

T = torch.tensor

ADADELTA = checks.Twin(
    torch_cls=torch.optim.Adadelta,
    fused_cls=fusedopt.FusedAdadelta,
    base_kw=dict(lr=0.5, weight_decay=1e-2),
    group_kw=[dict(lr=0.2, rho=0.8), dict(lr=1.0, weight_decay=0.0, eps=1e-4)],
    bitwise=False,
    rtol=1e-5,
    low_precision_kw=dict(eps=1e-3),  # fp16 holds it well (1e-6 is subnormal there)
)
# The same with torch's sqrt replaced by an IEEE one (tests that take the ieee_sqrt fixture).
EXACT = dataclasses.replace(ADADELTA, bitwise=True)

OPTION_SETS = {
    "default": dict(),
    "lr": dict(lr=0.5),
    "weight_decay": dict(lr=0.5, weight_decay=0.1),
    "maximize": dict(lr=0.5, maximize=True),
    "weight_decay_maximize": dict(lr=0.5, weight_decay=0.1, maximize=True),
    "rho_eps": dict(lr=1.0, rho=0.8, eps=1e-5),
    "rho_one": dict(lr=1.0, rho=1.0),  # torch allows rho = 1: the averages never change
}


@pytest.mark.parametrize("case", list(OPTION_SETS))
def test_matches_torch_within_its_sqrt_rounding_100_steps(case):
    checks.check_parity(ADADELTA, OPTION_SETS[case])


@pytest.mark.parametrize("case", list(OPTION_SETS))
def test_bit_for_bit_with_ieee_sqrt(case, ieee_sqrt):
    checks.check_parity(EXACT, OPTION_SETS[case], steps=60)


@pytest.mark.parametrize("case", ["lr", "lr_rho"])
def test_tensor_lr_matches_torch(case, ieee_sqrt):
    """lr as a tensor: torch takes it as a 0-d f32 tensor, rounded once where it meets f32 as float(lr) is
    (param.add_(delta, alpha=-lr)), so with an IEEE sqrt the runs agree bit for bit."""
    kw = dict(lr=T(0.5)) if case == "lr" else dict(lr=T(0.5), rho=0.8)
    group_kw = [dict(lr=T(0.2), rho=0.8), dict(lr=T(1.0), weight_decay=0.0)]
    checks.check_parity(EXACT, kw, group_kw)


def test_one_step_by_hand():
    """Step 1 from zero state: v = (1 - rho) g², delta = sqrt(eps) / sqrt(v + eps) g, p -= lr delta."""
    p = torch.nn.Parameter(T([1.0, -2.0, 0.5]))
    g = T([0.5, -0.25, 0.0])
    opt = fusedopt.FusedAdadelta([p], lr=0.5, rho=0.75, eps=0.0625)
    p.grad = g.clone()
    opt.step()
    g64 = g.double()
    v = 0.25 * g64 * g64
    delta = math.sqrt(0.0625) / (v + 0.0625).sqrt() * g64
    assert_close(p.detach(), (T([1.0, -2.0, 0.5]).double() - 0.5 * delta).float(), "param", rtol=1e-6)
    assert_close(opt.state[p]["acc_delta"], (0.25 * delta * delta).float(), "acc_delta", rtol=1e-6)
    assert_close(opt.state[p]["square_avg"], v.float(), "square_avg", rtol=1e-7)
    assert opt.state[p]["step"].dtype == torch.float32 and float(opt.state[p]["step"]) == 1.0


def test_state_dict_round_trips_both_ways(ieee_sqrt):
    checks.check_state_dict_round_trips(EXACT, EXACT.base_kw)


def test_state_dict_round_trips_with_torchs_sqrt():
    checks.check_state_dict_round_trips(ADADELTA, ADADELTA.base_kw)


@pytest.mark.parametrize("kind", ["fusedopt", "torch"], ids=["fusedopt.GradScaler", "torch.amp.GradScaler"])
def test_grad_scaler_skips_and_follows_torch(kind, ieee_sqrt):
    checks.check_grad_scaler(EXACT, kind)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_master_weights_follow_the_fp32_run(dtype):
    checks.check_master_weights(ADADELTA, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_params_stay_close_to_torchs_16_bit_run(dtype):
    checks.check_low_precision_default(ADADELTA, dtype)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_max_grad_norm_equals_clip_then_step(norm_type):
    checks.check_max_grad_norm(ADADELTA, norm_type)


def test_max_grad_norm_skips_a_non_finite_step():
    checks.check_max_grad_norm_skips_non_finite(ADADELTA)


def test_accumulation_equals_one_step_on_the_mean_gradient():
    checks.check_accumulation(ADADELTA)


def test_flatten_is_bit_identical(ieee_sqrt):
    checks.check_flatten(EXACT)


def test_thread_count_does_not_change_results():
    checks.check_thread_count(ADADELTA)


def test_flags_and_sparse_gradients_like_torch():
    checks.check_flags_and_sparse(ADADELTA)


def test_constructor_errors_like_torch():
    checks.check_constructor_errors(ADADELTA, [
        dict(lr=-1.0), dict(rho=-0.1), dict(rho=1.5), dict(eps=-1e-3), dict(weight_decay=-1e-2),
        dict(lr=T([1.0, 1.0])),
    ])


@pytest.mark.parametrize("key,value", [("lr", -1.0), ("lr", math.nan), ("rho", 1.5), ("rho", -0.5),
                                       ("eps", -1.0), ("weight_decay", -0.5)])
def test_invalid_group_value_mid_training_changes_nothing(key, value):
    checks.check_invalid_group_value_changes_nothing(ADADELTA, key, value)


def test_is_exported_and_its_engine_keys_are_torchs():
    assert "FusedAdadelta" in fusedopt.__all__
    assert list(fusedopt._C.algorithms["adadelta"]["state_names"])[:2] == ["square_avg", "acc_delta"]
    ps = make_params(1, sizes=[(3,)])
    opt = fusedopt.FusedAdadelta(ps)
    run(opt, ps, 1)
    assert set(opt.state[ps[0]]) == {"step", "square_avg", "acc_delta"}
