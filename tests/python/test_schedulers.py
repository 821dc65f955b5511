"""torch.optim.lr_scheduler drives the fused optimizers unchanged: same lr (and momentum / beta1)
sequence and same params as with the torch.optim twin."""

from __future__ import annotations

import copy
import warnings

import pytest
from algorithm_cases import PARITY
from conftest import FUSED, SQRT_FREE, TORCH, clone_params, compare_opts, groups_of, make_params, set_grads
from torch.optim import lr_scheduler as S

import torch

STEPS = 30


def _sched_factory(kind):
    if kind == "warmup_cosine":
        return lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.1, total_iters=5),
                                            S.CosineAnnealingLR(o, T_max=STEPS - 5, eta_min=1e-4)],
                                        milestones=[5])
    if kind == "onecycle":
        return lambda o: S.OneCycleLR(o, max_lr=[0.1, 0.05, 0.2], total_steps=STEPS, cycle_momentum=True)
    if kind == "step":
        return lambda o: S.StepLR(o, step_size=7, gamma=0.5)
    raise ValueError(kind)


OPT_KW = {name: case.scheduler_options for name, case in PARITY.items()}

# (OneCycleLR needs momentum or betas to cycle)
CASES = [(name, kind) for name, case in PARITY.items() for kind in case.schedulers]


def _make(name, params, fused, tensor_lr):
    kw = dict(OPT_KW[name])
    group_kw = [dict(lr=kw["lr"] / 2), dict(lr=kw["lr"] * 2)]
    if tensor_lr:
        kw["lr"] = torch.tensor(kw["lr"])
        for g in group_kw:
            g["lr"] = torch.tensor(g["lr"])
    groups = groups_of(params, group_kw=group_kw)
    return FUSED[name](groups, **kw) if fused else TORCH[name](groups, foreach=False, **kw)


def _hyper_trace(opt):
    out = []
    for g in opt.param_groups:
        lr = float(g["lr"])
        mom = g.get("momentum", None)
        b1 = float(g["betas"][0]) if "betas" in g else None
        out.append((lr, None if mom is None else float(mom), b1))
    return out


@pytest.mark.parametrize("tensor_lr", [False, True], ids=["float_lr", "tensor_lr"])
@pytest.mark.parametrize("name,kind", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_scheduler_same_sequence_and_params(name, kind, tensor_lr):
    make_sched = _sched_factory(kind)
    p_t = make_params(0)
    p_f = clone_params(p_t)
    tor = _make(name, p_t, False, tensor_lr)
    fus = _make(name, p_f, True, tensor_lr)
    s_t, s_f = make_sched(tor), make_sched(fus)
    traces_t, traces_f = [], []
    with warnings.catch_warnings():
        # e.g. "Detected call of `lr_scheduler.step()` before `optimizer.step()`": the scheduler
        # must see our step() through its wrapper
        warnings.simplefilter("error")
        for t in range(STEPS):
            for ps, o, s, tr in ((p_t, tor, s_t, traces_t), (p_f, fus, s_f, traces_f)):
                set_grads(ps, t)
                o.step()
                s.step()
                tr.append((s.get_last_lr(), _hyper_trace(o)))
    assert traces_f == traces_t  # exactly the same floats
    lrs = [x[0][0] for x in traces_t]
    assert len(set(lrs)) > 3, "the schedule really changes the lr"
    if kind == "onecycle":
        key = 2 if "betas" in fus.defaults else 1  # OneCycleLR's choice: beta1 where there are betas, else momentum
        assert len({tr[1][0][key] for tr in traces_t}) > 3, "momentum / beta1 really cycles"
    if tensor_lr:
        assert all(isinstance(g["lr"], torch.Tensor) for g in fus.param_groups)
    # The rules without a sqrt are reproduced bit for bit with a float lr; a tensor lr makes torch multiply
    # differently
    compare_opts(fus, tor, f"{name}-{kind}", bitwise=(name in SQRT_FREE and not tensor_lr), rtol=2e-5)
    # the scheduler state round-trips through the fused optimizer too
    assert s_f.state_dict().keys() == s_t.state_dict().keys()


def test_scheduler_resume_from_state_dicts():
    """Checkpoint (optimizer + scheduler) of a torch run, resumed with the fused optimizer."""
    p_t = make_params(0)
    tor = _make("AdamW", p_t, False, False)
    s_t = _sched_factory("onecycle")(tor)
    for t in range(12):
        set_grads(p_t, t)
        tor.step()
        s_t.step()
    p_f = clone_params(p_t)
    fus = _make("AdamW", p_f, True, False)
    s_f = _sched_factory("onecycle")(fus)
    fus.load_state_dict(copy.deepcopy(tor.state_dict()))
    s_f.load_state_dict(copy.deepcopy(s_t.state_dict()))
    for t in range(12, STEPS - 1):
        for ps, o, s in ((p_t, tor, s_t), (p_f, fus, s_f)):
            set_grads(ps, t)
            o.step()
            s.step()
        assert s_f.get_last_lr() == s_t.get_last_lr()
        assert [g["betas"] for g in fus.param_groups] == [g["betas"] for g in tor.param_groups]
    compare_opts(fus, tor, "resumed", rtol=2e-5)
