"""Shared helpers for the fusedopt drop-in tests (issue #3).

torch.optim (single-tensor path, foreach=False) is the independent reference everywhere: every test
runs the same scripted problem through a torch.optim optimizer and through its fusedopt twin and
compares params, states and whatever else the scenario is about.
"""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys

import numpy as np
import pytest
from algorithm_cases import PARITY

import torch

# Sizes of the random multi-tensor problem: 1 element, 7 elements, more than ATen's and fusedopt's
# 32768-element grain, a 2-D and a 3-D tensor.
SIZES = [(1,), (7,), (40000,), (33, 17), (4, 3, 5)]

# The algorithms of the generic suites and their per-algorithm data, by public name (algorithm_cases.py's table).
TORCH = {name: case.torch for name, case in PARITY.items()}
FUSED = {name: case.fused for name, case in PARITY.items()}
NAMES = list(PARITY)
# The rules without a square root: with float hyper-parameters the fused step reproduces torch's
# for-loop bit for bit as torch is. The others agree within a relative bound (torch's CPU fp32 sqrt is
# not correctly rounded), and bit for bit with an IEEE sqrt in torch (the ieee_sqrt fixture).
SQRT_FREE = tuple(name for name, case in PARITY.items() if case.sqrt_free)

# A "typical" option set per class (used where the scenario is not about the options).
BASE_KW = {name: case.defaults for name, case in PARITY.items()}

# Per-group overrides for groups 1 and 2 (group 0 takes the constructor's values).
GROUP_KW = {name: case.two_groups for name, case in PARITY.items()}


# ---- the random multi-tensor problem ------------------------------------------------------------

def make_params(seed: int = 0, dtype=torch.float32, sizes=SIZES) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in sizes]


def clone_params(params) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def groups_of(params, name: str | None = None, group_kw=None):
    """2-3 param groups: [p0, p1], [p2, p3], [p4, ...] with different hyper-parameters."""
    kws = group_kw if group_kw is not None else (GROUP_KW[name] if name else [{}, {}])
    out = [{"params": list(params[:2])}]
    rest = list(params[2:])
    out.append({"params": rest[:2], **copy.deepcopy(kws[0])})
    if rest[2:]:
        out.append({"params": rest[2:], **copy.deepcopy(kws[1])})
    return out


def has_grad(t: int, i: int) -> bool:
    """Which params get a grad on step t: some skip steps, the last one only starts at step 10."""
    if i == 1:
        return t % 3 != 0
    if i == 3:
        return t % 5 != 2
    if i == 4:
        return t >= 10
    return True


@functools.lru_cache(maxsize=4096)
def _randn(shape: tuple, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def set_grads(params, t: int, skip=has_grad, seed: int = 1234, sign: float = 1.0):
    """Grads of the quadratic loss sign*0.5*c_i*|p - target_i|^2 plus noise, all reproducible from
    (seed, t, i), computed from the param's own current value (so errors feed back), in the
    param's dtype. Params without a grad this step get grad None. sign=-1 is the loss that
    maximize=True climbs (so maximize runs converge instead of blowing up)."""
    for i, p in enumerate(params):
        if not skip(t, i):
            p.grad = None
            continue
        noise = _randn(tuple(p.shape), seed * 100003 + t * 101 + i)
        target = _randn(tuple(p.shape), seed + 7 * i)
        c = 0.5 + 0.25 * i
        g = c * (p.detach().float() - target) + 0.5 * noise
        p.grad = (g if sign == 1.0 else g * sign).to(p.dtype)


def set_fixed_grads(params, t: int, dtype=None, skip=lambda t, i: True, seed: int = 99):
    """Grads that do not depend on the params (so two runs whose params differ still see the same
    grads): noise rounded to `dtype` (default: the param's), then cast to the param's dtype."""
    for i, p in enumerate(params):
        if not skip(t, i):
            p.grad = None
            continue
        g = _randn(tuple(p.shape), seed * 100003 + t * 101 + i) + 0.3
        p.grad = g.to(dtype or p.dtype).to(p.dtype)


def run(opt, params, steps, start: int = 0, grads=set_grads, **kw):
    for t in range(start, start + steps):
        grads(params, t, **kw)
        opt.step()


# ---- comparisons --------------------------------------------------------------------------------

def close_mask(a: torch.Tensor, r: torch.Tensor, rtol: float = 1e-5, floor: float = 1e-2):
    """|a - r| <= rtol * max(|r|, floor * max|r| over the tensor) (a buffer-relative floor, for
    elements that cross zero). NaNs must sit at the same places."""
    a = a.detach().double()
    r = r.detach().double()
    both_nan = torch.isnan(a) & torch.isnan(r)
    scale = r.abs().nan_to_num(0.0).max() if r.numel() else torch.tensor(0.0, dtype=torch.float64)
    bound = rtol * torch.maximum(r.abs(), floor * scale)
    return both_nan | ((a - r).abs() <= bound) | (a == r)


def assert_close(a: torch.Tensor, r: torch.Tensor, what: str = "", rtol: float = 1e-5, floor: float = 1e-2):
    assert a.shape == r.shape, f"{what}: shape {tuple(a.shape)} != {tuple(r.shape)}"
    ok = close_mask(a, r, rtol, floor)
    if not bool(ok.all()):
        bad = (~ok).nonzero()[0].tolist()
        i = tuple(bad)
        rel = ((a.double() - r.double()).abs() / r.double().abs().clamp_min(1e-30)).max().item()
        raise AssertionError(f"{what}: {int((~ok).sum())}/{a.numel()} elements differ, first at {i}: "
                             f"{a[i].item()!r} vs {r[i].item()!r}; max rel diff {rel:.3g}")


def assert_bitwise(a: torch.Tensor, r: torch.Tensor, what: str = ""):
    assert a.dtype == r.dtype and a.shape == r.shape, f"{what}: {a.dtype}{tuple(a.shape)} vs {r.dtype}{tuple(r.shape)}"
    ia, ir = as_int(a), as_int(r)
    if not torch.equal(ia, ir):
        n = int((ia != ir).sum())
        i = tuple((ia != ir).nonzero()[0].tolist())
        raise AssertionError(f"{what}: {n}/{a.numel()} elements differ bitwise, first at {i}: "
                             f"{a[i].item()!r} vs {r[i].item()!r}")


# ---- 16-bit storage ulps ------------------------------------------------------------------------

# Measured (torch 2.13, AVX2, 10 steps of test_parity's 16-bit problem, fp16 with eps=1e-2): fused and torch 16-bit runs differ by at most
# 6 bf16 ulps (SGD momentum, AdamW) and 10 fp16 ulps (AdamW; every other case <= 6), counted in ulps
# of max(|ref|, max|ref|/8) (elements that crossed zero are measured against the tensor's scale).
# torch rounds every intermediate to the storage type (fp16 AdamW: p*(1-lr*wd) in fp16 puts torch
# itself 10 ulps from the fp32 run), fused rounds once per step. Bound: measured + 2.
ULP_BOUND = {torch.bfloat16: 8, torch.float16: 12}
MANTISSA = {torch.bfloat16: 7, torch.float16: 10}


def ulp_err(a, r, floor_frac=1 / 8):
    """|a - r| in ulps of a's 16-bit dtype at max(|r|, floor_frac * max|r| over the tensor)."""
    r64 = r.detach().double()
    mag = torch.maximum(r64.abs(), r64.abs().max() * floor_frac).clamp_min(2.0 ** -120)
    ulp = torch.exp2(torch.floor(torch.log2(mag)) - MANTISSA[a.dtype])
    return (a.detach().double() - r64).abs() / ulp


def as_int(t: torch.Tensor) -> torch.Tensor:
    """The bits of a float tensor (so that -0.0 != 0.0 and NaN == NaN with the same payload)."""
    t = t.detach().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view({torch.float32: torch.int32, torch.float16: torch.int16,
                   torch.bfloat16: torch.int16, torch.float64: torch.int64}[t.dtype])


def state_tensors(opt):
    """{(param index, key): tensor} for every tensor in opt.state (params in param_groups order)."""
    params = [p for g in opt.param_groups for p in g["params"]]
    out = {}
    for i, p in enumerate(params):
        for k, v in opt.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                out[(i, k)] = v
    return out


def snapshot(opt):
    """Deep copies of every param and state tensor of opt (to check that nothing changed)."""
    params = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
    states = {k: v.detach().clone() for k, v in state_tensors(opt).items()}
    return params, states


def assert_unchanged(opt, snap, what=""):
    params, states = snap
    now = [p for g in opt.param_groups for p in g["params"]]
    assert len(now) == len(params)
    for i, (p, q) in enumerate(zip(now, params)):
        assert_bitwise(p, q, f"{what} param {i}")
    cur = state_tensors(opt)
    assert cur.keys() == states.keys(), f"{what}: state keys changed: {sorted(cur)} vs {sorted(states)}"
    for k in states:
        assert_bitwise(cur[k], states[k], f"{what} state {k}")


def compare_opts(fused, ref, what="", rtol=1e-5, bitwise=False, check_params=True, state_floor=0.1):
    """Params and every state entry of two optimizers over the same params layout. States are
    running sums whose elements cross zero (momentum buffers, grad averages), so their floor is
    `state_floor` of the buffer's max instead of 1e-2."""
    fp = [p for g in fused.param_groups for p in g["params"]]
    rp = [p for g in ref.param_groups for p in g["params"]]
    assert len(fp) == len(rp)
    def cmp(a, r, w, floor=state_floor):
        if bitwise:
            assert_bitwise(a, r, w)
        else:
            assert_close(a, r, w, rtol, floor)

    if check_params:
        for i, (a, r) in enumerate(zip(fp, rp)):
            cmp(a.detach(), r.detach(), f"{what} param {i}", 1e-2)
    for i, (a, r) in enumerate(zip(fp, rp)):
        sa, sr = fused.state.get(a, {}), ref.state.get(r, {})
        ka = {k for k, v in sa.items() if v is not None}
        kr = {k for k, v in sr.items() if v is not None}
        assert ka == kr, f"{what} param {i}: state keys {sorted(ka)} != torch's {sorted(kr)}"
        for k in kr:
            va, vr = sa[k], sr[k]
            if k == "step":
                assert float(va) == float(vr), f"{what} param {i}: step {float(va)} != {float(vr)}"
                assert isinstance(va, torch.Tensor) and va.dtype == vr.dtype and va.shape == vr.shape
                continue
            assert va.dtype == vr.dtype, f"{what} param {i} state {k}: {va.dtype} != {vr.dtype}"
            cmp(va, vr, f"{what} param {i} state {k}")


def pytest_configure(config):
    config.addinivalue_line("markers", "convergence: trains a small CNN to a target accuracy (slow, ~10 s)")


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread for torch and for the engine (which uses torch.get_num_threads()): on a
    busy 2-core machine OpenMP spin-waiting makes 2 threads 20x slower. Results do not depend on
    the thread count (test_parity.py::test_thread_count_does_not_change_results checks it)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def ieee_sqrt(monkeypatch):
    """torch's CPU float32 sqrt is not correctly rounded (~20 % of inputs one ulp off); with an IEEE
    sqrt (numpy's) substituted for float32 tensors in torch's single-tensor path, fusedopt must
    reproduce torch bit for bit: it then proves that sqrt is the only difference."""
    orig_sqrt, orig_sqrt_ = torch.Tensor.sqrt, torch.Tensor.sqrt_

    def sqrt(self):
        if self.dtype != torch.float32:
            return orig_sqrt(self)
        return torch.from_numpy(np.sqrt(self.detach().numpy()))

    def sqrt_(self):
        if self.dtype != torch.float32:
            return orig_sqrt_(self)
        self.copy_(sqrt(self))
        return self

    monkeypatch.setattr(torch.Tensor, "sqrt", sqrt)
    monkeypatch.setattr(torch.Tensor, "sqrt_", sqrt_)
    x = torch.rand(1000) * 10
    assert torch.equal(x.sqrt(), torch.from_numpy(np.sqrt(x.numpy())))


def run_isolated(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (with tests/python importable): for scenarios that may
    corrupt memory and abort the process, so that they fail one test, not the whole session."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, "-c", code], cwd=here, env=env, capture_output=True, text=True,
                          timeout=timeout)
