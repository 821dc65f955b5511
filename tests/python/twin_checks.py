"""Scenarios shared by the tests of the optimizers added after the first five (their own test_<algo>.py files; those
without a torch.optim twin against their reference scripts): each runs a fused class and its reference
(torch.optim's single-tensor path, foreach=False, where there is one) on conftest's problem and compares params
and every state entry, with each algorithm's own option sets. The cross-cutting suites (test_parity.py,
test_amp.py, test_api.py, ...) run the torch.optim twins through conftest.NAMES and algorithm_cases.py's table
as well.

`Twin` says what a scenario needs of one algorithm: the two classes, the options of a typical run, the
per-group overrides, and whether torch's for-loop is reproduced bit for bit (no sqrt, or an IEEE sqrt
substituted with conftest's ieee_sqrt fixture) or only within `rtol` (torch's non-IEEE f32 sqrt).
"""

from __future__ import annotations

import copy
import io
import math
from dataclasses import dataclass, field

from conftest import (
    ULP_BOUND,
    as_int,
    assert_bitwise,
    assert_close,
    assert_unchanged,
    clone_params,
    compare_opts,
    groups_of,
    has_grad,
    make_params,
    run,
    set_fixed_grads,
    set_grads,
    snapshot,
    ulp_err,
)

import torch

T = torch.tensor


@dataclass
class Twin:
    torch_cls: type
    fused_cls: type
    base_kw: dict  # a typical option set (weight decay on)
    group_kw: list  # overrides of groups 1 and 2
    bitwise: bool  # torch's for-loop reproduced bit for bit as it is (no sqrt in the rule)
    rtol: float = 1e-5  # otherwise: the bound on relative differences after 100 steps
    low_precision_kw: dict = field(default_factory=dict)  # extra options of the 16-bit runs
    # ulp bounds of the 16-bit runs against torch's own 16-bit run, where a rule's torch ops round the
    # param more than once per step (NAdam's two addcdiv_): None takes conftest.ULP_BOUND
    low_precision_ulps: dict | None = None
    # the reference keeps a per-param state['step'] (torch.optim's twins); SGD-like ones (LARS) do not
    counts_steps: bool = True
    # the GradScaler scenario's fp32 params and states equal the reference's bit for bit with an IEEE sqrt
    # (False: within rtol, where the engine sums in another order than the reference, as AdamP's projection)
    scaler_bitwise: bool = True


def fresh(kw: dict) -> dict:
    """A copy of option dicts whose tensor hyper-parameters are new tensors (torch and schedulers may
    write into them)."""
    out = {}
    for k, v in kw.items():
        if isinstance(v, torch.Tensor):
            v = v.clone()
        elif isinstance(v, tuple) and v and isinstance(v[0], torch.Tensor):
            v = tuple(b.clone() for b in v)
        out[k] = v
    return out


def pair(twin: Twin, kw: dict, group_kw=None, seed: int = 0, **fused_kw):
    """(torch params, fused params, torch optimizer, fused optimizer) over the same start values."""
    gk = twin.group_kw if group_kw is None else group_kw
    p_ref = make_params(seed)
    p_fus = clone_params(p_ref)
    ref = twin.torch_cls(groups_of(p_ref, group_kw=[fresh(g) for g in gk]), foreach=False, **fresh(kw))
    fus = twin.fused_cls(groups_of(p_fus, group_kw=[fresh(g) for g in gk]), **fresh(kw), **fused_kw)
    return p_ref, p_fus, ref, fus


def train_both(p_ref, p_fus, ref, fus, steps: int, start: int = 0, maximize: bool = False):
    sign = -1.0 if maximize else 1.0
    for t in range(start, start + steps):
        set_grads(p_ref, t, sign=sign)
        set_grads(p_fus, t, sign=sign)
        ref.step()
        fus.step()


def check_parity(twin: Twin, kw: dict, group_kw=None, steps: int = 100, bitwise: bool | None = None):
    """`steps` steps of the multi-group problem (params skip steps, one starts late): params, states and
    step counts as torch's."""
    p_ref, p_fus, ref, fus = pair(twin, kw, group_kw)
    train_both(p_ref, p_fus, ref, fus, steps, maximize=bool(kw.get("maximize")))
    exact = twin.bitwise if bitwise is None else bitwise
    compare_opts(fus, ref, f"{twin.fused_cls.__name__}{kw}", rtol=twin.rtol, bitwise=exact)
    assert any(not torch.equal(a, b) for a, b in zip(p_fus, make_params(0))), "nothing moved"
    for a, r in zip(p_fus, p_ref):
        if r in ref.state and "step" in ref.state[r]:
            assert float(fus.state[a]["step"]) == float(ref.state[r]["step"])
        elif not twin.counts_steps:
            assert "step" not in fus.state.get(a, {})


def check_state_dict_round_trips(twin: Twin, kw: dict):
    """torch -> fused and fused -> torch, before any step (empty state) and after 5 steps; the loaded
    optimizer then continues exactly as the one it was loaded from."""
    for warmup in (0, 5):
        # torch -> fused
        p_ref, p_fus, ref, fus = pair(twin, kw)
        run(ref, p_ref, warmup)
        for p, r in zip(p_fus, p_ref):
            p.data.copy_(r.detach())
        fus.load_state_dict(copy.deepcopy(ref.state_dict()))
        assert fus.state_dict()["param_groups"] == ref.state_dict()["param_groups"]
        train_both(p_ref, p_fus, ref, fus, 5, start=warmup)
        compare_opts(fus, ref, f"torch -> fused after {warmup} steps", rtol=twin.rtol, bitwise=twin.bitwise)
        # fused -> torch
        p_ref, p_fus, ref, fus = pair(twin, kw)
        run(fus, p_fus, warmup)
        for p, r in zip(p_fus, p_ref):
            r.data.copy_(p.detach())
        sd = fus.state_dict()
        for entry in sd["state"].values():  # torch's own keys and types, nothing of ours
            if twin.counts_steps:
                assert isinstance(entry["step"], torch.Tensor) and entry["step"].dtype == torch.float32
            else:
                assert "step" not in entry
        ref.load_state_dict(copy.deepcopy(sd))
        train_both(p_ref, p_fus, ref, fus, 5, start=warmup)
        compare_opts(fus, ref, f"fused -> torch after {warmup} steps", rtol=twin.rtol, bitwise=twin.bitwise)


def check_grad_scaler(twin: Twin, kind: str):
    """test_amp.py's scripted sequence (inf/nan injected into fp32 and bf16 grads, back-off, growth):
    skipped steps change nothing, fp32 params and states follow torch + torch.amp.GradScaler bit for
    bit (with an IEEE sqrt in torch where the rule has one), bf16 params within the 16-bit bound."""
    from test_amp import EXPECTED_SCALE, INJECT, STEPS, _compare_params, _params, _scaled_grads, _scaler

    p_ref = _params()
    p_fus = clone_params(p_ref)
    ref = twin.torch_cls(groups_of(p_ref, group_kw=twin.group_kw), foreach=False, **twin.base_kw)
    fus = twin.fused_cls(groups_of(p_fus, group_kw=twin.group_kw), **twin.base_kw)
    s_ref, s_fus = _scaler("torch"), _scaler(kind)
    scales = []
    for t in range(STEPS):
        _scaled_grads(p_ref, t, s_ref)
        _scaled_grads(p_fus, t, s_fus)
        snap = snapshot(fus)
        s_ref.step(ref)
        s_fus.step(fus)
        s_ref.update()
        s_fus.update()
        scales.append(s_fus.get_scale())
        if t in INJECT:
            assert_unchanged(fus, snap, f"step {t} (overflow)")
        else:
            assert any(not torch.equal(a, b) for a, b in zip(p_fus, snap[0])), f"step {t} was not taken"
        if twin.scaler_bitwise:
            _compare_params(p_fus, p_ref, f"step {t}")
        else:
            for j, (a, r) in enumerate(zip(p_fus, p_ref)):
                if a.dtype == torch.float32:
                    assert_close(a.detach(), r.detach(), f"step {t} param {j}", rtol=twin.rtol)
                else:
                    assert ulp_err(a, r).max().item() <= ULP_BOUND[a.dtype], f"step {t} param {j}"
    assert scales == EXPECTED_SCALE
    for j, (a, r) in enumerate(zip(p_fus, p_ref)):
        if twin.counts_steps:
            assert float(fus.state[a]["step"]) == float(ref.state[r]["step"])
        for k, v in ref.state[r].items():
            if k != "step" and v.dtype == torch.float32 and twin.scaler_bitwise:
                assert_bitwise(fus.state[a][k], v, f"param {j} state {k}")
            elif k != "step":
                assert fus.state[a][k].dtype == v.dtype and bool(fus.state[a][k].isfinite().all())


def check_master_weights(twin: Twin, dtype: torch.dtype):
    """master_weights=True with 16-bit params: f32 master copy and f32 states follow an fp32 torch run
    fed the same (16-bit) grads; the param is the master's rounding."""
    kw = {**twin.base_kw, **twin.low_precision_kw}
    p0 = make_params(6, dtype)
    p_f = clone_params(p0)
    p_32 = [torch.nn.Parameter(p.detach().float()) for p in p0]
    fus = twin.fused_cls(groups_of(p_f, group_kw=twin.group_kw), master_weights=True, **kw)
    r32 = twin.torch_cls(groups_of(p_32, group_kw=twin.group_kw), foreach=False, **kw)
    for t in range(20):
        set_fixed_grads(p_f, t, dtype=dtype, skip=has_grad)
        set_fixed_grads(p_32, t, dtype=dtype, skip=has_grad)
        fus.step()
        r32.step()
    for j, (a, x) in enumerate(zip(p_f, p_32)):
        assert a.dtype == dtype
        st = fus.state[a]
        assert st["master_param"].dtype == torch.float32
        assert torch.equal(a.detach(), st["master_param"].to(dtype)), f"param {j} is not its master's rounding"
        ulps = (as_int(a).int() - as_int(x.detach().to(dtype)).int()).abs().max().item()
        assert ulps <= (0 if twin.bitwise else 1), f"param {j}: {ulps} ulps from the rounded fp32 run"
        if twin.bitwise:
            assert_bitwise(st["master_param"], x.detach(), f"master {j}")
        else:
            assert_close(st["master_param"], x.detach(), f"master {j}", rtol=twin.rtol)
        for k, v in r32.state[x].items():
            if k == "step":
                assert float(st[k]) == float(v)
            else:
                assert st[k].dtype == torch.float32
                assert_close(st[k], v, f"param {j} state {k}", rtol=max(twin.rtol, 1e-5))


def check_low_precision_default(twin: Twin, dtype: torch.dtype):
    """16-bit params without master weights: params and states stay in their dtype, as torch keeps
    them, within test_parity's ulp bound of torch's own 16-bit run."""
    kw = {**twin.base_kw, **twin.low_precision_kw}
    p0 = make_params(5, dtype)
    p_t, p_f = clone_params(p0), clone_params(p0)
    ref = twin.torch_cls(groups_of(p_t, group_kw=twin.group_kw), foreach=False, **kw)
    fus = twin.fused_cls(groups_of(p_f, group_kw=twin.group_kw), **kw)
    for t in range(10):
        for ps in (p_t, p_f):
            set_fixed_grads(ps, t, dtype=dtype, skip=has_grad)
        ref.step()
        fus.step()
    for j, (a, r) in enumerate(zip(p_f, p_t)):
        assert a.dtype == dtype
        for k, v in fus.state[a].items():
            if k != "step":  # (a 0-d scalar state, NAdam's mu_product, stays f32 as torch's)
                want = ref.state[r][k].dtype
                assert v.dtype == want, f"state {k} is {v.dtype}, torch keeps it in {want}"
                assert want == dtype or v.dim() == 0
        u = ulp_err(a, r).max().item()
        bound = (twin.low_precision_ulps or ULP_BOUND)[dtype]
        assert u <= bound, f"param {j}: {u} {dtype} ulps from torch's {dtype} run"
    compare_opts(fus, ref, check_params=False, rtol=0.5)  # same state keys and step counts


def check_max_grad_norm(twin: Twin, norm_type: float):
    """max_grad_norm= equals torch's clip_grad_norm_ then step; no gradient is written."""
    p_ref, p_fus, ref, fus = pair(twin, twin.base_kw, max_grad_norm=1.0, norm_type=norm_type)
    for t in range(8):
        set_grads(p_ref, t, skip=lambda t, i: True)
        set_grads(p_fus, t, skip=lambda t, i: True)
        grads = [p.grad.clone() for p in p_fus]
        fus.step()
        want = torch.nn.utils.clip_grad_norm_(p_ref, 1.0, norm_type=norm_type, foreach=False)
        ref.step()
        assert math.isclose(fus.last_grad_norm, want.item(), rel_tol=1e-6)
        for p, g in zip(p_fus, grads):
            assert torch.equal(p.grad, g), "the fused clip wrote a gradient"
    # torch scales the grads in place (one rounding more than the fused step's folded factor)
    compare_opts(fus, ref, f"max_grad_norm norm_type={norm_type}", rtol=max(twin.rtol, 1e-5))


def check_max_grad_norm_skips_non_finite(twin: Twin):
    params = make_params(3)
    opt = twin.fused_cls(params, max_grad_norm=1.0, **twin.base_kw)
    run(opt, params, 2, skip=lambda t, i: True)
    snap = snapshot(opt)
    set_grads(params, 2, skip=lambda t, i: True)
    params[2].grad[17] = float("nan")
    opt.step()
    assert math.isnan(opt.last_grad_norm)
    assert_unchanged(opt, snap, "a step with a NaN gradient")


def check_accumulation(twin: Twin, k: int = 3):
    """accumulation_steps=k equals one torch step on the mean of the k micro-batch gradients."""
    ours = make_params(4, sizes=[(7,), (40000,), (33, 17)])
    ref = clone_params(ours)
    opt = twin.fused_cls(ours, accumulation_steps=k, **twin.base_kw)
    topt = twin.torch_cls(ref, foreach=False, **twin.base_kw)
    for step in range(4):
        total = [torch.zeros(p.shape, dtype=torch.float64) for p in ref]
        for micro in range(k):
            set_fixed_grads(ours, 10 * step + micro)
            for t, p in zip(total, ours):
                t += p.grad.double()
            before = [p.detach().clone() for p in ours]
            opt.step()
            opt.zero_grad()
            if micro < k - 1:
                assert all(torch.equal(p, b) for p, b in zip(ours, before)), "updated inside a window"
        for p, t in zip(ref, total):
            p.grad = (t / k).float()
        topt.step()
    for j, (a, b) in enumerate(zip(ours, ref)):
        assert_close(a.detach(), b.detach(), f"param {j}", rtol=1e-5)
    if twin.counts_steps:
        assert opt.state[ours[0]]["step"].item() == 4


def check_flatten(twin: Twin):
    """flatten=True (fp32 and bf16 params, a mixed-dtype group) is bit-identical to the plain fused
    optimizer; both match torch."""
    def params(seed=0):
        return make_params(seed) + make_params(seed + 1, torch.bfloat16, sizes=[(3,), (100,), (2, 9)])

    p_flat = params()
    p_plain = clone_params(p_flat)
    p_torch = clone_params(p_flat)
    flat = twin.fused_cls(groups_of(p_flat, group_kw=twin.group_kw), flatten=True, **twin.base_kw)
    plain = twin.fused_cls(groups_of(p_plain, group_kw=twin.group_kw), **twin.base_kw)
    tor = twin.torch_cls(groups_of(p_torch, group_kw=twin.group_kw), foreach=False, **twin.base_kw)
    for t in range(12):
        for ps in (p_flat, p_plain, p_torch):
            set_grads(ps, t)
        flat.step()
        plain.step()
        tor.step()
    for j, (a, b) in enumerate(zip(p_flat, p_plain)):
        assert_bitwise(a.detach(), b.detach(), f"flat vs plain param {j}")
        for k, v in plain.state[b].items():
            assert_bitwise(flat.state[a][k], v, f"flat vs plain param {j} state {k}")
    fp32 = [j for j, p in enumerate(p_flat) if p.dtype == torch.float32]
    for j in fp32:
        a, r = p_flat[j], p_torch[j]
        if twin.bitwise:
            assert_bitwise(a.detach(), r.detach(), f"flat vs torch param {j}")
        else:
            assert_close(a.detach(), r.detach(), f"flat vs torch param {j}", rtol=twin.rtol)
    # a checkpoint of the flat optimizer loads into torch's
    back = twin.torch_cls(groups_of(clone_params(p_flat), group_kw=twin.group_kw), foreach=False, **twin.base_kw)
    buf = io.BytesIO()
    torch.save(flat.state_dict(), buf)
    buf.seek(0)
    back.load_state_dict(torch.load(buf))


def check_thread_count(twin: Twin):
    """1 and 2 threads give identical bits (the engine splits work by ATen's grain)."""
    runs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        ps = make_params(3, sizes=[(70000,), (5,), (33000,)])
        opt = twin.fused_cls(groups_of(ps, group_kw=twin.group_kw), **twin.base_kw)
        run(opt, ps, 4, skip=lambda t, i: True)
        runs.append((ps, opt))
    for j, (a, b) in enumerate(zip(runs[0][0], runs[1][0])):
        assert_bitwise(a.detach(), b.detach(), f"1 vs 2 threads, param {j}")
        for k, v in runs[0][1].state[a].items():
            assert_bitwise(runs[1][1].state[b][k], v, f"1 vs 2 threads, param {j} state {k}")


def check_flags_and_sparse(twin: Twin):
    """torch's flags are taken and kept (foreach, capturable=False, differentiable=False), fused= is
    refused as torch refuses it, and a sparse gradient raises torch's own error."""
    p = torch.nn.Parameter(torch.zeros(4))
    for kw in (dict(foreach=True), dict(foreach=False), dict(capturable=False), dict(differentiable=False),
               dict(maximize=True)):
        ours = twin.fused_cls([p], **kw)
        theirs = twin.torch_cls([p], **kw)
        assert ours.defaults == theirs.defaults
    for make in (twin.torch_cls, twin.fused_cls):
        try:
            make([p], fused=True)
        except TypeError as e:
            assert "fused" in str(e)
        else:
            raise AssertionError(f"{make.__name__} took fused=True")
    msgs = []
    for make in (twin.torch_cls, twin.fused_cls):
        q = torch.nn.Parameter(torch.zeros(4))
        q.grad = torch.zeros(4).to_sparse()
        try:
            make([q]).step()
        except RuntimeError as e:
            msgs.append(str(e))
    assert len(msgs) == 2 and msgs[1] == f"parameter 0 of group 0: {msgs[0]}", msgs  # named (issue #29 item 11)


def check_constructor_errors(twin: Twin, bad: list):
    """Invalid constructor arguments raise what torch raises, with torch's text."""
    for kw in bad:
        errors = []
        for make in (twin.torch_cls, twin.fused_cls):
            try:
                make([torch.nn.Parameter(torch.zeros(2))], **kw)
            except Exception as e:  # any type: compared with torch's
                errors.append((type(e), str(e)))
            else:
                errors.append(None)
        assert errors[0] is not None, f"torch accepts {kw}"
        assert errors[0] == errors[1], f"{kw}: {errors[1]} vs torch's {errors[0]}"


def check_invalid_group_value_changes_nothing(twin: Twin, key: str, value):
    """A group hyper-parameter that torch's constructor would refuse, set mid-training: the fused step
    raises ValueError naming it and changes nothing; fixed, training goes on as torch's."""
    p_ref, p_fus, ref, fus = pair(twin, twin.base_kw)
    run(ref, p_ref, 10)
    run(fus, p_fus, 10)
    set_grads(p_fus, 10)
    snap = snapshot(fus)
    good = fus.param_groups[1][key]
    fus.param_groups[1][key] = value
    try:
        fus.step()
    except ValueError as e:
        assert key.rstrip("s") in str(e) or key in str(e), str(e)
    else:
        raise AssertionError(f"{key}={value!r} was accepted")
    assert_unchanged(fus, snap, f"{key}={value!r}")
    fus.param_groups[1][key] = good
    run(ref, p_ref, 5, start=10)
    run(fus, p_fus, 5, start=10)
    compare_opts(fus, ref, f"after a rejected {key}", rtol=twin.rtol, bitwise=twin.bitwise)
