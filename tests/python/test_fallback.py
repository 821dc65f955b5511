"""A drop-in never refuses what torch.optim accepts (issue #13): params and steps the engine cannot
take (float64, complex128, strided views, other devices, sparse grads, grads laid out unlike their
param, differentiable=True) go through the reference's own step inside the same step(), with one
warning; complex64 params take the fused path as real views; strict=True raises instead. Every test
runs the same problem through torch.optim (foreach=False) and compares params and states."""

from __future__ import annotations

import copy
import pickle
import re
import sys
import warnings
from pathlib import Path

import pytest
from algorithm_cases import PARITY
from conftest import BASE_KW, FUSED, NAMES, TORCH, assert_bitwise, assert_close, assert_unchanged, snapshot

import torch


def _real(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().to_dense() if t.is_sparse else t.detach()
    return torch.view_as_real(t) if t.is_complex() else t


def _params(seed: int, dtypes) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=g, dtype=dt)) for dt, shape in dtypes]


def _grads(params, t: int) -> list[torch.Tensor]:
    """Reproducible grads of each param's dtype, pulling it towards a fixed target."""
    out = []
    for i, p in enumerate(params):
        g = torch.Generator().manual_seed(1000 * t + i)
        noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
        out.append(0.5 * p.detach() + noise)
    return out


def _steps(opt, params, steps, grads=_grads, start=0):
    for t in range(start, start + steps):
        for p, g in zip(params, grads(params, t)):
            p.grad = g
        opt.step()


def _compare(fused, ref, what, exact=()):
    """Params and states; bitwise for the params whose index is in `exact` (they took torch's own
    step), to f32 rounding otherwise."""
    fp = [p for g in fused.param_groups for p in g["params"]]
    rp = [p for g in ref.param_groups for p in g["params"]]
    for i, (a, r) in enumerate(zip(fp, rp)):
        pairs = [("param", a, r)]
        sa, sr = fused.state.get(a, {}), ref.state.get(r, {})
        assert sa.keys() == sr.keys(), f"{what} param {i}: state keys {sorted(sa)} != torch's {sorted(sr)}"
        pairs += [(k, sa[k], sr[k]) for k in sr if isinstance(sr[k], torch.Tensor)]
        for key, x, y in pairs:
            assert x.dtype == y.dtype and x.shape == y.shape and x.device == y.device, f"{what} {i} {key}"
            if x.device.type == "meta":
                continue
            if i in exact or key == "step":
                assert_bitwise(_real(x), _real(y), f"{what} param {i} {key}")
            else:
                assert_close(_real(x), _real(y), f"{what} param {i} {key}", rtol=1e-5)


MIXED = [(torch.float32, (40000,)), (torch.float64, (33, 17)), (torch.float32, (7,)),
         (torch.complex128, (5, 3)), (torch.complex64, (6, 4))]
ROUTED = (1, 3)  # float64 and complex128 take torch's step; complex64 the fused one, as real views


@pytest.mark.parametrize("name", NAMES)
def test_mixed_dtypes_match_torch(name):
    p_t, p_f = _params(0, MIXED), _params(0, MIXED)
    tor = TORCH[name](p_t, foreach=False, **BASE_KW[name])
    fus = FUSED[name](p_f, **BASE_KW[name])
    with pytest.warns(UserWarning, match=r"parameter 1 of group 0: its dtype is torch.float64.*"
                                         r"parameter 3 of group 0: its dtype is torch.complex128") as caught:
        _steps(fus, p_f, 1)
    assert caught[0].filename == __file__  # it points at the caller's step()
    _steps(tor, p_t, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning, not one per step
        _steps(fus, p_f, 6, start=1)
    _steps(tor, p_t, 6, start=1)
    _compare(fus, tor, name, exact=ROUTED)
    # state_dicts go both ways: torch continues from the fused one and the other way round
    tor2 = TORCH[name](_params(9, MIXED), foreach=False, **BASE_KW[name])
    tor2.load_state_dict(copy.deepcopy(fus.state_dict()))
    assert [sorted(s) for s in tor2.state_dict()["state"].values()] == \
           [sorted(s) for s in tor.state_dict()["state"].values()]
    fus.load_state_dict(copy.deepcopy(tor.state_dict()))  # (not sharing torch's state tensors)
    if PARITY[name].scalar_states:
        # torch's load_state_dict casts every state tensor but 'step' to its param's dtype: the float64
        # param's 0-d f32 scalar states become float64, and torch's own steps after a load then differ
        # (~1e-12) from its unloaded run. The reference goes through the same load as the fused one.
        tor.load_state_dict(copy.deepcopy(tor.state_dict()))
    for p, q in zip(p_f, p_t):
        p.data.copy_(q.detach())
    _steps(fus, p_f, 3, start=7)
    _steps(tor, p_t, 3, start=7)
    _compare(fus, tor, f"{name} after load_state_dict", exact=ROUTED)


@pytest.mark.parametrize("name", NAMES)
def test_complex64_takes_the_fused_path(name):
    """torch updates a complex param as its real view; so does the engine, without a warning."""
    shapes = [(torch.complex64, (300,)), (torch.complex64, (9, 7))]
    p_t, p_f = _params(1, shapes), _params(1, shapes)
    tor = TORCH[name](p_t, foreach=False, **BASE_KW[name])
    fus = FUSED[name](p_f, strict=True, **BASE_KW[name])  # strict: nothing may take torch's path
    _steps(fus, p_f, 8)
    _steps(tor, p_t, 8)
    _compare(fus, tor, f"{name} complex64")  # (SGD too: torch multiplies complex by real scalars as complex)
    for p in p_f:
        assert all(s.dtype == torch.complex64 for s in fus.state[p].values() if s.dim())


@pytest.mark.parametrize("name", NAMES)
def test_strided_view_param_updates_its_base_like_torch(name):
    base_t, base_f = torch.randn(6, 10), None
    base_f = base_t.clone()
    p_t = torch.nn.Parameter(base_t[:, ::2])  # a strided view: torch updates it, and so its base, in place
    p_f = torch.nn.Parameter(base_f[:, ::2])
    q_t, q_f = torch.nn.Parameter(torch.randn(20)), None
    q_f = torch.nn.Parameter(q_t.detach().clone())
    tor = TORCH[name]([p_t, q_t], foreach=False, **BASE_KW[name])
    fus = FUSED[name]([p_f, q_f], **BASE_KW[name])
    with pytest.warns(UserWarning, match="not dense in memory"):
        _steps(fus, [p_f, q_f], 5)
    _steps(tor, [p_t, q_t], 5)
    _compare(fus, tor, f"{name} strided", exact=(0,))
    assert_bitwise(base_f, base_t, "the base of the strided param")
    assert p_f.data_ptr() == base_f[:, ::2].data_ptr()


@pytest.mark.parametrize("name", NAMES)
def test_grad_laid_out_unlike_its_param(name):
    """A channels_last param with a contiguous grad (torch reads any strides)."""
    make = lambda: torch.nn.Parameter(  # noqa: E731
        torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(3)).to(memory_format=torch.channels_last))
    p_t, p_f = make(), make()

    def grads(params, t):
        return [torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(t)) for _ in params]

    tor = TORCH[name]([p_t], foreach=False, **BASE_KW[name])
    fus = FUSED[name]([p_f], **BASE_KW[name])
    with pytest.warns(UserWarning, match="its gradient has strides"):
        _steps(fus, [p_f], 4, grads)
    _steps(tor, [p_t], 4, grads)
    _compare(fus, tor, f"{name} channels_last", exact=(0,))
    strict = FUSED[name]([make()], strict=True, **BASE_KW[name])
    strict.param_groups[0]["params"][0].grad = grads([0], 0)[0]
    with pytest.raises(ValueError, match=r"parameter 0 of group 0 cannot be updated.*strides.*strict=True"):
        strict.step()


@pytest.mark.parametrize("name", NAMES)
def test_meta_params_step_like_torch(name):
    """Params on the meta device (shapes only, as when a model is planned before it is built)."""
    p_t = torch.nn.Parameter(torch.empty(4, 3, device="meta"))
    p_f = torch.nn.Parameter(torch.empty(4, 3, device="meta"))
    tor = TORCH[name]([p_t], foreach=False, **BASE_KW[name])
    p_t.grad = torch.empty(4, 3, device="meta")
    try:
        tor.step()
        torch_error = None
    except RuntimeError as e:  # a step that reads a scalar state with .item(), which a meta tensor has not
        torch_error = str(e)
    with pytest.warns(UserWarning, match="is on meta"):
        fus = FUSED[name]([p_f], **BASE_KW[name])
        p_f.grad = torch.empty(4, 3, device="meta")
        if torch_error is None:
            fus.step()
        else:  # the same error from the same place: the param went through torch's own step
            with pytest.raises(RuntimeError, match=re.escape(torch_error)):
                fus.step()
    if torch_error is None:
        _compare(fus, tor, f"{name} meta")
    else:  # a failed step changes nothing (issue #29 item 8), where torch's keeps the state it made
        assert p_f not in fus.state
    with pytest.raises(RuntimeError, match=r"parameter 0 of group 0 .*is on meta.*strict=True"):
        FUSED[name]([torch.nn.Parameter(torch.empty(2, device="meta"))], strict=True)


@pytest.mark.parametrize("name", [name for name, case in PARITY.items() if case.sparse_grad_options is not None])
def test_sparse_grads_take_torchs_step(name):
    """The torch.optim classes that take sparse grads (an embedding's): the dense params stay fused."""
    kw = PARITY[name].sparse_grad_options
    p_t, p_f = _params(2, [(torch.float32, (10, 4)), (torch.float32, (50,))]), None
    p_f = [torch.nn.Parameter(p.detach().clone()) for p in p_t]

    def grads(params, t):
        rows = torch.tensor([[t % 10, (3 * t + 1) % 10]])
        emb = torch.sparse_coo_tensor(rows, torch.full((2, 4), 0.5 + t), (10, 4), check_invariants=True)
        return [emb, torch.randn(50, generator=torch.Generator().manual_seed(t))]

    tor = TORCH[name](p_t, foreach=False, **kw)
    fus = FUSED[name](p_f, **kw)
    with pytest.warns(UserWarning, match="parameter 0 of group 0: its gradient is sparse"):
        _steps(fus, p_f, 5, grads)
    _steps(tor, p_t, 5, grads)
    _compare(fus, tor, f"{name} sparse", exact=(0,))
    strict = FUSED[name]([torch.nn.Parameter(torch.zeros(10, 4))], strict=True, **kw)
    strict.param_groups[0]["params"][0].grad = grads(None, 0)[0]
    snap = snapshot(strict)
    with pytest.raises(RuntimeError, match="sparse"):
        strict.step()
    assert_unchanged(strict, snap, "strict sparse")


@pytest.mark.parametrize("name", NAMES)
def test_differentiable_takes_torchs_step(name):
    """differentiable=True: the update is part of the autograd graph (e.g. to learn a
    hyper-parameter through it), so torch's own step runs it."""
    kw = {k: v for k, v in BASE_KW[name].items() if k != "amsgrad"}  # (torch's amsgrad is not differentiable)

    def run(cls, steps=3):
        w = torch.randn(5, generator=torch.Generator().manual_seed(4), requires_grad=True)
        p = w.clone()  # a non-leaf param: gradients flow back to w through the updates
        p.retain_grad()
        opt = cls([p], differentiable=True, **kw)
        for t in range(steps):
            p.grad = torch.randn(5, generator=torch.Generator().manual_seed(t)) * (p.detach() + 1)
            opt.step()
        p.sum().backward()
        return p.detach(), w.grad

    steps = 3
    if PARITY[name].differentiable_backward_steps is not None:
        # torch itself raises on a backward through more steps than its differentiable step allows
        # (algorithm_cases.py says why): the fused one (torch's step) must raise the same; the graph of the
        # steps torch can differentiate is compared below.
        with pytest.raises(RuntimeError) as et:
            run(TORCH[name])
        with pytest.warns(UserWarning, match="differentiable=True"):
            with pytest.raises(RuntimeError, match="^" + re.escape(str(et.value)) + "$"):
                run(FUSED[name])
        steps = PARITY[name].differentiable_backward_steps
    with pytest.warns(UserWarning, match="differentiable=True"):
        got = run(FUSED[name], steps)
    want = run(TORCH[name], steps)
    assert_bitwise(got[0], want[0], f"{name} differentiable param")
    assert_bitwise(got[1], want[1], f"{name} gradient through the updates")
    with pytest.raises(RuntimeError, match="differentiable"):
        FUSED[name]([torch.nn.Parameter(torch.zeros(2))], differentiable=True, strict=True)


@pytest.mark.parametrize("name", NAMES)
def test_grad_scaler_and_clipping_span_both_paths(name):
    """The GradScaler's unscale, its skip, and max_grad_norm's global norm cover the params of both
    paths: the same as torch's unscale_ + clip_grad_norm_ + step (to rounding: the fused step folds
    the clip coefficient into its gradient scale)."""
    shapes = [(torch.float32, (300,)), (torch.float64, (40,)), (torch.float32, (3, 7)), (torch.complex128, (5,))]
    p_t, p_f = _params(5, shapes), _params(5, shapes)
    tor = TORCH[name](p_t, foreach=False, **BASE_KW[name])
    fus = FUSED[name](p_f, max_grad_norm=1.0, **BASE_KW[name])
    scale = 1024.0
    warnings.simplefilter("ignore")
    for t in range(6):
        grads = _grads(p_t, t)
        if t == 3:
            grads[1][0] = float("inf")  # the float64 grad overflows: both skip the whole step
        for p, q, g in zip(p_f, p_t, grads):
            p.grad, q.grad = g * scale, g.clone()
        fus.grad_scale = torch.tensor(scale)  # as torch.amp.GradScaler.step sets them
        fus.found_inf = torch.tensor(0.0)
        fus._found_inf_out = torch.zeros(())  # fusedopt.GradScaler: the step's own check
        fus.step()
        assert float(fus._found_inf_out) == (1.0 if t == 3 else 0.0)
        if t != 3:
            norm = torch.nn.utils.clip_grad_norm_(p_t, 1.0)
            assert fus.last_grad_norm == pytest.approx(float(norm), rel=1e-6)
            tor.step()
    del fus.grad_scale, fus.found_inf, fus._found_inf_out
    _compare(fus, tor, f"{name} scaled and clipped")


@pytest.mark.parametrize("name", NAMES)
def test_rejected_step_changes_nothing_on_either_path(name):
    p_f = _params(6, [(torch.float32, (30,)), (torch.float64, (30,))])
    fus = FUSED[name](p_f, **BASE_KW[name])
    warnings.simplefilter("ignore")
    _steps(fus, p_f, 2)
    for p, g in zip(p_f, _grads(p_f, 2)):
        p.grad = g
    snap = snapshot(fus)
    fus.param_groups[0]["lr"] = -1.0  # the engine's check fails before either path updates
    with pytest.raises(ValueError, match="lr"):
        fus.step()
    assert_unchanged(fus, snap, "rejected mixed step")


@pytest.mark.parametrize("name", NAMES)
def test_hooks_run_once_per_step(name):
    p_f = _params(7, [(torch.float32, (30,)), (torch.float64, (30,))])
    fus = FUSED[name](p_f, **BASE_KW[name])
    calls = []
    fus.register_step_pre_hook(lambda *a: calls.append("pre"))
    fus.register_step_post_hook(lambda *a: calls.append("post"))
    torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])  # patches torch's own step with hooks too
    warnings.simplefilter("ignore")
    _steps(fus, p_f, 2)
    assert calls == ["pre", "post"] * 2


@pytest.mark.parametrize("name", NAMES)
def test_deepcopy_and_pickle_keep_the_routing(name):
    p_f = _params(8, MIXED)
    fus = FUSED[name](p_f, **BASE_KW[name])
    warnings.simplefilter("ignore")
    _steps(fus, p_f, 2)
    copies = [copy.deepcopy(fus), pickle.loads(pickle.dumps(fus))]
    _steps(fus, p_f, 2, start=2)
    for other in copies:
        _steps(other, [p for g in other.param_groups for p in g["params"]], 2, start=2)
        _compare(other, fus, f"{name} copy", exact=range(len(MIXED)))


def test_flatten_leaves_the_routed_params_alone():
    p_t, p_f = _params(9, MIXED), _params(9, MIXED)
    tor = torch.optim.AdamW(p_t, foreach=False, lr=1e-2)
    fus = FUSED["AdamW"](p_f, lr=1e-2, flatten=True)
    f64 = p_f[1].data_ptr()
    warnings.simplefilter("ignore")
    for t in range(4):
        for ps in (p_t, p_f):
            for p, g in zip(ps, _grads(ps, t)):
                p.grad = g
        tor.step()
        fus.step()
        fus.zero_grad(set_to_none=False)
        assert all(float(p.grad.abs().max()) == 0.0 for p in p_f)
    assert p_f[1].data_ptr() == f64
    _compare(fus, tor, "flatten", exact=ROUTED)


@pytest.mark.parametrize("name", NAMES)
def test_accumulation_spans_both_paths(name):
    """accumulation_steps=3: the routed params' sums (grad / 3 per micro-batch, in their own dtype)
    step with the fused ones at the window's end; an Inf in a routed grad skips the whole window."""
    shapes = [(torch.float32, (300,)), (torch.float64, (40,)), (torch.complex128, (6,))]
    p_t, p_f = _params(10, shapes), _params(10, shapes)
    tor = TORCH[name](p_t, foreach=False, **BASE_KW[name])
    fus = FUSED[name](p_f, accumulation_steps=3, **BASE_KW[name])
    warnings.simplefilter("ignore")
    for window in range(4):
        sums = [torch.zeros_like(p) for p in p_t]
        for micro in range(3):
            grads = _grads(p_t, 10 * window + micro)
            if window == 2 and micro == 1:
                grads[1][3] = float("inf")
            for p, g, s in zip(p_f, grads, sums):
                p.grad = g.clone()
                s.add_(g * (1.0 / 3))
            snap = snapshot(fus)
            fus.step()
            if micro < 2:
                assert_unchanged(fus, snap, "mid-window")
        if window != 2:  # (the window with the Inf is skipped on both paths)
            for p, s in zip(p_t, sums):
                p.grad = s
            tor.step()
    _compare(fus, tor, f"{name} accumulated", exact=(1, 2))
    clipped = FUSED[name](_params(10, shapes), accumulation_steps=2, max_grad_norm=1.0, **BASE_KW[name])
    for p, grad in zip(clipped.param_groups[0]["params"], _grads(p_t, 0)):
        p.grad = grad
    with pytest.raises(ValueError, match=r"max_grad_norm with accumulation_steps > 1.*parameter 1 of group 0"):
        clipped.step()


def test_lion_and_lamb_route_to_their_references():
    lion_pytorch = pytest.importorskip("lion_pytorch")
    import fusedopt

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from lamb_reference import LambReference

    for fused_cls, ref_cls, kw in ((fusedopt.FusedLion, lion_pytorch.Lion, dict(lr=1e-3, weight_decay=0.1)),
                                   (fusedopt.FusedLAMB, LambReference, dict(lr=1e-2, max_grad_norm=1e9))):
        shapes = [(torch.float64, (50,)), (torch.float64, (4, 6))]
        p_t, p_f = _params(11, shapes), _params(11, shapes)
        ref, fus = ref_cls(p_t, **kw), fused_cls(p_f, **kw)
        with pytest.warns(UserWarning, match="float64"):
            _steps(fus, p_f, 5)
        _steps(ref, p_t, 5)
        for a, r in zip(p_f, p_t):
            assert_close(a, r, fused_cls.__name__, rtol=1e-12)
