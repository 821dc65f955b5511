"""Parity of every fused optimizer with its torch.optim twin (single-tensor path, foreach=False).

The problem: five params (1, 7, 40000, 33x17 and 4x3x5 elements) in three param groups with
different hyper-parameters; grads of a noisy quadratic computed from each run's own params (so
differences feed back); param 1 and 3 have no grad on some steps and param 4 only from step 10 on.
"""

from __future__ import annotations

import inspect

import pytest
from algorithm_cases import PARITY
from conftest import (
    FUSED,
    NAMES,
    SQRT_FREE,
    TORCH,
    ULP_BOUND,
    as_int,
    assert_bitwise,
    assert_close,
    clone_params,
    compare_opts,
    groups_of,
    has_grad,
    make_params,
    run,
    set_fixed_grads,
    set_grads,
    ulp_err,
)

import torch

T = torch.tensor

# (the algorithms' own test files run more option sets each)
OPTION_SETS = {name: case.option_sets for name, case in PARITY.items()}

# Tensor hyper-parameters in every group for the tensor option sets (algorithm_cases.py's tensor_group_kw where an
# algorithm has no betas or is checked with a tensor lr only).
TENSOR_GROUP_KW = [dict(lr=T(3e-3), betas=(T(0.8), T(0.99))), dict(lr=T(2e-2), weight_decay=0.0)]
TENSOR_GROUP_KW_OF = {name: case.tensor_group_kw for name, case in PARITY.items() if case.tensor_group_kw is not None}

CASES = [(n, i) for n in NAMES for i in range(len(OPTION_SETS[n]))]
CASE_IDS = [f"{n}-{i}-" + "-".join(f"{k}" for k in OPTION_SETS[n][i] if k != "lr") for n, i in CASES]


def _kw(name, i):
    kw = OPTION_SETS[name][i]
    tensors = isinstance(kw.get("lr"), torch.Tensor)
    # fresh tensor hyper-parameters per optimizer (schedulers and torch may write to them)
    kw = {k: (v.clone() if isinstance(v, torch.Tensor) else
              tuple(b.clone() for b in v) if isinstance(v, tuple) and isinstance(v[0], torch.Tensor) else v)
          for k, v in kw.items()}
    gk = None
    if tensors:
        gk = [{k: (v.clone() if isinstance(v, torch.Tensor) else
                   tuple(b.clone() for b in v) if isinstance(v, tuple) and isinstance(v[0], torch.Tensor) else v)
               for k, v in g.items()}
              for g in TENSOR_GROUP_KW_OF.get(name, TENSOR_GROUP_KW)]
    return kw, gk, tensors


def _pair(name, i, params_seed=0):
    p_ref = make_params(params_seed)
    p_fus = clone_params(p_ref)
    kw, gk, _ = _kw(name, i)
    ref = TORCH[name](groups_of(p_ref, name, gk), foreach=False, **kw)
    kw, gk, _ = _kw(name, i)
    fus = FUSED[name](groups_of(p_fus, name, gk), **kw)
    return p_ref, p_fus, ref, fus


def _train(name, i, steps=100):
    p_ref, p_fus, ref, fus = _pair(name, i)
    sign = -1.0 if OPTION_SETS[name][i].get("maximize") else 1.0
    for t in range(steps):
        set_grads(p_ref, t, sign=sign)
        set_grads(p_fus, t, sign=sign)
        ref.step()
        fus.step()
    return p_ref, p_fus, ref, fus


def _rtol(name, i):
    # Where a rule takes the sqrt of a difference that nearly cancels, torch's 1-ulp sqrt errors (its CPU
    # sqrt is not correctly rounded) grow to ~3e-5 relative over 100 steps. test_bitwise_with_ieee_sqrt
    # shows that this is the only difference.
    options = OPTION_SETS[name][i]
    return 1e-4 if any(options.get(k) for k in PARITY[name].cancelling_sqrt_options) else 1e-5


@pytest.mark.parametrize("name,i", CASES, ids=CASE_IDS)
def test_fp32_parity_100_steps(name, i):
    p_ref, p_fus, ref, fus = _train(name, i)
    # The rules without a sqrt are reproduced bit for bit (params and states), except with tensor
    # hyper-parameters (torch then computes e.g. lr / (1 - beta1**step) as an f32 tensor op, the engine
    # in double: the last bit may differ).
    bitwise = name in SQRT_FREE and not isinstance(OPTION_SETS[name][i].get("lr"), torch.Tensor)
    compare_opts(fus, ref, f"{name}{OPTION_SETS[name][i]}", rtol=_rtol(name, i), bitwise=bitwise)
    # the problem really moved the params, and the never-stepped ones stayed put
    assert any(not torch.equal(a, b) for a, b in zip(p_fus, make_params(0)))


# (the rules without a sqrt: test_fp32_parity_100_steps checks them bit for bit as torch is)
SQRT_CASES = [(n, i) for n, i in CASES
              if n not in SQRT_FREE and not isinstance(OPTION_SETS[n][i].get("lr"), torch.Tensor)]


@pytest.mark.parametrize("name,i", SQRT_CASES, ids=[CASE_IDS[CASES.index(c)] for c in SQRT_CASES])
def test_bitwise_with_ieee_sqrt(name, i, ieee_sqrt):
    p_ref, p_fus, ref, fus = _train(name, i, steps=60)
    compare_opts(fus, ref, f"{name}{OPTION_SETS[name][i]}", bitwise=True)


# Late steps: once beta^t < 2^-24 a bias correction rounds to exactly 1 in f32 and the engine leaves
# out its division (src/math/bias_correction_math.h). With betas (0.5, 0.5) that happens at step 25:
# 60 steps run on both sides of it, the params that skip steps included.
LATE_CASES = {
    "Adam": dict(lr=1e-2, betas=(0.5, 0.5), weight_decay=0.1),
    "Adam-amsgrad": dict(lr=1e-2, betas=(0.5, 0.5), amsgrad=True),
    "AdamW": dict(lr=1e-2, betas=(0.5, 0.5)),
    "AdamW-amsgrad": dict(lr=1e-2, betas=(0.5, 0.5), amsgrad=True),
    "NAdam": dict(lr=1e-2, betas=(0.5, 0.5), weight_decay=0.1),
}


@pytest.mark.parametrize("case", list(LATE_CASES))
def test_bias_corrections_of_one_are_bitwise(case, ieee_sqrt):
    name = case.split("-")[0]
    p_ref = make_params(0)
    p_fus = clone_params(p_ref)
    every_group = [dict(LATE_CASES[case]), dict(LATE_CASES[case])]
    ref = TORCH[name](groups_of(p_ref, group_kw=every_group), foreach=False, **LATE_CASES[case])
    fus = FUSED[name](groups_of(p_fus, group_kw=every_group), **LATE_CASES[case])
    run(ref, p_ref, 60)
    run(fus, p_fus, 60)
    compare_opts(fus, ref, case, bitwise=True)
    assert all(float(s["step"]) > 25 for s in fus.state.values())


@pytest.mark.parametrize("name", NAMES)
def test_thread_count_does_not_change_results(name):
    """The engine splits work by ATen's grain; 1 and 2 threads must give identical bits."""
    kw = dict(OPTION_SETS[name][-1])
    runs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        ps = make_params(3, sizes=[(70000,), (5,), (33000,)])
        opt = FUSED[name](groups_of(ps, name), **kw)
        for t in range(4):
            set_grads(ps, t, skip=lambda t, i: True)
            opt.step()
        runs.append((ps, opt))
    for a, b in zip(runs[0][0], runs[1][0]):
        assert_bitwise(a.detach(), b.detach(), f"{name} 1 vs 2 threads")


# ---- 16-bit params ------------------------------------------------------------------------------

LOW_OPTS = {name: case.low_precision_option_sets for name, case in PARITY.items()}
LOW_CASES = [(n, i) for n in NAMES for i in range(len(LOW_OPTS[n]))]
LOW_IDS = [f"{n}-{i}" for n, i in LOW_CASES]

def _kw16(name, i, dtype):
    kw = dict(LOW_OPTS[name][i])
    if dtype == torch.float16 and "eps" in inspect.signature(TORCH[name]).parameters:
        # torch's fp16 path needs an eps that fp16 holds well: 1e-8 rounds to 0 in fp16 and torch
        # then divides 0 by 0 wherever exp_avg_sq underflows; with 1e-3, torch's subnormal
        # exp_avg_sq (g < 0.25) puts torch itself 12 ulps away from the fp32 run (fused: 4).
        kw["eps"] = 1e-2
    return kw


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name,i", LOW_CASES, ids=LOW_IDS)
def test_low_precision_params_default_mode(name, i, dtype):
    """16-bit params without master weights: updated (and states kept) in their own dtype, as torch
    does; within a few storage ulps of torch's own 16-bit run, and at least as close to an fp32 run."""
    kw = _kw16(name, i, dtype)
    p0 = make_params(5, dtype)
    p_t, p_f = clone_params(p0), clone_params(p0)
    p_32 = [torch.nn.Parameter(p.detach().float()) for p in p0]
    ref = TORCH[name](groups_of(p_t, name), foreach=False, **kw)
    fus = FUSED[name](groups_of(p_f, name), **kw)
    r32 = TORCH[name](groups_of(p_32, name), foreach=False, **kw)
    sign = -1.0 if kw.get("maximize") else 1.0
    for t in range(10):
        for ps in (p_t, p_f, p_32):  # the same grads (rounded to the 16-bit type) for all three
            set_fixed_grads(ps, t, dtype=dtype, skip=has_grad)
            for p in ps:
                if p.grad is not None and sign < 0:
                    p.grad.neg_()
        ref.step(), fus.step(), r32.step()
    err_f = err_t = 0.0
    max_f = max_t = 0.0
    for j, (a, r, x) in enumerate(zip(p_f, p_t, p_32)):
        assert a.dtype == dtype
        for k, v in fus.state[a].items():
            if k in PARITY[name].scalar_states:
                # 0-d f32 scalars per param, not buffers: torch keeps them in f32 for 16-bit params too
                assert v.dtype == ref.state[r][k].dtype == torch.float32 and v.dim() == 0
            elif k != "step":
                assert v.dtype == dtype, f"state {k} is {v.dtype}, torch keeps it in {dtype}"
        u = ulp_err(a, r).max().item()
        assert u <= ULP_BOUND[dtype], f"param {j}: {u} {dtype} ulps from torch's {dtype} run"
        err_f += (a.double() - x.double()).abs().sum().item()
        err_t += (r.double() - x.double()).abs().sum().item()
        max_f = max(max_f, ulp_err(a, x.to(dtype)).max().item())
        max_t = max(max_t, ulp_err(r, x.to(dtype)).max().item())
    compare_opts(fus, ref, check_params=False, rtol=0.5)  # same state keys and step counts
    # at least as accurate as torch's 16-bit run, measured against the fp32 run
    assert err_f <= err_t * 1.01, f"fused total error {err_f:.5g} > torch's {err_t:.5g}"
    assert max_f <= max_t + 2, f"fused max error {max_f} ulps vs torch's {max_t}"


MASTER_OPTS = {name: case.master_weights_options for name, case in PARITY.items()}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", NAMES)
def test_master_weights_follow_fp32_run(name, dtype):
    """master_weights=True: f32 master copy and f32 states; the 16-bit param is the rounding of an
    fp32 torch run fed the same grads (within 1 ulp: torch's sqrt)."""
    kw = MASTER_OPTS[name]
    p0 = make_params(6, dtype)
    p_f = clone_params(p0)
    p_32 = [torch.nn.Parameter(p.detach().float()) for p in p0]
    fus = FUSED[name](groups_of(p_f, name), master_weights=True, **kw)
    r32 = TORCH[name](groups_of(p_32, name), foreach=False, **kw)
    for t in range(20):
        set_fixed_grads(p_f, t, dtype=dtype, skip=has_grad)
        set_fixed_grads(p_32, t, dtype=dtype, skip=has_grad)
        fus.step()
        r32.step()
    for j, (a, x) in enumerate(zip(p_f, p_32)):
        assert a.dtype == dtype
        ulps = (as_int(a).int() - as_int(x.detach().to(dtype)).int()).abs().max().item()
        assert ulps <= (0 if name in SQRT_FREE else 1), f"param {j}: {ulps} ulps from the rounded fp32 run"
        st = fus.state[a]
        assert st["master_param"].dtype == torch.float32  # every param had grads by now
        if name in SQRT_FREE:
            assert_bitwise(st["master_param"], x.detach(), f"master {j}")
        else:
            assert_close(st["master_param"], x.detach(), f"master {j}")
        for k, v in r32.state[x].items():
            if k == "step":
                assert float(st[k]) == float(v)
            else:
                assert st[k].dtype == torch.float32, f"state {k} should be f32 with master weights"
                assert_close(st[k], v, f"param {j} state {k}", rtol=1e-5 if name in SQRT_FREE else 1e-4)


@pytest.mark.parametrize("how", ["no_grad_copy_", "data_assign", "data_copy_"])
def test_master_weights_respect_params_loaded_outside_the_optimizer(how):
    """master_weights=True: a checkpoint loaded into the 16-bit params mid-training wins over the
    f32 master copy (the next step starts from the loaded values, as torch's own 16-bit run does),
    however it is written: `with no_grad: p.copy_(v)` and `p.data = v` are noticed by themselves;
    the classic `p.data.copy_(v)` bypasses p's version counter and is announced with
    resync_master_weights()."""
    p_f = make_params(9, torch.bfloat16)
    p_t = clone_params(p_f)
    fus = FUSED["SGD"](p_f, lr=0.1, master_weights=True)
    tor = TORCH["SGD"](p_t, lr=0.1, foreach=False)
    run(fus, p_f, 3, grads=set_fixed_grads)
    run(tor, p_t, 3, grads=set_fixed_grads)
    ckpt = [torch.randn(p.shape, generator=torch.Generator().manual_seed(50 + j)).bfloat16()
            for j, p in enumerate(p_f)]
    for ps, mode in ((p_f, how), (p_t, "no_grad_copy_")):
        for p, v in zip(ps, ckpt):
            if mode == "no_grad_copy_":
                with torch.no_grad():
                    p.copy_(v)
            elif mode == "data_assign":
                p.data = v.clone()
            else:
                p.data.copy_(v)
    if how == "data_copy_":
        fus.resync_master_weights()
    run(fus, p_f, 1, start=3, grads=set_fixed_grads)
    run(tor, p_t, 1, start=3, grads=set_fixed_grads)
    for j, (a, r) in enumerate(zip(p_f, p_t)):
        ulps = ulp_err(a, r).max().item()  # torch rounds p - lr*g once, fused via the f32 master
        assert ulps <= 1, f"param {j}: {ulps} ulps from torch's run from the loaded values ({how})"


@pytest.mark.parametrize("flatten", [False, True], ids=["plain", "flat"])
@pytest.mark.parametrize("name", NAMES)
def test_master_weights_checkpoint_resume_is_exact(name, flatten):
    """state_dict (through torch.save/load) of a master_weights run, loaded into a new optimizer
    over params holding the same 16-bit values: the f32 master copy and f32 states survive the
    load (torch would cast them to the param dtype), so the resumed run is bit-identical to the
    uninterrupted one."""
    import io
    kw = MASTER_OPTS[name]
    p_a = make_params(0, torch.bfloat16)
    p_b = clone_params(p_a)
    a = FUSED[name](groups_of(p_a, name), master_weights=True, flatten=flatten, **kw)
    run(a, p_a, 6, grads=set_fixed_grads, skip=has_grad)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    with torch.no_grad():
        for x, y in zip(p_b, p_a):
            x.copy_(y)
    b = FUSED[name](groups_of(p_b, name), master_weights=True, flatten=flatten, **kw)
    b.load_state_dict(torch.load(buf))
    run(a, p_a, 6, start=6, grads=set_fixed_grads, skip=has_grad)
    run(b, p_b, 6, start=6, grads=set_fixed_grads, skip=has_grad)
    for j, (x, y) in enumerate(zip(p_a, p_b)):
        assert_bitwise(y.detach(), x.detach(), f"param {j}")
        assert a.state[x].keys() == b.state[y].keys()
        for k, v in a.state[x].items():
            assert b.state[y][k].dtype == v.dtype
            assert_bitwise(b.state[y][k], v, f"param {j} state {k}")
