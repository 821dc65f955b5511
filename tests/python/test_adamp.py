"""FusedAdamP against clovaai's adamp.AdamP (0.3.0, the pip reference; torch_npu's NpuFusedAdamP ports it) and
tools/adamp_reference.py's AdampReference, its op-for-op copy with torch.optim's tensor state['step'] (checked bit
for bit against adamp.AdamP here; shared/docs/algorithms-more.md §1.1). The projection's per-row sums are the
engine's (double, fixed order) where the reference sums float32 in ATen's order, and torch's float32 sqrt is not
correctly rounded, so the runs agree within 1e-5 relative rather than bit for bit; the projection's branch (channel,
layer, none) is the reference's: the gradients here either are tangent to the params, per channel row or per
layer, or have a large radial part, far from the thresholds. The shared scenarios are twin_checks.py's, with
delta=10 so that every param of more than one dimension is projected per channel on every step."""

from __future__ import annotations

import copy
import math
import sys
import warnings
from pathlib import Path

import fusedopt
import pytest
import twin_checks as checks
from conftest import (
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from adamp_reference import AdampReference  # noqa: E402

T = torch.tensor


def reference(params, foreach=None, **kw):
    """AdampReference, taking (and ignoring) the foreach flag the shared scenarios pass to torch.optim twins."""
    return AdampReference(params, **kw)


ADAMP = checks.Twin(
    torch_cls=reference,
    fused_cls=fusedopt.FusedAdamP,
    base_kw=dict(lr=1e-2, weight_decay=1e-2, delta=10.0),
    group_kw=[dict(lr=3e-3, betas=(0.8, 0.99), nesterov=True, wd_ratio=0.5),
              dict(lr=2e-2, weight_decay=0.0, eps=1e-6, delta=0.1)],
    bitwise=False,
    rtol=1e-5,
    low_precision_kw=dict(eps=1e-3),  # fp16 holds it (1e-8 is subnormal there)
    scaler_bitwise=False,  # the projection's sums are the engine's, in another order than torch's
    # the reference's fp16 run rounds the projection's p_n, products and row sums to fp16 (18 fp16 ulps from an
    # f32 run after 10 steps on the (33, 17) param); the engine rounds once from f32 (2; see below)
    low_precision_ulps={torch.bfloat16: 8, torch.float16: 24},
)


def tangent_grads(params, t, per_row=True, seed=5):
    """Gradients tangent to each param of more than one dimension: noise minus its radial part, per channel row
    (per_row) or for the whole tensor, as a scale-invariant weight (one before a normalization) gets them; noise
    for the others. Computed in double from the param's current value, rounded once."""
    for i, p in enumerate(params):
        h = torch.randn(p.shape, generator=torch.Generator().manual_seed(seed * 1009 + 31 * t + i), dtype=torch.float64)
        if p.dim() > 1:
            x = p.detach().double().reshape(p.shape[0] if per_row else 1, -1)
            hh = h.reshape(x.shape)
            hh = hh - (hh * x).sum(1, keepdim=True) / (x * x).sum(1, keepdim=True) * x
            h = hh.reshape(p.shape)
        g = torch.empty_like(p, memory_format=torch.preserve_format)  # the param's layout
        g.copy_(h.to(p.dtype))
        p.grad = g


def layer_tangent_grads(params, t):
    tangent_grads(params, t, per_row=False)


GRADS = {"channel": tangent_grads, "layer": layer_tangent_grads, "radial": set_grads}
OPTION_SETS = {
    "default": dict(lr=1e-2),
    "weight_decay": dict(lr=1e-2, weight_decay=1e-2),
    "wd_ratio": dict(lr=1e-2, weight_decay=0.1, wd_ratio=0.5),
    "nesterov": dict(lr=1e-2, nesterov=True, weight_decay=1e-2),
    "betas_eps_delta": dict(lr=5e-3, betas=(0.8, 0.99), eps=1e-6, delta=0.05),
    # √bc2 is exactly 1 from step 25 on, where the engine leaves its division out
    "late_steps": dict(lr=1e-2, betas=(0.5, 0.5)),
}


def train(opt, params, steps, grads, start=0):
    for t in range(start, start + steps):
        grads(params, t)
        opt.step()


def projected(opt, params, grads):
    """Which params the reference projects on a fresh step: 'channel', 'layer' or None each."""
    out = []
    for p in params:
        if p.dim() <= 1:
            out.append(None)
            continue
        g = opt.param_groups[0]
        grads([p], 0)
        kinds = [("channel", p.shape[0]), ("layer", 1)]
        kind = None
        for name, rows in kinds:
            cos = torch.nn.functional.cosine_similarity(p.grad.reshape(rows, -1), p.detach().reshape(rows, -1), dim=1,
                                                        eps=g["eps"]).abs_()
            if cos.max() < g["delta"] / math.sqrt(p.numel() / rows):
                kind = name
                break
        out.append(kind)
    return out


@pytest.mark.parametrize("grads", list(GRADS))
@pytest.mark.parametrize("case", list(OPTION_SETS))
def test_matches_the_reference_100_steps(case, grads):
    kw = OPTION_SETS[case]
    p_ref = make_params(0)
    p_fus = clone_params(p_ref)
    ref = AdampReference(p_ref, **kw)
    fus = fusedopt.FusedAdamP(p_fus, **kw)
    want = {"channel": "channel", "layer": "layer", "radial": None}[grads]
    assert [k for k, p in zip(projected(ref, clone_params(p_ref), GRADS[grads]), p_ref) if p.dim() > 1] == [want] * 2
    for t in range(100):
        GRADS[grads](p_ref, t)
        GRADS[grads](p_fus, t)
        ref.step()
        fus.step()
    compare_opts(fus, ref, f"{case} {grads}", rtol=1e-5)


@pytest.mark.parametrize("grads", list(GRADS))
def test_the_reference_is_adamp_bit_for_bit(grads):
    """AdampReference is clovaai's adamp.AdamP op for op (the step count aside: a tensor, not an int)."""
    adamp = pytest.importorskip("adamp")
    for kw in (dict(lr=1e-2, weight_decay=1e-2), dict(lr=1e-2, nesterov=True, weight_decay=0.1, wd_ratio=0.3),
               dict(lr=1e-2, delta=10.0)):
        p_a = make_params(1)
        p_r = clone_params(p_a)
        theirs, ours = adamp.AdamP(p_a, **kw), AdampReference(p_r, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for t in range(30):
                GRADS[grads](p_a, t)
                GRADS[grads](p_r, t)
                theirs.step()
                ours.step()
        for j, (a, r) in enumerate(zip(p_a, p_r)):
            assert_bitwise(r.detach(), a.detach(), f"{kw} param {j}")
            if a in theirs.state:
                for k in ("exp_avg", "exp_avg_sq"):
                    assert_bitwise(ours.state[r][k], theirs.state[a][k], f"{kw} param {j} {k}")
                assert float(ours.state[r]["step"]) == theirs.state[a]["step"]


def test_pytorch_optimizer_adamp_agrees_where_its_formula_is_ours():
    """pytorch-optimizer 4.1.0's AdamP divides by (sqrt(v) + eps) / sqrt(1 - b2^t) (clovaai: sqrt(v) / sqrt(1 -
    b2^t) + eps) and counts one step per group; with eps=0 and a grad for every param on every step it is the same
    update (its exp_avg is a lerp, its denominator a reciprocal: rounding only)."""
    pytorch_optimizer = pytest.importorskip("pytorch_optimizer")
    sizes = [(7,), (33, 17), (4, 3, 5)]
    for grads in (tangent_grads, layer_tangent_grads):
        kw = dict(lr=1e-2, weight_decay=1e-2, eps=0.0)
        p_ours, p_theirs = make_params(2, sizes=sizes), make_params(2, sizes=sizes)
        ours = fusedopt.FusedAdamP(p_ours, **kw)
        theirs = pytorch_optimizer.AdamP(p_theirs, foreach=False, **kw)
        train(ours, p_ours, 20, grads)
        train(theirs, p_theirs, 20, grads)
        for j, (a, b) in enumerate(zip(p_ours, p_theirs)):
            assert_close(a.detach(), b.detach(), f"{grads.__name__} param {j}", rtol=1e-5)


def test_one_step_by_hand():
    """Rows tangent to their param: the channel view projects. Step 1 from zero state: m = 0.1 g,
    v = 0.001 g^2, u = m / (sqrt(v) / sqrt(0.001) + eps) (about sign(g)), then per row u -= p_n * (p_n . u) with
    p_n = p / (|p_r| + eps), then p *= 1 - lr * wd * wd_ratio and p -= lr / 0.1 * u."""
    p0 = T([[3.0, 4.0, 0.0], [1.0, -2.0, 2.0]], dtype=torch.float64)
    g = T([[4.0, -3.0, 1.0], [2.0, 1.0, 0.0]], dtype=torch.float64)
    assert bool(((g * p0).sum(1) == 0).all())
    p = torch.nn.Parameter(p0.float())
    opt = fusedopt.FusedAdamP([p], lr=0.1, weight_decay=0.5, wd_ratio=0.2)
    p.grad = g.float()
    opt.step()
    m, v = 0.1 * g, 0.001 * g * g
    u = m / (v.sqrt() / math.sqrt(0.001) + 1e-8)
    p_n = p0 / (p0.norm(dim=1, keepdim=True) + 1e-8)
    u = u - p_n * (p_n * u).sum(1, keepdim=True)
    want = p0 * (1 - 0.1 * 0.5 * 0.2) - 0.1 / 0.1 * u
    assert_close(p.detach(), want.float(), "one step", rtol=1e-6)
    assert torch.equal(p.grad, g.float()), "the gradient was written"
    assert float(opt.state[p]["step"]) == 1.0


def test_one_dimensional_params_are_never_projected():
    """A 1-D param whose gradient is tangent to it takes Adam's step and the full decay (wd_ratio 1); the same
    values as a (1, n) param are projected (a layer of one channel) and decayed by wd_ratio."""
    x = T([3.0, 4.0, 0.0])
    g = T([4.0, -3.0, 2.0])
    flat, row = torch.nn.Parameter(x.clone()), torch.nn.Parameter(x.clone().reshape(1, 3))
    opt = fusedopt.FusedAdamP([flat, row], lr=0.1, weight_decay=0.5)
    flat.grad, row.grad = g.clone(), g.clone().reshape(1, 3)
    opt.step()
    ref_flat, ref_row = torch.nn.Parameter(x.clone()), torch.nn.Parameter(x.clone().reshape(1, 3))
    ref = AdampReference([ref_flat, ref_row], lr=0.1, weight_decay=0.5)
    ref_flat.grad, ref_row.grad = g.clone(), g.clone().reshape(1, 3)
    ref.step()
    assert_close(flat.detach(), ref_flat.detach(), "1-D", rtol=1e-6)
    assert_close(row.detach(), ref_row.detach(), "(1, 3)", rtol=1e-6)
    assert not torch.allclose(flat.detach(), row.detach().reshape(3)), "the (1, 3) param was not projected"


def test_layouts_other_than_row_major_take_the_reference_step():
    """The engine projects channel rows that are contiguous in memory: a channels_last conv weight (dimension 0
    outermost) is fused; a transposed matrix (rows strided) takes the reference's step, with a warning."""
    conv = torch.randn(8, 3, 3, 3, generator=torch.Generator().manual_seed(3)).to(memory_format=torch.channels_last)
    mat = torch.randn(6, 10, generator=torch.Generator().manual_seed(4)).t()
    assert not conv.is_contiguous() and not mat.is_contiguous()
    p_f = [torch.nn.Parameter(conv.clone(memory_format=torch.preserve_format)),
           torch.nn.Parameter(mat.clone(memory_format=torch.preserve_format))]
    p_r = [torch.nn.Parameter(t.clone()) for t in (conv, mat)]
    fus = fusedopt.FusedAdamP(p_f, lr=1e-2, weight_decay=1e-2)
    ref = AdampReference(p_r, lr=1e-2, weight_decay=1e-2)
    with pytest.warns(UserWarning, match="channel rows"):
        train(fus, p_f, 10, tangent_grads)
    train(ref, p_r, 10, tangent_grads)
    assert p_f[0].stride() == conv.stride()
    compare_opts(fus, ref, "layouts", rtol=1e-5)
    with pytest.raises(ValueError, match="channel rows"):
        strict = fusedopt.FusedAdamP([torch.nn.Parameter(mat.clone())], strict=True)
        tangent_grads(strict.param_groups[0]["params"], 0)
        strict.step()


def test_float64_params_take_the_reference_step():
    p_f = make_params(11, torch.float64, sizes=[(50,), (4, 6)])
    p_r = clone_params(p_f)
    fus, ref = fusedopt.FusedAdamP(p_f, lr=1e-2, weight_decay=1e-2), AdampReference(p_r, lr=1e-2, weight_decay=1e-2)
    with pytest.warns(UserWarning, match="float64"):
        train(fus, p_f, 5, tangent_grads)
    train(ref, p_r, 5, tangent_grads)
    compare_opts(fus, ref, "float64", bitwise=True)


def test_nan_gradient_stops_the_projection_like_the_reference():
    """A NaN gradient makes that row's cosine NaN, and max() of it NaN: no view projects (NaN < x is false), and
    the NaN reaches only the elements whose moments it enters."""
    p_f = make_params(2, sizes=[(6, 5)])
    p_r = clone_params(p_f)
    fus, ref = fusedopt.FusedAdamP(p_f, lr=1e-2, weight_decay=0.1), AdampReference(p_r, lr=1e-2, weight_decay=0.1)
    for t in range(3):
        tangent_grads(p_f, t)
        tangent_grads(p_r, t)
        if t == 2:  # the last step: later gradients of that row would be NaN everywhere
            p_f[0].grad[2, 3] = math.nan
            p_r[0].grad[2, 3] = math.nan
        fus.step()
        ref.step()
    a, r = p_f[0].detach(), p_r[0].detach()
    assert torch.equal(a.isnan(), r.isnan()) and int(a.isnan().sum()) == 1
    assert_close(a.nan_to_num(), r.nan_to_num(), "NaN step", rtol=1e-5)


def test_state_dict_round_trips_both_ways():
    checks.check_state_dict_round_trips(ADAMP, ADAMP.base_kw)


def test_state_dict_from_clovaai_adamp_loads():
    """adamp.AdamP keeps state['step'] as a Python int: a fused optimizer loads it (as a float32 tensor) and goes
    on as adamp.AdamP does."""
    adamp = pytest.importorskip("adamp")
    p_a = make_params(3)
    p_f = clone_params(p_a)
    theirs = adamp.AdamP(p_a, **ADAMP.base_kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(theirs, p_a, 5, tangent_grads)
        for p, q in zip(p_f, p_a):
            p.data.copy_(q.detach())
        fus = fusedopt.FusedAdamP(p_f, **ADAMP.base_kw)
        fus.load_state_dict(copy.deepcopy(theirs.state_dict()))  # (torch would share the tensors)
        train(theirs, p_a, 5, tangent_grads, start=5)
    train(fus, p_f, 5, tangent_grads, start=5)
    for j, (a, b) in enumerate(zip(p_f, p_a)):
        assert_close(a.detach(), b.detach(), f"param {j}", rtol=1e-5)
        assert float(fus.state[a]["step"]) == theirs.state[b]["step"] == 10


@pytest.mark.parametrize("kind", ["fusedopt", "torch"], ids=["fusedopt.GradScaler", "torch.amp.GradScaler"])
def test_grad_scaler_skips_and_follows_the_reference(kind, ieee_sqrt):
    checks.check_grad_scaler(ADAMP, kind)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_master_weights_follow_the_fp32_run(dtype):
    checks.check_master_weights(ADAMP, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_params_stay_close_to_the_references_16_bit_run(dtype):
    checks.check_low_precision_default(ADAMP, dtype)


def test_fp16_params_stay_closer_to_the_f32_run_than_the_references_fp16_run():
    """The engine computes in f32 and rounds each param once per step: after 10 steps its fp16 params are within
    4 fp16 ulps of the f32 reference run on the same (fp16) gradients, closer than the reference's own fp16 run."""
    kw = {**ADAMP.base_kw, **ADAMP.low_precision_kw}
    p0 = make_params(5, torch.float16)
    p_t, p_f = clone_params(p0), clone_params(p0)
    p_32 = [torch.nn.Parameter(p.detach().float()) for p in p0]
    ref = AdampReference(groups_of(p_t, group_kw=ADAMP.group_kw), **kw)
    fus = fusedopt.FusedAdamP(groups_of(p_f, group_kw=ADAMP.group_kw), **kw)
    r32 = AdampReference(groups_of(p_32, group_kw=ADAMP.group_kw), **kw)
    for t in range(10):
        for ps in (p_t, p_f, p_32):
            set_fixed_grads(ps, t, dtype=torch.float16, skip=has_grad)
        ref.step()
        fus.step()
        r32.step()
    ours = max(ulp_err(a, x.detach().half()).max().item() for a, x in zip(p_f, p_32))
    theirs = max(ulp_err(r, x.detach().half()).max().item() for r, x in zip(p_t, p_32))
    assert ours <= 4 and ours < theirs, (ours, theirs)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_max_grad_norm_equals_clip_then_step(norm_type):
    checks.check_max_grad_norm(ADAMP, norm_type)


def test_max_grad_norm_skips_a_non_finite_step():
    checks.check_max_grad_norm_skips_non_finite(ADAMP)


def test_accumulation_equals_one_step_on_the_mean_gradient():
    checks.check_accumulation(ADAMP)


def test_flatten_is_bit_identical():
    checks.check_flatten(ADAMP)


def test_thread_count_does_not_change_results():
    checks.check_thread_count(ADAMP)


def test_parity_over_the_shared_problem():
    checks.check_parity(ADAMP, ADAMP.base_kw)


def test_constructor_errors():
    p = [torch.nn.Parameter(torch.zeros(2))]
    for kw, match in ((dict(lr=-1.0), "Invalid learning rate: -1.0"), (dict(eps=-1e-3), "Invalid epsilon value"),
                      (dict(betas=(1.0, 0.999)), "Invalid beta parameter at index 0: 1.0"),
                      (dict(betas=(0.9, -0.1)), "Invalid beta parameter at index 1: -0.1"),
                      (dict(weight_decay=-1e-2), "Invalid weight_decay value: -0.01"),
                      (dict(delta=-0.1), "Invalid delta value: -0.1"),
                      (dict(wd_ratio=-0.5), "Invalid wd_ratio value: -0.5")):
        with pytest.raises(ValueError, match=match):
            fusedopt.FusedAdamP(p, **kw)
    with pytest.raises(TypeError, match="maximize"):
        fusedopt.FusedAdamP(p, maximize=True)


@pytest.mark.parametrize("key,value", [("lr", -1.0), ("lr", math.nan), ("eps", -1.0), ("betas", (1.0, 0.9)),
                                       ("weight_decay", -0.5), ("delta", -1.0), ("wd_ratio", math.inf)])
def test_invalid_group_value_mid_training_changes_nothing(key, value):
    checks.check_invalid_group_value_changes_nothing(ADAMP, key, value)


def test_sparse_gradients_are_refused():
    q = torch.nn.Parameter(torch.zeros(4))
    q.grad = torch.zeros(4).to_sparse()
    with pytest.raises(RuntimeError, match="FusedAdamP does not support sparse gradients"):
        fusedopt.FusedAdamP([q]).step()


def test_rejected_step_changes_nothing():
    params = make_params(4)
    opt = fusedopt.FusedAdamP(groups_of(params, group_kw=ADAMP.group_kw), **ADAMP.base_kw)
    run(opt, params, 3)
    snap = snapshot(opt)
    set_grads(params, 3)
    opt.param_groups[1]["delta"] = -1.0
    with pytest.raises(ValueError, match="delta"):
        opt.step()
    assert_unchanged(opt, snap, "delta -1")


def test_is_exported_and_its_state_is_adamps():
    assert "FusedAdamP" in fusedopt.__all__
    assert list(fusedopt._C.algorithms["adamp"]["state_names"]) == ["exp_avg", "exp_avg_sq"]
    p = torch.nn.Parameter(torch.ones(3, 2))
    opt = fusedopt.FusedAdamP([p])
    assert opt.defaults == AdampReference([p]).defaults
    p.grad = torch.ones(3, 2)
    opt.step()
    assert set(opt.state[p]) == {"step", "exp_avg", "exp_avg_sq"}
