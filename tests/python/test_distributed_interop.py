"""Interoperability with torch.distributed, on 2 gloo ranks on 127.0.0.1 (dist_harness.run_ranks):
DistributedDataParallel driving FusedAdamW and FusedSGD, and ZeroRedundancyOptimizer with
optimizer_class=FusedAdamW (its parameter sharding, param broadcast after the step and
consolidate_state_dict), each against the same run with its torch.optim twin (foreach=False).

Starting the ranks dominates the cost (~4 s), so one run_ranks call computes every case
(interop_cases) and the tests below only compare what it returned."""

from __future__ import annotations

import contextlib
import math
import traceback

import fusedopt
import numpy as np
import pytest
from conftest import assert_close
from dist_harness import run_ranks

import torch

# Its ranks run once, on one xdist worker (scripts/test: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("distributed")

STEPS = 10
MODEL_SEED = 0
DATA_SEED = 1000
# Linear(256, 160) - Tanh - Linear(160, 8): 42408 params; the first weight (40960 elements) is more
# than one 32768-element chunk of the engine, so its multi-chunk path runs.
IN, HIDDEN, OUT = 256, 160, 8
MODEL_SHAPES = [(HIDDEN, IN), (HIDDEN,), (OUT, HIDDEN), (OUT,)]
BATCH = 16  # the global batch of a step; rank r trains on rows [r * BATCH / 2, (r + 1) * BATCH / 2)

ADAMW_KW = dict(lr=1e-3, weight_decay=0.1)
SGD_KW = dict(lr=0.05, momentum=0.9, weight_decay=1e-2)
# SGD has no sqrt: fused and torch agree bit for bit. AdamW divides by sqrt(v), and torch's CPU fp32
# sqrt is not correctly rounded: params agree within RTOL of max(|ref|, FLOOR * max|ref| over the
# tensor) (conftest.assert_close; an element that crossed zero is measured against the tensor's
# scale). Measured (torch 2.13, AVX2, 10 steps): 3.5e-7. With an IEEE sqrt in torch's AdamW
# (_ieee_sqrt) they agree bit for bit, which shows that sqrt is the only difference.
RTOL, FLOOR = 1e-6, 0.1
# exp_avg and exp_avg_sq of ZeRO's consolidated state_dict: the moments cross zero, so a floor of 0.1
# of the buffer's max as in conftest.compare_opts. Measured: 1.5e-6.
STATE_RTOL, STATE_FLOOR = 1e-5, 0.1

# name -> (fusedopt class, torch.optim class, optimizer kwargs, DistributedDataParallel kwargs)
DDP_CASES = {
    "adamw": ("FusedAdamW", "AdamW", ADAMW_KW, {}),
    "sgd": ("FusedSGD", "SGD", SGD_KW, {}),
    "sgd_nesterov": ("FusedSGD", "SGD", dict(SGD_KW, nesterov=True), {}),
    # the grads are views into DDP's flat all-reduce buckets
    "adamw_grad_bucket_view": ("FusedAdamW", "AdamW", ADAMW_KW, dict(gradient_as_bucket_view=True)),
    "sgd_nesterov_grad_bucket_view": (
        "FusedSGD",
        "SGD",
        dict(SGD_KW, nesterov=True),
        dict(gradient_as_bucket_view=True),
    ),
}
# name -> ZeroRedundancyOptimizer kwargs (besides optimizer_class and ADAMW_KW)
ZERO_CASES = {
    "zero": {},
    # the params of each rank's shard become views into one flat buffer
    "zero_param_bucket_view": dict(parameters_as_bucket_view=True),
}


# ---- what the ranks run -------------------------------------------------------------------------


def _model() -> torch.nn.Module:
    torch.manual_seed(MODEL_SEED)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def _batch(t: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(DATA_SEED + t)
    x, y = torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)
    rows = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
    return x[rows], y[rows]


def _train(ddp: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> list[list[torch.Tensor]]:
    """The params after each step."""
    rank = torch.distributed.get_rank()
    history = []
    for t in range(steps):
        x, y = _batch(t, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        history.append([p.detach().clone() for p in ddp.module.parameters()])
    return history


def _ddp_run(opt_class, kw: dict, ddp_kw: dict, steps: int) -> list[list[torch.Tensor]]:
    ddp = torch.nn.parallel.DistributedDataParallel(_model(), **ddp_kw)
    return _train(ddp, opt_class(ddp.parameters(), **kw), steps)


def _zero_run(opt_class, kw: dict, zero_kw: dict, steps: int) -> dict:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    ddp = torch.nn.parallel.DistributedDataParallel(_model())
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=opt_class, **zero_kw, **kw)
    history = _train(ddp, opt, steps)
    local = [p for g in opt.optim.param_groups for p in g["params"]]
    opt.consolidate_state_dict(to=0)
    state_dict = opt.state_dict() if torch.distributed.get_rank() == 0 else None
    return {"params": history, "local_numel": sum(p.numel() for p in local), "state_dict": state_dict}


@contextlib.contextmanager
def _ieee_sqrt():
    """torch's float32 Tensor.sqrt/sqrt_ replaced by numpy's correctly rounded one (as conftest's
    ieee_sqrt fixture does): torch's AdamW then differs from the engine's in nothing else."""
    orig_sqrt, orig_sqrt_ = torch.Tensor.sqrt, torch.Tensor.sqrt_

    def sqrt(self):
        return torch.from_numpy(np.sqrt(self.detach().numpy())) if self.dtype == torch.float32 else orig_sqrt(self)

    def sqrt_(self):
        return self.copy_(sqrt(self)) if self.dtype == torch.float32 else orig_sqrt_(self)

    torch.Tensor.sqrt, torch.Tensor.sqrt_ = sqrt, sqrt_
    try:
        yield
    finally:
        torch.Tensor.sqrt, torch.Tensor.sqrt_ = orig_sqrt, orig_sqrt_


def _guarded(fn, *args, ieee_sqrt: bool = False):
    """fn's result, or {"error": traceback} (one failing case does not hide the others' results)."""
    try:
        with _ieee_sqrt() if ieee_sqrt else contextlib.nullcontext():
            return fn(*args)
    except Exception:
        return {"error": traceback.format_exc()}


def interop_cases(steps: int) -> dict:
    """Every case, fused and torch, on this rank (run by dist_harness.run_ranks)."""
    out = {}
    for name, (fused, ref, kw, ddp_kw) in DDP_CASES.items():
        out[name] = {
            "fused": _guarded(_ddp_run, getattr(fusedopt, fused), kw, ddp_kw, steps),
            "torch": _guarded(_ddp_run, getattr(torch.optim, ref), dict(kw, foreach=False), ddp_kw, steps),
        }
        if ref == "AdamW":
            out[name]["torch_ieee_sqrt"] = _guarded(
                _ddp_run, torch.optim.AdamW, dict(kw, foreach=False), ddp_kw, steps, ieee_sqrt=True
            )
    for name, zero_kw in ZERO_CASES.items():
        out[name] = {
            "fused": _guarded(_zero_run, fusedopt.FusedAdamW, ADAMW_KW, zero_kw, steps),
            "torch": _guarded(_zero_run, torch.optim.AdamW, dict(ADAMW_KW, foreach=False), zero_kw, steps),
            "torch_ieee_sqrt": _guarded(
                _zero_run, torch.optim.AdamW, dict(ADAMW_KW, foreach=False), zero_kw, steps, ieee_sqrt=True
            ),
        }
    return out


# ---- the tests ----------------------------------------------------------------------------------

ADAMW_CASES = [name for name, case in DDP_CASES.items() if case[1] == "AdamW"] + list(ZERO_CASES)


def _run_ranks() -> list[dict]:
    return run_ranks("test_distributed_interop:interop_cases", 2, args=(STEPS,), timeout=120)


@pytest.fixture(scope="module")
def results() -> list[dict]:
    """interop_cases' results, one dict per rank (the module's tests share one xdist worker: pytestmark)."""
    return _run_ranks()


def _get(results: list[dict], rank: int, case: str, which: str):
    r = results[rank][case][which]
    if isinstance(r, dict) and "error" in r:
        pytest.fail(f"rank {rank}, {case}, the {which} run raised:\n{r['error']}", pytrace=False)
    return r


def _history(results: list[dict], rank: int, case: str, which: str) -> list[list[torch.Tensor]]:
    r = _get(results, rank, case, which)
    return r["params"] if case in ZERO_CASES else r


def _compare(
    a: torch.Tensor, r: torch.Tensor, what: str, bitwise: bool, rtol: float = RTOL, floor: float = FLOOR
) -> None:
    if bitwise:
        assert a.dtype == r.dtype and a.shape == r.shape, (
            f"{what}: {a.dtype}{tuple(a.shape)} vs {r.dtype}{tuple(r.shape)}"
        )
        if not torch.equal(a, r):
            n = int((a != r).sum())
            raise AssertionError(
                f"{what}: {n}/{a.numel()} elements differ, max abs diff "
                f"{(a.double() - r.double()).abs().max().item():.3g}"
            )
    else:
        assert_close(a, r, what, rtol=rtol, floor=floor)


def _compare_histories(fused, ref, what: str, bitwise: bool) -> None:
    assert len(fused) == len(ref) == STEPS
    for t, (ps, rs) in enumerate(zip(fused, ref)):
        assert len(ps) == len(rs) == len(MODEL_SHAPES)
        for i, (p, r) in enumerate(zip(ps, rs)):
            _compare(p, r, f"{what}: step {t + 1}, param {i} {tuple(r.shape)}", bitwise)


@pytest.mark.parametrize("case", DDP_CASES)
def test_ddp_matches_torch(results, case):
    bitwise = DDP_CASES[case][1] == "SGD"
    for rank in (0, 1):
        _compare_histories(
            _history(results, rank, case, "fused"),
            _history(results, rank, case, "torch"),
            f"DDP {case}, rank {rank}, fused vs torch",
            bitwise,
        )


@pytest.mark.parametrize("case", ZERO_CASES)
def test_zero_matches_torch(results, case):
    for rank in (0, 1):
        fused, ref = _get(results, rank, case, "fused"), _get(results, rank, case, "torch")
        # each rank's local optimizer holds a real share of the params (the sharding did happen)
        total = sum(math.prod(s) for s in MODEL_SHAPES)
        assert 0 < fused["local_numel"] == ref["local_numel"] < total
        _compare_histories(fused["params"], ref["params"], f"ZeRO {case}, rank {rank}, fused vs torch", False)


@pytest.mark.parametrize("case", ADAMW_CASES)
def test_adamw_matches_torch_with_ieee_sqrt_bitwise(results, case):
    # the substitution took effect: torch's own runs with and without it differ
    plain, ieee = (_history(results, 0, case, which) for which in ("torch", "torch_ieee_sqrt"))
    assert not all(torch.equal(p, q) for ps, qs in zip(plain, ieee) for p, q in zip(ps, qs))
    for rank in (0, 1):
        _compare_histories(
            _history(results, rank, case, "fused"),
            _history(results, rank, case, "torch_ieee_sqrt"),
            f"{case}, rank {rank}, fused vs torch with an IEEE sqrt",
            True,
        )


@pytest.mark.parametrize("case", [*DDP_CASES, *ZERO_CASES])
def test_ranks_hold_identical_params(results, case):
    for which in ("fused", "torch"):
        h0, h1 = (_history(results, rank, case, which) for rank in (0, 1))
        for t, (ps0, ps1) in enumerate(zip(h0, h1)):
            for i, (p0, p1) in enumerate(zip(ps0, ps1)):
                _compare(p0, p1, f"{case}, {which}: rank 1 vs rank 0, step {t + 1}, param {i}", True)


@pytest.mark.parametrize("case", ZERO_CASES)
def test_zero_consolidated_state_dict(results, case):
    """consolidate_state_dict(to=0), then state_dict() on rank 0: the whole model's state in torch's
    layout, as torch's AdamW's (within STATE_RTOL), and bit for bit as with an IEEE sqrt."""
    fused = _get(results, 0, case, "fused")["state_dict"]
    for which, bitwise in (("torch", False), ("torch_ieee_sqrt", True)):
        ref = _get(results, 0, case, which)["state_dict"]
        what = f"ZeRO {case}, rank 0's consolidated state_dict, fused vs {which}"
        assert fused.keys() == ref.keys(), what
        assert len(fused["param_groups"]) == len(ref["param_groups"]) == 1, what
        gf, gr = fused["param_groups"][0], ref["param_groups"][0]
        assert gf["params"] == gr["params"] == list(range(len(MODEL_SHAPES))), what
        for k in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"):
            assert gf[k] == gr[k], f"{what}: param group {k} {gf[k]!r} != {gr[k]!r}"
        assert sorted(fused["state"]) == sorted(ref["state"]) == gr["params"], what
        for i, sr in ref["state"].items():
            sf = fused["state"][i]
            assert sf.keys() == sr.keys(), f"{what}: param {i} state keys {sorted(sf)} != {sorted(sr)}"
            _compare(sf["step"], sr["step"], f"{what}: param {i} step", True)
            assert float(sf["step"]) == STEPS
            for k in ("exp_avg", "exp_avg_sq"):
                assert sf[k].shape == MODEL_SHAPES[i], f"{what}: param {i} {k} shape {tuple(sf[k].shape)}"
                _compare(sf[k], sr[k], f"{what}: param {i} {k}", bitwise, STATE_RTOL, STATE_FLOOR)
