#!/usr/bin/env python3
"""Writes tests/algos/signdescent.json, the golden vectors of the test-only sign descent algorithm
(tests/algos/sign_descent.h), with tools/make_golden.py's machinery (hashed inputs, cases, format) and a reference
written here in torch ops on float32 tensors, independent of the C++ math body:

    .venv/bin/python tests/algos/make_sign_descent_golden.py

The step p <- p * (1 - lr * wd) - lr * sign(g) rounds once per op: the products of sign(g) and -lr are exact, so
the fused kernel matches it bit for bit.
"""

import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_golden as mg  # noqa: E402


class SignDescentReference(torch.optim.Optimizer):
    """Sign descent, one tensor at a time: decoupled weight decay, then a step of -lr times the gradient's sign."""

    def __init__(self, params, lr=1e-3, weight_decay=0.0, maximize=False):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, maximize=maximize))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = -p.grad if group["maximize"] else p.grad
                if group["weight_decay"] != 0:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(grad.sign(), alpha=-group["lr"])


CASES = [
    ("default", [dict(lr=1e-2)]),
    ("weight_decay_maximize", [dict(lr=1e-2, weight_decay=0.1, maximize=True)]),
    ("groups_none_grad", [dict(lr=1e-2, weight_decay=0.05), dict(lr=3e-2, weight_decay=0.0, maximize=True)]),
]


def main():
    out = os.path.join(ROOT, "tests", "algos", "signdescent.json")
    cases = []
    for ci, (name, groups) in enumerate(CASES):
        if len(groups) == 1:
            group_of, has_grad = mg.ONE_GROUP, mg.all_grads()
        else:
            group_of, has_grad = mg.TWO_GROUPS, mg.none_grad_pattern()
        cases.append(mg.run_case(SignDescentReference, name, 90000 + ci, groups, group_of, has_grad))
    doc = {
        "algorithm": "SignDescent",
        "generator": "tests/algos/make_sign_descent_golden.py",
        "torch_version": torch.__version__,
        "cpu_capability": mg.cpu_capability_line(),
        "path": "float32 CPU tensors, one tensor at a time",
        "inputs": {"param_scale": mg.PARAM_SCALE, "grad_scale": mg.GRAD_SCALE, "hash": "tools/make_golden.py"},
        "steps": mg.STEPS,
        "checkpoint_steps": mg.CHECKPOINTS,
        "cases": cases,
    }
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        f.write(mg.dump(doc) + "\n")
    print(f"wrote {out} ({os.path.getsize(out)} bytes, {len(cases)} cases)")
    json.loads(open(out, encoding="utf-8").read())


if __name__ == "__main__":
    main()
