"""Training-loop features fused into the step (issue #4): clip_grad_norm_/clip_grad_value_ against
torch.nn.utils, max_grad_norm= against torch's clip-then-step, the C++ LossScaler and
fusedopt.GradScaler against torch.amp.GradScaler on scripted overflow sequences, gradient
accumulation against one large batch, and bf16 optimizer states."""

from __future__ import annotations

import copy
import io
import math

import fusedopt
import pytest
from fusedopt import _C

import torch

SHAPES = [(1,), (7,), (40000,), (33, 17)]


def _params(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in SHAPES]


def _grads(params, step, scale=1.0, dtype=None):
    g = torch.Generator().manual_seed(1000 + step)
    return [(torch.randn(p.shape, generator=g) * scale).to(dtype or p.dtype) for p in params]


def _set_grads(params, grads):
    for p, g in zip(params, grads):
        p.grad = g.clone()


# ---- clip_grad_norm_ / clip_grad_value_ ------------------------------------------------------------

@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, "inf"])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    ours, ref = _params(), _params()
    grads = _grads(ours, 0, scale=3.0)
    _set_grads(ours, grads)
    _set_grads(ref, grads)
    got = fusedopt.clip_grad_norm_(ours, max_norm, norm_type=norm_type)
    want = torch.nn.utils.clip_grad_norm_(ref, max_norm, norm_type=norm_type, foreach=False)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.grad, b.grad, rtol=2e-6, atol=0)
    if max_norm > 1e5:  # not clipped: the grads are untouched
        for a, g in zip(ours, grads):
            assert torch.equal(a.grad, g)


def test_clip_grad_norm_low_precision_grads_match_torch_on_f32_copies():
    ours = _params(torch.bfloat16)
    ref = [torch.nn.Parameter(p.detach().float()) for p in ours]
    grads = _grads(ours, 1, scale=2.0)
    _set_grads(ours, grads)
    _set_grads(ref, [g.float() for g in grads])
    got = fusedopt.clip_grad_norm_(ours, 1.0)
    want = torch.nn.utils.clip_grad_norm_(ref, 1.0)
    assert got.dtype == torch.bfloat16  # torch's result dtype
    torch.testing.assert_close(got.float(), want, rtol=8e-3, atol=0)
    for a, b in zip(ours, ref):  # each element: f32 product rounded once to bf16
        torch.testing.assert_close(a.grad, b.grad.to(torch.bfloat16), rtol=8e-3, atol=1e-30)


def test_clip_grad_norm_nonfinite():
    ours, ref = _params(), _params()
    grads = _grads(ours, 2)
    grads[2][123] = float("inf")
    _set_grads(ours, grads)
    _set_grads(ref, grads)
    with pytest.raises(RuntimeError, match="non-finite"):
        fusedopt.clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)
    for a, g in zip(ours, grads):
        assert torch.equal(a.grad, g)  # nothing changed
    got = fusedopt.clip_grad_norm_(ours, 1.0)
    want = torch.nn.utils.clip_grad_norm_(ref, 1.0, foreach=False)
    assert torch.isinf(got) and torch.isinf(want)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.grad, b.grad, equal_nan=True)


def test_clip_grad_norm_edge_cases_follow_torch():
    assert fusedopt.clip_grad_norm_([torch.nn.Parameter(torch.ones(3))], 1.0).item() == 0.0  # no grads
    p, q = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(4))
    p.grad = torch.arange(4.0)
    q.grad = torch.arange(4.0)
    # a single tensor, and an unsupported norm order that goes to torch's implementation
    assert torch.equal(fusedopt.clip_grad_norm_(p, 100.0), torch.nn.utils.clip_grad_norm_(q, 100.0))
    assert torch.equal(fusedopt.clip_grad_norm_(p, 100.0, norm_type=3.0),
                       torch.nn.utils.clip_grad_norm_(q, 100.0, norm_type=3.0))
    with pytest.raises(ValueError, match="max_norm"):
        fusedopt.clip_grad_norm_(p, -1.0)


def test_clip_grad_value_matches_torch_and_keeps_nan():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        ours, ref = _params(dtype), _params(dtype)
        grads = _grads(ours, 3, scale=2.0)
        grads[1][3] = float("nan")
        _set_grads(ours, grads)
        _set_grads(ref, grads)
        fusedopt.clip_grad_value_(ours, 0.7)
        torch.nn.utils.clip_grad_value_(ref, 0.7, foreach=False)
        for a, b in zip(ours, ref):
            assert torch.equal(a.grad.isnan(), b.grad.isnan())
            assert torch.equal(a.grad.nan_to_num(), b.grad.nan_to_num()), dtype
    with pytest.raises(ValueError, match="clip_value"):
        fusedopt.clip_grad_value_(ours, -1.0)


# ---- max_grad_norm= in the step --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["SGD", "AdamW", "RMSprop"])
@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_max_grad_norm_equals_torch_clip_then_step(name, norm_type):
    kw = {"SGD": dict(lr=0.05, momentum=0.9), "AdamW": dict(lr=1e-2, weight_decay=0.1),
          "RMSprop": dict(lr=1e-2, momentum=0.5)}[name]
    ours, ref = _params(), _params()
    opt = getattr(fusedopt, f"Fused{name}")(ours, max_grad_norm=1.0, norm_type=norm_type, **kw)
    topt = getattr(torch.optim, name)(ref, foreach=False, **kw)
    for step in range(5):
        grads = _grads(ours, step, scale=2.0)
        _set_grads(ours, grads)
        _set_grads(ref, grads)
        opt.step()
        want = torch.nn.utils.clip_grad_norm_(ref, 1.0, norm_type=norm_type, foreach=False)
        topt.step()
        assert opt.last_grad_norm == pytest.approx(want.item(), rel=1e-6)
        for a, g in zip(ours, grads):
            assert torch.equal(a.grad, g)  # the fused clip writes no gradient
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_max_grad_norm_skips_a_nonfinite_step_leaving_everything_unchanged():
    ours = _params()
    opt = fusedopt.FusedAdamW(ours, lr=1e-2, max_grad_norm=1.0)
    _set_grads(ours, _grads(ours, 0))
    opt.step()
    before = copy.deepcopy(opt.state_dict())
    values = [p.detach().clone() for p in ours]
    grads = _grads(ours, 1)
    grads[0][0] = float("nan")
    _set_grads(ours, grads)
    opt.step()
    assert math.isnan(opt.last_grad_norm)
    for p, v in zip(ours, values):
        assert torch.equal(p, v)
    after = opt.state_dict()
    for k, st in before["state"].items():
        for key, t in st.items():
            assert torch.equal(after["state"][k][key], t), key
    # A skipped first step creates no state.
    fresh = _params(seed=1)
    opt2 = fusedopt.FusedAdam(fresh, max_grad_norm=1.0)
    _set_grads(fresh, grads)
    opt2.step()
    assert len(opt2.state) == 0


def test_invalid_training_options():
    with pytest.raises(ValueError, match="max_grad_norm"):
        fusedopt.FusedAdamW(_params(), max_grad_norm=-1.0)
    with pytest.raises(ValueError, match="norm_type"):
        fusedopt.FusedAdamW(_params(), max_grad_norm=1.0, norm_type=3.0)
    with pytest.raises(ValueError, match="accumulation_steps"):
        fusedopt.FusedAdamW(_params(), accumulation_steps=0)
    with pytest.raises(TypeError, match="state_dtype"):
        fusedopt.FusedAdamW(_params(), state_dtype=torch.float64)


# ---- loss scaling ----------------------------------------------------------------------------------

OVERFLOWS = [False, False, True, False, False, False, False, True, True, False, False, False, False]


@pytest.mark.parametrize("kw", [dict(), dict(init_scale=1024.0, growth_interval=3),
                                dict(init_scale=2.0**126, growth_factor=4.0, growth_interval=1),
                                dict(init_scale=3.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=2)])
def test_cpp_loss_scaler_follows_torch_grad_scaler(kw):
    ours = _C.LossScaler(**kw)
    ref = torch.amp.GradScaler("cpu", **kw)
    ref._lazy_init_scale_growth_tracker(torch.device("cpu"))
    for overflow in OVERFLOWS:
        found = torch.full((1,), 1.0 if overflow else 0.0)
        torch._amp_update_scale_(ref._scale, ref._growth_tracker, found, ref._growth_factor,
                                 ref._backoff_factor, ref._growth_interval)
        ours.update(overflow)
        assert ours.scale == ref._scale.item()
        assert ours.growth_tracker == ref._growth_tracker.item()
        assert ours.inv_scale == ref._scale.double().reciprocal().float().item()


@pytest.mark.parametrize("with_clip", [False, True])
def test_grad_scaler_with_fused_prepass_follows_torch(with_clip):
    kw = dict(lr=1e-2, weight_decay=0.1)
    ours, ref = _params(), _params()
    opt = fusedopt.FusedAdamW(ours, max_grad_norm=1.0 if with_clip else None, **kw)
    topt = torch.optim.AdamW(ref, foreach=False, **kw)
    scaler = fusedopt.GradScaler(init_scale=1024.0, growth_interval=3)
    tscaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    for step, overflow in enumerate(OVERFLOWS):
        scaler.scale(torch.ones(()))  # scale(loss) starts each iteration
        tscaler.scale(torch.ones(()))
        grads = _grads(ours, step, scale=scaler.get_scale())
        if overflow:
            grads[step % len(grads)].view(-1)[-1] = float("inf") if step % 2 else float("nan")
        _set_grads(ours, grads)
        _set_grads(ref, grads)
        values = [p.detach().clone() for p in ours]
        scaler.step(opt)
        scaler.update()
        if with_clip:
            tscaler.unscale_(topt)
            if not overflow:
                torch.nn.utils.clip_grad_norm_(ref, 1.0, foreach=False)
        tscaler.step(topt)
        tscaler.update()
        assert scaler.get_scale() == tscaler.get_scale()
        if overflow:
            for p, v in zip(ours, values):
                assert torch.equal(p, v)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ---- gradient accumulation -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("flatten,set_to_none", [(False, True), (True, True), (True, False)])
def test_accumulation_equals_one_step_on_the_mean_gradient(dtype, flatten, set_to_none):
    """f32 params, or bf16 params and grads with f32 masters: the accumulators are f32 either way,
    and the update equals one torch step (f32 params) on the mean of the micro-batch gradients; with
    flatten=True too, whether zero_grad drops the grads or zeroes them in their flat buffer."""
    k = 4
    ours = _params(dtype)
    ref = [torch.nn.Parameter(p.detach().float()) for p in ours]
    opt = fusedopt.FusedAdamW(ours, lr=1e-2, accumulation_steps=k, master_weights=dtype != torch.float32,
                              flatten=flatten)
    topt = torch.optim.AdamW(ref, lr=1e-2, foreach=False)
    for step in range(3):
        total = [torch.zeros(p.shape, dtype=torch.float64) for p in ref]
        for micro in range(k):
            grads = _grads(ours, 10 * step + micro)
            _set_grads(ours, grads)
            for t, g in zip(total, grads):
                t += g.double()
            before = [p.detach().clone() for p in ours]
            opt.step()
            opt.zero_grad(set_to_none=set_to_none)
            if micro < k - 1:
                assert all(torch.equal(p, b) for p, b in zip(ours, before))
        for p, t in zip(ref, total):
            p.grad = (t / k).float()
        topt.step()
    for a, b in zip(ours, ref):
        got = opt.state[a]["master_param"] if dtype != torch.float32 else a
        torch.testing.assert_close(got, b, rtol=1e-6, atol=1e-6)
    assert opt.state[ours[0]]["step"].item() == 3


@pytest.mark.parametrize("flatten", [False, True])
def test_accumulation_window_with_an_overflow_is_skipped(flatten):
    ours = _params()
    opt = fusedopt.FusedAdamW(ours, accumulation_steps=2, flatten=flatten)
    scaler = fusedopt.GradScaler(init_scale=64.0)
    values = [p.detach().clone() for p in ours]
    for micro in range(2):
        scaler.scale(torch.ones(()))
        grads = _grads(ours, micro, scale=scaler.get_scale())
        if micro == 0:
            grads[2][7] = float("inf")
        _set_grads(ours, grads)
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 32.0
    assert all(torch.equal(p, v) for p, v in zip(ours, values))
    assert len(opt.state) == 0
    for micro in range(2):  # the next window steps
        scaler.scale(torch.ones(()))
        _set_grads(ours, _grads(ours, 5 + micro, scale=scaler.get_scale()))
        scaler.step(opt)
        scaler.update()
    assert opt.state[ours[0]]["step"].item() == 1


# ---- low-memory states -----------------------------------------------------------------------------

def test_bf16_states_halve_the_memory_and_stay_close_to_f32():
    ours, ref = _params(), _params()
    opt = fusedopt.FusedAdamW(ours, lr=1e-2, state_dtype=torch.bfloat16)
    topt = torch.optim.AdamW(ref, lr=1e-2, foreach=False)
    for step in range(10):
        grads = _grads(ours, step)
        _set_grads(ours, grads)
        _set_grads(ref, grads)
        opt.step()
        topt.step()
    st = opt.state[ours[2]]
    assert st["exp_avg"].dtype == st["exp_avg_sq"].dtype == torch.bfloat16
    assert st["exp_avg"].element_size() * 2 == 4  # 4 bytes per param instead of 8
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-3)  # lr 1e-2 per step, moments to 3 digits
    # The state_dict round trip keeps the bf16 states (torch casts them to the param dtype on load).
    opt2 = fusedopt.FusedAdamW([torch.nn.Parameter(p.detach().clone()) for p in ours], lr=1e-2,
                               state_dtype=torch.bfloat16)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # step tensors are shared otherwise
    grads = _grads(ours, 99)
    _set_grads(ours, grads)
    _set_grads(opt2.param_groups[0]["params"], grads)
    opt.step()
    opt2.step()
    for a, b in zip(ours, opt2.param_groups[0]["params"]):
        assert torch.equal(a, b)


def test_stochastic_rounding_is_reproducible_and_keyed_on_the_seed():
    def run(seed, stochastic=True, threads=1):
        torch.set_num_threads(threads)
        try:
            ps = _params(torch.bfloat16)
            opt = fusedopt.FusedAdamW(ps, lr=1e-3, stochastic_rounding=stochastic, seed=seed)
            for step in range(3):
                _set_grads(ps, _grads(ps, step))
                opt.step()
            assert opt.state[ps[2]]["exp_avg"].dtype == torch.bfloat16
            return [p.detach().clone() for p in ps] + [opt.state[ps[2]]["exp_avg"].clone()]
        finally:
            torch.set_num_threads(1)

    a = run(1)
    assert all(torch.equal(x, y) for x, y in zip(a, run(1, threads=2)))
    assert not torch.equal(a[2], run(2)[2])  # another seed, other rounding
    assert not torch.equal(a[2], run(1, stochastic=False)[2])  # not round-to-nearest
    with pytest.raises(ValueError, match="seed"):
        fusedopt.FusedAdamW(_params(), stochastic_rounding=True, seed=-1)


_SUB_ULP = {"adam": lambda ps: fusedopt.FusedAdam(ps, lr=1e-4, stochastic_rounding=True, seed=3),
            "sgd": lambda ps: fusedopt.FusedSGD(ps, lr=1.0, stochastic_rounding=True, seed=3),
            "sgd_momentum": lambda ps: fusedopt.FusedSGD(ps, lr=1.0, momentum=0.5, dampening=0.5,
                                                         stochastic_rounding=True, seed=3),
            "lion": lambda ps: fusedopt.FusedLion(ps, lr=1e-4, stochastic_rounding=True, seed=3)}


@pytest.mark.parametrize("name", list(_SUB_ULP))
def test_stochastic_rounding_follows_sub_ulp_updates_of_every_element(name):
    """Pure bf16 params at 1.0 (ulp 2^-7), each step moving them by 1e-4 (sgd: lr 1 times gradient 1e-4, or a
    momentum buffer that stays at the gradient; adam and lion: lr 1e-4 times a unit sign): over 200 steps
    stochastic rounding must move almost every element, with a mean near the exact -0.02, which it does only when
    the noise changes every step. SGD and Lion keep no state['step']: their noise is keyed by
    state['rounding_step'] (docs/numerics.md); keyed by SGD's fresh-buffer flag it repeated, and 2.5 % of the
    elements took every step and the rest none."""
    p = torch.nn.Parameter(torch.ones(4096, dtype=torch.bfloat16))
    opt = _SUB_ULP[name]([p])
    for _ in range(200):
        p.grad = torch.full_like(p, 1e-4)
        opt.step()
    change = p.float() - 1.0
    assert (change != 0).float().mean() > 0.9
    assert abs(change.mean().item() + 0.02) < 0.002
    if name != "adam":
        assert opt.state[p]["rounding_step"].item() == 200


@pytest.mark.parametrize("name", ["sgd", "sgd_momentum", "lion"])
def test_rounding_step_survives_a_state_dict_round_trip(name):
    """A run resumed from a state_dict (through torch.save, whose load_state_dict casts floating states to a
    bf16 param's dtype, which would round a count of 300 or more) ends with the bits of the uninterrupted run."""
    def grads(k):
        return torch.full((1024,), 1e-4 * (1 + k % 3), dtype=torch.bfloat16)

    def run(resume_at=None):
        p = torch.nn.Parameter(torch.linspace(0.5, 1.5, 1024, dtype=torch.bfloat16))
        opt = _SUB_ULP[name]([p])
        for k in range(600):
            if k == resume_at:
                buffer = io.BytesIO()
                torch.save(opt.state_dict(), buffer)
                q = torch.nn.Parameter(p.detach().clone())
                opt = _SUB_ULP[name]([q])
                buffer.seek(0)
                opt.load_state_dict(torch.load(buffer))
                p = q
            p.grad = grads(k)
            opt.step()
        return p.detach(), opt.state[p]["rounding_step"]

    whole, count = run()
    resumed, resumed_count = run(resume_at=513)
    assert count.dtype == resumed_count.dtype == torch.float32 and resumed_count.item() == 600
    assert torch.equal(whole, resumed)
