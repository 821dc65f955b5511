"""fusedopt.distributed.DistributedOptimizer on 2 gloo ranks when only one rank sees a reason not to step.

After backward every rank holds the same averaged gradients, but user code can still change one rank's
(here: an Inf written into rank 1's p.grad before scaler.step). The step's decisions (skip on overflow, a
non-finite clipping norm, a rejected step) must be the same on every rank: with zero=1 a rank that skips
alone leaves the others waiting in the param all-gather forever, and with zero=0 the ranks' params part.
The reference is the run's own state before the step: a skipped or rejected step leaves params and states
bit-identical on every rank. A hang fails the test through run_ranks' timeout, which kills the ranks."""

from __future__ import annotations

import copy
import math
import warnings

import fusedopt
import fusedopt.distributed
import pytest
import torch.distributed as dist
from dist_harness import run_ranks

import torch

pytestmark = pytest.mark.xdist_group("distributed")

INIT_SCALE = 2.0**10
CASES = [f"zero{zero}-{kind}" for zero in (0, 1) for kind in ("torch_scaler", "fused_scaler", "fused_unscale", "clip", "missing")]
# "fused_unscale": fusedopt.GradScaler with an explicit unscale_() before step (as before clipping).
# "missing": a param takes no part in rank 1's backward only, which rank 1 must refuse (as it does today) and
# rank 0, whose backward was complete, with it.


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _snapshot(model, opt) -> tuple:
    return [p.detach().clone() for p in model.parameters()], copy.deepcopy(opt.state_dict()["state"])


def _case(name: str, rank: int) -> dict:
    zero, kind = int(name[4]), name.split("-", 1)[1]
    model = _model()
    options = {"max_grad_norm": 1.0} if kind == "clip" else {}
    opt = fusedopt.distributed.DistributedOptimizer(
        fusedopt.FusedAdamW(model.parameters(), lr=1e-2, **options), zero=zero)
    scaler = {"torch_scaler": lambda: torch.amp.GradScaler("cpu", init_scale=INIT_SCALE),
              "fused_scaler": lambda: fusedopt.GradScaler(init_scale=INIT_SCALE),
              "fused_unscale": lambda: fusedopt.GradScaler(init_scale=INIT_SCALE)}.get(kind, lambda: None)()
    out: dict = {}
    for step in range(4):  # the third is the one with a reason on rank 1; the ranks go on together after it
        g = torch.Generator().manual_seed(step * 2 + rank)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        odd = step == 2
        if kind == "missing" and odd and rank == 1:
            loss = model[0](x).square().mean()  # the last Linear gets no gradient on this rank
        else:
            loss = torch.nn.functional.mse_loss(model(x), y)
        (loss if scaler is None else scaler.scale(loss)).backward()
        if odd:
            out["before"] = _snapshot(model, opt)
            if rank == 1 and kind != "missing":
                model[0].weight.grad[0, 0] = math.inf  # p.grad is its slot in the reduced bucket
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if scaler is None:
                    opt.step()
                else:
                    if kind == "fused_unscale":
                        scaler.unscale_(opt)
                    scaler.step(opt)
                    scaler.update()
            except RuntimeError as e:
                out.setdefault("errors", {})[step] = str(e)
        opt.zero_grad()
        if odd:
            out["after"] = _snapshot(model, opt)
            out["warnings"] = [str(w.message) for w in caught]
            out["scale"] = None if scaler is None else scaler.get_scale()
    out["params"] = [p.detach().clone() for p in model.parameters()]
    return out


def rank_overflow_cases() -> dict:
    rank = dist.get_rank()
    return {name: _case(name, rank) for name in CASES}


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    # A rank left alone in a collective fails through gloo's timeout (60 s, dist_harness) or is killed here.
    return run_ranks("test_distributed_overflow:rank_overflow_cases", 2, timeout=120)


def _assert_unchanged(before: tuple, after: tuple) -> None:
    for a, b in zip(before[0], after[0], strict=True):
        assert torch.equal(a, b), "a param changed"
    assert before[1].keys() == after[1].keys()
    for i, state in before[1].items():
        for key, value in state.items():
            assert torch.equal(value, after[1][i][key]), f"state {i} {key} changed"


@pytest.mark.parametrize("case", CASES)
def test_a_reason_one_rank_sees_stops_every_rank(ranks, case):
    for rank in ranks:
        _assert_unchanged(rank[case]["before"], rank[case]["after"])
    for a, b in zip(ranks[0][case]["params"], ranks[1][case]["params"], strict=True):
        assert torch.equal(a, b), "the ranks' params differ"
    errors = [rank[case].get("errors", {}) for rank in ranks]
    if case.endswith("missing"):
        assert "took no part in this backward on rank 1" in errors[1].pop(2)
        assert "rank 1 rejected this step" in errors[0].pop(2)
    if case.endswith(("fused_scaler", "fused_unscale")):  # its check spans the ranks: both scales back off
        assert ranks[0][case]["scale"] == ranks[1][case]["scale"] == INIT_SCALE / 2
    if case.endswith("torch_scaler"):
        # Rank 0's own check saw no Inf: it is told its scale did not back off, and the next step, with the
        # ranks' scales apart (which would mix gradients of two scales), is refused on every rank.
        assert ranks[1][case]["scale"] == INIT_SCALE / 2
        assert any("did not see" in w for w in ranks[0][case]["warnings"]), ranks[0][case]["warnings"]
        for rank in errors:
            assert "scales differ (512 to 1024" in rank.pop(3)
    assert errors == [{}, {}]
