"""FusedBertAdam against tools/bert_adam_reference.py's BertAdamReference (torch_npu NpuFusedBertAdam's formulas in
float32 torch ops; shared/docs/algorithms-more.md §1.2): no bias correction, the four warmup schedules, and
max_grad_norm clipping per (param group, dtype) buffer. The reference's clip norm is a float32 sum and the engine's
a double one, and torch 2.13's CPU float32 sqrt is not correctly rounded (§0): against the reference as it is the
results agree within a relative bound; without clipping and with an IEEE sqrt substituted in torch
(conftest.ieee_sqrt) bit for bit. The reference itself is checked against the formulas written out per element in
float64, and against HF pytorch-pretrained-bert 0.6.2's BertAdam where their semantics coincide (one param per group:
per-param clipping is per-buffer clipping; warmup_linear / warmup_constant, or no schedule). The shared scenarios are
twin_checks.py's."""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
import warnings
from pathlib import Path

import fusedopt
import numpy as np
import pytest
import twin_checks as checks
from conftest import assert_bitwise, assert_close, assert_unchanged, make_params, run, set_grads, snapshot

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from bert_adam_reference import BertAdamReference  # noqa: E402

T = torch.tensor


class Reference(BertAdamReference):
    """The reference as twin_checks builds a torch.optim class (it passes foreach=False, which has no meaning
    here)."""

    def __init__(self, params, foreach=None, **kw):
        super().__init__(params, **kw)


# Clipping on in every group (the defaults' 1.0, then 5.0 and 0.5: conftest's gradients have norms of a few units
# to a few tens per group), each group with its own schedule over t_total 80 (100 steps run past it).
BERT = checks.Twin(
    torch_cls=Reference,
    fused_cls=fusedopt.FusedBertAdam,
    base_kw=dict(lr=1e-2, warmup=0.1, t_total=80, weight_decay=0.01),
    group_kw=[dict(lr=3e-3, b1=0.8, max_grad_norm=5.0, schedule="warmup_cosine"),
              dict(lr=2e-2, weight_decay=0.0, e=1e-4, max_grad_norm=0.5, schedule="warmup_poly")],
    bitwise=False,
    rtol=1e-5,
    low_precision_kw=dict(e=1e-3),  # fp16 holds it; with 1e-6 an underflowed exp_avg_sq makes u = m / e explode
    scaler_bitwise=False,
)
# Without clipping and with torch's sqrt replaced by an IEEE one (tests that take the ieee_sqrt fixture).
EXACT = dataclasses.replace(
    BERT,
    base_kw=dict(BERT.base_kw, max_grad_norm=-1.0),
    group_kw=[dict(g, max_grad_norm=-1.0) for g in BERT.group_kw],
    bitwise=True,
    scaler_bitwise=True,
)

OPTION_SETS = {
    "defaults": dict(lr=1e-2),
    "no_clipping_no_decay": dict(lr=1e-2, max_grad_norm=-1.0, weight_decay=0.0),
    "warmup_linear": dict(lr=1e-2, warmup=0.1, t_total=60),
    "linear_without_warmup": dict(lr=1e-2, t_total=60),
    "warmup_constant": dict(lr=1e-2, warmup=0.2, t_total=60, schedule="warmup_constant"),
    "warmup_cosine": dict(lr=1e-2, warmup=0.1, t_total=60, schedule="warmup_cosine"),
    "warmup_poly": dict(lr=1e-2, warmup=0.05, t_total=60, schedule="warmup_poly", max_grad_norm=3.0),
    "betas_e": dict(lr=1e-2, b1=0.8, b2=0.99, e=1e-4, weight_decay=0.1),
}


@pytest.mark.parametrize("case", list(OPTION_SETS))
def test_matches_the_reference_100_steps(case):
    checks.check_parity(BERT, OPTION_SETS[case], [dict(lr=3e-3, max_grad_norm=2.0), dict(lr=2e-2, weight_decay=0.0)])


def test_mixed_schedules_and_clipping_per_group():
    checks.check_parity(BERT, BERT.base_kw)


@pytest.mark.parametrize("case", ["warmup_linear", "warmup_cosine", "warmup_poly", "betas_e"])
def test_bit_for_bit_without_clipping_with_ieee_sqrt(case, ieee_sqrt):
    kw = dict(OPTION_SETS[case], max_grad_norm=-1.0)
    checks.check_parity(EXACT, kw, [dict(g, max_grad_norm=-1.0) for g in EXACT.group_kw], steps=60)


def test_tensor_lr():
    """lr as a 1-element tensor: the engine takes float(lr) times the schedule in double, rounded once; the reference
    multiplies the f32 tensor by the factor (another rounding)."""
    kw = dict(lr=T(1e-2), t_total=50)
    checks.check_parity(BERT, kw, [dict(lr=T(3e-3)), dict(lr=T(2e-2), max_grad_norm=2.0)])


def _one_step_clip_factors(opt, params, grads):
    """From one step from zero state with b1 = 0.5: exp_avg = 0.5 * g * c, so c per param (in double)."""
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()
    return [float((opt.state[p]["exp_avg"].double() / (0.5 * g.double())).mean()) for p, g in zip(params, grads)]


def test_clipping_is_per_group_and_dtype_not_global_nor_per_param():
    """Two groups, each with f32 and bf16 params: every (group, dtype) buffer gets max_grad_norm / (||g|| + 1e-6)
    of its own gradients (master_weights keeps f32 states, so exp_avg shows the factor); neither the global
    factor nor a per-param one."""
    gen = torch.Generator().manual_seed(5)
    dtypes = [torch.float32, torch.bfloat16, torch.float32, torch.float32, torch.bfloat16]
    sizes = [40, 30, 20, 50, 10]
    scales = [1.0, 3.0, 0.5, 2.0, 0.1]
    params = [torch.nn.Parameter(torch.randn(n, generator=gen).to(d)) for n, d in zip(sizes, dtypes)]
    grads = [(s * torch.randn(n, generator=gen)).to(d) for n, s, d in zip(sizes, scales, dtypes)]
    opt = fusedopt.FusedBertAdam([{"params": params[:2]}, {"params": params[2:], "max_grad_norm": 4.0}], lr=1e-3,
                                 b1=0.5, max_grad_norm=2.0, master_weights=True)
    got = _one_step_clip_factors(opt, params, grads)
    buffers = {(0, torch.float32): [0], (0, torch.bfloat16): [1], (1, torch.float32): [2, 3],
               (1, torch.bfloat16): [4]}
    max_norm = {0: 2.0, 1: 4.0}
    want = [0.0] * len(params)
    for (group, _), members in buffers.items():
        norm = math.sqrt(sum(float(grads[i].double().square().sum()) for i in members))
        c = min(max_norm[group] / (norm + 1e-6), 1.0)
        for i in members:
            want[i] = c
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert want[4] == 1.0 and want[0] < 1.0  # a small buffer is not clipped, a large one is
    total = math.sqrt(sum(float(g.double().square().sum()) for g in grads))
    assert not math.isclose(want[2], 4.0 / total, rel_tol=1e-3)  # not global
    assert not math.isclose(want[2], 4.0 / float(grads[2].double().norm()), rel_tol=1e-3)  # not per param


def test_grad_is_left_as_it_is_while_the_reference_clips_it():
    """The reference writes the clipped gradient into .grad; the fused step only reads it."""
    p, q = torch.nn.Parameter(torch.ones(100)), torch.nn.Parameter(torch.ones(100))
    g = torch.linspace(-3, 3, 100)
    p.grad, q.grad = g.clone(), g.clone()
    fusedopt.FusedBertAdam([p], lr=1e-2).step()
    Reference([q], lr=1e-2).step()
    assert torch.equal(p.grad, g)
    assert_close(q.grad, g * (1.0 / (float(g.double().norm()) + 1e-6)), "reference's clipped grad", rtol=1e-6)
    assert_close(p.detach(), q.detach(), "param", rtol=1e-6)


def _schedule(name, x, warmup):
    """§1.2's formulas, with fusedopt's fixes (warmup -1 is 0, cosine with math.cos, poly 0 past 1)."""
    w = max(warmup, 0.0)
    if x < w:
        return x / w
    return {"warmup_linear": max((x - 1.0) / (w - 1.0), 0.0), "warmup_constant": 1.0,
            "warmup_cosine": 0.5 * (1.0 + math.cos(math.pi * x)),
            "warmup_poly": (1.0 - x) ** 0.5 if x < 1.0 else 0.0}[name]


@pytest.mark.parametrize("schedule", ["warmup_linear", "warmup_constant", "warmup_cosine", "warmup_poly"])
@pytest.mark.parametrize("warmup", [-1, 0.0, 0.25])
def test_each_step_moves_by_the_scheduled_lr(schedule, warmup):
    """b1 = b2 = 0, e = 0, no decay or clipping: u = g / |g| = -1 exactly, so step s (0-based) moves a zero param to
    f32(lr * schedule(s / t_total)), read before the step count's increment; past t_total too."""
    lr, t_total = 0.5, 20
    p = torch.nn.Parameter(torch.zeros(3))
    opt = fusedopt.FusedBertAdam([p], lr=lr, warmup=warmup, t_total=t_total, schedule=schedule, b1=0.0, b2=0.0,
                                 e=0.0, weight_decay=0.0, max_grad_norm=-1.0)
    for s in range(30):
        with torch.no_grad():
            p.zero_()  # so the step is exactly f32(lr_s)
        p.grad = torch.full((3,), -2.0)
        opt.step()
        want = np.float32(lr * _schedule(schedule, s / t_total, warmup))
        np.testing.assert_allclose(p.detach().double().numpy(), float(want), rtol=1e-6, atol=0, err_msg=f"step {s}")
        assert float(opt.state[p]["step"]) == s + 1


def test_the_step_count_is_per_param_and_a_resumed_run_continues_its_schedule():
    """state['step'] counts each param's own steps (the NPU class never increments it), and a state_dict loaded
    into a new optimizer continues the schedule where it stood: bit for bit the uninterrupted run."""
    kw = dict(lr=1e-2, warmup=0.2, t_total=30, schedule="warmup_linear")
    ps = make_params(3)
    full = fusedopt.FusedBertAdam(copy.deepcopy(ps), **kw)
    fparams = [p for g in full.param_groups for p in g["params"]]
    run(full, fparams, 20)
    half_params = copy.deepcopy(ps)
    half = fusedopt.FusedBertAdam(half_params, **kw)
    run(half, half_params, 10)
    counts = [float(half.state[p]["step"]) for p in half_params if p in half.state]
    assert counts and counts[0] == 10.0 and counts[1] < 10.0  # param 1 skips every third step
    resumed = fusedopt.FusedBertAdam(half_params, **kw)
    resumed.load_state_dict(copy.deepcopy(half.state_dict()))
    run(resumed, half_params, 10, start=10)
    for a, b in zip(half_params, fparams):
        assert_bitwise(a.detach(), b.detach(), "resumed vs uninterrupted")


def test_cosine_works_where_the_npu_class_raises():
    """NpuFusedBertAdam's warmup_cosine calls torch.cos on a float (TypeError); ours uses math.cos."""
    with pytest.raises(TypeError):
        torch.cos(math.pi * 0.5)
    checks.check_parity(BERT, dict(lr=1e-2, t_total=40, schedule="warmup_cosine"), steps=50)


def npu_formula(params, grads_per_step, lr, warmup=-1, t_total=-1, schedule="warmup_linear", b1=0.9, b2=0.999,
                e=1e-6, weight_decay=0.01, max_grad_norm=1.0):
    """§1.2 written out per element in Python floats (doubles), all params one buffer: the independent check of
    the reference."""
    p = [[float(x) for x in q] for q in params]
    m = [[0.0] * len(q) for q in p]
    v = [[0.0] * len(q) for q in p]
    for s, grads in enumerate(grads_per_step):
        gs = [[float(x) for x in g] for g in grads]
        if max_grad_norm > 0:
            c = max_grad_norm / (math.sqrt(sum(x * x for g in gs for x in g)) + 1e-6)
            if c < 1:
                gs = [[x * c for x in g] for g in gs]
        lr_s = lr if t_total == -1 else lr * _schedule(schedule, s / t_total, warmup)
        for j, g in enumerate(gs):
            for i, x in enumerate(g):
                m[j][i] = b1 * m[j][i] + (1 - b1) * x
                v[j][i] = b2 * v[j][i] + (1 - b2) * x * x
                u = m[j][i] / (math.sqrt(v[j][i]) + e)
                if weight_decay > 0:
                    u += weight_decay * p[j][i]
                p[j][i] -= lr_s * u
    return p, m, v


@pytest.mark.parametrize("case", ["defaults", "warmup_cosine", "warmup_poly", "no_clipping_no_decay"])
def test_reference_is_the_formula_in_float64(case):
    kw = dict(OPTION_SETS[case])
    if case == "warmup_poly":
        kw["t_total"] = 8  # the 10 steps run past it
    gen = torch.Generator().manual_seed(3)
    p0 = [torch.randn(n, generator=gen, dtype=torch.float64) for n in (17, 5)]
    steps = [[torch.randn(n, generator=gen, dtype=torch.float64) for n in (17, 5)] for _ in range(10)]
    ps = [torch.nn.Parameter(p.clone()) for p in p0]
    ref = BertAdamReference(ps, **kw)
    for grads in steps:
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        ref.step()
    want_p, want_m, want_v = npu_formula([p.tolist() for p in p0], [[g.tolist() for g in gs] for gs in steps], **kw)
    for j, p in enumerate(ps):
        np.testing.assert_allclose(p.detach().numpy(), want_p[j], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(ref.state[p]["exp_avg"].numpy(), want_m[j], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(ref.state[p]["exp_avg_sq"].numpy(), want_v[j], rtol=1e-12, atol=1e-14)
        assert float(ref.state[p]["step"]) == 10.0


HF_CASES = {
    "constant_lr": dict(lr=1e-2),
    "warmup_linear": dict(lr=1e-2, warmup=0.1, t_total=40),
    "linear_warmup_minus_one": dict(lr=1e-2, t_total=40),  # HF and fusedopt: warmup 0 (the NPU: (1 - x) / 2)
    "warmup_constant": dict(lr=1e-2, warmup=0.3, t_total=40, schedule="warmup_constant", b1=0.8, e=1e-4),
    "no_clipping_no_decay": dict(lr=1e-2, max_grad_norm=-1, weight_decay=0.0),
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_bert_adam_agrees_where_the_semantics_coincide(case):
    """HF pytorch-pretrained-bert 0.6.2's BertAdam clips each param by its own norm (clip_grad_norm_): with one
    param per group that is our per-(group, dtype) clipping. Its schedules match ours for warmup_linear and
    warmup_constant (its warmup_cosine is another formula; it has no warmup_poly). Its state keys are next_m and
    next_v; it runs the deprecated add_(Number, Tensor) overloads (a UserWarning)."""
    optimization = pytest.importorskip("pytorch_pretrained_bert.optimization")
    kw = HF_CASES[case]
    ps = make_params(4)
    theirs, ours, ref = (copy.deepcopy(ps) for _ in range(3))
    hf = optimization.BertAdam([{"params": [p]} for p in theirs], **kw)
    fus = fusedopt.FusedBertAdam([{"params": [p]} for p in ours], **kw)
    rf = BertAdamReference([{"params": [p]} for p in ref], **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t in range(50):
            for group in (theirs, ours, ref):
                set_grads(group, t)
            hf.step()
            fus.step()
            rf.step()
    for j, (a, b, r) in enumerate(zip(ours, theirs, ref)):
        # HF's clip factor comes from clip_grad_norm_'s float32 norm (ours: a float64 sum rounded once); over 50 steps
        # that difference reaches 1e-4 relative in a few elements near zero. A semantic difference would be far
        # larger (the NPU's warmup -1 halves the lr).
        assert_close(r.detach(), b.detach(), f"reference vs HF, param {j}", rtol=1e-4)
        assert_close(a.detach(), b.detach(), f"fused vs HF, param {j}", rtol=1e-4)
        if b in hf.state:
            assert_close(fus.state[a]["exp_avg"], hf.state[b]["next_m"], f"param {j} exp_avg", rtol=1e-4, floor=0.1)
            assert_close(fus.state[a]["exp_avg_sq"], hf.state[b]["next_v"], f"param {j} exp_avg_sq", rtol=1e-4)
            assert float(fus.state[a]["step"]) == hf.state[b]["step"]


def test_state_dict_round_trips_both_ways(ieee_sqrt):
    checks.check_state_dict_round_trips(EXACT, EXACT.base_kw)


def test_state_dict_round_trips_with_clipping():
    checks.check_state_dict_round_trips(BERT, BERT.base_kw)


def test_a_state_dict_with_an_int_step_loads():
    """The NPU class and HF keep state['step'] as a Python int: such a state_dict loads and continues."""
    ps = make_params(1)
    ref = Reference(ps, lr=1e-2)
    run(ref, ps, 3)
    sd = copy.deepcopy(ref.state_dict())
    for entry in sd["state"].values():
        entry["step"] = int(entry["step"].item())
    qs = copy.deepcopy(ps)
    fus = fusedopt.FusedBertAdam(qs, lr=1e-2)
    fus.load_state_dict(sd)
    run(fus, qs, 2, start=3)
    run(ref, ps, 2, start=3)
    for a, r in zip(qs, ps):
        assert_close(a.detach(), r.detach(), "param", rtol=1e-6)
    assert float(fus.state[qs[0]]["step"]) == 5.0


def _for_the_scaler(twin):
    """The GradScaler scenario checks that every step it takes moves the params (no warmup: its lr is 0 at step 0)
    and its bf16 params within 8 ulps of the reference's bf16 run, which rounds m, v and the update to bf16 op by
    op: lrs of 1e-3 keep that drift below the bound."""
    return dataclasses.replace(twin, base_kw=dict(twin.base_kw, warmup=-1, lr=1e-3),
                               group_kw=[dict(g, lr=1e-3) for g in twin.group_kw])


@pytest.mark.parametrize("kind", ["fusedopt", "torch"], ids=["fusedopt.GradScaler", "torch.amp.GradScaler"])
def test_grad_scaler_skips_and_follows_the_reference(kind, ieee_sqrt):
    checks.check_grad_scaler(_for_the_scaler(EXACT), kind)


@pytest.mark.parametrize("kind", ["fusedopt", "torch"], ids=["fusedopt.GradScaler", "torch.amp.GradScaler"])
def test_grad_scaler_with_clipping(kind):
    """The clip norm is that of the unscaled gradients, as after the reference's unscale_."""
    checks.check_grad_scaler(_for_the_scaler(BERT), kind)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_master_weights_follow_the_fp32_run(dtype):
    checks.check_master_weights(BERT, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_params_stay_close_to_the_references_16_bit_run(dtype):
    checks.check_low_precision_default(BERT, dtype)


def test_bf16_states():
    """state_dtype=torch.bfloat16: the moments in bf16; the params move as the f32 reference's do (the direction
    of the whole displacement, per param)."""
    ps = make_params(2)
    p0 = copy.deepcopy(ps)
    qs = copy.deepcopy(ps)
    fus = fusedopt.FusedBertAdam(ps, lr=1e-2, state_dtype=torch.bfloat16)
    ref = Reference(qs, lr=1e-2)
    for t in range(20):
        set_grads(ps, t, skip=lambda t, i: True)
        set_grads(qs, t, skip=lambda t, i: True)
        fus.step()
        ref.step()
    for a, r, s in zip(ps, qs, p0):
        assert fus.state[a]["exp_avg"].dtype == torch.bfloat16
        cos = torch.nn.functional.cosine_similarity((a - s).detach().flatten(), (r - s).detach().flatten(), dim=0)
        assert cos > 0.99, float(cos)


def test_accumulation_equals_one_step_on_the_mean_gradient():
    checks.check_accumulation(BERT)


def test_flatten_is_bit_identical():
    checks.check_flatten(BERT)


def test_thread_count_does_not_change_results():
    checks.check_thread_count(BERT)


def test_a_scheduler_drives_lr_as_in_the_reference():
    p_ref, p_fus, ref, fus = checks.pair(BERT, BERT.base_kw)
    s_ref = torch.optim.lr_scheduler.StepLR(ref, step_size=7, gamma=0.5)
    s_fus = torch.optim.lr_scheduler.StepLR(fus, step_size=7, gamma=0.5)
    for t in range(30):
        set_grads(p_ref, t)
        set_grads(p_fus, t)
        ref.step()
        fus.step()
        s_ref.step()
        s_fus.step()
    checks.compare_opts(fus, ref, "StepLR", rtol=BERT.rtol)


def test_constructor_errors_like_the_npu_class():
    """NpuFusedBertAdam's checks and texts (without its error-code suffix), its defaults and its required lr."""
    checks.check_constructor_errors(BERT, [
        dict(lr=-1.0), dict(lr=1e-2, warmup=-0.5), dict(lr=1e-2, warmup=1.0), dict(lr=1e-2, schedule="cosine"),
        dict(lr=1e-2, b1=1.0), dict(lr=1e-2, b1=-0.1), dict(lr=1e-2, b2=1.0), dict(lr=1e-2, e=-1e-6), dict(),
    ])
    for kw, text in ((dict(lr=-1.0), "Invalid learning rate: -1.0"), (dict(lr=1.0, warmup=2), "Invalid warmup: 2"),
                     (dict(lr=1.0, schedule="linear"), "Invalid schedule parameter: linear"),
                     (dict(lr=1.0, b1=1.5), "Invalid b1 parameter: 1.5"),
                     (dict(lr=1.0, b2=-0.5), "Invalid b2 parameter: -0.5"),
                     (dict(lr=1.0, e=-1.0), "Invalid epsilon value: -1.0"),
                     (dict(), "parameter group didn't specify a value of required optimization parameter lr")):
        with pytest.raises(ValueError) as e:
            fusedopt.FusedBertAdam([torch.nn.Parameter(torch.zeros(2))], **kw)
        assert str(e.value) == text
    # t_total 0 would divide by zero at the reference's first scheduled step: refused up front.
    with pytest.raises(ValueError, match=r"Invalid t_total: 0 \(must be -1 or > 0\)"):
        fusedopt.FusedBertAdam([torch.nn.Parameter(torch.zeros(2))], lr=1.0, t_total=0)
    with pytest.raises(TypeError, match="norm_type"):
        fusedopt.FusedBertAdam([torch.nn.Parameter(torch.zeros(2))], lr=1.0, norm_type=1.0)
    opt = fusedopt.FusedBertAdam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    assert opt.defaults == dict(lr=1e-3, schedule="warmup_linear", warmup=-1, t_total=-1, b1=0.9, b2=0.999, e=1e-6,
                                weight_decay=0.01, max_grad_norm=1.0)
    assert opt.max_grad_norm == 1.0 and opt._max_grad_norm == math.inf  # not the mixin's global clipping


@pytest.mark.parametrize("key,value", [("lr", -1.0), ("lr", math.nan), ("b1", 1.0), ("b2", -0.5), ("e", -1.0),
                                       ("warmup", 2.0), ("t_total", 0), ("schedule", "cosine"),
                                       ("max_grad_norm", math.nan), ("weight_decay", math.inf)])
def test_invalid_group_value_mid_training_changes_nothing(key, value):
    checks.check_invalid_group_value_changes_nothing(BERT, key, value)


def test_a_float64_param_sends_the_step_to_the_reference():
    """A param the engine cannot take (float64) makes that step the reference's for every param, so that each
    (group, dtype) buffer is clipped by its whole norm: the float32 params and the float64 one follow the
    reference."""
    kw = dict(lr=1e-2, warmup=0.1, t_total=20, max_grad_norm=2.0)
    ps = make_params(7, sizes=[(11,), (5, 3), (40,)])
    ps[1] = torch.nn.Parameter(ps[1].detach().double())
    qs = copy.deepcopy(ps)
    ours, ref = fusedopt.FusedBertAdam(ps, **kw), BertAdamReference(qs, **kw)
    with pytest.warns(UserWarning, match="reference's own"):
        for t in range(6):
            set_grads(ps, t, skip=lambda t, i: True)
            set_grads(qs, t, skip=lambda t, i: True)
            ours.step()
            ref.step()
    for j, (a, r) in enumerate(zip(ps, qs)):
        assert_close(a.detach(), r.detach(), f"param {j}", rtol=1e-5)
        for k in ("exp_avg", "exp_avg_sq"):
            assert_close(ours.state[a][k], ref.state[r][k], f"param {j} {k}", rtol=1e-5, floor=0.1)
        assert float(ours.state[a]["step"]) == 6.0


def test_strict_refuses_what_the_engine_cannot_take():
    with pytest.raises(TypeError, match="float64"):
        fusedopt.FusedBertAdam([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))], lr=1e-2, strict=True)


def test_accumulation_with_a_routed_param_and_clipping_is_refused_and_changes_nothing():
    ps = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]
    opt = fusedopt.FusedBertAdam(ps, lr=1e-2, accumulation_steps=2)
    for p in ps:
        p.grad = torch.ones_like(p)
    snap = snapshot(opt)
    with pytest.raises(ValueError, match="max_grad_norm"):
        opt.step()
    assert_unchanged(opt, snap, "refused accumulation")


def test_sparse_gradients_are_refused():
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.zeros(4).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        fusedopt.FusedBertAdam([p], lr=1e-2).step()


def test_is_exported_and_its_engine_keys_are_the_references():
    assert "FusedBertAdam" in fusedopt.__all__
    assert list(fusedopt._C.algorithms["bert_adam"]["state_names"]) == ["exp_avg", "exp_avg_sq"]
    ps = make_params(1, sizes=[(3,)])
    opt = fusedopt.FusedBertAdam(ps, lr=1e-2)
    run(opt, ps, 1)
    assert set(opt.state[ps[0]]) == {"step", "exp_avg", "exp_avg_sq"}
    assert opt.state[ps[0]]["step"].dtype == torch.float32
