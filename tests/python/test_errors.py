"""Errors: torch's types and texts where torch has them, clear fusedopt errors where fusedopt is
narrower than torch, and a rejected step leaves params and states bit-identical."""

from __future__ import annotations

import re

import pytest
from algorithm_cases import PARITY
from conftest import (
    BASE_KW,
    FUSED,
    NAMES,
    SQRT_FREE,
    TORCH,
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


def _raises_like_torch(fn_torch, fn_fused):
    """Both raise, with the same exception type and message (torch's is the reference)."""
    with pytest.raises(Exception) as et:
        fn_torch()
    with pytest.raises(type(et.value), match="^" + re.escape(str(et.value)) + "$"):
        fn_fused()


# ---- sparse grads -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [name for name, case in PARITY.items() if case.sparse_grad_is_torchs_error])
def test_sparse_grad_error_is_torchs(name):
    def make():
        ps = make_params(0)
        opt_kw = BASE_KW[name]
        return ps, opt_kw

    ps_t, kw = make()
    ps_f = clone_params(ps_t)
    tor = TORCH[name](groups_of(ps_t, name), foreach=False, **kw)
    fus = FUSED[name](groups_of(ps_f, name), **kw)
    for ps in (ps_t, ps_f):
        set_grads(ps, 0, skip=lambda t, i: True)
        ps[3].grad = ps[3].grad.to_sparse()
    snap = snapshot(fus)
    with pytest.raises(RuntimeError) as et:
        tor.step()
    # torch's error, with the param named (issue #29 item 11)
    with pytest.raises(RuntimeError, match="^" + re.escape(f"parameter 1 of group 1: {et.value}") + "$"):
        fus.step()
    assert_unchanged(fus, snap, "after the sparse-grad error")


@pytest.mark.parametrize("name", [name for name, case in PARITY.items() if case.sparse_grad_options is not None])
def test_sparse_grad_with_strict_is_a_runtime_error(name):
    """The torch.optim classes that accept sparse grads (test_fallback.py: so do the fused ones, through
    torch's step); with strict=True the fused ones reject them (RuntimeError) without touching
    anything."""
    ps = make_params(0)
    fus = FUSED[name](groups_of(ps, name), strict=True, **BASE_KW[name])
    run(fus, ps, 2, skip=lambda t, i: t > 0 or i != 4)  # param 4 has no state yet...
    set_grads(ps, 2, skip=lambda t, i: True)  # ...and gets its first grad in the failing step
    ps[3].grad = ps[3].grad.to_sparse()
    snap = snapshot(fus)
    with pytest.raises(RuntimeError, match="sparse"):
        fus.step()
    assert_unchanged(fus, snap, "after the sparse-grad error")


# ---- unsupported params -------------------------------------------------------------------------

BAD_DTYPES = [torch.complex128, torch.float64, torch.int32]


def _bad_param(dtype):
    if dtype.is_floating_point or dtype.is_complex:
        return torch.nn.Parameter(torch.zeros(3, dtype=dtype))
    return torch.zeros(3, dtype=dtype)  # a leaf int tensor: torch.optim takes it


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_unsupported_dtype_with_strict_is_a_type_error_naming_the_param(name, dtype):
    good = torch.nn.Parameter(torch.zeros(2))
    TORCH[name]([good, _bad_param(dtype)])  # torch.optim accepts it, and so does the fused one
    FUSED[name]([good, _bad_param(dtype)])  # (test_fallback.py: it takes torch's step)
    with pytest.raises(TypeError, match=r"parameter 1 of group 0.*" + re.escape(str(dtype)) + ".*strict=True"):
        FUSED[name]([good, _bad_param(dtype)], strict=True)
    # with named params the message carries the name
    with pytest.raises(TypeError, match=r"'decoder\.weight'"):
        FUSED[name]([("encoder.weight", good), ("decoder.weight", _bad_param(dtype))], strict=True)
    # in a group added later, too
    opt = FUSED[name]([good], strict=True)
    with pytest.raises(TypeError, match=r"parameter 0 of group 1"):
        opt.add_param_group({"params": [_bad_param(dtype)]})


@pytest.mark.parametrize("name", NAMES)
def test_non_dense_param_with_strict_is_a_value_error(name):
    base = torch.randn(4, 6)
    p = torch.nn.Parameter(base[:, ::2])  # every other column: not one dense block
    assert not p.is_contiguous()
    TORCH[name]([p])  # torch accepts it (and the fused one without strict: test_fallback.py)
    with pytest.raises(ValueError, match=r"parameter 0 of group 0 cannot be updated.*not dense"):
        FUSED[name]([torch.nn.Parameter(base[:, ::2])], strict=True)
    # a dense but permuted param (e.g. channels_last) is fine, and steps like torch
    q_t = torch.nn.Parameter(torch.randn(3, 5).t())
    q_f = torch.nn.Parameter(q_t.detach().clone().t().contiguous().t())
    assert q_f.stride() == q_t.stride()
    tor = TORCH[name]([q_t], foreach=False, **BASE_KW[name])
    fus = FUSED[name]([q_f], **BASE_KW[name])
    for t in range(3):
        g = torch.randn(5, 3, generator=torch.Generator().manual_seed(t))
        # grads laid out like their param, as autograd makes them
        q_t.grad = torch.empty_strided(q_t.shape, q_t.stride()).copy_(g)
        q_f.grad = torch.empty_strided(q_f.shape, q_f.stride()).copy_(g)
        tor.step()
        fus.step()
    compare_opts(fus, tor, f"{name} transposed param", bitwise=(name in SQRT_FREE))


# ---- constructor arguments ----------------------------------------------------------------------

BAD_ARGS = {name: case.bad_constructor_args for name, case in PARITY.items()}
ARG_CASES = [(n, kw) for n in NAMES for kw in BAD_ARGS[n]]


@pytest.mark.parametrize("name,kw", ARG_CASES, ids=[f"{n}-{'-'.join(kw)}-{i}" for i, (n, kw) in enumerate(ARG_CASES)])
def test_invalid_constructor_args_like_torch(name, kw):
    _raises_like_torch(lambda: TORCH[name]([torch.nn.Parameter(torch.zeros(2))], **kw),
                       lambda: FUSED[name]([torch.nn.Parameter(torch.zeros(2))], **kw))


@pytest.mark.parametrize("name", NAMES)
def test_invalid_params_argument_like_torch(name):
    p = torch.nn.Parameter(torch.zeros(2))
    for arg in (p, [], [p * 2], [1.0], [{"params": [p]}, {"params": [p]}]):
        _raises_like_torch(lambda arg=arg: TORCH[name](arg), lambda arg=arg: FUSED[name](arg))
    opt_t, opt_f = TORCH[name]([p]), FUSED[name]([torch.nn.Parameter(torch.zeros(2))])
    _raises_like_torch(lambda: opt_t.add_param_group({"params": {torch.nn.Parameter(torch.zeros(1))}}),
                       lambda: opt_f.add_param_group({"params": {torch.nn.Parameter(torch.zeros(1))}}))


@pytest.mark.parametrize("name", NAMES)
def test_differentiable_with_strict_is_a_runtime_error(name):
    TORCH[name]([torch.nn.Parameter(torch.zeros(2))], differentiable=True)  # torch supports it
    FUSED[name]([torch.nn.Parameter(torch.zeros(2))], differentiable=True)  # so do we (test_fallback.py)
    with pytest.raises(RuntimeError, match="differentiable"):
        FUSED[name]([torch.nn.Parameter(torch.zeros(2))], differentiable=True, strict=True)
    FUSED[name]([torch.nn.Parameter(torch.zeros(2))], differentiable=False)  # accepted and kept
    assert FUSED[name]([torch.nn.Parameter(torch.zeros(2))]).defaults["differentiable"] is False


# ---- a rejected step changes nothing ------------------------------------------------------------

BAD_HYPERS = {name: case.bad_group_edits for name, case in PARITY.items()}
HYPER_CASES = [(n, k, v) for n in NAMES for k, v in BAD_HYPERS[n]]


def _mid_training(name):
    """A fused optimizer and its torch twin after 10 steps (param 4's first grad comes at step 10, so
    the failing step would create its state)."""
    p_t = make_params(0)
    p_f = clone_params(p_t)
    tor = TORCH[name](groups_of(p_t, name), foreach=False, **BASE_KW[name])
    fus = FUSED[name](groups_of(p_f, name), **BASE_KW[name])
    run(tor, p_t, 10)
    run(fus, p_f, 10)
    return p_t, p_f, tor, fus


def _continue_and_compare(name, p_t, p_f, tor, fus):
    run(tor, p_t, 5, start=10)
    run(fus, p_f, 5, start=10)
    compare_opts(fus, tor, f"{name} after a rejected step", bitwise=(name in SQRT_FREE))


@pytest.mark.parametrize("name,key,value", HYPER_CASES, ids=[f"{n}-{k}={v}" for n, k, v in HYPER_CASES])
def test_invalid_hyper_parameter_mid_training_changes_nothing(name, key, value):
    p_t, p_f, tor, fus = _mid_training(name)
    set_grads(p_f, 10)
    snap = snapshot(fus)
    group = fus.param_groups[2]  # the last group: the engine already saw the valid groups 0 and 1
    old = group[key]
    group[key] = value
    with pytest.raises(ValueError, match=key.rstrip("s") if key != "betas" else "beta"):
        fus.step()
    assert_unchanged(fus, snap, f"rejected step ({key}={value})")
    group[key] = old
    _continue_and_compare(name, p_t, p_f, tor, fus)


@pytest.mark.parametrize("name", NAMES)
def test_grad_with_wrong_number_of_elements_changes_nothing(name):
    p_t, p_f, tor, fus = _mid_training(name)
    set_grads(p_f, 10)
    p_f[3].grad.data = torch.randn(5)  # .data bypasses the shape check of `p.grad = ...`
    snap = snapshot(fus)
    with pytest.raises((ValueError, RuntimeError), match=r"\(5,\)"):
        fus.step()
    assert_unchanged(fus, snap, "rejected step (wrong grad numel)")
    _continue_and_compare(name, p_t, p_f, tor, fus)


@pytest.mark.parametrize("name", NAMES)
def test_grad_with_wrong_shape_same_numel_is_rejected(name):
    """A (17, 33) grad for a (33, 17) param: torch's step raises (the ops do not broadcast), so must
    the fused one, instead of reading the grad as if it had the param's shape."""
    p_t, p_f, tor, fus = _mid_training(name)
    set_grads(p_f, 10)
    set_grads(p_t, 10)
    for ps in (p_t, p_f):
        ps[3].grad.data = ps[3].grad.detach().t().contiguous()
    with pytest.raises(RuntimeError):
        tor.step()
    snap = snapshot(fus)
    with pytest.raises((ValueError, RuntimeError)):
        fus.step()
    assert_unchanged(fus, snap, "rejected step (transposed grad)")


@pytest.mark.parametrize("name", NAMES)
def test_non_dense_grad_changes_nothing(name):
    p_t, p_f, tor, fus = _mid_training(name)
    set_grads(p_f, 10)
    g = torch.randn(33, 34)[:, ::2]  # right shape, not dense
    p_f[3].grad = g
    with pytest.warns(UserWarning, match="strides"):  # torch's step takes that param (test_fallback.py)
        fus.step()
    p_t2, _, tor2, _ = _mid_training(name)
    set_grads(p_t2, 10)
    p_t2[3].grad = g
    tor2.step()
    compare_opts(fus, tor2, f"{name} non-dense grad", bitwise=(name in SQRT_FREE))
    strict = FUSED[name](groups_of(clone_params(p_f), name), strict=True, **BASE_KW[name])
    set_grads([p for grp in strict.param_groups for p in grp["params"]], 10)
    strict.param_groups[1]["params"][1].grad = g
    snap = snapshot(strict)
    with pytest.raises(ValueError, match="strides"):
        strict.step()
    assert_unchanged(strict, snap, "rejected step (non-dense grad, strict=True)")
