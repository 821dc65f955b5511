"""FusedNAdam against torch.optim.NAdam (single-tensor path, foreach=False; shared/docs/algorithms-more.md
§2.3). Each param's state['mu_product'] is a 0-d f32 tensor that the engine advances itself, in f32 as
torch does (mu_product *= mu), only once the step's update ran; the two addcdiv coefficients come from
it in double. The step takes a square root, and the f32 sqrt of torch 2.13's CPU wheel is not correctly
rounded (§0): against torch as it is the results agree within a relative bound, with an IEEE sqrt
substituted in torch (conftest.ieee_sqrt) bit for bit, mu_product included. The scenarios are
twin_checks.py's."""

from __future__ import annotations

import copy
import dataclasses
import math

import fusedopt
import pytest
import twin_checks as checks
from conftest import assert_bitwise, make_params, run

import torch

T = torch.tensor

NADAM = checks.Twin(
    torch_cls=torch.optim.NAdam,
    fused_cls=fusedopt.FusedNAdam,
    base_kw=dict(lr=1e-2, weight_decay=1e-2),
    group_kw=[dict(lr=3e-3, betas=(0.8, 0.99), momentum_decay=1e-2), dict(lr=2e-2, weight_decay=0.0, eps=1e-6)],
    bitwise=False,
    rtol=1e-5,
    low_precision_kw=dict(eps=1e-3),  # fp16 holds it (1e-8 is subnormal there)
    # torch's 16-bit run rounds the param after each of its two addcdiv_ and keeps denom in 16 bits;
    # the engine rounds once from f32 (and is the closer of the two to an f32 run, see below)
    low_precision_ulps={torch.bfloat16: 8, torch.float16: 24},
)
EXACT = dataclasses.replace(NADAM, bitwise=True)  # with the ieee_sqrt fixture

OPTION_SETS = {
    "default": dict(),
    "lr": dict(lr=1e-2),
    "weight_decay": dict(lr=1e-2, weight_decay=0.1),
    "decoupled_weight_decay": dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
    "maximize": dict(lr=1e-2, maximize=True),
    "weight_decay_maximize": dict(lr=1e-2, weight_decay=0.1, maximize=True),
    "momentum_decay": dict(lr=1e-2, momentum_decay=0.05),
    "no_momentum_decay": dict(lr=1e-2, momentum_decay=0.0),
    "betas_eps": dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6),
}


@pytest.mark.parametrize("case", list(OPTION_SETS))
def test_matches_torch_within_its_sqrt_rounding_100_steps(case):
    checks.check_parity(NADAM, OPTION_SETS[case])


@pytest.mark.parametrize("case", list(OPTION_SETS))
def test_bit_for_bit_with_ieee_sqrt(case, ieee_sqrt):
    checks.check_parity(EXACT, OPTION_SETS[case], steps=60)


TENSOR_CASES = {
    "lr": (dict(lr=T(1e-2)), [dict(lr=T(3e-3), betas=(0.8, 0.99)), dict(lr=T(2e-2), weight_decay=0.0)]),
    "lr_decoupled": (dict(lr=T(1e-2), weight_decay=0.1, decoupled_weight_decay=True),
                     [dict(lr=T(3e-3)), dict(lr=T(2e-2), weight_decay=0.0)]),
}


@pytest.mark.parametrize("case", list(TENSOR_CASES))
def test_tensor_lr_matches_torch(case):
    """A tensor lr: torch's _single_tensor_nadam takes its value (_to_scalar), so the coefficients are
    doubles as with a float lr: equal within rtol 1e-5 (torch's sqrt)."""
    kw, group_kw = TENSOR_CASES[case]
    checks.check_parity(NADAM, kw, group_kw)


def test_mu_product_is_torchs_f32_product_bit_for_bit():
    """state['mu_product'] after each step equals torch's: a 0-d f32 tensor, f32(old * f32(mu_t)), and it
    is the same tensor object from step to step (the engine writes into it)."""
    ps = make_params(2, sizes=[(300,), (7,)])
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    ours = fusedopt.FusedNAdam(ps, lr=1e-2, momentum_decay=0.02)
    ref = torch.optim.NAdam(qs, lr=1e-2, momentum_decay=0.02, foreach=False)
    first = None
    for t in range(30):
        for p, q in zip(ps, qs):
            g = torch.randn(p.shape, generator=torch.Generator().manual_seed(t))
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
        for p, q in zip(ps, qs):
            mine, theirs = ours.state[p]["mu_product"], ref.state[q]["mu_product"]
            assert mine.dtype == torch.float32 and mine.dim() == 0 and mine.device.type == "cpu"
            assert_bitwise(mine, theirs, f"step {t + 1}")
        if first is None:
            first = ours.state[ps[0]]["mu_product"]
        assert ours.state[ps[0]]["mu_product"] is first


def test_a_param_listed_twice_advances_mu_product_twice(ieee_sqrt):
    """torch's for-loop steps a param listed twice twice, its mu_product too (with step 1 then 2)."""
    p = make_params(0, sizes=[(50,)])[0]
    q = torch.nn.Parameter(p.detach().clone())
    with pytest.warns(UserWarning):
        ours = fusedopt.FusedNAdam([p, p], lr=1e-2)
    with pytest.warns(UserWarning):
        ref = torch.optim.NAdam([q, q], lr=1e-2, foreach=False)
    for t in range(4):
        g = torch.randn(50, generator=torch.Generator().manual_seed(t))
        p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    assert_bitwise(p.detach(), q.detach(), "param")
    assert_bitwise(ours.state[p]["mu_product"], ref.state[q]["mu_product"], "mu_product")
    assert float(ours.state[p]["step"]) == float(ref.state[q]["step"]) == 8.0


def test_a_loaded_mu_product_of_another_kind_is_converted():
    """A Python float (an old state_dict, as NAdam.__setstate__ converts it) or a bf16 tensor (torch's
    load_state_dict casts it to a bf16 param's dtype) becomes a 0-d f32 tensor of the same value at the
    next step (torch keeps a loaded bf16 one in bf16: we continue the product in f32, docs/numerics.md)."""
    for loaded in (0.25, T(0.25, dtype=torch.bfloat16), T([0.25])):
        p = make_params(0, sizes=[(20,)])[0]
        opt = fusedopt.FusedNAdam([p], lr=1e-2)
        run(opt, [p], 1)
        opt.state[p]["mu_product"] = loaded
        expected = float(T(0.25) * T(opt.defaults["betas"][0] * (1 - 0.5 * 0.96 ** (2 * 4e-3))))
        run(opt, [p], 1)
        mp = opt.state[p]["mu_product"]
        assert isinstance(mp, torch.Tensor) and mp.dtype == torch.float32 and mp.dim() == 0
        assert float(mp) == expected


def test_a_bad_mu_product_is_an_error_that_changes_nothing():
    p = make_params(0, sizes=[(20,)])[0]
    opt = fusedopt.FusedNAdam([p], lr=1e-2)
    run(opt, [p], 1)
    opt.state[p]["mu_product"] = "nope"
    before = p.detach().clone()
    with pytest.raises(TypeError, match="mu_product"):
        run(opt, [p], 1)
    assert_bitwise(p.detach(), before, "param")
    assert opt.state[p]["mu_product"] == "nope"


def test_state_dict_round_trips_both_ways(ieee_sqrt):
    checks.check_state_dict_round_trips(EXACT, EXACT.base_kw)


def test_state_dict_round_trips_with_torchs_sqrt():
    checks.check_state_dict_round_trips(NADAM, dict(NADAM.base_kw, decoupled_weight_decay=True))


def test_state_dict_keys_and_types_are_torchs():
    """Before and after the first step, fused -> torch and torch -> fused: the same keys, mu_product a 0-d
    f32 tensor on both sides."""
    ps = make_params(0, sizes=[(10,), (3,)])
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    ours, ref = fusedopt.FusedNAdam(ps), torch.optim.NAdam(qs, foreach=False)
    assert ours.state_dict()["state"] == ref.state_dict()["state"] == {}
    run(ours, ps, 1)
    run(ref, qs, 1)
    for a, b in zip(ours.state_dict()["state"].values(), ref.state_dict()["state"].values()):
        assert set(a) == set(b) == {"step", "mu_product", "exp_avg", "exp_avg_sq"}
        assert a["mu_product"].dtype == b["mu_product"].dtype == torch.float32
        assert a["mu_product"].shape == b["mu_product"].shape == ()
    back = torch.optim.NAdam([torch.nn.Parameter(p.detach().clone()) for p in ps], foreach=False)
    back.load_state_dict(copy.deepcopy(ours.state_dict()))
    run(back, list(back.param_groups[0]["params"]), 1)


@pytest.mark.parametrize("kind", ["fusedopt", "torch"], ids=["fusedopt.GradScaler", "torch.amp.GradScaler"])
def test_grad_scaler_skips_and_follows_torch(kind, ieee_sqrt):
    """Skipped steps leave every state, mu_product included, bit-identical (twin_checks snapshots all)."""
    checks.check_grad_scaler(EXACT, kind)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_master_weights_follow_the_fp32_run(dtype):
    checks.check_master_weights(NADAM, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_params_stay_close_to_torchs_16_bit_run(dtype):
    checks.check_low_precision_default(NADAM, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_params_are_closer_to_the_f32_run_than_torchs_16_bit_run(dtype):
    """Why the fp16 bound above is wider: from the same 16-bit gradients, the engine's 16-bit params end
    nearer torch's f32 run than torch's own 16-bit run does (it rounds once per step, torch per op)."""
    kw = dict(lr=1e-2, weight_decay=1e-2, eps=1e-3)
    p0 = make_params(5, dtype)
    p_t, p_f = [torch.nn.Parameter(p.detach().clone()) for p in p0], [torch.nn.Parameter(p.detach().clone())
                                                                      for p in p0]
    p_32 = [torch.nn.Parameter(p.detach().float()) for p in p0]
    ref, fus = torch.optim.NAdam(p_t, foreach=False, **kw), fusedopt.FusedNAdam(p_f, **kw)
    r32 = torch.optim.NAdam(p_32, foreach=False, **kw)
    for t in range(10):
        for j, p in enumerate(p0):
            g = torch.randn(p.shape, generator=torch.Generator().manual_seed(100 * t + j)).to(dtype)
            p_t[j].grad, p_f[j].grad, p_32[j].grad = g.clone(), g.clone(), g.float()
        ref.step()
        fus.step()
        r32.step()
    ours = sum((a.float() - x).abs().sum().item() for a, x in zip(p_f, p_32))
    theirs = sum((r.float() - x).abs().sum().item() for r, x in zip(p_t, p_32))
    assert ours <= theirs, (ours, theirs)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_max_grad_norm_equals_clip_then_step(norm_type):
    checks.check_max_grad_norm(NADAM, norm_type)


def test_max_grad_norm_skips_a_non_finite_step():
    checks.check_max_grad_norm_skips_non_finite(NADAM)


def test_accumulation_equals_one_step_on_the_mean_gradient():
    checks.check_accumulation(NADAM)


def test_flatten_is_bit_identical(ieee_sqrt):
    checks.check_flatten(EXACT)


def test_thread_count_does_not_change_results():
    checks.check_thread_count(NADAM)


def test_flags_and_sparse_gradients_like_torch():
    checks.check_flags_and_sparse(NADAM)


def test_constructor_errors_like_torch():
    checks.check_constructor_errors(NADAM, [
        dict(lr=-1.0), dict(eps=-1e-3), dict(betas=(1.0, 0.999)), dict(betas=(0.9, 1.0)), dict(betas=(-0.1, 0.9)),
        dict(weight_decay=-1e-2), dict(momentum_decay=-1e-3), dict(lr=T([1e-3, 1e-3])),
    ])


@pytest.mark.parametrize("key,value", [("lr", -1.0), ("lr", math.nan), ("eps", -1.0), ("betas", (1.0, 0.9)),
                                       ("betas", (0.9, 1.5)), ("weight_decay", -0.5), ("momentum_decay", -0.5)])
def test_invalid_group_value_mid_training_changes_nothing(key, value):
    checks.check_invalid_group_value_changes_nothing(NADAM, key, value)


def test_is_exported_and_its_engine_keys_are_torchs():
    assert "FusedNAdam" in fusedopt.__all__
    entry = fusedopt._C.algorithms["nadam"]
    assert list(entry["state_names"])[:2] == ["exp_avg", "exp_avg_sq"]
    assert list(entry["scalar_names"]) == ["mu_product"]
    assert list(fusedopt._C.algorithms["radam"]["scalar_names"]) == []
    ps = make_params(1, sizes=[(3,)])
    opt = fusedopt.FusedNAdam(ps, decoupled_weight_decay=True, weight_decay=0.1, momentum_decay=0.01)
    run(opt, ps, 1)
    assert set(opt.state[ps[0]]) == {"step", "mu_product", "exp_avg", "exp_avg_sq"}
    assert opt.param_groups[0]["decoupled_weight_decay"] is True
    assert opt.param_groups[0]["momentum_decay"] == 0.01


def test_a_replaced_mu_product_tensor_is_read_at_the_next_step():
    """The segment cache checks state['mu_product'] like the other state tensors: a new 0-d f32 tensor put
    in its place (as load_state_dict does) is the one the next step reads and advances."""
    p = make_params(0, sizes=[(20,)])[0]
    q = torch.nn.Parameter(p.detach().clone())
    ours, ref = fusedopt.FusedNAdam([p], lr=1e-2), torch.optim.NAdam([q], lr=1e-2, foreach=False)
    run(ours, [p], 3)
    run(ref, [q], 3)
    old = ours.state[p]["mu_product"]
    ours.state[p]["mu_product"] = T(0.125)
    ref.state[q]["mu_product"] = T(0.125)
    run(ours, [p], 2, start=3)
    run(ref, [q], 2, start=3)
    assert_bitwise(ours.state[p]["mu_product"], ref.state[q]["mu_product"], "mu_product")
    assert ours.state[p]["mu_product"] is not old
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)
