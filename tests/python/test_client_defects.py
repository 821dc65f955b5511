"""Regression tests of issue #29's items 1, 7, 8, 9 and 11 (defects real clients found in the PyTorch drop-in's
step): copies that lose their options, a gradient of another dtype, a failed step on torch's path that changes
state, a rejected micro-batch that still counts, and errors from torch's path that do not name the parameter.
torch.optim (or the original optimizer itself, for copies) is the reference everywhere."""

from __future__ import annotations

import copy
import pickle
import warnings

import fusedopt
import pytest
from conftest import (
    BASE_KW,
    FUSED,
    NAMES,
    TORCH,
    assert_bitwise,
    assert_unchanged,
    compare_opts,
    snapshot,
    state_tensors,
)

import torch

# ---- item 1: a copy continues bit for bit as the original would ---------------------------------

CLASSES = [c for c in map(fusedopt.__dict__.get, fusedopt.__all__)
           if isinstance(c, type) and issubclass(c, torch.optim.Optimizer)]
# Arguments each class needs, or that make its own attributes matter (FusedLion's decoupled_wd and _init_lr).
CLASS_KW = {
    "FusedSGD": dict(lr=0.05, momentum=0.9, weight_decay=0.01),
    "FusedLion": dict(lr=1e-3, weight_decay=0.5, decoupled_weight_decay=True),
    "FusedBertAdam": dict(lr=1e-2, t_total=10, warmup=0.2),
    "FusedLARS": dict(lr=0.05, momentum=0.9, weight_decay=0.01),
}
# The options, in three sets. The gradients' norm is far above max_grad_norm (clipping binds; FusedLAMB's own
# max_grad_norm=1.0 too); the copies are made mid-window. f32 states in bf16 with stochastic rounding; bf16
# params with f32 master copies.
OPTION_SETS = {
    "window": (torch.float32, dict(flatten=True, max_grad_norm=0.5, accumulation_steps=2, strict=True)),
    "rounding": (torch.float32, dict(state_dtype=torch.bfloat16, stochastic_rounding=True, seed=12345)),
    "master": (torch.bfloat16, dict(master_weights=True, flatten=True)),
}
SHAPES = [(40, 3), (7,), (5, 4)]


def _options(cls, option_set):
    dtype, options = OPTION_SETS[option_set]
    options = dict(options)
    if cls is fusedopt.FusedBertAdam and "max_grad_norm" in options:
        options.pop("max_grad_norm")  # its max_grad_norm is the reference's per-buffer clipping (the default, 1.0)
    return dtype, {**CLASS_KW.get(cls.__name__, dict(lr=1e-2)), **options}


def _make(cls, option_set):
    dtype, kw = _options(cls, option_set)
    g = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in SHAPES]
    return params, cls(params, **kw)


def _params(opt):
    return [p for group in opt.param_groups for p in group["params"]]


def _set_grads(opt, t):
    g = torch.Generator().manual_seed(100 + t)
    for p in _params(opt):
        p.grad = (10.0 * torch.randn(p.shape, generator=g) + 1.0).to(p.dtype)


def _assert_same(opt, ref, what):
    """Params and every state entry, bit for bit (states of one param by key)."""
    for i, (a, r) in enumerate(zip(_params(opt), _params(ref))):
        assert_bitwise(a.detach(), r.detach(), f"{what} param {i}")
        sa, sr = opt.state.get(a, {}), ref.state.get(r, {})
        assert sa.keys() == sr.keys(), f"{what} param {i}: state keys {sorted(sa)} != {sorted(sr)}"
        for k, v in sr.items():
            if isinstance(v, torch.Tensor):
                assert_bitwise(sa[k], v, f"{what} param {i} state {k}")
            else:
                assert sa[k] == v, f"{what} param {i} state {k}"


def _spans(buffers):
    return [(b.data_ptr(), b.data_ptr() + b.numel() * b.element_size()) for b in buffers]


def _copies(cls, option_set, original):
    """copy.deepcopy, a pickle round trip, and load_state_dict into a twin built with the same arguments."""
    twin_params, twin = _make(cls, option_set)
    with torch.no_grad():  # the model first, then the optimizer (its f32 master copies are the truth)
        for p, q in zip(twin_params, _params(original)):
            p.copy_(q)
    twin.load_state_dict(copy.deepcopy(original.state_dict()))  # (as torch.save and load: no tensor shared)
    return {"deepcopy": copy.deepcopy(original), "pickle": pickle.loads(pickle.dumps(original)), "twin": twin}


@pytest.mark.parametrize("option_set", list(OPTION_SETS))
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_copy_continues_as_the_original(cls, option_set):
    _, original = _make(cls, option_set)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no param may take torch's step here: all are on the fused path
        for t in range(3):  # with accumulation_steps=2: one window and one micro-batch of the next
            _set_grads(original, t)
            original.step()
        copies = _copies(cls, option_set, original)
        for t in range(3, 7):
            for opt in (original, *copies.values()):
                _set_grads(opt, t)
                opt.step()
            for how, opt in copies.items():
                _assert_same(opt, original, f"{cls.__name__} {option_set} {how} step {t}")
    if OPTION_SETS[option_set][1].get("flatten"):  # each lays its own params out in flat buffers of its own
        theirs = _spans(original.flat_grads())
        for how, opt in copies.items():
            mine = _spans(opt.flat_grads())
            assert not any(a < d and c < b for a, b in mine for c, d in theirs), how
            assert all(any(a <= p.grad.data_ptr() < b for a, b in mine) for p in _params(opt)), how
    if OPTION_SETS[option_set][1].get("strict"):  # still strict: a float64 param is refused when it joins
        for opt in copies.values():
            with pytest.raises(TypeError, match="float64.*strict=True"):
                opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))]})


def test_copied_lamb_still_clips():
    """The issue's example: FusedLAMB's copy stopped clipping (every element differed from the original's)."""
    p = torch.nn.Parameter(torch.linspace(-1, 1, 50))
    opt = fusedopt.FusedLAMB([p], lr=0.1, max_grad_norm=1.0)
    twin = copy.deepcopy(opt)
    for o in (opt, twin):
        _params(o)[0].grad = torch.full((50,), 3.0)
        o.step()
    assert opt.last_grad_norm == twin.last_grad_norm == pytest.approx(3.0 * 50**0.5)
    assert_bitwise(_params(twin)[0].detach(), p.detach(), "param")


def test_copied_lion_steps():
    """The issue's example: a copied FusedLion raised AttributeError: decoupled_wd on its first step."""
    p = torch.nn.Parameter(torch.linspace(-1, 1, 50))
    opt = fusedopt.FusedLion([p], lr=1e-2, weight_decay=0.3, decoupled_weight_decay=True)
    twin = pickle.loads(pickle.dumps(opt))
    for o in (opt, twin):
        _params(o)[0].grad = torch.linspace(-2, 1, 50)
        o.step()
    assert_bitwise(_params(twin)[0].detach(), p.detach(), "param")


# ---- item 7: a gradient of another dtype than its param's (set through .grad.data) ---------------

def _f64_grad_run(cls, name, steps=3, **kw):
    """A float32 param on the fused path and one whose float32 gradient is replaced by a float64 one through
    .grad.data, as torch allows; returns the optimizer, its params and the first error, if any."""
    g = torch.Generator().manual_seed(5)
    params = [torch.nn.Parameter(torch.randn(6, generator=g)), torch.nn.Parameter(torch.randn(9, generator=g))]
    opt = cls(params, **BASE_KW[name], **kw)
    for t in range(steps):
        gen = torch.Generator().manual_seed(50 + t)
        params[0].grad = torch.randn(6, generator=gen)
        params[1].grad = torch.zeros(9)
        params[1].grad.data = torch.randn(9, generator=gen, dtype=torch.float64)
        snap = snapshot(opt)
        try:
            opt.step()
        except Exception as e:
            return opt, params, e, snap
    return opt, params, None, None


@pytest.mark.parametrize("name", NAMES)
def test_grad_of_another_dtype_steps_as_torch(name, ieee_sqrt):
    ref, _, torch_error, _ = _f64_grad_run(lambda ps, **kw: TORCH[name](ps, foreach=False, **kw), name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the param takes the reference's step, with a warning)
        fus, params, error, snap = _f64_grad_run(FUSED[name], name)
    if torch_error is None:
        assert error is None, error
        compare_opts(fus, ref, name, bitwise=True)
        assert params[1].grad.dtype == torch.float64  # the gradient is left as it was
    else:  # torch's own error (Adam's lerp_ takes no float64 gradient), named; nothing changed
        assert type(error) is type(torch_error)
        assert str(error) == f"parameter 1 of group 0: {torch_error}"
        assert_unchanged(fus, snap, f"{name} after the error")


def test_grad_of_another_dtype_with_accumulation_sums_in_its_dtype():
    """accumulation_steps=2: the reference's step of the window's mean gradient, summed in float64 (as
    grad * 1/k per micro-batch); the param's own float64 gradient is put back after the step."""
    w = torch.nn.Parameter(torch.linspace(-1, 1, 9))
    w_ref = torch.nn.Parameter(w.detach().clone())
    opt = fusedopt.FusedSGD([w], lr=0.1, momentum=0.9, accumulation_steps=2)
    ref = torch.optim.SGD([w_ref], lr=0.1, momentum=0.9, foreach=False)
    for window in range(2):
        total = None
        for k in range(2):
            g = torch.linspace(-3, 2, 9, dtype=torch.float64) * (1 + window + 0.1 * k)
            w.grad = torch.zeros(9)
            w.grad.data = g
            own = w.grad
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                opt.step()
            assert w.grad is own and torch.equal(w.grad, g)
            total = g * 0.5 if total is None else total + g * 0.5
        w_ref.grad = torch.zeros(9)
        w_ref.grad.data = total
        ref.step()
        compare_opts(opt, ref, f"window {window}", bitwise=True)


# ---- item 8: a failed step on torch's path changes nothing ----------------------------------------

def _assert_unchanged(opt, snap, what):
    """conftest's assert_unchanged, for integer params too."""
    def same(a, r, w):
        if a.is_floating_point():
            assert_bitwise(a.detach(), r, w)
        else:
            assert a.dtype == r.dtype and torch.equal(a, r), w

    params, states = snap
    assert len(_params(opt)) == len(params)
    for i, (p, r) in enumerate(zip(_params(opt), params)):
        same(p, r, f"{what} param {i}")
    now = state_tensors(opt)
    assert now.keys() == states.keys(), f"{what}: state keys changed: {sorted(now)} vs {sorted(states)}"
    for k, r in states.items():
        same(now[k], r, f"{what} state {k}")


def _mid_run_f64(cls, name, **kw):
    """A float32 param on the fused path, and one whose .data is replaced by float64 after the first step (its
    states stay float32, as torch's do); then an int32 param gets a gradient. Returns the optimizer, and per
    step after the first its error (or None) and a snapshot from before it."""
    g = torch.Generator().manual_seed(8)
    a, b = torch.nn.Parameter(torch.randn(5, generator=g)), torch.nn.Parameter(torch.randn(7, generator=g))
    c = torch.arange(4, dtype=torch.int32)
    opt = cls([a, b, c], **BASE_KW[name], **kw)
    out = []
    for t in range(3):
        if t == 1:
            b.data = b.data.double()
        a.grad, b.grad = torch.randn(5, generator=g), torch.randn(7, generator=g, dtype=b.dtype)
        if t == 2:
            c.grad = torch.ones(4, dtype=torch.int32)
        snap = snapshot(opt)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                opt.step()
            out.append((None, snap))
        except Exception as e:
            out.append((e, snap))
    return opt, out[1:]


@pytest.mark.parametrize("name", NAMES)
def test_failed_torch_step_changes_nothing(name):
    """torch creates an int32 param's state, or updates a float64 one, before it raises; the fused twin raises
    torch's error (named) and changes nothing, the fused param's update included."""
    _, want = _mid_run_f64(lambda ps, **kw: TORCH[name](ps, foreach=False, **kw), name)
    opt, got = _mid_run_f64(FUSED[name], name)
    assert want[1][0] is not None  # (torch refuses the int32 param's step)
    for t, ((torch_error, _), (error, snap)) in enumerate(zip(want, got), 1):
        assert type(error) is type(torch_error), (t, error, torch_error)
        if error is not None:
            culprit = 1 if t == 1 or want[0][0] is not None else 2  # (the float64 param's step fails each time)
            assert str(error) == f"parameter {culprit} of group 0: {torch_error}"
            _assert_unchanged(opt, snap, f"{name} after the failed step {t}")


def test_failed_torch_step_at_window_end_changes_nothing():
    """accumulation_steps=2: torch's step of the window's end fails; the fused params' update, the window and
    its sums are as before the call, which can be retried."""
    a = torch.nn.Parameter(torch.linspace(-1, 1, 6))
    c = torch.arange(4, dtype=torch.int32)
    opt = fusedopt.FusedAdam([a, c], lr=0.1, accumulation_steps=2)
    a.grad, c.grad = torch.ones(6), torch.ones(4, dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt.step()
        snap, sums, count = snapshot(opt), {p: s.clone() for p, s in opt._accumulators.items()}, opt._micro_batches
        with pytest.raises(RuntimeError, match="^parameter 1 of group 0: expected dtype int"):
            opt.step()
    _assert_unchanged(opt, snap, "after the failed window end")
    assert opt._micro_batches == count == 1
    for p, s in sums.items():
        assert_bitwise(opt._accumulators[p], s, "sum")


# ---- item 9: a rejected micro-batch does not count ------------------------------------------------

@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_rejected_micro_batch_changes_nothing(name):
    """A micro-batch rejected mid-window (a gradient of the wrong shape, set through .data; a sparse gradient
    that the reference refuses; a negative lr) changes nothing: the retried call continues as a run without it."""
    def make():
        return [torch.nn.Parameter(torch.linspace(-1, 1, 40)), torch.nn.Parameter(torch.ones(7))]

    ps_a, ps_b = make(), make()
    good = FUSED[name](ps_a, accumulation_steps=3, **BASE_KW[name])
    bad = FUSED[name](ps_b, accumulation_steps=3, **BASE_KW[name])
    for t in range(6):
        for ps in (ps_a, ps_b):
            gen = torch.Generator().manual_seed(t)
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gen)
        good.step()
        if t in (1, 4):  # mid-window, after one micro-batch
            count, size, snap = bad._micro_batches, bad.state_bytes(), snapshot(bad)
            sums = {i: s.clone() for i, s in enumerate(bad._accumulators.values())}
            kept, value = ps_b[1].grad, ps_b[1].grad.clone()
            ps_b[1].grad.data = torch.randn(5)
            with pytest.raises(ValueError, match=r"gradient of parameter 1 of group 0 has shape \(5,\)"):
                bad.step()
            if name == "Adam":
                ps_b[1].grad = torch.randn(7).to_sparse()
                with pytest.raises(RuntimeError, match="^parameter 1 of group 0: Adam does not support sparse"):
                    bad.step()
            assert (bad._micro_batches, bad.state_bytes()) == (count, size) == (1, size)
            assert_unchanged(bad, snap, "after the rejected micro-batch")
            for i, s in enumerate(bad._accumulators.values()):
                assert_bitwise(s, sums[i], f"sum {i}")
            kept.data = value
            ps_b[1].grad = kept
            # A hyper-parameter the window's last call would be refused for is refused mid-window too.
            lr = bad.param_groups[0]["lr"]
            bad.param_groups[0]["lr"] = -1.0
            with pytest.raises(ValueError, match="group 0: invalid lr: -1"):
                bad.step()
            bad.param_groups[0]["lr"] = lr
            assert bad._micro_batches == 1
        bad.step()
        compare_opts(bad, good, f"{name} micro-batch {t}", bitwise=True)


def test_rejected_first_micro_batch_makes_no_sums():
    """strict=True refuses the second param's gradient: the first param's f32 sum is not made either."""
    a, b = torch.nn.Parameter(torch.zeros(1000)), torch.nn.Parameter(torch.zeros(3))
    opt = fusedopt.FusedAdamW([a, b], accumulation_steps=2, strict=True)
    a.grad, b.grad = torch.ones(1000), torch.ones(6)[::2]
    with pytest.raises(ValueError, match="parameter 1 of group 0 cannot be updated by the fused engine"):
        opt.step()
    assert opt.state_bytes() == 0 and opt._micro_batches == 0


# ---- item 11: errors from torch's path name the parameter ----------------------------------------

def test_sparse_gradient_error_names_the_parameter():
    """The issue's example, by name and by group and index; the text after the name is torch's."""
    m = torch.nn.Linear(3, 2)
    ref = torch.optim.AdamW(m.parameters())
    m.weight.grad, m.bias.grad = torch.ones(2, 3).to_sparse(), torch.ones(2)
    with pytest.raises(RuntimeError) as torch_error:
        ref.step()
    for params, name in ((m.named_parameters(), "'weight' (group 0, index 0)"), (m.parameters(), "0 of group 0")):
        opt = fusedopt.FusedAdamW(params)
        for strict in (False, True):
            opt._strict = strict
            with pytest.raises(RuntimeError) as error:
                opt.step()
            assert str(error.value) == f"parameter {name}: {torch_error.value}"


def test_torch_step_error_names_the_parameter_that_raised():
    """Several params take torch's step at once, the second one fails: it is the one named."""
    x = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    y = torch.arange(3, dtype=torch.int32)
    z = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = fusedopt.FusedRMSprop([("x", x), ("y", y), ("z", z)], lr=0.1)
    x.grad, y.grad = torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.int32)
    z.grad = torch.ones(2, dtype=torch.float64)
    snap = snapshot(opt)
    with pytest.warns(UserWarning, match="reference's own"):
        with pytest.raises(RuntimeError, match=r"^parameter 'y' \(group 0, index 1\): result type Float can't be"):
            opt.step()
    _assert_unchanged(opt, snap, "after the error")
