"""bench-torch's `engine` row and bench/one_call_ab.py: what they time as the engine alone is the fused step itself
(the drop-in's overhead is measured against it), on the fused impl's own tensors."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from conftest import assert_bitwise

import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import torch_bench  # noqa: E402


@pytest.mark.parametrize("optimizer", ["sgd", "adamw", "lamb"])
def test_the_engine_row_takes_the_fused_step(optimizer):
    """EngineOnly(opt).step() moves opt's params as opt.step() moves a twin's, bit for bit, step after step."""
    dims = [(3, 40), (700,), (5,)]
    opt = torch_bench.build_fused(optimizer, torch_bench.make_params(dims, torch.float32), False)
    twin = torch_bench.build_fused(optimizer, torch_bench.make_params(dims, torch.float32), False)
    for o in (opt, twin):
        o.step()
    engine = torch_bench.EngineOnly(opt)
    for _ in range(3):
        engine.step()
        twin.step()
        for a, b in zip(torch_bench.params_of(opt), torch_bench.params_of(twin)):
            assert_bitwise(a.detach(), b.detach(), optimizer)


def test_one_call_ab_runs():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "one_call_ab.py"), "--optimizer", "sgd", "--after",
                          "fused", "--numel", "1000", "--rounds", "3", "--threads", "1"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "the one call saves" in out and "over the engine" in out, out
