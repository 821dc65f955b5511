"""torch.optim.Optimizer API of the fused optimizers, checked against torch.optim: step(closure),
params without grads, per-param steps, add_param_group, zero_grad and state_dict exchange."""

from __future__ import annotations

import copy
import io

import pytest
from algorithm_cases import PARITY
from conftest import (
    BASE_KW,
    FUSED,
    NAMES,
    SQRT_FREE,
    TORCH,
    assert_bitwise,
    clone_params,
    compare_opts,
    groups_of,
    has_grad,
    make_params,
    run,
    run_isolated,
    set_grads,
)

import torch


def _pair(name, seed=0, **extra):
    p_ref = make_params(seed)
    p_fus = clone_params(p_ref)
    ref = TORCH[name](groups_of(p_ref, name), foreach=False, **BASE_KW[name])
    fus = FUSED[name](groups_of(p_fus, name), **BASE_KW[name], **extra)
    return p_ref, p_fus, ref, fus


def _bitwise(name):
    return name in SQRT_FREE


@pytest.mark.parametrize("name", NAMES)
def test_isinstance_and_python_step(name):
    opt = FUSED[name]([torch.nn.Parameter(torch.zeros(3))])
    assert isinstance(opt, TORCH[name]) and isinstance(opt, torch.optim.Optimizer)
    assert opt.defaults == TORCH[name]([torch.nn.Parameter(torch.zeros(3))]).defaults


@pytest.mark.parametrize("name", NAMES)
def test_step_closure_returns_loss(name):
    torch.manual_seed(1)
    x, y = torch.randn(16, 5), torch.randn(16, 3)
    models = [torch.nn.Linear(5, 3) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [TORCH[name](models[0].parameters(), foreach=False, **BASE_KW[name]),
            FUSED[name](models[1].parameters(), **BASE_KW[name])]
    calls = [0, 0]
    for it in range(5):
        losses = []
        for k, (m, o) in enumerate(zip(models, opts)):
            def closure(m=m, o=o, k=k):
                calls[k] += 1
                o.zero_grad()
                loss = torch.nn.functional.mse_loss(m(x), y)
                loss.backward()
                return loss
            out = o.step(closure)
            assert isinstance(out, torch.Tensor) and out.requires_grad  # closure ran under enable_grad
            losses.append(out.item())
        assert losses[0] == losses[1], f"step {it}: loss {losses[1]} != torch's {losses[0]}"
    assert calls == [5, 5]
    for a, r in zip(models[1].parameters(), models[0].parameters()):
        if _bitwise(name):
            assert_bitwise(a.detach(), r.detach(), name)
        else:
            torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6)
    assert opts[1].step() is None  # no closure: returns None like torch


@pytest.mark.parametrize("name", NAMES)
def test_params_without_grad_are_skipped(name):
    """A param whose grad is None: no state (but for torch's eager init state), no step count,
    not touched, also while its neighbours in the same group step; per-param step counts = torch's."""
    p_ref = make_params(0)
    p_fus = clone_params(p_ref)
    never_ref = torch.nn.Parameter(torch.randn(9))
    never = torch.nn.Parameter(never_ref.detach().clone())
    g_ref, g_fus = groups_of(p_ref, name), groups_of(p_fus, name)
    g_ref[1]["params"].append(never_ref)  # never gets a grad (not in the list set_grads sees)
    g_fus[1]["params"].append(never)
    ref = TORCH[name](g_ref, foreach=False, **BASE_KW[name])
    fus = FUSED[name](g_fus, **BASE_KW[name])
    before = never.detach().clone()
    for t in range(15):
        set_grads(p_ref, t)
        set_grads(p_fus, t)
        if t == 3:  # one step where no param of group 0 has a grad
            for ps in (p_ref, p_fus):
                ps[0].grad = None
                ps[1].grad = None
        ref.step()
        fus.step()
        if t == 4:
            # param 4 gets its first grad only at step 10: no state exists for it yet
            assert dict(fus.state.get(p_fus[4], {})).keys() == dict(ref.state.get(p_ref[4], {})).keys()
            if not PARITY[name].eager_state:
                assert len(fus.state.get(p_fus[4], {})) == 0
    assert_bitwise(never.detach(), before, "never-stepped param")
    assert never.grad is None
    if PARITY[name].eager_state:
        assert float(fus.state[never]["step"]) == 0.0
    else:
        assert len(fus.state.get(never, {})) == 0
    compare_opts(fus, ref, name, bitwise=_bitwise(name))
    if PARITY[name].counts_steps:
        steps = [float(fus.state[p]["step"]) for p in p_fus]
        assert steps == [float(ref.state[p]["step"]) for p in p_ref]
        assert len(set(steps)) > 1  # the params really have different counts


@pytest.mark.parametrize("name", NAMES)
def test_add_param_group_mid_training(name):
    p_ref, p_fus, ref, fus = _pair(name)
    run(ref, p_ref, 10)
    run(fus, p_fus, 10)
    extra_ref = [torch.nn.Parameter(torch.randn(50, 3)), torch.nn.Parameter(torch.randn(1))]
    extra_fus = clone_params(extra_ref)
    hyper = PARITY[name].added_group
    ref.add_param_group({"params": extra_ref, **hyper})
    fus.add_param_group({"params": extra_fus, **hyper})
    assert fus.param_groups[-1].keys() == ref.param_groups[-1].keys()
    all_ref, all_fus = p_ref + extra_ref, p_fus + extra_fus
    run(ref, all_ref, 10, start=10)
    run(fus, all_fus, 10, start=10)
    compare_opts(fus, ref, name, bitwise=_bitwise(name))


@pytest.mark.parametrize("name", NAMES)
def test_zero_grad(name):
    p_ref, p_fus, ref, fus = _pair(name)
    run(ref, p_ref, 3)
    run(fus, p_fus, 3)
    set_grads(p_ref, 3)
    set_grads(p_fus, 3)
    ptrs = [p.grad.data_ptr() if p.grad is not None else None for p in p_fus]
    fus.zero_grad(set_to_none=False)
    ref.zero_grad(set_to_none=False)
    for p, q, ptr in zip(p_fus, p_ref, ptrs):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            assert p.grad.data_ptr() == ptr, "zero_grad(set_to_none=False) zeroes in place"
            assert not p.grad.requires_grad and p.grad.grad_fn is None
            assert_bitwise(p.grad, q.grad, "zeroed grad")
            assert not p.grad.any()
    ref.step()
    fus.step()  # a step on zero grads still moves momentum / Adam params
    compare_opts(fus, ref, name, bitwise=_bitwise(name))
    fus.zero_grad()  # torch 2.x default: set_to_none=True
    assert all(p.grad is None for p in p_fus)
    set_grads(p_fus, 4)
    fus.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in p_fus)
    snap = [p.detach().clone() for p in p_fus]
    fus.step()  # nothing has a grad: nothing moves
    for a, b in zip(p_fus, snap):
        assert_bitwise(a.detach(), b, "step without grads")


# ---- state_dict exchange with torch -----------------------------------------------------------

VARIANTS = [dict(foreach=False), dict(foreach=True), dict(fused=True)]
VARIANT_IDS = ["forloop", "foreach", "fused"]


def _variant_cases():
    for name in NAMES:
        for v, vid in zip(VARIANTS, VARIANT_IDS):
            if "fused" in v and not PARITY[name].torch_has_fused:
                continue  # (torch 2.13 has no fused implementation of it)
            yield pytest.param(name, v, id=f"{name}-{vid}")


def _torch_variant(name, params, variant):
    return TORCH[name](groups_of(params, name), **BASE_KW[name], **variant)


def _variant_skip(name, variant):
    """Which params get grads: some of torch's fused steps cannot step a group where some params already
    have state and others not yet (a momentum buffer: "expected Tensor as element 1 in argument 2, but
    got NoneType", torch 2.13), so with them every param gets a grad on every step."""
    if PARITY[name].torch_fused_needs_every_grad and variant.get("fused"):
        return lambda t, i: True
    return has_grad


def _variant_rtol(variant):
    # torch's foreach and fused paths round a few ops differently from its for-loop (and so from
    # fusedopt); over 10 steps that stays within 1e-5 relative
    return 1e-5 if not variant.get("foreach") and not variant.get("fused") else 2e-5


@pytest.mark.parametrize("name,variant", list(_variant_cases()))
def test_state_dict_torch_to_fused_mid_training(name, variant):
    p_t = make_params(0)
    tor = _torch_variant(name, p_t, variant)
    skip = _variant_skip(name, variant)
    run(tor, p_t, 10, skip=skip)
    p_f = clone_params(p_t)
    fus = FUSED[name](groups_of(p_f, name), **BASE_KW[name])
    sd = copy.deepcopy(tor.state_dict())  # as if saved to disk (load_state_dict may alias tensors)
    fus.load_state_dict(sd)
    compare_opts(fus, tor, "after load", bitwise=True)
    run(tor, p_t, 10, start=10, skip=skip)
    run(fus, p_f, 10, start=10, skip=skip)
    compare_opts(fus, tor, f"{name}{variant}", rtol=_variant_rtol(variant),
                 bitwise=_bitwise(name) and not variant.get("fused") and not variant.get("foreach"))
    assert fus.param_groups[0]["lr"] == sd["param_groups"][0]["lr"]


@pytest.mark.parametrize("name,variant", list(_variant_cases()))
def test_state_dict_fused_to_torch_mid_training(name, variant):
    p_f = make_params(0)
    # the fused optimizer accepts (and ignores) torch's foreach/fused flags; they travel in the
    # state_dict and decide which torch path continues after loading
    fus = FUSED[name](groups_of(p_f, name), **BASE_KW[name], **variant)
    skip = _variant_skip(name, variant)
    run(fus, p_f, 10, skip=skip)
    p_t = clone_params(p_f)
    tor = _torch_variant(name, p_t, variant)
    buf = io.BytesIO()
    torch.save(fus.state_dict(), buf)  # through a file, as users do
    buf.seek(0)
    sd = torch.load(buf)
    # the fused state_dict has torch's format: same keys, dtypes and shapes as torch's own
    p_r = clone_params(make_params(0))
    ref = _torch_variant(name, p_r, variant)
    run(ref, p_r, 10, skip=skip)
    rsd = ref.state_dict()
    assert sd["state"].keys() == rsd["state"].keys()
    for k in rsd["state"]:
        assert sd["state"][k].keys() == rsd["state"][k].keys()
        for key, v in rsd["state"][k].items():
            if isinstance(v, torch.Tensor) and key != "step":
                assert sd["state"][k][key].dtype == v.dtype and sd["state"][k][key].shape == v.shape
    for g, rg in zip(sd["param_groups"], rsd["param_groups"]):
        assert set(g) - set(rg) <= set(), f"extra group keys {set(g) - set(rg)}"
    tor.load_state_dict(sd)
    run(tor, p_t, 10, start=10, skip=skip)
    run(fus, p_f, 10, start=10, skip=skip)
    compare_opts(fus, tor, f"{name}{variant}", rtol=_variant_rtol(variant),
                 bitwise=_bitwise(name) and not variant.get("fused") and not variant.get("foreach"))


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_before_first_step(name):
    p_t = make_params(0)
    tor = TORCH[name](groups_of(p_t, name), foreach=False, **BASE_KW[name])
    p_f = clone_params(p_t)
    fus = FUSED[name](groups_of(p_f, name), **BASE_KW[name])
    fus.load_state_dict(copy.deepcopy(tor.state_dict()))  # empty state (Adagrad: its eager state)
    p_t2 = clone_params(p_t)
    tor2 = TORCH[name](groups_of(p_t2, name), foreach=False, **BASE_KW[name])
    tor2.load_state_dict(FUSED[name](groups_of(clone_params(p_t), name), **BASE_KW[name]).state_dict())
    run(tor, p_t, 10)
    run(fus, p_f, 10)
    run(tor2, p_t2, 10)
    compare_opts(fus, tor, name, bitwise=_bitwise(name))
    compare_opts(tor2, tor, name, bitwise=True)


@pytest.mark.parametrize("name", NAMES)
def test_load_state_dict_after_first_step(name):
    """A fused optimizer that has already stepped (its own states exist) loads torch's state from
    another run: the loaded state replaces its own everywhere (no stale buffer is used)."""
    p_t = make_params(0)
    tor = TORCH[name](groups_of(p_t, name), foreach=False, **BASE_KW[name])
    run(tor, p_t, 10)
    p_f = make_params(1)  # different params and history
    fus = FUSED[name](groups_of(p_f, name), **BASE_KW[name])
    run(fus, p_f, 3, seed=77)
    with torch.no_grad():
        for a, b in zip(p_f, p_t):
            a.copy_(b)
    fus.load_state_dict(copy.deepcopy(tor.state_dict()))
    run(tor, p_t, 10, start=10)
    run(fus, p_f, 10, start=10)
    compare_opts(fus, tor, name, bitwise=_bitwise(name))


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_lr_changes_are_loaded(name):
    """The saved hyper-parameters replace the live ones (torch's rule) and the next step uses them."""
    p_t = make_params(0)
    tor = TORCH[name](groups_of(p_t, name), foreach=False, **BASE_KW[name])
    run(tor, p_t, 5)
    tor.param_groups[1]["lr"] *= 3
    p_f = clone_params(p_t)
    fus = FUSED[name](groups_of(p_f, name), **BASE_KW[name])
    fus.load_state_dict(copy.deepcopy(tor.state_dict()))
    assert fus.param_groups[1]["lr"] == tor.param_groups[1]["lr"]
    run(tor, p_t, 5, start=5)
    run(fus, p_f, 5, start=5)
    compare_opts(fus, tor, name, bitwise=_bitwise(name))


STATE_KEY = {name: case.state_key for name, case in PARITY.items()}


def test_state_tensor_storage_replaced_through_data():
    """User code may swap a state tensor's storage while keeping the tensor object
    (`state[k].data = new`, as optimizer-state offloading code does); torch then uses the new
    values. The fused step must read the state's address afresh too: a stale address means writes
    into freed memory, which can abort the interpreter, so the scenario runs in a subprocess (all
    five optimizers in one, to pay for one interpreter start)."""
    code = """
import torch
from conftest import *
from test_api import _pair, STATE_KEY, _bitwise
torch.set_num_threads(1)
for name in NAMES:
    p_t, p_f, tor, fus = _pair(name)
    run(tor, p_t, 5)
    run(fus, p_f, 5)
    key = STATE_KEY[name]
    for o, ps in ((tor, p_t), (fus, p_f)):
        st = o.state[ps[2]]
        st[key].data = torch.full_like(st[key], 0.5)
    run(tor, p_t, 5, start=5)
    run(fus, p_f, 5, start=5)
    try:
        # rtol 1e-4: a reset second-moment state makes a 1/sqrt amplify torch's 1-ulp sqrt errors
        compare_opts(fus, tor, name, bitwise=_bitwise(name), rtol=1e-4)
        print(name, "PASS", flush=True)
    except AssertionError as e:
        print(name, "FAIL", str(e)[:300], flush=True)
"""
    proc = run_isolated(code)
    passed = [line.split()[0] for line in proc.stdout.splitlines() if " PASS" in line]
    assert proc.returncode == 0 and passed == NAMES, (
        f"exit code {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
