"""fusedopt.schedules (the C++ closed forms behind fusedopt._C) against torch.optim.lr_scheduler.

Each test drives two optimizers through the same loop (`opt.step(); sched.step()`), one with torch's scheduler
and one with fusedopt's FunctionalLR, and compares the param groups' lr (and momentum / betas[0]) after every
step. torch updates lrs recursively and we use closed forms, so values agree to rounding: REL = 1e-12 relative,
with an absolute floor of 1e-14 * max|lr| for values that the closed form makes exactly 0 (see
tests/schedule_test.cc, which holds the C++ side to the same tolerance).
"""

from __future__ import annotations

import functools
import io
import math
import warnings

import fusedopt
import pytest
from fusedopt import schedules as fs
from torch.optim import lr_scheduler as S

import torch

REL = 1e-12
ABS_FACTOR = 1e-14
GROUP_LRS = [0.1, 0.03]


def make_opt(cls=torch.optim.SGD, **kwargs):
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in GROUP_LRS]
    return cls([{"params": [p], "lr": lr} for p, lr in zip(params, GROUP_LRS)], **kwargs)


def group_values(opt):
    out = []
    for g in opt.param_groups:
        row = [float(g["lr"])]
        if "betas" in g:
            row.append(float(g["betas"][0]))
        if "momentum" in g:
            row.append(float(g["momentum"]))
        out.append(row)
    return out


def assert_sequences_close(got, want):
    """got, want: [step][group][value]."""
    assert len(got) == len(want)
    scale = max(abs(x) for step in want for row in step for x in row)
    for t, (gs, ws) in enumerate(zip(got, want)):
        for gi, (g, w) in enumerate(zip(gs, ws)):
            for k, (a, b) in enumerate(zip(g, w)):
                assert math.isclose(a, b, rel_tol=REL, abs_tol=ABS_FACTOR * scale), \
                    f"step {t} group {gi} value {k}: fusedopt {a!r} torch {b!r}"


def drive(opt, sched, steps):
    """[step][group][lr, (beta1), (momentum)] at step 0 and after each of `steps` opt.step(); sched.step()."""
    seq = [group_values(opt)]
    for _ in range(steps):
        for g in opt.param_groups:
            for p in g["params"]:
                p.grad = torch.ones_like(p)
        opt.step()
        sched.step()
        seq.append(group_values(opt))
    return seq


# (torch scheduler factory, fusedopt schedule factory base_lr -> Schedule, steps)
CASES = {
    "constant": (lambda o: S.ConstantLR(o, factor=0.5, total_iters=4),
                 lambda lr: fs.constant_lr(lr, factor=0.5, total_iters=4), 12),
    "linear_defaults": (lambda o: S.LinearLR(o), fs.linear_lr, 10),
    "linear_decay": (lambda o: S.LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=15),
                     lambda lr: fs.linear_lr(lr, start_factor=1.0, end_factor=0.0, total_iters=15), 20),
    "cosine": (lambda o: S.CosineAnnealingLR(o, T_max=20, eta_min=1e-3),
               functools.partial(fs.cosine_annealing_lr, T_max=20, eta_min=1e-3), 50),
    "step": (lambda o: S.StepLR(o, step_size=4, gamma=0.5), functools.partial(fs.step_lr, step_size=4, gamma=0.5),
             30),
    "multi_step": (lambda o: S.MultiStepLR(o, milestones=[3, 7, 7]),
                   functools.partial(fs.multi_step_lr, milestones=[3, 7, 7]), 12),
    "exponential": (lambda o: S.ExponentialLR(o, gamma=0.93), functools.partial(fs.exponential_lr, gamma=0.93), 60),
    "polynomial": (lambda o: S.PolynomialLR(o, total_iters=12, power=3.0),
                   functools.partial(fs.polynomial_lr, total_iters=12, power=3.0), 20),
    "warmup_cosine": (lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.01, total_iters=8),
                                                   S.CosineAnnealingLR(o, T_max=32, eta_min=1e-4)], milestones=[8]),
                      lambda lr: fs.warmup_cosine(lr, 8, 40, min_lr=1e-4, warmup_start_factor=0.01), 45),
    "sequential_3": (lambda o: S.SequentialLR(o, [S.ConstantLR(o, factor=0.2, total_iters=2),
                                                  S.PolynomialLR(o, total_iters=6),
                                                  S.ExponentialLR(o, gamma=0.8)], milestones=[3, 9]),
                     lambda lr: fs.sequential_lr([fs.constant_lr(lr, factor=0.2, total_iters=2),
                                                  fs.polynomial_lr(lr, total_iters=6),
                                                  fs.exponential_lr(lr, gamma=0.8)], milestones=[3, 9]), 20),
}


@pytest.mark.parametrize("name", list(CASES))
def test_functional_lr_matches_torch_scheduler(name):
    torch_factory, ours, steps = CASES[name]
    opt_t, opt_f = make_opt(momentum=0.9), make_opt(momentum=0.9)
    want = drive(opt_t, torch_factory(opt_t), steps)
    sched = fs.FunctionalLR(opt_f, ours)
    got = drive(opt_f, sched, steps)
    assert_sequences_close(got, want)
    assert sched.get_last_lr() == [row[0] for row in got[-1]]


ONE_CYCLE = [
    (torch.optim.SGD, dict(momentum=0.9), dict(total_steps=40)),
    (torch.optim.SGD, dict(momentum=0.9), dict(total_steps=25, anneal_strategy="linear", three_phase=True,
                                               pct_start=0.2)),
    (torch.optim.Adam, {}, dict(total_steps=30, base_momentum=0.8, max_momentum=0.9)),
    (torch.optim.AdamW, {}, dict(epochs=3, steps_per_epoch=7, three_phase=True)),
    (torch.optim.SGD, {}, dict(total_steps=20, cycle_momentum=False, div_factor=10.0, final_div_factor=50.0)),
]


@pytest.mark.parametrize("cls,opt_kw,kw", ONE_CYCLE)
def test_one_cycle_lr_and_momentum_match_torch(cls, opt_kw, kw):
    max_lrs = [0.2, 0.05]
    opt_t, opt_f = make_opt(cls, **opt_kw), make_opt(cls, **opt_kw)
    total = kw.get("total_steps") or kw["epochs"] * kw["steps_per_epoch"]
    sched_t = S.OneCycleLR(opt_t, max_lr=max_lrs, **kw)
    want = drive(opt_t, sched_t, total)
    sched_f = fs.FunctionalLR(opt_f, [fs.one_cycle_lr(m, **kw) for m in max_lrs])
    got = drive(opt_f, sched_f, total)
    assert_sequences_close(got, want)
    assert sched_f.schedules[0].has_momentum == kw.get("cycle_momentum", True)
    # Both refuse to go past total_steps.
    with pytest.raises(ValueError, match="Tried to step"):
        sched_t.step()
    with pytest.raises(ValueError, match="total_steps"):
        sched_f.step()


def test_schedule_object_is_a_pure_function():
    s = fs.warmup_cosine(1.0, warmup_steps=4, total_steps=12, min_lr=0.1, warmup_start_factor=0.25)
    assert [s(t) for t in range(5)] == pytest.approx([0.25, 0.4375, 0.625, 0.8125, 1.0], rel=1e-15)
    assert s(12) == pytest.approx(0.1, rel=1e-15)
    assert s.lr(7) == s(7) and s(7) == s(7)  # any order, any number of times
    assert not s.has_momentum
    assert "WarmupCosine(base_lr=1" in repr(s)
    c = fs.one_cycle_lr(0.1, total_steps=10)
    assert c.has_momentum and c.momentum(0) == pytest.approx(0.95) and c(0) == pytest.approx(0.004)


def test_errors_are_value_errors_naming_the_argument():
    with pytest.raises(ValueError, match="start_factor: 0"):
        fs.linear_lr(0.1, start_factor=0.0)
    with pytest.raises(ValueError, match="T_max: 0"):
        fs.cosine_annealing_lr(0.1, T_max=0)
    with pytest.raises(ValueError, match="milestones"):
        fs.multi_step_lr(0.1, milestones=[5, 2])
    with pytest.raises(ValueError, match="pct_start"):
        fs.one_cycle_lr(0.1, total_steps=10, pct_start=1.5)
    with pytest.raises(ValueError, match="anneal_strategy"):
        fs.one_cycle_lr(0.1, total_steps=10, anneal_strategy="exp")
    with pytest.raises(ValueError, match="total_steps OR"):
        fs.one_cycle_lr(0.1)
    with pytest.raises(ValueError, match="1 milestones"):
        fs.sequential_lr([fs.constant(0.1)], milestones=[3])
    with pytest.raises(ValueError, match="step: -1"):
        fs.step_lr(0.1, step_size=2)(-1)
    with pytest.raises(ValueError, match="no momentum"):
        fs.constant(0.1).momentum(0)
    with pytest.raises(TypeError):
        fs.step_lr(0.1, step_size=2.5)  # integers only, as torch's step counts


def test_functional_lr_needs_momentum_for_one_cycle():
    opt = make_opt(torch.optim.Adagrad)  # neither momentum nor betas
    with pytest.raises(ValueError, match="momentum or beta1"):
        fs.FunctionalLR(opt, fs.one_cycle_lr(0.1, total_steps=10))
    with pytest.raises(ValueError, match="same length"):
        fs.FunctionalLR(make_opt(), [fs.constant(0.1)])


def test_functional_lr_state_dict_round_trip():
    opt = make_opt()
    sched = fs.FunctionalLR(opt, functools.partial(fs.cosine_annealing_lr, T_max=10))
    for _ in range(4):
        opt.step()
        sched.step()
    buf = io.BytesIO()
    torch.save(sched.state_dict(), buf)  # picklable: no C++ objects inside
    buf.seek(0)
    opt2 = make_opt()
    sched2 = fs.FunctionalLR(opt2, functools.partial(fs.cosine_annealing_lr, T_max=10))
    sched2.load_state_dict(torch.load(buf, weights_only=False))
    for _ in range(3):
        opt.step()
        sched.step()
        opt2.step()
        sched2.step()
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups]
    assert sched2.last_epoch == 7


def _adamw_run(sched_factory, steps=25):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(37)), torch.nn.Parameter(torch.randn(5, 3))]
    opt = fusedopt.FusedAdamW([{"params": [params[0]], "lr": 1e-2}, {"params": [params[1]], "lr": 3e-3}],
                              weight_decay=0.05)
    sched = sched_factory(opt)
    gen = torch.Generator().manual_seed(1)
    lrs = []
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
        sched.step()
        lrs.append([(g["lr"], g["betas"][0]) for g in opt.param_groups])
    return [p.detach().clone() for p in params], lrs


@pytest.mark.parametrize("kind", ["warmup_cosine", "one_cycle"])
def test_drives_fused_adamw_like_torch_scheduler(kind):
    if kind == "warmup_cosine":
        def torch_sched(o):
            return S.SequentialLR(o, [S.LinearLR(o, start_factor=0.1, total_iters=5),
                                      S.CosineAnnealingLR(o, T_max=20, eta_min=1e-4)], milestones=[5])

        def ours(o):
            return fs.FunctionalLR(o, lambda lr: fs.warmup_cosine(lr, 5, 25, min_lr=1e-4, warmup_start_factor=0.1))
    else:
        def torch_sched(o):
            return S.OneCycleLR(o, max_lr=[0.02, 0.01], total_steps=25)

        def ours(o):
            return fs.FunctionalLR(o, [fs.one_cycle_lr(0.02, total_steps=25), fs.one_cycle_lr(0.01, total_steps=25)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "lr_scheduler.step() before optimizer.step()" warnings
        want_params, want_lrs = _adamw_run(torch_sched)
        got_params, got_lrs = _adamw_run(ours)
    for a, b in zip(got_lrs, want_lrs):
        for (lr_a, b1_a), (lr_b, b1_b) in zip(a, b):
            assert math.isclose(lr_a, lr_b, rel_tol=REL, abs_tol=1e-18)
            assert math.isclose(b1_a, b1_b, rel_tol=REL)
    # The engine rounds the step coefficients to f32, so lrs equal to 1e-12 give (almost always) the same
    # bits; 1e-6 relative leaves room for a rare last-bit flip.
    for a, b in zip(got_params, want_params):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # The schedule mattered: a constant lr ends elsewhere.
    const_params, _ = _adamw_run(lambda o: fs.FunctionalLR(o, fs.constant))
    assert not torch.allclose(const_params[0], want_params[0], rtol=1e-4, atol=1e-5)
