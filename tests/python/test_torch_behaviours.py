"""What PyTorch's own generic optimizer tests (test/test_optim.py, TestOptimRenewed) exercise, written
as our own tests against torch.optim: every hook kind, named params in the state_dict, a tensor lr,
a step with no grads, deep copies and pickling mid-training, load_state_dict with missing or
extra state keys."""

from __future__ import annotations

import copy
import pickle
import re

import pytest
from conftest import BASE_KW, FUSED, NAMES, SQRT_FREE, TORCH, clone_params, compare_opts, make_params, run

import torch


def _pair(name, seed=0, **kw):
    p_ref = make_params(seed)
    p_fus = clone_params(p_ref)
    kw = {**BASE_KW[name], **kw}
    return p_ref, p_fus, TORCH[name](p_ref, foreach=False, **kw), FUSED[name](p_fus, **kw)


@pytest.mark.parametrize("name", NAMES)
def test_every_hook_runs_as_with_torch(name):
    p_ref, p_fus, ref, fus = _pair(name)
    logs = {}
    for opt, key in ((ref, "ref"), (fus, "fus")):
        log = logs[key] = []
        opt.register_step_pre_hook(lambda o, a, k, log=log: log.append("step_pre"))
        opt.register_step_post_hook(lambda o, a, k, log=log: log.append("step_post"))
        opt.register_state_dict_pre_hook(lambda o, log=log: log.append("sd_pre"))
        opt.register_state_dict_post_hook(lambda o, sd, log=log: (log.append("sd_post"), sd)[1])
        opt.register_load_state_dict_pre_hook(lambda o, sd, log=log: (log.append("load_pre"), sd)[1])
        opt.register_load_state_dict_post_hook(lambda o, log=log: log.append("load_post"))
    run(ref, p_ref, 2)
    run(fus, p_fus, 2)
    for opt in (ref, fus):
        opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert logs["fus"] == logs["ref"] == ["step_pre", "step_post"] * 2 + ["sd_pre", "sd_post", "load_pre",
                                                                          "load_post"]
    # a pre-hook that changes the grads changes the update the same way
    def halve_grads(o, args, kwargs):
        for g in o.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.grad.mul_(0.5)

    for opt in (ref, fus):
        opt.register_step_pre_hook(halve_grads)
    run(ref, p_ref, 2, start=2)
    run(fus, p_fus, 2, start=2)
    compare_opts(fus, ref, f"{name} hooks")


@pytest.mark.parametrize("name", NAMES)
def test_named_params_in_state_dict(name):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    twin = copy.deepcopy(model)
    ref = TORCH[name](twin.named_parameters(), foreach=False, **BASE_KW[name])
    fus = FUSED[name](model.named_parameters(), **BASE_KW[name])
    for m, opt in ((twin, ref), (model, fus)):
        m(torch.ones(5, 4)).square().sum().backward()
        opt.step()
    sd_ref, sd_fus = ref.state_dict(), fus.state_dict()
    assert [g["param_names"] for g in sd_fus["param_groups"]] == [g["param_names"] for g in sd_ref["param_groups"]]
    assert sd_fus["param_groups"][0]["param_names"] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    other = FUSED[name](copy.deepcopy(model).named_parameters(), **BASE_KW[name])
    other.load_state_dict(copy.deepcopy(sd_ref))
    assert other.state_dict()["param_groups"][0]["param_names"] == sd_ref["param_groups"][0]["param_names"]


@pytest.mark.parametrize("name", NAMES)
def test_tensor_lr(name):
    p_ref, p_fus, ref, fus = _pair(name, lr=torch.tensor(0.01))
    run(ref, p_ref, 5)
    run(fus, p_fus, 5)
    for opt in (ref, fus):
        opt.param_groups[0]["lr"].fill_(0.003)  # a scheduler writes into the tensor
    run(ref, p_ref, 5, start=5)
    run(fus, p_fus, 5, start=5)
    compare_opts(fus, ref, f"{name} tensor lr", bitwise=(name == "SGD"))


@pytest.mark.parametrize("name", NAMES)
def test_step_without_grads_changes_nothing(name):
    p_ref, p_fus, ref, fus = _pair(name)
    for opt in (ref, fus):
        opt.step()
    assert len(fus.state) == len(ref.state)  # (Adagrad's constructor makes every state)
    compare_opts(fus, ref, f"{name} no grads", bitwise=True)


@pytest.mark.parametrize("name", NAMES)
def test_deepcopy_and_pickle_continue_like_the_original(name):
    p_ref, p_fus, ref, fus = _pair(name)
    run(fus, p_fus, 3)
    run(ref, p_ref, 3)
    for copied in (copy.deepcopy(fus), pickle.loads(pickle.dumps(fus))):
        assert type(copied) is type(fus)
        params = [p for g in copied.param_groups for p in g["params"]]
        run(copied, params, 3, start=3)
        ref2 = copy.deepcopy(ref)
        run(ref2, [p for g in ref2.param_groups for p in g["params"]], 3, start=3)
        compare_opts(copied, ref2, f"{name} copy", bitwise=(name in SQRT_FREE))


@pytest.mark.parametrize("name", NAMES)
def test_load_state_dict_with_missing_or_extra_keys_like_torch(name):
    p_ref, p_fus, ref, fus = _pair(name)
    run(ref, p_ref, 2)
    run(fus, p_fus, 2)
    sd = copy.deepcopy(ref.state_dict())
    # a state entry torch does not know rides along, as with torch
    sd["state"][0]["extra_key"] = torch.zeros(1)
    fresh_ref, fresh_fus = (cls(clone_params(p_ref), **BASE_KW[name]) for cls in (TORCH[name], FUSED[name]))
    fresh_ref.load_state_dict(copy.deepcopy(sd))
    fresh_fus.load_state_dict(copy.deepcopy(sd))
    assert "extra_key" in fresh_fus.state_dict()["state"][0] and "extra_key" in fresh_ref.state_dict()["state"][0]
    # missing top-level keys and mismatched group sizes raise torch's own errors
    for broken in ({"state": sd["state"]}, {**sd, "param_groups": sd["param_groups"][:1] * 2}):
        with pytest.raises(Exception) as et:
            fresh_ref.load_state_dict(copy.deepcopy(broken))
        with pytest.raises(type(et.value), match=re.escape(str(et.value))):
            fresh_fus.load_state_dict(copy.deepcopy(broken))
