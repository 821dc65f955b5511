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


def test_step_wrapper_does_what_torchs_does():
    """fusedopt's own step wrapper (python/fusedopt/_hooks.py, in place of torch's profile_hook_step): the global hooks
    around the optimizer's, in torch's order; a pre-hook's (args, kwargs) taken; a bad return refused as torch refuses
    it; the profiler's label; the step run without grad and the grad mode restored, also when the step raises."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    logs = {}
    handles = []
    for key in ("ref", "fus"):
        logs[key] = []
    handles.append(register_optimizer_step_pre_hook(lambda o, a, k: logs[_kind(o)].append("global_pre")))
    handles.append(register_optimizer_step_post_hook(lambda o, a, k: logs[_kind(o)].append("global_post")))
    try:
        p_ref, p_fus, ref, fus = _pair("AdamW")
        for opt, key in ((ref, "ref"), (fus, "fus")):
            opt.register_step_pre_hook(lambda o, a, k, log=logs[key]: log.append(("pre", len(a), torch.is_grad_enabled())))
            opt.register_step_post_hook(lambda o, a, k, log=logs[key]: log.append("post"))
        run(ref, p_ref, 1)
        run(fus, p_fus, 1)
    finally:
        for h in handles:
            h.remove()
    assert logs["fus"] == logs["ref"] == ["global_pre", ("pre", 1, True), "post", "global_post"]

    seen = []  # a pre-hook that passes a closure in: the step calls it, without grad around it but with it inside
    fus.register_step_pre_hook(lambda o, a, k: (a, {"closure": lambda: seen.append(torch.is_grad_enabled())}))
    fus.step()
    assert seen == [True]
    with torch.enable_grad():
        fus.register_step_pre_hook(lambda o, a, k: 3)
        with pytest.raises(RuntimeError, match="must return None or a tuple of"):
            fus.step()
        assert torch.is_grad_enabled()

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _, p_fus, _, fus = _pair("AdamW")
        run(fus, p_fus, 1)
    assert "Optimizer.step#FusedAdamW.step" in {e.name for e in prof.events()}


def _kind(opt):
    return "fus" if type(opt).__name__.startswith("Fused") else "ref"


def test_subclass_step_runs_the_hooks_once():
    """A subclass whose own step calls the fused one (super().step()) runs each hook once, as a torch.optim subclass
    does."""
    FusedAdamW = FUSED["AdamW"]

    class Sub(FusedAdamW):
        def step(self, closure=None):
            self.calls = getattr(self, "calls", 0) + 1
            return super().step(closure)

    _, p_fus, _, fus = _pair("AdamW")
    sub = Sub(clone_params(p_fus), **BASE_KW["AdamW"])
    log = []
    sub.register_step_pre_hook(lambda o, a, k: log.append("pre"))
    sub.register_step_post_hook(lambda o, a, k: log.append("post"))
    run(sub, list(sub.param_groups[0]["params"]), 2)
    run(fus, p_fus, 2)
    assert log == ["pre", "post"] * 2 and sub.calls == 2
    compare_opts(sub, fus, "subclass", bitwise=True)


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


def test_group_values_changed_between_steps_are_read():
    """A step reuses the last step's Hyper of a group that holds the very same immutable values (_group_hypers). A
    list put in and then changed in place, a tuple, a float and a bool replaced are each read at the next step."""
    p_ref, p_fus, ref, fus = _pair("Adam")
    changes = (lambda g: g.update(betas=[0.7, 0.999]), lambda g: g["betas"].__setitem__(0, 0.5),
               lambda g: g.update(betas=(0.8, 0.99)),
               lambda g: g.update(weight_decay=0.1), lambda g: g.update(amsgrad=True), lambda g: g.update(lr=0.5))
    run(ref, p_ref, 2)
    run(fus, p_fus, 2)
    for k, change in enumerate(changes):
        for opt in (ref, fus):
            change(opt.param_groups[0])
        run(ref, p_ref, 2, start=2 + 2 * k)
        run(fus, p_fus, 2, start=2 + 2 * k)
        compare_opts(fus, ref, f"Adam after change {k}")


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
