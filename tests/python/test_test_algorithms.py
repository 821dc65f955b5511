"""The test-only algorithms (tests/algos: each a descriptor, a math body and a kernel, no other edit) get their
Python class as a registry algorithm does: fusedopt_test_algos binds them as fusedopt._C binds the registry
(src/python/algorithm_bindings.h), and fusedopt._generic.generic_class makes the fused class from its `algorithms`
entry. That class then replays their golden vectors (tests/algos/<lowercase torch name>.json, written from torch ops,
independent of the C++ math body) bit for bit, and continues bit-identically after a state_dict round trip and after
a fusedopt checkpoint (save_checkpoint / load_checkpoint into a fresh optimizer)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import fusedopt
import fusedopt_test_algos  # built with the Python module (tests/CMakeLists.txt), beside the build's fusedopt
import pytest
from conftest import assert_bitwise
from fusedopt import _C
from fusedopt._base import FusedOptimizerMixin
from fusedopt._generic import generic_class

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import make_golden as mg  # noqa: E402  (the golden files' hashed inputs)

ENTRIES = fusedopt_test_algos.algorithms
CLASSES = {name: generic_class(name, entry, __name__) for name, entry in ENTRIES.items()}
GOLDEN = {name: json.loads((ROOT / "tests" / "algos" / f"{entry['torch_name'].lower()}.json").read_text())
          for name, entry in ENTRIES.items()}
CASES = [pytest.param(name, case, id=f"{name}-{case['name']}") for name, doc in GOLDEN.items() for case in doc["cases"]]
RESUME_AT = 5  # the round trips' step: the second optimizer continues from there to the golden file's last step


def test_there_are_test_algorithms_and_they_are_not_the_registrys():
    assert ENTRIES, "fusedopt_test_algos binds no algorithm"
    for name, cls in CLASSES.items():
        assert name not in _C.algorithms
        assert cls.__name__ == f"Fused{ENTRIES[name]['torch_name']}"
        assert issubclass(cls, FusedOptimizerMixin) and issubclass(cls, torch.optim.Optimizer)
        assert cls._engine_step is ENTRIES[name]["step"]  # the test module's step, not one of _C's


def _params(case: dict) -> list[torch.nn.Parameter]:
    shapes = case.get("shapes") or [[n] for n in case["sizes"]]
    return [torch.nn.Parameter(mg.make_tensor(case["seed"], t, 0, n, mg.PARAM_SCALE).reshape(shapes[t]))
            for t, n in enumerate(case["sizes"])]


def _optimizer(name: str, case: dict, params: list) -> torch.optim.Optimizer:
    """As the golden file's generator built its reference: the constructor's keywords, each group's saved keys."""
    groups = [{**g, "params": [p for p, gi in zip(params, case["group_of"]) if gi == i]}
              for i, g in enumerate(case["groups"])]
    clip = {"max_grad_norm": case["max_grad_norm"]} if "max_grad_norm" in case else {}
    return CLASSES[name](groups, **case["constructor"], **clip, strict=True)  # strict: the engine steps every param


def _steps(opt, params: list, case: dict, first: int, last: int):
    """Global steps first..last (1-based) with the golden file's hashed gradients; yields each step after it."""
    for step in range(first, last + 1):
        for t, p in enumerate(params):
            grad = mg.make_tensor(case["seed"], t, step, p.numel(), mg.GRAD_SCALE).reshape(p.shape)
            p.grad = grad if case["has_grad"][step - 1][t] else None
        opt.step()
        yield step


def _assert_same_run(a, pa: list, b, pb: list, what: str):
    for t, (x, y) in enumerate(zip(pa, pb)):
        assert_bitwise(x.detach(), y.detach(), f"{what}: param {t}")
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    assert sa.keys() == sb.keys(), what
    for t in sa:
        assert sa[t].keys() == sb[t].keys(), f"{what}: param {t}"
        for key, v in sa[t].items():
            assert_bitwise(v, sb[t][key], f"{what}: param {t} state {key}")


@pytest.mark.parametrize(("name", "case"), CASES)
def test_golden_vectors_bit_for_bit(name, case):
    params = _params(case)
    opt = _optimizer(name, case, params)
    checkpoints = {c["step"]: c for c in case["checkpoints"]}
    for step in _steps(opt, params, case, 1, GOLDEN[name]["steps"]):
        if step not in checkpoints:
            continue
        golden = checkpoints[step]
        state = opt.state_dict()["state"]
        for t, p in enumerate(params):
            want = torch.tensor(golden["params"][t], dtype=torch.float32).reshape(p.shape)
            assert_bitwise(p.detach(), want, f"step {step} param {t}")
            assert sorted(state.get(t, {})) == sorted(golden["state"][t]), f"step {step} param {t}: state keys"
            for key, value in golden["state"][t].items():
                got = state[t][key]
                if key == "step":
                    assert int(got) == value, f"step {step} param {t}: state step"
                else:
                    assert_bitwise(got, torch.tensor(value, dtype=torch.float32).reshape(got.shape),
                                   f"step {step} param {t} state {key}")


@pytest.mark.parametrize(("name", "case"), CASES)
def test_state_dict_round_trip_continues_bit_identically(name, case):
    last = GOLDEN[name]["steps"]
    params = _params(case)
    opt = _optimizer(name, case, params)
    for _ in _steps(opt, params, case, 1, RESUME_AT):
        pass
    saved = opt.state_dict()
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = _optimizer(name, case, resumed_params)
    resumed.load_state_dict(saved)
    for _ in _steps(opt, params, case, RESUME_AT + 1, last):
        pass
    for _ in _steps(resumed, resumed_params, case, RESUME_AT + 1, last):
        pass
    _assert_same_run(resumed, resumed_params, opt, params, f"resumed at step {RESUME_AT}")


@pytest.mark.parametrize(("name", "case"), CASES)
def test_checkpoint_round_trip_continues_bit_identically(name, case, tmp_path):
    last = GOLDEN[name]["steps"]
    params = _params(case)
    opt = _optimizer(name, case, params)
    for _ in _steps(opt, params, case, 1, RESUME_AT):
        pass
    path = tmp_path / "checkpoint.safetensors"
    fusedopt.save_checkpoint(opt, path)
    resumed_params = [torch.nn.Parameter(torch.zeros_like(p)) for p in params]  # the file restores them
    resumed = _optimizer(name, case, resumed_params)
    fusedopt.load_checkpoint(resumed, path)
    for _ in _steps(opt, params, case, RESUME_AT + 1, last):
        pass
    for _ in _steps(resumed, resumed_params, case, RESUME_AT + 1, last):
        pass
    _assert_same_run(resumed, resumed_params, opt, params, f"checkpoint of step {RESUME_AT}")
