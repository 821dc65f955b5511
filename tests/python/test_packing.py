"""The bulk check that lets an unchanged step reuse the last step's segment table
(_pack_unchanged in python/fusedopt/_packing.py, its checks in C++: src/python_torch/unchanged_step.cc), and the
one call that also runs the step (_step_unchanged): every change user code can make between two steps must send
the step back to packing param by param, with the result torch.optim gets."""

import math

import fusedopt
import pytest
from conftest import NAMES, assert_unchanged, compare_opts, run, set_grads, snapshot
from fusedopt import _packing
from test_api import STATE_KEY, _bitwise, _pair

import torch


def _mutations(name):
    key = STATE_KEY[name]

    def replace_state_tensor(opt, ps):
        opt.state[ps[1]][key] = opt.state[ps[1]][key].clone().mul_(0.5)

    def replace_step_counter(opt, ps):
        opt.state[ps[2]]["step"] = opt.state[ps[2]]["step"].clone().add_(3)

    def drop_state(opt, ps):
        del opt.state[ps[3]]

    def move_param(opt, ps):
        ps[0].data = ps[0].data.clone()

    def swap_param(opt, ps):  # (as Module.to() does with swap_module_params_on_conversion)
        torch.utils.swap_tensors(ps[0], torch.nn.Parameter(ps[0].detach().mul(0.5)))

    def change_group(opt, ps):
        opt.param_groups[0]["lr"] *= 0.5
        opt.param_groups[0]["weight_decay"] = 0.25
        if name == "SGD":
            opt.param_groups[0]["momentum"] = 0.0  # a state slot less

    def drop_grad(opt, ps):
        ps[4].grad = None

    def regroup(opt, ps):  # the group lists edited in place: a param moves to another group
        opt.param_groups[0]["params"].append(opt.param_groups[1]["params"].pop(0))

    found = {"replace_state_tensor": replace_state_tensor, "drop_state": drop_state,
             "move_param": move_param, "swap_param": swap_param, "change_group": change_group, "drop_grad": drop_grad,
             "regroup": regroup}
    if name != "SGD":
        found["replace_step_counter"] = replace_step_counter
    return found


def _all_grads(params, t):
    set_grads(params, t, skip=lambda t, i: True)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mutation", ["replace_state_tensor", "replace_step_counter", "drop_state",
                                      "move_param", "swap_param", "change_group", "drop_grad", "regroup"])
@pytest.mark.parametrize("flatten", [False, True])
@pytest.mark.parametrize("dict_versions", [True, False], ids=["dict_versions", "lookups"])
def test_change_between_steps_is_noticed(name, mutation, flatten, dict_versions, monkeypatch):
    """Also with flatten=True, where each step's new p.grad (zero_grad sets them to None) is copied
    into its slot of the flat buffer; the state dicts checked by their versions (CPython <= 3.11) and by lookups."""
    if dict_versions and not _packing._unchanged.dict_versions:
        pytest.skip("this Python has no dict versions")
    monkeypatch.setattr(_packing, "_DICT_VERSIONS", dict_versions)
    change = _mutations(name).get(mutation)
    if change is None:
        pytest.skip(f"{name} keeps no state['step']")
    p_t, p_f, tor, fus = _pair(name, flatten=flatten)
    run(tor, p_t, 3, grads=_all_grads)
    run(fus, p_f, 3, grads=_all_grads)
    _all_grads(p_f, 3)
    assert fus._pack_unchanged(fus._group_hypers()) is not None  # the bulk path is in use
    assert fus._last.prepared  # and the step in one call
    for opt, ps in ((tor, p_t), (fus, p_f)):
        change(opt, ps)
    keep_grad = mutation == "drop_grad"
    for t in range(3, 6):
        for params in (p_t, p_f):
            _all_grads(params, t)
            if keep_grad:
                params[4].grad = None
        tor.step()
        fus.step()
    compare_opts(fus, tor, f"{name} after {mutation}", bitwise=_bitwise(name))


def test_sgd_first_step_counts_from_a_fresh_buffer_once():
    """SGD's first step starts a momentum buffer as a copy of the gradient (step 1); the table kept
    for the next steps must take the buffer it made (step 2), also when a later param joins."""
    p_t, p_f, tor, fus = _pair("SGD")
    for t in range(4):
        for params in (p_t, p_f):
            _all_grads(params, t)
            if t < 2:
                params[3].grad = None  # joins at step 3, with a fresh buffer of its own
        tor.step()
        fus.step()
    compare_opts(fus, tor, "SGD", bitwise=True)


def test_without_the_bulk_check_every_step_packs_param_by_param(monkeypatch):
    """A build without fusedopt._unchanged (torch's C++ API absent when it was built, or another torch in use) packs
    every step param by param, with the same results."""
    assert _packing._unchanged is not None, "this build should have fusedopt._unchanged (scripts/build)"
    monkeypatch.setattr(_packing, "_unchanged", None)
    p_t, p_f, tor, fus = _pair("AdamW")
    run(tor, p_t, 4, grads=_all_grads)
    run(fus, p_f, 4, grads=_all_grads)
    assert fus._last is None
    compare_opts(fus, tor, "AdamW packed param by param", bitwise=_bitwise("AdamW"))


def _count_one_calls(opt) -> list:
    """The results of opt's _step_unchanged calls, as they come."""
    calls, one_call = [], opt._step_unchanged

    def counted(*args):
        calls.append(one_call(*args))
        return calls[-1]

    opt._step_unchanged = counted
    return calls


@pytest.mark.parametrize("name", NAMES)
def test_unchanged_steps_take_one_call_under_a_grad_scaler(name, ieee_sqrt):
    """From the second step on, a loop that sets every grad anew steps in one call, also under fusedopt.GradScaler
    (the scale and the overflow check come with each call): the same params and states as torch.optim under
    torch.amp.GradScaler, bit for bit, and an Inf at step 3 skips that step whole."""
    p_t, p_f, tor, fus = _pair(name)
    calls = _count_one_calls(fus)
    s_t = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)
    s_f = fusedopt.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)
    for t in range(6):
        for params, scaler in ((p_t, s_t), (p_f, s_f)):
            _all_grads(params, t)
            for p in params:
                p.grad = scaler.scale(p.grad)
            if t == 3:
                params[2].grad.view(-1)[5] = math.inf
        snap = snapshot(fus)
        for opt, scaler in ((tor, s_t), (fus, s_f)):
            scaler.step(opt)
            scaler.update()
        if t == 3:
            assert_unchanged(fus, snap, f"{name} step {t} (overflow)")
        assert s_f.get_scale() == s_t.get_scale()
        compare_opts(fus, tor, f"{name} step {t}", bitwise=True)
    assert calls == [False] + [True] * 5


@pytest.mark.parametrize("name", ["SGD", "AdamW", "Adagrad"])
def test_unchanged_steps_take_one_call_with_clipping(name):
    """max_grad_norm's pre-pass runs within the one call: the norm it reports is torch's clip_grad_norm_'s, and
    the step equals torch's after clipping."""
    p_t, p_f, tor, fus = _pair(name, max_grad_norm=1.0)
    calls = _count_one_calls(fus)
    for t in range(4):
        _all_grads(p_t, t)
        _all_grads(p_f, t)
        norm = torch.nn.utils.clip_grad_norm_(p_t, 1.0)
        tor.step()
        fus.step()
        assert fus.last_grad_norm == pytest.approx(float(norm), rel=1e-6)
        # (the fused norm is summed in double: its clip coefficient may be an ulp from torch's f32 one)
        compare_opts(fus, tor, f"{name} step {t}", rtol=1e-5)
    assert calls == [False, True, True, True]


def test_a_tensor_lr_takes_the_ordinary_path():
    """A tensor lr may change in place, so its group's Hyper is made anew at each step, never run in one call."""
    p_t, p_f, tor, fus = _pair("AdamW")
    for opt in (tor, fus):
        opt.param_groups[0]["lr"] = torch.tensor(0.01)
    calls = _count_one_calls(fus)
    for t in range(4):
        for opt, params in ((tor, p_t), (fus, p_f)):
            _all_grads(params, t)
            opt.param_groups[0]["lr"].mul_(0.5)
            opt.step()
    compare_opts(fus, tor, "AdamW with a tensor lr", bitwise=False)
    assert calls == [False] * 4


def test_an_engine_refusal_in_one_call_raises_and_changes_nothing():
    """The check cannot see a count that went bad in place; the engine refuses it before touching anything, and the
    step takes the ordinary path, which raises the engine's ValueError."""
    _, p_f, _, fus = _pair("AdamW")
    calls = _count_one_calls(fus)
    run(fus, p_f, 2, grads=_all_grads)
    fus.state[p_f[1]]["step"].fill_(-1.0)
    _all_grads(p_f, 2)
    snap = snapshot(fus)
    with pytest.raises(ValueError, match=r"invalid state\['step'\]: -1"):
        fus.step()
    assert_unchanged(fus, snap, "a refused step")
    assert calls == [False, True, False]
