"""AMP: fusedopt.GradScaler and torch.amp.GradScaler("cpu") driving the fused optimizers, against
torch.amp.GradScaler("cpu") + torch.optim on the same scripted sequence (injected inf/nan grads in
fp32 and bf16 params, back-off, growth)."""

from __future__ import annotations

import math

import fusedopt
import pytest
from conftest import (
    BASE_KW,
    FUSED,
    NAMES,
    TORCH,
    ULP_BOUND,
    assert_bitwise,
    assert_unchanged,
    clone_params,
    groups_of,
    has_grad,
    make_params,
    set_grads,
    snapshot,
    ulp_err,
)

import torch

INIT_SCALE = 2.0 ** 10
GROWTH_INTERVAL = 3

# params: five fp32 (sizes of conftest.SIZES) and two bf16 (300 elements and 1 element), the bf16
# ones in group 2 together with the last fp32 param
SIZES32 = [(1,), (7,), (40000,), (33, 17), (4, 3, 5)]
BF16_SIZES = [(300,), (1,)]

# step -> (param index, flat element index, value); params 5 and 6 are bf16
INJECT = {2: (2, 33000, math.inf), 3: (5, 7, math.nan), 7: (0, 0, -math.inf), 11: (6, 0, math.nan),
          12: (2, 5, math.inf), 16: (3, 100, math.nan)}
STEPS = 20
# scale after each update(): back-off by 0.5 on an overflow, x2 after 3 clean steps in a row
EXPECTED_SCALE = [1024, 1024, 512, 256, 256, 256, 512, 256, 256, 256, 512, 256, 128, 128, 128, 256, 128,
                  128, 128, 256]


def _params(seed=0):
    ps = make_params(seed, sizes=SIZES32)
    ps += make_params(seed + 1, torch.bfloat16, sizes=BF16_SIZES)
    return ps


def _skip(t, i):
    return has_grad(t, i) if i < 5 else True


def _scaler(kind):
    cls = fusedopt.GradScaler if kind == "fusedopt" else torch.amp.GradScaler
    return cls("cpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)


def _scaled_grads(params, t, scaler):
    """The quadratic's grads times the (power-of-two) scale, exact in fp32 and bf16, plus the
    injected non-finite element of this step."""
    set_grads(params, t, skip=_skip)
    for p in params:
        if p.grad is not None:
            p.grad = scaler.scale(p.grad.float()).to(p.dtype)
    if t in INJECT:
        i, k, v = INJECT[t]
        assert params[i].grad is not None
        params[i].grad.view(-1)[k] = v


def _compare_params(a_list, r_list, what):
    """fp32: bit for bit (torch runs with an IEEE sqrt, see conftest.ieee_sqrt); bf16: within the
    ulp bound of test_parity.py (fused rounds once per step, torch after each op)."""
    for j, (a, r) in enumerate(zip(a_list, r_list)):
        if a.dtype == torch.bfloat16:
            assert ulp_err(a, r).max().item() <= ULP_BOUND[torch.bfloat16], f"{what} param {j}"
        else:
            assert_bitwise(a.detach(), r.detach(), f"{what} param {j}")


@pytest.mark.parametrize("kind", ["fusedopt", "torch"], ids=["fusedopt.GradScaler", "torch.amp.GradScaler"])
@pytest.mark.parametrize("name", NAMES)
def test_scaler_skips_backs_off_and_grows_like_torch(name, kind, ieee_sqrt):
    p_ref = _params()
    p_fus = clone_params(p_ref)
    ref = TORCH[name](groups_of(p_ref, name), foreach=False, **BASE_KW[name])
    fus = FUSED[name](groups_of(p_fus, name), **BASE_KW[name])
    s_ref = _scaler("torch")
    s_fus = _scaler(kind)
    scales_ref, scales_fus = [], []
    for t in range(STEPS):
        _scaled_grads(p_ref, t, s_ref)
        _scaled_grads(p_fus, t, s_fus)
        snap = snapshot(fus)
        s_ref.step(ref)
        s_fus.step(fus)
        s_ref.update()
        s_fus.update()
        scales_ref.append(s_ref.get_scale())
        scales_fus.append(s_fus.get_scale())
        if t in INJECT:
            # skipped: params and every state tensor bit-identical, no new state, no step count
            assert_unchanged(fus, snap, f"{name} step {t} (overflow)")
        else:
            assert any(not torch.equal(a, b) for a, b in zip(p_fus, snap[0])), f"step {t} was not taken"
        _compare_params(p_fus, p_ref, f"{name} step {t}")
    assert scales_ref == EXPECTED_SCALE
    assert scales_fus == scales_ref
    assert s_fus.state_dict() == s_ref.state_dict()
    for a, r in zip(p_fus, p_ref):  # per-param step counts: skipped steps do not count
        if name != "SGD":
            assert float(fus.state[a]["step"]) == float(ref.state[r]["step"])
    # states, with the same tolerances as the params
    for j, (a, r) in enumerate(zip(p_fus, p_ref)):
        for k, v in ref.state[r].items():
            if k == "step":
                continue
            if v.dtype == torch.bfloat16:
                # 16-bit running buffers drift apart by a few % (torch rounds twice per step);
                # what matters here is that no inf/nan of a skipped step got into them
                assert fus.state[a][k].dtype == v.dtype and bool(fus.state[a][k].isfinite().all())
            else:
                assert_bitwise(fus.state[a][k], v, f"param {j} state {k}")


@pytest.mark.parametrize("kind", ["fusedopt", "torch"], ids=["fusedopt.GradScaler", "torch.amp.GradScaler"])
@pytest.mark.parametrize("name", ["SGD", "AdamW", "RMSprop", "Adadelta", "NAdam"])
def test_unscale_clip_step_matches_torch(name, kind, ieee_sqrt):
    """scaler.unscale_(opt) -> clip_grad_norm_ -> scaler.step(opt) -> update, with one overflow."""
    p_ref = make_params(0)
    p_fus = clone_params(p_ref)
    ref = TORCH[name](groups_of(p_ref, name), foreach=False, **BASE_KW[name])
    fus = FUSED[name](groups_of(p_fus, name), **BASE_KW[name])
    s_ref, s_fus = _scaler("torch"), _scaler(kind)
    for t in range(8):
        norms = []
        for ps, o, s in ((p_ref, ref, s_ref), (p_fus, fus, s_fus)):
            set_grads(ps, t)
            for p in ps:
                if p.grad is not None:
                    p.grad = s.scale(p.grad)
            if t == 4:
                ps[2].grad[123] = math.inf
            s.unscale_(o)
            norms.append(torch.nn.utils.clip_grad_norm_(ps, max_norm=5.0))
        for a, r in zip(p_fus, p_ref):  # unscaled (and clipped) grads are torch's, bit for bit
            assert (a.grad is None) == (r.grad is None)
            if a.grad is not None:
                assert_bitwise(a.grad, r.grad, f"step {t} grad")
        assert_bitwise(norms[1], norms[0], f"step {t} total norm")
        assert (t == 4) == (not math.isfinite(norms[0].item()))
        snap = snapshot(fus)
        s_ref.step(ref)
        s_fus.step(fus)
        if t == 4:
            assert_unchanged(fus, snap, "overflow step")
        s_ref.update()
        s_fus.update()
        assert s_fus.get_scale() == s_ref.get_scale()
        _compare_params(p_fus, p_ref, f"step {t}")
    assert norms[0].item() > 5.0, "the clipping really clipped"


def test_unscale_errors_like_torch():
    for kind in ("fusedopt", "torch"):
        p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float16))
        opt = fusedopt.FusedSGD([p], lr=0.1)
        s = _scaler(kind)
        s.scale(torch.ones(()))
        p.grad = torch.ones(4, dtype=torch.float16)
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
            s.unscale_(opt)
        q = torch.nn.Parameter(torch.zeros(4))
        opt = fusedopt.FusedSGD([q], lr=0.1)
        q.grad = torch.ones(4)
        s = _scaler(kind)
        s.scale(torch.ones(()))
        s.unscale_(opt)
        with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called on this optimizer"):
            s.unscale_(opt)
        with pytest.raises(RuntimeError, match="Closure use is not currently supported"):
            s.step(opt, closure=lambda: None)


@pytest.mark.xfail(strict=True, reason="fusedopt deviation: with a scaler, the fused step unscales grads "
                   "on the fly and leaves .grad scaled; every torch path (for-loop + unscale_, torch's "
                   "fused Adam) leaves the unscaled grads in .grad after scaler.step()")
@pytest.mark.parametrize("kind", ["fusedopt"])
def test_grads_are_unscaled_after_scaler_step_like_torch(kind):
    p_ref = make_params(0)
    p_fus = clone_params(p_ref)
    ref = torch.optim.Adam(p_ref, lr=1e-2, fused=True)  # torch's own fused optimizer writes back
    fus = fusedopt.FusedAdam(p_fus, lr=1e-2)
    s_ref, s_fus = _scaler("torch"), _scaler(kind)
    for ps, o, s in ((p_ref, ref, s_ref), (p_fus, fus, s_fus)):
        set_grads(ps, 0, skip=lambda t, i: True)
        for p in ps:
            p.grad = s.scale(p.grad)
        s.step(o)
        s.update()
    for a, r in zip(p_fus, p_ref):
        assert_bitwise(a.grad, r.grad, "grad after scaler.step")
