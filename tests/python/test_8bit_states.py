"""8-bit block-wise optimizer states (state_dtype=torch.uint8 and the bitsandbytes twins of fusedopt.bnb).

References: bitsandbytes 0.50.2 itself (its maps, its optimizers on the CPU, its state_dict), with its CPU
quantizer (a lookup table, not nearest: docs/8bit-states.md) replaced by the exact-nearest numpy oracle below;
and fusedopt's own f32-state step where 8-bit states must not change anything."""

from __future__ import annotations

import copy
import hashlib

import fusedopt
import numpy as np
import pytest
from algorithm_cases import CASES
from fusedopt import _C

import torch

bnb = pytest.importorskip("bitsandbytes")
from bitsandbytes.backends.cpu import ops as bnb_cpu_ops  # noqa: E402

BLOCK = 256
SIZES = (5000, 300, 70001)  # one under min_8bit_size (4096), one with a partial last block


# ---- the oracle: exact nearest rounding on a map ---------------------------------------------------------------
def nearest_codes(x: np.ndarray, qmap: np.ndarray) -> np.ndarray:
    """The nearest entry of qmap (ascending f32) for each x (already scaled by its absmax): between two entries a
    value takes the larger magnitude only past their f32 midpoint (a + b) * 0.5f, a tie the smaller one; on the
    signed map a negative value never gets the zero code 127 (126, the smallest negative, instead)."""
    m = qmap.astype(np.float32)
    hi = np.clip(np.searchsorted(m, x, side="left"), 1, 255)
    lo = hi - 1
    mid = (m[lo] + m[hi]) * np.float32(0.5)
    code = np.where((x > mid) | ((x < 0) & (x == mid)), hi, lo)
    code = np.where(x >= m[255], 255, np.where(x <= m[0], 0, code))
    if m[0] < 0:
        code = np.where((x < 0) & (code == 127), 126, code)
    return code.astype(np.uint8)


def oracle_quantize(values, qmap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, absmax) of values (flat, in order) in blocks of 256: absmax = max |x|, codes of x · f32(1 / absmax)
    (x / absmax where the reciprocal overflows; an all-zero block: absmax 0 and the zero code)."""
    x = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    n = x.size
    padded = np.zeros(-(-n // BLOCK) * BLOCK, np.float32)
    padded[:n] = x
    blocks = padded.reshape(-1, BLOCK)
    absmax = np.abs(blocks).max(axis=1).astype(np.float32)
    safe = np.where(absmax > 0, absmax, np.float32(1))[:, None]
    with np.errstate(over="ignore"):
        inverse = np.float32(1) / safe
    codes = nearest_codes(np.where(np.isinf(inverse), blocks / safe, blocks * inverse), qmap)
    codes[absmax == 0] = 127 if qmap[0] < 0 else 0
    return codes.reshape(-1)[:n], absmax


def qmap(signed: bool) -> np.ndarray:
    return bnb.functional.create_dynamic_map(signed).numpy()


@pytest.fixture
def exact_bnb(monkeypatch):
    """bitsandbytes' CPU 8-bit optimizers with the exact-nearest quantizer in place of its lookup table."""

    def quantize(A, code, absmax_out, out_uint8, blocksize):
        assert blocksize == BLOCK
        codes, absmax = oracle_quantize(A.detach().numpy(), code.numpy())
        out_uint8.copy_(torch.from_numpy(codes).reshape(out_uint8.shape))
        absmax_out.copy_(torch.from_numpy(absmax))

    monkeypatch.setattr(bnb_cpu_ops, "_quant_blockwise_fp32_direct", quantize)


# ---- the maps and the quantizer ---------------------------------------------------------------------------------
@pytest.mark.parametrize("signed, sha", [(True, "e732639a65f497b4"), (False, "305f002cc11278fb")])
def test_dynamic_map_is_bitsandbytes(signed, sha):
    ours = np.array(_C.dynamic_map(signed), dtype=np.float32)
    assert ours.tobytes() == qmap(signed).tobytes()
    assert hashlib.sha256(ours.astype("<f4").tobytes()).hexdigest().startswith(sha)


@pytest.mark.parametrize("signed", [True, False])
def test_quantize_is_exact_nearest(signed):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(70001, generator=gen) * torch.rand(70001, generator=gen) ** 6
    x[256:512] = 0.0  # an all-zero block
    x[600] = 0.0  # a zero in a mixed block: the zero code
    if not signed:
        x = x.abs()
    codes = torch.empty(x.numel(), dtype=torch.uint8)
    absmax = torch.empty(-(-x.numel() // BLOCK))
    _C.quantize(x.data_ptr(), x.numel(), signed, codes.data_ptr(), absmax.data_ptr())
    want_codes, want_absmax = oracle_quantize(x.numpy(), qmap(signed))
    np.testing.assert_array_equal(absmax.numpy(), want_absmax)
    np.testing.assert_array_equal(codes.numpy(), want_codes)
    back = torch.empty_like(x)
    _C.dequantize(codes.data_ptr(), absmax.data_ptr(), x.numel(), signed, back.data_ptr())
    m = qmap(signed)
    np.testing.assert_array_equal(back.numpy(), m[codes.numpy()] * np.repeat(want_absmax, BLOCK)[:x.numel()])
    assert back[600] == 0.0 and (back[256:512] == 0).all()


# ---- the twins against bitsandbytes ----------------------------------------------------------------------------
TWINS = [  # (fusedopt class, bitsandbytes class, constructor arguments)
    ("FusedAdamW8bit", "AdamW8bit", dict(lr=1e-2)),
    ("FusedAdam8bit", "Adam8bit", dict(lr=1e-2, weight_decay=0.1)),
    ("FusedPagedAdamW8bit", "PagedAdamW8bit", dict(lr=1e-2, betas=(0.8, 0.99))),
    ("FusedPagedAdam8bit", "PagedAdam8bit", dict(lr=1e-2, weight_decay=0.1, is_paged=False)),
    ("FusedLion8bit", "Lion8bit", dict(lr=1e-3, weight_decay=0.1)),
    ("FusedPagedLion8bit", "PagedLion8bit", dict(lr=1e-3, betas=(0.8, 0.95))),
    ("FusedSGD8bit", "SGD8bit", dict(lr=1e-2, momentum=0.9, weight_decay=0.01)),
    ("FusedRMSprop8bit", "RMSprop8bit", dict(lr=1e-3, alpha=0.9, weight_decay=0.01)),
    ("FusedAdagrad8bit", "Adagrad8bit", dict(lr=1e-2, weight_decay=0.01)),
]
TWIN_IDS = [t[1] for t in TWINS]


def _problem(seed=0):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(n, generator=gen) for n in SIZES]
    grads = [[torch.randn(n, generator=gen) for n in SIZES] for _ in range(5)]
    return params, grads


def _run(opt, params, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        opt.step()


def _pair(ours, theirs, kw, seed=0):
    params, grads = _problem(seed)
    a = [p.clone().requires_grad_() for p in params]
    b = [p.clone().requires_grad_() for p in params]
    return getattr(fusedopt, ours)(a, **kw), a, getattr(bnb.optim, theirs)(b, **kw), b, grads


def _assert_close_runs(oa, a, ob, b):
    for x, y in zip(a, b):
        torch.testing.assert_close(x.detach(), y.detach(), rtol=1e-5, atol=1e-6)
    for x, y in zip(a, b):
        sa, sb = oa.state[x], ob.state[y]
        for key in ("state1", "state2"):
            if key not in sb:
                continue
            assert sa[key].dtype == sb[key].dtype and sa[key].shape == sb[key].shape
            if sb[key].dtype == torch.uint8:
                assert (sa[key] != sb[key]).sum() <= 3, key  # near-tie codes only
                akey = "absmax" + key[-1]
                torch.testing.assert_close(sa[akey], sb[akey], rtol=1e-4, atol=1e-12)
            else:
                torch.testing.assert_close(sa[key], sb[key], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("ours, theirs, kw", TWINS, ids=TWIN_IDS)
def test_twin_matches_bitsandbytes(exact_bnb, ours, theirs, kw):
    oa, a, ob, b, grads = _pair(ours, theirs, kw)
    _run(oa, a, grads)
    _run(ob, b, grads)
    assert oa.param_groups[0].keys() == ob.param_groups[0].keys()
    assert [oa.state[p]["state1"].dtype for p in a] == [torch.uint8, torch.float32, torch.uint8]
    _assert_close_runs(oa, a, ob, b)


def test_zero_gradients_never_move_params():
    """bitsandbytes' CPU lookup table quantizes an exact 0 in a mixed block to a non-zero code, so params whose
    gradient is always 0 drift; the exact nearest code of 0 is 0, and they stay."""
    params, grads = _problem()
    for step_grads in grads:
        step_grads[0][::2] = 0.0
    a = [p.clone().requires_grad_() for p in params]
    b = [p.clone().requires_grad_() for p in params]
    oa = fusedopt.FusedAdamW8bit(a, lr=1e-2, weight_decay=0.0)
    ob = bnb.optim.AdamW8bit(b, lr=1e-2, weight_decay=0.0)
    _run(oa, a, grads)
    _run(ob, b, grads)
    assert torch.equal(a[0].detach()[::2], params[0][::2])
    assert not torch.equal(b[0].detach()[::2], params[0][::2])


def test_twin_constructors_are_bitsandbytes():
    p = [torch.zeros(3, requires_grad=True)]
    for ours, theirs, kw in TWINS:
        o, t = getattr(fusedopt, ours)(p, **kw), getattr(bnb.optim, theirs)(p, **kw)
        assert o.param_groups[0].keys() == t.param_groups[0].keys()
        for key in t.param_groups[0]:
            if key != "params":
                assert tuple(np.atleast_1d(o.param_groups[0][key])) == tuple(np.atleast_1d(t.param_groups[0][key]))
    bad = [("AdamW8bit", dict(amsgrad=True)), ("AdamW8bit", dict(optim_bits=8)), ("Adam8bit", dict(lr=-1.0)),
           ("Lion8bit", dict(betas=(0.9, 1.0))), ("SGD8bit", dict(lr=0.1)), ("SGD8bit", dict(lr=0.1, momentum=0.9,
           weight_decay=-1.0)), ("RMSprop8bit", dict(alpha=0.0)), ("RMSprop8bit", dict(centered=True)),
           ("Adagrad8bit", dict(lr_decay=0.1)), ("Adagrad8bit", dict(initial_accumulator_value=1.0)),
           ("Adagrad8bit", dict(optim_bits=32)), ("PagedAdamW8bit", dict(eps=-1.0)),
           ("PagedAdam8bit", dict(amsgrad=True)), ("PagedLion8bit", dict(lr=-1.0))]
    for name, kw in bad:
        with pytest.raises((ValueError, NotImplementedError)) as theirs:
            getattr(bnb.optim, name)(p, **kw)
        with pytest.raises(theirs.type, match=None) as ours:
            getattr(fusedopt, "Fused" + name)(p, **kw)
        assert str(ours.value) == str(theirs.value)


# ---- state_dict interchange ------------------------------------------------------------------------------------
@pytest.mark.parametrize("ours, theirs, kw", [t for t in TWINS if t[1] in ("AdamW8bit", "SGD8bit")],
                         ids=["AdamW8bit", "SGD8bit"])
def test_state_dict_interchange(exact_bnb, ours, theirs, kw):
    oa, a, ob, b, grads = _pair(ours, theirs, kw)
    _run(oa, a, grads[:2])
    _run(ob, b, grads[:2])
    saved_ours, saved_theirs = oa.state_dict(), ob.state_dict()
    # bitsandbytes' layout: step an int, the quantization tensors wrapped, keys in its order
    for mine, its in zip(saved_ours["state"].values(), saved_theirs["state"].values()):
        assert list(mine) == list(its) and type(mine["step"]) is int and mine["step"] == its["step"] == 2
        wrapped = mine["__bnb_optimizer_quant_state__"]
        assert list(wrapped) == list(its["__bnb_optimizer_quant_state__"])
        for key, t in wrapped.items():
            assert t.dtype == its["__bnb_optimizer_quant_state__"][key].dtype
            if key.startswith("qmap"):
                assert torch.equal(t, its["__bnb_optimizer_quant_state__"][key])

    # ours -> bitsandbytes, continued there; against ours continued
    oc = getattr(bnb.optim, theirs)(c := [p.detach().clone().requires_grad_() for p in a], **kw)
    oc.load_state_dict(copy.deepcopy(saved_ours))
    _run(oc, c, grads[2:])
    od, d = copy.deepcopy(oa), None
    d = [p for g in od.param_groups for p in g["params"]]
    _run(od, d, grads[2:])
    _assert_close_runs(od, d, oc, c)

    # bitsandbytes -> ours (its wrapped layout, and flat), continued; against bitsandbytes continued
    for layout in ("wrapped", "flat"):
        sd = copy.deepcopy(saved_theirs)
        if layout == "flat":
            for entry in sd["state"].values():
                entry.update(entry.pop("__bnb_optimizer_quant_state__"))
                entry["step"] = torch.tensor(float(entry["step"]))
        oe = getattr(fusedopt, ours)(e := [p.detach().clone().requires_grad_() for p in b], **kw)
        oe.load_state_dict(sd)
        _run(oe, e, grads[2:])
        of = getattr(bnb.optim, theirs)(f := [p.detach().clone().requires_grad_() for p in b], **kw)
        of.load_state_dict(copy.deepcopy(saved_theirs))  # (a deepcopy of a bitsandbytes optimizer cannot step)
        _run(of, f, grads[2:])
        _assert_close_runs(oe, e, of, f)

    # ours -> ours: bit for bit what continuing without the round trip gives
    og = getattr(fusedopt, ours)(g := [p.detach().clone().requires_grad_() for p in a], **kw)
    og.load_state_dict(saved_ours)
    _run(og, g, grads[2:])
    for x, y in zip(g, d):
        assert torch.equal(x, y)
    for x, y in zip(g, d):
        for key, t in od.state[y].items():
            assert torch.equal(og.state[x][key], t), key


# ---- state_dtype=torch.uint8 on every fused class ----------------------------------------------------------------
QUANTIZABLE = [name for name, entry in _C.algorithms.items() if entry["quantizable"]]
REFUSED = [name for name, entry in _C.algorithms.items() if not entry["quantizable"]]
# LAMB, LARS, BertAdam: sums over whole tensors (BertAdam: over its group) before an element-wise update
TWO_PHASE = [name for name in QUANTIZABLE if not _C.algorithms[name]["element_wise"]]


def _options(name: str) -> dict:
    """The case's options, with states to quantize (LARS keeps none without momentum)."""
    case = CASES[name]
    return {**case.required_options, **case.defaults, **({"momentum": 0.9} if name == "lars" else {})}


def _inputs(sizes, steps, seed=3, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(*s, generator=gen).to(dtype) for s in sizes]
    grads = [[torch.randn(*s, generator=gen).to(dtype) for s in sizes] for _ in range(steps)]
    return params, grads


@pytest.mark.parametrize("name", QUANTIZABLE)
def test_uint8_states(name):
    case = CASES[name]
    sizes = [(80, 70), (300,), (64, 3)]  # 5600 elements quantized, two under min_8bit_size
    params, grads = _inputs(sizes, 3)
    q = [p.clone().requires_grad_() for p in params]
    f = [p.clone().requires_grad_() for p in params]
    oq = case.fused(q, **_options(name), state_dtype=torch.uint8)
    of = case.fused(f, **_options(name))
    unsigned = _C.algorithms[name]["unsigned_map_states"]
    slot_keys = _C.algorithms[name]["state_names"]
    for step, step_grads in enumerate(grads):
        before = {k: v.clone() for k, v in of.state[f[0]].items()} if step else None
        for x, y, g in zip(q, f, step_grads):
            x.grad, y.grad = g.clone(), g.clone()
        oq.step()
        of.step()
        # small params: what state_dtype=None gives, bit for bit
        for x, y in zip(q[1:], f[1:]):
            assert torch.equal(x, y)
            assert oq.state[x].keys() == of.state[y].keys()
            for key, t in of.state[y].items():
                assert torch.equal(oq.state[x][key], t), key
        if step == 0:
            # the first step starts from states the codes hold exactly (zeros, ones, lr): the update is the f32
            # one, and the codes are those of the f32 states
            assert torch.equal(q[0], f[0])
            for k, key in enumerate(slot_keys):
                if key not in of.state[f[0]]:
                    continue
                codes, absmax = oracle_quantize(of.state[f[0]][key].numpy(), qmap(not unsigned >> k & 1))
                np.testing.assert_array_equal(oq.state[q[0]][key].numpy().reshape(-1), codes, err_msg=key)
                np.testing.assert_array_equal(oq.state[q[0]][key + "_absmax"].numpy(), absmax)
        del before
    big = oq.state[q[0]]
    used = [k for k in slot_keys if k in big]
    assert used and all(big[k].dtype == torch.uint8 for k in used)
    # about one byte per element and state (Adam: 2.03 bytes per element, a quarter of f32 moments)
    big_bytes = oq.state_bytes() - sum(t.numel() * t.element_size() for p in q[1:] for t in oq.state[p].values()
                                       if isinstance(t, torch.Tensor))
    assert big_bytes <= 1.05 * len(used) * q[0].numel()
    assert torch.isfinite(q[0]).all()


@pytest.mark.parametrize("name", REFUSED)
def test_uint8_states_refused(name):
    case = CASES[name]
    with pytest.raises(ValueError, match=f"{case.fused.__name__}.*state_dtype=torch.uint8"):
        case.fused([torch.zeros(3, requires_grad=True)], **case.defaults, state_dtype=torch.uint8)


@pytest.mark.parametrize("name", QUANTIZABLE)
def test_uint8_flatten_equals_unflattened(name):
    """flatten=True keeps each param's codes in its slot of one flat uint8 buffer, its blocks starting at its own
    first element: the same bits as flatten=False, also after grads and states are swapped out by user code."""
    case = CASES[name]
    sizes = [(70, 80), (300,), (4100,)]  # two quantized (the 4100 one ends in a partial block), one under 4096
    params, grads = _inputs(sizes, 4)
    flat = [p.clone().requires_grad_() for p in params]
    plain = [p.clone().requires_grad_() for p in params]
    of = case.fused(flat, **_options(name), state_dtype=torch.uint8, flatten=True)
    op = case.fused(plain, **_options(name), state_dtype=torch.uint8)
    for step, step_grads in enumerate(grads):
        for x, y, g in zip(flat, plain, step_grads):
            x.grad, y.grad = g.clone(), g.clone()  # a new grad tensor every step: moved into its slot
        if step == 2:  # a state_dict of flatten=False loaded into the flattened optimizer: codes moved in
            of.load_state_dict(copy.deepcopy(op.state_dict()))
        of.step()
        op.step()
        for x, y in zip(flat, plain):
            assert torch.equal(x, y)
            assert of.state[x].keys() == op.state[y].keys()
            for key, t in op.state[y].items():
                assert torch.equal(of.state[x][key], t), key
    codes = [of.state[x][k] for x in (flat[0], flat[2]) for k in of.state[x] if of.state[x][k].dtype == torch.uint8]
    assert codes
    for t in codes:  # every code tensor is a view into a flat buffer, each in its own slot
        assert t._base is not None and t._base.dtype == torch.uint8 and t._base.numel() > t.numel()
        p, key = next((p, k) for p in flat for k, v in of.state[p].items() if v is t)
        assert of._flat.in_slot(p, of._codes_role(key), t)


@pytest.mark.parametrize("name", TWO_PHASE)
def test_two_phase_sums_read_the_decoded_states(name):
    """Their sums (LAMB's ‖u‖ from the moments) are taken on the states the codes hold: every step equals the f32
    step from the decoded states (the 8-bit state_dict loaded into an f32-state optimizer), params bit for bit, and
    the new codes are the oracle's quantization of that step's f32 states."""
    case = CASES[name]
    params, grads = _inputs([(70, 80), (4100,), (300,)], 4)
    q = [p.clone().requires_grad_() for p in params]
    oq = case.fused(q, **_options(name), state_dtype=torch.uint8)
    unsigned = _C.algorithms[name]["unsigned_map_states"]
    for step_grads in grads:
        f = [p.detach().clone().requires_grad_() for p in q]
        of = case.fused(f, **_options(name))
        if oq.state:
            of.load_state_dict(copy.deepcopy(oq.state_dict()))
        for x, y, g in zip(q, f, step_grads):
            x.grad, y.grad = g.clone(), g.clone()
        oq.step()
        of.step()
        for x, y in zip(q, f):
            assert torch.equal(x, y)
            for slot, key in enumerate(_C.algorithms[name]["state_names"]):
                if key not in oq.state[x] or oq.state[x][key].dtype != torch.uint8:
                    continue
                codes, absmax = oracle_quantize(of.state[y][key].numpy(), qmap(not unsigned >> slot & 1))
                np.testing.assert_array_equal(oq.state[x][key].numpy().reshape(-1), codes, err_msg=key)
                np.testing.assert_array_equal(oq.state[x][key + "_absmax"].numpy(), absmax, err_msg=key)
    assert sum(t.dtype == torch.uint8 for t in oq.state[q[0]].values()) >= 1


def test_min_8bit_size_refused():
    with pytest.raises(ValueError, match="min_8bit_size"):
        fusedopt.FusedAdamW([torch.zeros(3, requires_grad=True)], state_dtype=torch.uint8, min_8bit_size=-1)


def _snapshot(opt, params):
    return [p.detach().clone() for p in params], [{k: (v.clone() if isinstance(v, torch.Tensor) else v)
                                                   for k, v in opt.state[p].items()} for p in params]


def _assert_same(snapshot, opt, params):
    values, states = snapshot
    for p, v, s in zip(params, values, states):
        assert torch.equal(p.detach(), v)
        assert opt.state[p].keys() == s.keys()
        for k, t in s.items():
            assert torch.equal(opt.state[p][k], t) and opt.state[p][k].dtype == t.dtype, k


def test_failed_step_changes_nothing():
    params, grads = _inputs([(5000,), (4096,), (100,)], 2)
    ps = [p.clone().requires_grad_() for p in params]
    opt = fusedopt.FusedAdamW(ps[:2], lr=1e-2, state_dtype=torch.uint8)
    for p, g in zip(ps, grads[0]):
        p.grad = g
    opt.step()
    opt.add_param_group({"params": [ps[2]]})  # a fresh param: its new state must go again too
    before = _snapshot(opt, ps)
    for p, g in zip(ps, grads[1]):
        p.grad = g.clone()
    ps[1].grad.data = torch.zeros(17)  # a gradient of the wrong shape among others (set as a training loop can)
    with pytest.raises(ValueError, match="shape"):
        opt.step()
    _assert_same(before, opt, ps)
    # a loaded f32 state quantized by a step that fails is put back too
    sd = opt.state_dict()
    f32 = fusedopt.FusedAdamW([p.detach().clone().requires_grad_() for p in ps[:2]], lr=1e-2)
    f32.load_state_dict({"state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.randn(5000),
                                       "exp_avg_sq": torch.rand(5000)}}, "param_groups": sd["param_groups"][:1]})
    q = fusedopt.FusedAdamW(qs := [p.detach().clone().requires_grad_() for p in ps[:2]], lr=1e-2,
                            state_dtype=torch.uint8)
    q.load_state_dict(f32.state_dict())
    before = _snapshot(q, qs[:1])
    qs[0].grad, qs[1].grad = grads[1][0], grads[1][1]
    qs[1].grad.data = torch.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        q.step()
    _assert_same(before, q, qs[:1])


def _dequantize(codes: np.ndarray, absmax: np.ndarray, signed: bool) -> np.ndarray:
    return qmap(signed)[codes.reshape(-1)] * np.repeat(absmax, BLOCK)[:codes.size]


def _torch_adam_zero_grad_step(p: torch.Tensor, states: dict) -> dict:
    """torch.optim.Adam's states after one step with a zero gradient from `states` (f32 arrays, step 1)."""
    x = p.clone().requires_grad_()
    ref = torch.optim.Adam([x], lr=1e-2, foreach=False)
    ref.load_state_dict({"state": {0: {"step": torch.tensor(1.0), **{k: torch.from_numpy(v.copy())
                                                                      for k, v in states.items()}}},
                         "param_groups": [{**ref.param_groups[0], "params": [0]}]})
    x.grad = torch.zeros_like(x)
    ref.step()
    return {k: ref.state[x][k].numpy() for k in states}


def test_state_dict_conversions():
    """An f32 state loaded into 8-bit states is quantized; 8-bit states loaded into f32 ones are dequantized.
    Checked through one step with a zero gradient, against torch.optim.Adam from the (de)quantized values."""
    signed = {"exp_avg": True, "exp_avg_sq": False}
    params, grads = _inputs([(5000,)], 1)
    f = [params[0].clone().requires_grad_()]
    of = fusedopt.FusedAdam(f, lr=1e-2)
    f[0].grad = grads[0][0]
    of.step()
    q = [params[0].clone().requires_grad_()]
    oq = fusedopt.FusedAdam(q, lr=1e-2, state_dtype=torch.uint8)
    oq.load_state_dict(of.state_dict())
    q[0].grad = torch.zeros(5000)
    oq.step()  # (the conversion happens when the step needs the states)
    loaded = {k: _dequantize(*oracle_quantize(of.state[f[0]][k].numpy(), qmap(s)), s) for k, s in signed.items()}
    stepped = _torch_adam_zero_grad_step(params[0], loaded)
    state = oq.state[q[0]]
    for key, s in signed.items():
        np.testing.assert_array_equal(state[key].numpy(), oracle_quantize(stepped[key], qmap(s))[0], err_msg=key)
    # and back: 8-bit into an f32-state optimizer
    back = fusedopt.FusedAdam([r := params[0].clone().requires_grad_()], lr=1e-2)
    back.load_state_dict(oq.state_dict())
    r.grad = torch.zeros(5000)
    back.step()
    codes = {k: _dequantize(state[k].numpy(), state[k + "_absmax"].numpy(), s) for k, s in signed.items()}
    stepped = _torch_adam_zero_grad_step(params[0], codes)
    for key in signed:
        np.testing.assert_allclose(back.state[r][key].numpy(), stepped[key], rtol=1e-6, atol=0)
        assert key + "_absmax" not in back.state[r]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_params_keep_f32_absmax(dtype):
    params, grads = _inputs([(5000,)], 3, dtype=dtype)
    ps = [params[0].clone().requires_grad_()]
    opt = fusedopt.FusedAdamW(ps, lr=1e-2, state_dtype=torch.uint8, master_weights=True)
    _run(opt, ps, grads[:2])
    sd = copy.deepcopy(opt.state_dict())
    other = fusedopt.FusedAdamW(qs := [ps[0].detach().clone().requires_grad_()], lr=1e-2, state_dtype=torch.uint8,
                                master_weights=True)
    other.load_state_dict(sd)
    for key, t in opt.state[ps[0]].items():
        assert other.state[qs[0]][key].dtype == t.dtype and torch.equal(other.state[qs[0]][key], t), key
    assert other.state[qs[0]]["exp_avg_absmax"].dtype == torch.float32
    _run(opt, ps, grads[2:])
    _run(other, qs, grads[2:])
    assert torch.equal(ps[0], qs[0])
    # a twin keeps its f32 absmax1 too (bitsandbytes' load keeps them f32)
    b = [params[0].clone().requires_grad_()]
    twin = fusedopt.FusedAdamW8bit(b)
    _run(twin, b, grads[:1])
    again = fusedopt.FusedAdamW8bit([params[0].clone().requires_grad_()])
    again.load_state_dict(twin.state_dict())
    state = next(iter(again.state.values()))
    assert state["absmax1"].dtype == torch.float32 and state["state1"].dtype == torch.uint8


def test_thread_count_invariance():
    params, grads = _inputs([(70001,), (5000,)], 3)
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            ps = [p.clone().requires_grad_() for p in params]
            opt = fusedopt.FusedAdamW8bit(ps, lr=1e-2)
            _run(opt, ps, grads)
            results.append([ps, [opt.state[p] for p in ps]])
    finally:
        torch.set_num_threads(threads)
    (p1, s1), (p2, s2) = results
    for x, y in zip(p1, p2):
        assert torch.equal(x, y)
    for a, b in zip(s1, s2):
        for key in a:
            assert torch.equal(a[key], b[key]), key


def test_options_that_read_grads():
    """max_grad_norm, accumulation_steps and GradScaler only change the gradients the step reads: against the same
    step on gradients changed by hand (clip_grad_norm_, the mean, the unscaled gradient)."""
    params, grads = _inputs([(5000,)], 2)
    p = params[0]

    def run(**options):
        x = p.clone().requires_grad_()
        return x, fusedopt.FusedAdamW([x], lr=1e-2, state_dtype=torch.uint8, **options)

    x, clipped = run(max_grad_norm=1.0)
    x.grad = grads[0][0].clone()
    clipped.step()
    y, plain = run()
    y.grad = grads[0][0].clone()
    torch.nn.utils.clip_grad_norm_([y], 1.0)
    plain.step()
    torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)
    x, acc = run(accumulation_steps=2)
    for g in (grads[0][0], grads[1][0]):
        x.grad = g.clone()
        acc.step()
    y, plain = run()
    y.grad = (grads[0][0] + grads[1][0]) / 2
    plain.step()
    torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)
    assert acc.state[x]["exp_avg"].dtype == torch.uint8
    # GradScaler: the step reads grad / scale (a power of two: exact), and skips on overflow
    x, scaled = run()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(x.sum()).backward()  # (the scaler's own bookkeeping; the gradient is replaced below)
    x.grad = grads[0][0] * 1024.0
    scaler.step(scaled)
    y, plain = run()
    y.grad = grads[0][0].clone()
    plain.step()
    assert torch.equal(x, y)
    for key, t in plain.state[y].items():
        assert torch.equal(scaled.state[x][key], t), key


def test_replaced_absmax_is_noticed():
    """The cached packing of the last step must notice an absmax tensor replaced in the state (the step writes the
    new one, never the old)."""
    params, grads = _inputs([(5000,)], 3)
    x = params[0].clone().requires_grad_()
    y = params[0].clone().requires_grad_()
    ox = fusedopt.FusedAdamW([x], lr=1e-2, state_dtype=torch.uint8)
    oy = fusedopt.FusedAdamW([y], lr=1e-2, state_dtype=torch.uint8)
    for p, o in ((x, ox), (y, oy)):
        p.grad = grads[0][0].clone()
        o.step()
        p.grad = grads[1][0].clone()
        o.step()
    old = ox.state[x]["exp_avg_absmax"]
    kept = old.clone()
    ox.state[x]["exp_avg_absmax"] = old.clone()
    for p, o in ((x, ox), (y, oy)):
        p.grad = grads[2][0].clone()
        o.step()
    assert torch.equal(old, kept)
    assert torch.equal(ox.state[x]["exp_avg_absmax"], oy.state[y]["exp_avg_absmax"])
    assert torch.equal(x, y)


@pytest.mark.parametrize("make", [
    lambda ps: fusedopt.FusedAdamW(ps, lr=1e-2, state_dtype=torch.uint8),
    lambda ps: fusedopt.FusedAdamW8bit(ps, lr=1e-2),
], ids=["state_dtype_uint8", "FusedAdamW8bit"])
def test_checkpoint_round_trip_continues_bit_for_bit(make, tmp_path):
    """fusedopt's safetensors checkpoints keep the codes (U8) and absmax: a run resumed from one takes the same
    next step as the run that saved it."""
    torch.manual_seed(0)
    w, b = torch.nn.Parameter(torch.randn(5000)), torch.nn.Parameter(torch.randn(10))
    opt = make([w, b])
    for _ in range(2):
        w.grad, b.grad = torch.randn(5000), torch.randn(10)
        opt.step()
    path = tmp_path / "c.safetensors"
    fusedopt.save_checkpoint(opt, path)
    w2, b2 = torch.nn.Parameter(w.detach().clone()), torch.nn.Parameter(b.detach().clone())
    resumed = make([w2, b2])
    fusedopt.load_checkpoint(resumed, path)
    g, gb = torch.randn(5000), torch.randn(10)
    w.grad, b.grad, w2.grad, b2.grad = g, gb, g.clone(), gb.clone()
    opt.step()
    resumed.step()
    assert torch.equal(w, w2) and torch.equal(b, b2)
    codes = [t for t in resumed.state[w2].values() if t.dtype == torch.uint8]
    assert len(codes) == 2
