"""FusedASGD against torch.optim.ASGD (single-tensor path, foreach=False), bit for bit: ASGD has no sqrt, so
the fused step reproduces torch's for-loop exactly (param.mul_(1 - lambd * eta), param.add_(grad,
alpha=-eta), then ax.copy_(param) while mu == 1 and ax.add_(param.sub(ax).mul_(mu)) after). Each param's
state['eta'] and state['mu'] are 0-d f32 tensors that the engine reads as the previous step left them and
advances itself, in double rounded to f32 as torch.as_tensor does, only once the step's update ran. The
scenarios are twin_checks.py's; base_kw starts averaging early (t0=5) so that both phases run."""

from __future__ import annotations

import copy
import math

import fusedopt
import pytest
import twin_checks as checks
from conftest import assert_bitwise, make_params, run

import torch

T = torch.tensor

ASGD = checks.Twin(
    torch_cls=torch.optim.ASGD,
    fused_cls=fusedopt.FusedASGD,
    base_kw=dict(lr=1e-2, weight_decay=1e-2, t0=5.0),
    group_kw=[dict(lr=3e-3, lambd=1e-3, t0=20.0), dict(lr=2e-2, weight_decay=0.0, alpha=0.5, t0=1e6)],
    bitwise=True,
)

OPTION_SETS = {
    "default": dict(),
    "lr": dict(lr=3e-2),
    "t0": dict(lr=1e-2, t0=10.0),
    "t0_zero": dict(lr=1e-2, t0=0.0),
    "lambd_alpha": dict(lr=5e-2, lambd=0.1, alpha=0.5, t0=30.0),
    "weight_decay": dict(lr=1e-2, weight_decay=0.1, t0=15.0),
    "maximize": dict(lr=1e-2, maximize=True, t0=15.0),
    "weight_decay_maximize": dict(lr=1e-2, weight_decay=0.1, maximize=True, t0=15.0),
    "fractional_t0": dict(lr=1e-2, t0=12.5),
}


@pytest.mark.parametrize("case", list(OPTION_SETS))
def test_matches_torch_bit_for_bit_100_steps(case):
    checks.check_parity(ASGD, OPTION_SETS[case])


TENSOR_CASES = {
    "lr": (dict(lr=T(1e-2), t0=5.0), [dict(lr=T(3e-3), lambd=1e-3), dict(lr=T(2e-2), weight_decay=0.0)]),
}


@pytest.mark.parametrize("case", list(TENSOR_CASES))
def test_tensor_lr_matches_torch_closely(case):
    """With a tensor lr, torch's _to_scalar keeps it a tensor, so the new eta = lr / (1 + lambd * lr * step) **
    alpha is a chain of f32 tensor ops; the engine takes float(lr) and computes eta in double, rounded once,
    as for a Python float lr. eta may then differ in its last bits: equal within rtol 1e-5 after 100 steps."""
    kw, group_kw = TENSOR_CASES[case]
    checks.check_parity(ASGD, kw, group_kw, bitwise=False)


def test_first_steps_by_hand():
    """Step 1 (eta = lr, mu = 1): p = p * (1 - lambd * lr) - lr * g, ax = p; after it eta = lr / (1 + lambd * lr)
    ** alpha and mu = 1 / max(1, 1 - t0). With t0 = -1, step 2 averages with mu = 1/2: ax = ax + (p - ax) / 2.
    alpha = 0 keeps eta = lr, so every value here is exact in f32."""
    p = torch.nn.Parameter(T([1.0, -2.0, 0.5]))
    opt = fusedopt.FusedASGD([p], lr=0.25, lambd=0.5, alpha=0.0, t0=-1.0)
    p.grad = T([0.5, -0.25, 0.0])
    opt.step()
    want = T([1.0 * 0.875 - 0.125, -2.0 * 0.875 + 0.0625, 0.5 * 0.875])
    assert_bitwise(p.detach(), want, "param after step 1")
    assert_bitwise(opt.state[p]["ax"], want, "ax after step 1 (a copy)")
    assert_bitwise(opt.state[p]["eta"], T(0.25), "eta after step 1")
    assert_bitwise(opt.state[p]["mu"], T(0.5), "mu after step 1: 1 / max(1, 1 + 1)")
    p.grad = T([1.0, 2.0, -4.0])
    opt.step()
    ax = want
    want = want * 0.875 - 0.25 * p.grad
    assert_bitwise(p.detach(), want, "param after step 2")
    assert_bitwise(opt.state[p]["ax"], ax + (want - ax) * 0.5, "ax after step 2 (averaged)")
    assert_bitwise(opt.state[p]["mu"], T(1 / 3), "mu after step 2")
    assert float(opt.state[p]["step"]) == 2.0


def test_eta_and_mu_are_torchs_f32_values_bit_for_bit():
    """state['eta'] and state['mu'] after each step equal torch's (0-d f32 tensors) across the start of the
    averaging, and stay the same tensor objects from step to step (the engine writes into them)."""
    ps = make_params(2, sizes=[(300,), (7,)])
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    kw = dict(lr=3e-2, lambd=0.05, alpha=0.6, t0=10.0)
    ours = fusedopt.FusedASGD(ps, **kw)
    ref = torch.optim.ASGD(qs, foreach=False, **kw)
    first = None
    for t in range(30):
        for p, q in zip(ps, qs):
            g = torch.randn(p.shape, generator=torch.Generator().manual_seed(t))
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
        for p, q in zip(ps, qs):
            for key in ("eta", "mu"):
                mine, theirs = ours.state[p][key], ref.state[q][key]
                assert mine.dtype == torch.float32 and mine.dim() == 0 and mine.device.type == "cpu"
                assert_bitwise(mine, theirs, f"{key} at step {t + 1}")
            assert_bitwise(p.detach(), q.detach(), f"param at step {t + 1}")
            assert_bitwise(ours.state[p]["ax"], ref.state[q]["ax"], f"ax at step {t + 1}")
        if first is None:
            first = (ours.state[ps[0]]["eta"], ours.state[ps[0]]["mu"])
        assert ours.state[ps[0]]["eta"] is first[0] and ours.state[ps[0]]["mu"] is first[1]
    assert float(ours.state[ps[0]]["mu"]) < 1.0  # the run reached the averaging


def test_ax_is_not_read_before_averaging():
    """While mu == 1 torch overwrites ax with the param (ax.copy_), whatever it held: so does the engine,
    which then does not read it (a NaN there does not leak)."""
    p = make_params(0, sizes=[(40,)])[0]
    q = torch.nn.Parameter(p.detach().clone())
    ours, ref = fusedopt.FusedASGD([p], lr=1e-2), torch.optim.ASGD([q], lr=1e-2, foreach=False)
    run(ours, [p], 2)
    run(ref, [q], 2)
    ours.state[p]["ax"].fill_(float("nan"))
    ref.state[q]["ax"].fill_(float("nan"))
    run(ours, [p], 1, start=2)
    run(ref, [q], 1, start=2)
    assert_bitwise(ours.state[p]["ax"], ref.state[q]["ax"], "ax")
    assert bool(ours.state[p]["ax"].isfinite().all())


def test_lr_schedule_changes_eta_as_torch():
    """eta is recomputed from the group's current lr at the end of each step: a schedule that changes lr
    changes the next step's eta, in torch and in the engine alike."""
    ps = make_params(3)
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    ours = fusedopt.FusedASGD(ps, lr=5e-2, t0=8.0)
    ref = torch.optim.ASGD(qs, lr=5e-2, t0=8.0, foreach=False)
    s_ours = torch.optim.lr_scheduler.StepLR(ours, step_size=4, gamma=0.5)
    s_ref = torch.optim.lr_scheduler.StepLR(ref, step_size=4, gamma=0.5)
    for t in range(20):
        run(ours, ps, 1, start=t)
        run(ref, qs, 1, start=t)
        s_ours.step()
        s_ref.step()
    checks.compare_opts(ours, ref, "StepLR", bitwise=True)


def test_a_param_listed_twice_advances_eta_and_mu_twice():
    """torch's for-loop steps a param listed twice twice, its eta and mu too (with step 1 then 2)."""
    p = make_params(0, sizes=[(50,)])[0]
    q = torch.nn.Parameter(p.detach().clone())
    with pytest.warns(UserWarning):
        ours = fusedopt.FusedASGD([p, p], lr=1e-2, t0=2.0)
    with pytest.warns(UserWarning):
        ref = torch.optim.ASGD([q, q], lr=1e-2, t0=2.0, foreach=False)
    for t in range(4):
        g = torch.randn(50, generator=torch.Generator().manual_seed(t))
        p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    assert_bitwise(p.detach(), q.detach(), "param")
    for key in ("eta", "mu", "ax"):
        assert_bitwise(ours.state[p][key], ref.state[q][key], key)
    assert float(ours.state[p]["step"]) == float(ref.state[q]["step"]) == 8.0


def test_loaded_eta_and_mu_of_another_kind_are_converted():
    """A Python float (an old state_dict, as ASGD.__setstate__ converts it) or a bf16 tensor (torch's
    load_state_dict casts it to a bf16 param's dtype) becomes a 0-d f32 tensor of the same value at the next
    step, which reads it as torch's own step would."""
    for loaded in (0.25, T(0.25, dtype=torch.bfloat16), T([0.25])):
        p = make_params(0, sizes=[(20,)])[0]
        q = torch.nn.Parameter(p.detach().clone())
        ours, ref = fusedopt.FusedASGD([p], lr=1e-2), torch.optim.ASGD([q], lr=1e-2, foreach=False)
        run(ours, [p], 1)
        run(ref, [q], 1)
        ours.state[p]["eta"] = loaded
        ours.state[p]["mu"] = loaded
        ref.state[q]["eta"], ref.state[q]["mu"] = T(0.25), T(0.25)
        run(ours, [p], 1, start=1)
        run(ref, [q], 1, start=1)
        for key in ("eta", "mu"):
            v = ours.state[p][key]
            assert isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.dim() == 0
            assert_bitwise(v, ref.state[q][key], key)
        assert_bitwise(p.detach(), q.detach(), "param")  # stepped with eta 0.25
        assert_bitwise(ours.state[p]["ax"], ref.state[q]["ax"], "ax")  # averaged with mu 0.25


@pytest.mark.parametrize("key", ["eta", "mu"])
def test_a_bad_scalar_state_is_an_error_that_changes_nothing(key):
    p = make_params(0, sizes=[(20,)])[0]
    opt = fusedopt.FusedASGD([p], lr=1e-2)
    run(opt, [p], 1)
    opt.state[p][key] = "nope"
    before = p.detach().clone()
    ax = opt.state[p]["ax"].clone()
    with pytest.raises(TypeError, match=key):
        run(opt, [p], 1)
    assert_bitwise(p.detach(), before, "param")
    assert_bitwise(opt.state[p]["ax"], ax, "ax")
    assert opt.state[p][key] == "nope"
    assert float(opt.state[p]["step"]) == 1.0


def test_state_dict_round_trips_both_ways():
    checks.check_state_dict_round_trips(ASGD, ASGD.base_kw)


def test_state_dict_keys_and_types_are_torchs():
    """Before and after the first step, fused -> torch and torch -> fused: the same keys, eta and mu 0-d f32
    tensors on both sides."""
    ps = make_params(0, sizes=[(10,), (3,)])
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    ours, ref = fusedopt.FusedASGD(ps, t0=1.0), torch.optim.ASGD(qs, t0=1.0, foreach=False)
    assert ours.state_dict()["state"] == ref.state_dict()["state"] == {}
    run(ours, ps, 1)
    run(ref, qs, 1)
    for a, b in zip(ours.state_dict()["state"].values(), ref.state_dict()["state"].values()):
        assert set(a) == set(b) == {"step", "eta", "mu", "ax"}
        for key in ("step", "eta", "mu"):
            assert a[key].dtype == b[key].dtype == torch.float32
            assert a[key].shape == b[key].shape == ()
    back = torch.optim.ASGD([torch.nn.Parameter(p.detach().clone()) for p in ps], t0=1.0, foreach=False)
    back.load_state_dict(copy.deepcopy(ours.state_dict()))
    run(back, list(back.param_groups[0]["params"]), 3)


@pytest.mark.parametrize("kind", ["fusedopt", "torch"], ids=["fusedopt.GradScaler", "torch.amp.GradScaler"])
def test_grad_scaler_skips_and_follows_torch(kind):
    """Skipped steps leave every state, eta and mu included, bit-identical (twin_checks snapshots all)."""
    checks.check_grad_scaler(ASGD, kind)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_master_weights_follow_the_fp32_run(dtype):
    checks.check_master_weights(ASGD, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_params_stay_close_to_torchs_16_bit_run(dtype):
    checks.check_low_precision_default(ASGD, dtype)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_max_grad_norm_equals_clip_then_step(norm_type):
    checks.check_max_grad_norm(ASGD, norm_type)


def test_max_grad_norm_skips_a_non_finite_step():
    checks.check_max_grad_norm_skips_non_finite(ASGD)


def test_accumulation_equals_one_step_on_the_mean_gradient():
    checks.check_accumulation(ASGD)


def test_flatten_is_bit_identical():
    checks.check_flatten(ASGD)


def test_thread_count_does_not_change_results():
    checks.check_thread_count(ASGD)


def test_flags_and_sparse_gradients_like_torch():
    checks.check_flags_and_sparse(ASGD)


def test_constructor_errors_like_torch():
    checks.check_constructor_errors(ASGD, [
        dict(lr=-1.0), dict(weight_decay=-1e-2), dict(lr=T([1e-3, 1e-3])),
    ])


@pytest.mark.parametrize("key,value", [("lr", -1.0), ("lr", math.nan), ("weight_decay", -0.5),
                                       ("weight_decay", math.nan)])
def test_invalid_group_value_mid_training_changes_nothing(key, value):
    checks.check_invalid_group_value_changes_nothing(ASGD, key, value)


def test_is_exported_and_its_engine_keys_are_torchs():
    assert "FusedASGD" in fusedopt.__all__
    entry = fusedopt._C.algorithms["asgd"]
    assert list(entry["state_names"])[:1] == ["ax"]
    assert list(entry["scalar_names"]) == ["eta", "mu"]
    assert list(fusedopt._C.AsgdHyper(lr=0.125).initial_scalars()) == [0.125, 1.0]
    ps = make_params(1, sizes=[(3,)])
    opt = fusedopt.FusedASGD(ps, lambd=1e-3, alpha=0.5, t0=7.0, weight_decay=0.1)
    run(opt, ps, 1)
    assert set(opt.state[ps[0]]) == {"step", "eta", "mu", "ax"}
    assert opt.param_groups[0]["t0"] == 7.0 and opt.param_groups[0]["lambd"] == 1e-3
