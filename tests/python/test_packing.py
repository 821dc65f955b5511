"""The bulk check that lets an unchanged step reuse the last step's segment table
(_pack_unchanged in python/fusedopt/_packing.py, its checks in C++: src/python_torch/unchanged_step.cc): every
change user code can make between two steps must send the step back to packing param by param, with the result
torch.optim gets."""

import pytest
from conftest import NAMES, compare_opts, run, set_grads
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
