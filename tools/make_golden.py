#!/usr/bin/env python3
"""Writes the golden vectors under tests/golden/ (checked by tests/golden_test.cc).

Run from the repository root with the project venv (torch 2.x, lion-pytorch 0.2.5, adamp 0.3.0):

    .venv/bin/python tools/make_golden.py

This file is the machinery (the hashed inputs, the run, the writer); each algorithm's reference (torch.optim's
class where torch has the algorithm, else its reference implementation: lion-pytorch, clovaai's adamp, or one of
ours written from the reference's formulas, tools/*_reference.py) and cases are tools/golden_cases.py. Every case
runs the single-tensor path (foreach=False and fused=False where the class takes them) on float32 CPU tensors for
STEPS steps (those of golden_cases.LONG_RUNS: their own count) and
records the params and the optimizer state (torch state_dict keys) after the steps in CHECKPOINTS. Inputs are
not stored: the initial params and every gradient come from a 32-bit integer hash
that the C++ test reimplements bit for bit (see `value` below), so each file holds only the hyper-parameters,
the layout and the results. The output is deterministic: the same torch build and CPU capability write the
same bytes.

torch should run with the AVX2 CPU capability (it uses FMA for add_/addcmul_/lerp_; torch-semantics.md
§3, §10); the capability in use is recorded in each file. Set ATEN_CPU_CAPABILITY=avx2 if the machine would
pick AVX512. Even so, the PyPI torch 2.x wheel computes sqrt through MKL VML, which is not correctly rounded
(about 1 float32 in 5 is 1 ulp off; each file records a probe in "torch_sqrt"), so only SGD can match a
correctly rounded kernel bit for bit. `--exact-sqrt` swaps in an IEEE sqrt to check that this is the only
difference (write those files elsewhere with --out):

    .venv/bin/python tools/make_golden.py --exact-sqrt --out /tmp/golden_exact
    FOPT_GOLDEN_DIR=/tmp/golden_exact build/release/bin/fusedopt_tests --gtest_filter='Golden*'
"""

import argparse
import inspect
import json
import math
import os
import sys

import numpy as np

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tools/: the cases and our own references
from golden_cases import GLOBAL_MAX_GRAD_NORM, LONG_RUNS, REFERENCE_VERSIONS, REFERENCES, SCENARIOS  # noqa: E402

STEPS = 20
CHECKPOINTS = [1, 5, 20]
SIZES = [1, 7, 33, 64]
PARAM_SCALE = 1.0
GRAD_SCALE = 1.0
M32 = 0xFFFFFFFF

# Global steps (1-based) on which the intermittent tensor of the "groups_none_grad" cases has no grad. It
# also misses step 1, so its state is created lazily on global step 2 (its own step 1). Beyond step 20 (LONG_RUNS)
# it misses every step s with s % 9 == 4.
NONE_GRAD_STEPS = {1, 3, 4, 7, 10, 11, 12, 16, 19}


def mix32(x):
    """The 'lowbias32' integer finalizer (Chris Wellons); a bijection on 32-bit integers."""
    x &= M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    x ^= x >> 16
    return x


def hash32(seed, tensor, step, index):
    x = mix32(seed)
    x = mix32(x ^ tensor)
    x = mix32(x ^ step)
    return mix32(x ^ index)


def value(seed, tensor, step, index, scale):
    """Element `index` of tensor `tensor`: its initial value for step 0, its gradient on global step `step`.

    k = h % 20001 and (k - 10000) / 10000.0 * scale are evaluated in double, then rounded once to float32.
    """
    k = hash32(seed, tensor, step, index) % 20001
    return float(np.float32((k - 10000) / 10000.0 * scale))


def make_tensor(seed, tensor, step, n, scale):
    return torch.tensor([value(seed, tensor, step, i, scale) for i in range(n)], dtype=torch.float32)


def floats(t):
    """A float32 tensor as a list of Python floats (exact: every float32 is a double)."""
    out = [float(x) for x in t.detach().reshape(-1).tolist()]
    for x in out:
        if not math.isfinite(x):
            raise RuntimeError("non-finite value in a golden vector")
    return out


def jsonable(v):
    if isinstance(v, torch.Tensor):
        return v.item()
    if isinstance(v, tuple):
        return [jsonable(x) for x in v]
    return v


def run_case(cls, name, seed, groups, group_of, has_grad, steps=STEPS, checkpoint_steps=CHECKPOINTS, shapes=None):
    """groups: list of hyper-parameter dicts; group_of[t]: group of tensor t; has_grad[s][t] for step s+1.
    shapes: the tensors' shapes (the same hashed values, reshaped; recorded in the case), or 1-D of SIZES."""
    n_tensors = len(group_of)
    shapes = shapes or [(n,) for n in SIZES[:n_tensors]]
    sizes = [math.prod(s) for s in shapes]
    params = [
        torch.nn.Parameter(make_tensor(seed, t, 0, sizes[t], PARAM_SCALE).reshape(shapes[t]))
        for t in range(n_tensors)
    ]
    # Group 0's hyper-parameters go to the constructor (as users write it); later groups override them.
    # This matters for Adagrad, whose eager `sum` is filled with the constructor's initial_accumulator_value
    # even when a group dict sets another one (torch quirk).
    constructor = dict(groups[0])
    torch_groups = []
    for gi, hyper in enumerate(groups):
        g = {} if gi == 0 else dict(hyper)
        g["params"] = [params[t] for t in range(n_tensors) if group_of[t] == gi]
        torch_groups.append(g)
    # Group order in torch == order of tensors (the tensors of group 0 come first), so that state_dict's
    # integer ids equal our tensor indices.
    order = [t for gi in range(len(groups)) for t in range(n_tensors) if group_of[t] == gi]
    if order != list(range(n_tensors)):
        raise RuntimeError(f"{name}: tensors must be listed group by group")

    # Only the arguments the class takes: RMSprop has no `fused`, Lion and LambReference have neither.
    accepted = inspect.signature(cls.__init__).parameters
    flags = {k: False for k in ("foreach", "fused") if k in accepted}
    opt = cls(torch_groups, **constructor, **flags)
    checkpoints = []
    for step in range(1, steps + 1):
        for t, p in enumerate(params):
            p.grad = (make_tensor(seed, t, step, sizes[t], GRAD_SCALE).reshape(shapes[t]) if has_grad[step - 1][t]
                      else None)
        opt.step()
        if step in checkpoint_steps:
            sd = opt.state_dict()
            states = []
            for t in range(n_tensors):
                st = {}
                for key, v in sorted(sd["state"].get(t, {}).items()):
                    if key == "step":
                        st[key] = int(v.item()) if isinstance(v, torch.Tensor) else int(v)
                    elif v is None:
                        st[key] = None
                    else:
                        if v.dtype != torch.float32:
                            raise RuntimeError(f"{name}: state {key} is {v.dtype}")
                        st[key] = floats(v)
                states.append(st)
            checkpoints.append(
                {"step": step, "params": [floats(p) for p in params], "state": states}
            )

    saved_groups = []
    for g in opt.state_dict()["param_groups"]:
        saved_groups.append({k: jsonable(v) for k, v in sorted(g.items()) if k != "params"})
    case = {
        "name": name,
        "seed": seed,
        "sizes": sizes,
        "constructor": {k: jsonable(v) for k, v in sorted(constructor.items())},
        "groups": saved_groups,
        "group_of": group_of,
        "has_grad": has_grad,
    }
    if any(len(s) > 1 for s in shapes):
        case["shapes"] = [list(s) for s in shapes]  # AdamP: a param of more than one dimension is projected
    if "max_grad_norm" in opt.defaults and cls in GLOBAL_MAX_GRAD_NORM:
        # LAMB: the global clipping threshold (the copies in the group dicts are ignored).
        case["max_grad_norm"] = opt.defaults["max_grad_norm"]
    case["checkpoints"] = checkpoints
    return case


def all_grads(steps=STEPS):
    return [[True] * len(SIZES) for _ in range(steps)]


def none_grad_pattern(steps=STEPS):
    # Tensor 2 (in group 1) skips the steps in NONE_GRAD_STEPS, and after step 20 those with s % 9 == 4.
    def skips(s):
        return s in NONE_GRAD_STEPS or (s > 20 and s % 9 == 4)

    return [[not (t == 2 and skips(s)) for t in range(len(SIZES))] for s in range(1, steps + 1)]


TWO_GROUPS = [0, 0, 1, 1]
ONE_GROUP = [0, 0, 0, 0]


def sqrt_probe(n=100000):
    """How many of n float32 values torch.sqrt rounds differently from the correctly rounded sqrt.

    Nonzero on builds whose CPU sqrt goes through MKL VML (PyPI wheels: about 1 in 5 values off by 1 ulp);
    the Adam/RMSprop/Adagrad goldens then cannot be matched bit for bit by a correctly rounded kernel.
    """
    x = np.array([abs(value(12345, 0, 0, i, 4.0)) for i in range(n)], dtype=np.float32)
    ours = np.sqrt(x)  # IEEE sqrt: correctly rounded
    theirs = _TORCH_SQRT(torch.from_numpy(x)).numpy()
    return {"values": n, "not_correctly_rounded": int((ours.view(np.uint32) != theirs.view(np.uint32)).sum())}


_TORCH_SQRT = torch.Tensor.sqrt


def use_exact_sqrt():
    """Diagnostic only: makes Tensor.sqrt/sqrt_ correctly rounded (numpy's IEEE sqrt) for float32 tensors."""

    def sqrt(self):
        return torch.from_numpy(np.sqrt(self.detach().numpy()))

    def sqrt_(self):
        self.copy_(sqrt(self))
        return self

    torch.Tensor.sqrt = sqrt
    torch.Tensor.sqrt_ = sqrt_


def cpu_capability_line():
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage" in line:
            return line.strip().lstrip("- ").strip()
    return "unknown"


def dump(obj, indent=0):
    """JSON with objects and lists of containers one item per line, and lists of scalars on one line."""
    pad = " " * indent
    inner = " " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {dump(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(x, (dict, list)) for x in obj):
        items = [inner + dump(x, indent + 1) for x in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj, allow_nan=False, separators=(",", ":"))


def main():
    parser = argparse.ArgumentParser(description="Writes torch.optim golden vectors (tests/golden/*.json).")
    parser.add_argument("--out", default=os.path.join("tests", "golden"), help="output folder")
    # A diagnostic: swaps torch's sqrt for a correctly rounded one; the fp32 kernels should then match bit
    # for bit (run the test with FOPT_GOLDEN_DIR=OUT).
    parser.add_argument("--exact-sqrt", action="store_true", help="use an IEEE sqrt instead of torch's")
    args = parser.parse_args()
    exact_sqrt, out_dir = args.exact_sqrt, args.out
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)  # unused (inputs come from the hash); set for good measure
    probe = sqrt_probe()
    if exact_sqrt:
        use_exact_sqrt()
    header = {
        "generator": "tools/make_golden.py",
        "torch_version": torch.__version__,
        "cpu_capability": cpu_capability_line(),
        "torch_sqrt": probe,
        "exact_sqrt_diagnostic": exact_sqrt,
        "path": "single-tensor (foreach=False, fused=False), float32 CPU tensors",
        "inputs": {
            "hash": "mix32(x) = lowbias32: x ^= x>>16; x *= 0x7feb352d; x ^= x>>15; x *= 0x846ca68b; "
            "x ^= x>>16 (mod 2^32). h = mix32(mix32(mix32(mix32(seed) ^ tensor) ^ step) ^ index)",
            "value": "float32((h % 20001 - 10000) / 10000.0 * scale), evaluated in double",
            "initial_params": "step = 0, scale = param_scale",
            "grads": "step = global step (1-based), scale = grad_scale, only where has_grad[step-1][tensor]",
            "param_scale": PARAM_SCALE,
            "grad_scale": GRAD_SCALE,
        },
    }
    for seed_base, (algo, (cls, cases, *shapes)) in enumerate(SCENARIOS.items()):
        steps, checkpoint_steps = LONG_RUNS.get(algo, (STEPS, CHECKPOINTS))
        out_cases = []
        for ci, (name, groups) in enumerate(cases):
            seed = 1000 * (seed_base + 1) + ci
            if len(groups) == 1:
                group_of, has_grad = ONE_GROUP, all_grads(steps)
            else:
                group_of, has_grad = TWO_GROUPS, none_grad_pattern(steps)
            out_cases.append(run_case(cls, name, seed, groups, group_of, has_grad, steps, checkpoint_steps, *shapes))
        extra = dict(REFERENCES.get(algo, {}))
        if algo in REFERENCE_VERSIONS:
            extra["reference"] %= REFERENCE_VERSIONS[algo]()
        doc = {"algorithm": algo, **header, "steps": steps, "checkpoint_steps": checkpoint_steps, **extra,
               "cases": out_cases}
        path = os.path.join(out_dir, f"{algo.lower()}.json")
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(dump(doc) + "\n")
        print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(out_cases)} cases)")


if __name__ == "__main__":
    main()
