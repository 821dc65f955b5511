#!/usr/bin/env python3
"""Writes the golden vectors under tests/golden/ (checked by tests/golden_test.cc).

Run from the repository root with the project venv (torch 2.x, lion-pytorch 0.2.5, adamp 0.3.0):

    .venv/bin/python tools/make_golden.py

The references: torch.optim's SGD, Adam, AdamW, RMSprop, Adagrad, Adamax, Adadelta, RAdam, NAdam, ASGD, Rprop and Adafactor; lucidrains' lion_pytorch.Lion (the
independent reference of Lion); tools/lamb_reference.py's LambReference for LAMB (apex FusedLAMB written
from its formulas: apex itself is CUDA only); tools/lars_reference.py's LarsReference for LARS (apex LARC
around torch.optim.SGD, written from its formulas); tools/rmsproptf_reference.py's RMSpropTFReference for
RMSpropTF (torch_npu's NpuFusedRMSpropTF written from its formulas: the NPU class runs on Ascend only); clovaai's
adamp.AdamP for AdamP; tools/bert_adam_reference.py's BertAdamReference for BertAdam (torch_npu's NpuFusedBertAdam
written from its formulas). Every case runs the single-tensor path (foreach=False and fused=False where the
class takes them) on float32 CPU tensors for STEPS steps (the algorithms of LONG_RUNS: their own count) and
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
import importlib.metadata
import inspect
import json
import math
import os
import sys

import numpy as np
from adamp import AdamP
from lion_pytorch import Lion

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tools/: the references of our own
from lamb_reference import LambReference  # noqa: E402
from lars_reference import LarsReference  # noqa: E402
from bert_adam_reference import BertAdamReference  # noqa: E402
from rmsproptf_reference import RMSpropTFReference  # noqa: E402

STEPS = 20
CHECKPOINTS = [1, 5, 20]
# Algorithms whose files run longer: (steps, checkpoints). ASGD's step size decays with the step and its averaging
# starts only after t0 steps; Rprop's per-element step sizes grow and shrink until they reach their bounds;
# BertAdam's schedules run over t_total steps (and past them); Adafactor's rho = min(lr, 1/sqrt(t)) moves with t.
# Their cases run 100 steps.
LONG_RUNS = {
    "ASGD": (100, [1, 5, 20, 100]),
    "Rprop": (100, [1, 5, 20, 100]),
    "BertAdam": (100, [1, 5, 20, 100]),
    "Adafactor": (100, [1, 5, 20, 100]),
}
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
    if "max_grad_norm" in opt.defaults and cls is LambReference:
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

SCENARIOS = {
    "SGD": (
        torch.optim.SGD,
        [
            ("plain", [{"lr": 0.1}]),
            ("momentum", [{"lr": 0.1, "momentum": 0.9}]),
            ("momentum_dampening", [{"lr": 0.1, "momentum": 0.9, "dampening": 0.1}]),
            ("nesterov", [{"lr": 0.1, "momentum": 0.9, "nesterov": True}]),
            ("weight_decay_momentum", [{"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}]),
            ("maximize_weight_decay", [{"lr": 0.1, "weight_decay": 0.01, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 0.1, "momentum": 0.9},
                    {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01},
                ],
            ),
        ],
    ),
    "Adam": (
        torch.optim.Adam,
        [
            ("default", [{"lr": 1e-2}]),
            ("amsgrad", [{"lr": 1e-2, "amsgrad": True}]),
            ("weight_decay", [{"lr": 1e-2, "weight_decay": 0.05}]),
            ("maximize", [{"lr": 1e-2, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 3e-3, "weight_decay": 0.02, "betas": (0.8, 0.99)},
                ],
            ),
        ],
    ),
    "AdamW": (
        torch.optim.AdamW,
        [
            ("default", [{"lr": 1e-2}]),
            ("amsgrad", [{"lr": 1e-2, "amsgrad": True}]),
            ("lr_weight_decay", [{"lr": 3e-3, "weight_decay": 0.1}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 5e-3, "weight_decay": 0.1},
                ],
            ),
        ],
    ),
    "RMSprop": (
        torch.optim.RMSprop,
        [
            ("default", [{"lr": 1e-2}]),
            ("centered", [{"lr": 1e-2, "centered": True}]),
            ("momentum", [{"lr": 1e-2, "momentum": 0.9}]),
            (
                "centered_momentum_weight_decay",
                [{"lr": 1e-2, "centered": True, "momentum": 0.9, "weight_decay": 0.01}],
            ),
            ("maximize", [{"lr": 1e-2, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2, "momentum": 0.5},
                    {"lr": 3e-3, "weight_decay": 0.05, "centered": True},
                ],
            ),
        ],
    ),
    "Adagrad": (
        torch.optim.Adagrad,
        [
            ("default", [{"lr": 0.1}]),
            ("lr_decay", [{"lr": 0.1, "lr_decay": 0.01}]),
            (
                "initial_accumulator_weight_decay",
                [{"lr": 0.1, "initial_accumulator_value": 0.1, "weight_decay": 0.01}],
            ),
            ("maximize", [{"lr": 0.1, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 0.1},
                    {"lr": 0.05, "weight_decay": 0.01, "lr_decay": 0.02},
                ],
            ),
        ],
    ),
    # The new algorithms come after the torch.optim ones: seeds follow SCENARIOS order, so appending keeps
    # the older files byte for byte.
    "Lion": (
        Lion,
        [
            ("default", [{"lr": 1e-3}]),
            ("weight_decay", [{"lr": 3e-3, "weight_decay": 0.1}]),
            ("betas", [{"lr": 3e-3, "betas": (0.95, 0.98)}]),
            # lion-pytorch divides wd by the constructor lr: p *= 1 - lr * (wd / init_lr) = 0.9 every step.
            ("decoupled_weight_decay", [{"lr": 1e-2, "weight_decay": 0.1, "decoupled_weight_decay": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 3e-3, "weight_decay": 0.02},
                    {"lr": 1e-2, "weight_decay": 0.1},
                ],
            ),
        ],
    ),
    "LAMB": (
        LambReference,
        [
            # The hash grads have a global norm of about 6, so the default max_grad_norm=1.0 clips too.
            ("default", [{"lr": 1e-2}]),
            ("no_bias_correction", [{"lr": 1e-2, "bias_correction": False}]),
            ("l2_mode", [{"lr": 1e-2, "adam_w_mode": False, "weight_decay": 0.05}]),
            ("no_grad_averaging", [{"lr": 1e-2, "grad_averaging": False}]),
            ("no_weight_decay", [{"lr": 1e-2, "weight_decay": 0.0}]),  # no trust ratio
            ("nvlamb", [{"lr": 1e-2, "weight_decay": 0.0, "use_nvlamb": True}]),
            ("clipping", [{"lr": 1e-2, "max_grad_norm": 0.5}]),
            ("no_clipping", [{"lr": 1e-2, "max_grad_norm": 1e9}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 5e-3, "weight_decay": 0.1, "betas": (0.8, 0.99)},
                ],
            ),
        ],
    ),
    # torch.optim classes added after Lion and LAMB: appended, so the older files keep their seeds.
    "Adamax": (
        torch.optim.Adamax,
        [
            ("default", [{"lr": 2e-2}]),
            ("weight_decay", [{"lr": 2e-2, "weight_decay": 0.05}]),
            ("betas", [{"lr": 1e-2, "betas": (0.8, 0.99)}]),
            ("maximize", [{"lr": 2e-2, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 2e-2},
                    {"lr": 5e-3, "weight_decay": 0.02, "betas": (0.8, 0.99)},
                ],
            ),
        ],
    ),
    "Adadelta": (
        torch.optim.Adadelta,
        [
            ("default", [{"lr": 1.0}]),
            ("weight_decay", [{"lr": 0.5, "weight_decay": 0.05}]),
            ("rho_eps", [{"lr": 1.0, "rho": 0.8, "eps": 1e-4}]),
            ("maximize", [{"lr": 1.0, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1.0},
                    {"lr": 0.5, "weight_decay": 0.02, "rho": 0.8},
                ],
            ),
        ],
    ),
    # beta2 = 0.999: steps 1-5 are not rectified (p -= lr * m_hat), steps 6-20 are.
    "RAdam": (
        torch.optim.RAdam,
        [
            ("default", [{"lr": 1e-2}]),
            ("weight_decay", [{"lr": 1e-2, "weight_decay": 0.05}]),
            ("decoupled_weight_decay", [{"lr": 1e-2, "weight_decay": 0.1, "decoupled_weight_decay": True}]),
            ("maximize", [{"lr": 1e-2, "maximize": True}]),
            ("never_rectified", [{"lr": 1e-2, "betas": (0.8, 0.6)}]),  # rho_inf = 4: no step is rectified
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 3e-3, "weight_decay": 0.02, "betas": (0.8, 0.99)},
                ],
            ),
        ],
    ),
    # state['mu_product'] (a 0-d f32 tensor) is recorded as a one-element list.
    "NAdam": (
        torch.optim.NAdam,
        [
            ("default", [{"lr": 1e-2}]),
            ("weight_decay", [{"lr": 1e-2, "weight_decay": 0.05}]),
            ("decoupled_weight_decay", [{"lr": 1e-2, "weight_decay": 0.1, "decoupled_weight_decay": True}]),
            ("maximize", [{"lr": 1e-2, "maximize": True}]),
            ("momentum_decay", [{"lr": 1e-2, "momentum_decay": 0.05}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 3e-3, "weight_decay": 0.02, "betas": (0.8, 0.99), "momentum_decay": 0.0},
                ],
            ),
        ],
    ),
    # Every combination of weight decay (none, coupled, decoupled) x centered x momentum (none, lr in the
    # buffer, lr on the step): 18 cases, then two groups. Momentum 0.5: with 0.9 the 1-element tensor's param
    # ends near 0 after cancellation in one case, where torch's non-IEEE sqrt puts it 1e-5 (relative) from a
    # correctly rounded kernel; with --exact-sqrt every buffer is bit for bit either way.
    "RMSpropTF": (
        RMSpropTFReference,
        [
            (
                f"{decay}_{'centered' if centered else 'plain'}_{mode}",
                [
                    {
                        "lr": 1e-2,
                        "weight_decay": 0.0 if decay == "no_decay" else 0.05,
                        "decoupled_decay": decay == "decoupled",
                        "centered": centered,
                        "momentum": 0.0 if mode == "no_momentum" else 0.5,
                        "lr_in_momentum": mode != "momentum_lr_on_step",
                    }
                ],
            )
            for decay in ("no_decay", "coupled", "decoupled")
            for centered in (False, True)
            for mode in ("no_momentum", "momentum_lr_in_buffer", "momentum_lr_on_step")
        ]
        + [
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2, "momentum": 0.5, "alpha": 0.8},
                    {"lr": 3e-3, "weight_decay": 0.02, "decoupled_decay": True, "centered": True, "eps": 1e-6},
                ],
            ),
        ],
    ),
    # 100 steps (LONG_RUNS). state['eta'] and state['mu'] (0-d f32 tensors) are recorded as one-element lists;
    # with torch's t0 = 1e6, ax stays a copy of the param, so most cases average from step t0 + 2 on.
    "ASGD": (
        torch.optim.ASGD,
        [
            ("default", [{"lr": 1e-2}]),
            ("t0", [{"lr": 1e-2, "t0": 10.0}]),
            ("lambd_alpha", [{"lr": 0.05, "lambd": 0.1, "alpha": 0.5, "t0": 30.0}]),
            ("weight_decay", [{"lr": 1e-2, "weight_decay": 0.05, "t0": 5.0}]),
            ("maximize", [{"lr": 1e-2, "maximize": True, "t0": 20.0}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2, "t0": 15.0},
                    {"lr": 3e-3, "weight_decay": 0.02, "lambd": 1e-3, "t0": 40.0},
                ],
            ),
        ],
    ),
    # LARC's rate tc * ||p|| / (||g|| + wd * ||p|| + eps) is about 0.02 on these inputs: clip mode (the default)
    # scales lr 0.1 by about 0.2 and leaves lr 0.005 alone (min(rate / lr, 1) = 1).
    "LARS": (
        LarsReference,
        [
            ("default", [{"lr": 0.1}]),
            ("momentum", [{"lr": 0.1, "momentum": 0.9}]),
            ("dampening_weight_decay", [{"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}]),
            ("nesterov", [{"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}]),
            ("clipped_to_lr", [{"lr": 0.005, "momentum": 0.9, "weight_decay": 1e-4}]),
            ("scale_mode", [{"lr": 1.0, "momentum": 0.9, "clip": False, "trust_coefficient": 1e-3,
                             "weight_decay": 1e-4}]),
            # LARC's pitfall: adaptive_lr / lr = inf, min(inf, 1) = 1; the params stay, the buffer takes g + wd * p.
            ("lr_zero", [{"lr": 0.0, "momentum": 0.9, "weight_decay": 0.01}]),
            (
                "groups_none_grad",
                [
                    {"lr": 0.1, "momentum": 0.9},
                    {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01, "trust_coefficient": 0.05, "clip": False,
                     "eps": 1e-4},
                ],
            ),
        ],
    ),
    # 100 steps (LONG_RUNS): step sizes that reach step_sizes' bounds, and every sign case.
    "Rprop": (
        torch.optim.Rprop,
        [
            ("default", [{"lr": 1e-2}]),
            ("etas", [{"lr": 1e-2, "etas": (0.25, 1.75)}]),
            ("step_sizes", [{"lr": 1e-2, "step_sizes": (1e-3, 3e-2)}]),
            ("maximize", [{"lr": 1e-2, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 3e-3, "etas": (0.4, 1.3), "step_sizes": (1e-4, 0.1)},
                ],
            ),
        ],
    ),
    # clovaai's adamp.AdamP itself (adamp 0.3.0). Tensors 2 and 3 are a (6, 11) and a (4, 2, 3, 3) param: the hash
    # gradients are unrelated to the params, so their |cos| is about 1/sqrt(row length): delta 0.1 projects a layer
    # now and then, delta 1 most layers and some channel views, delta 10 every channel view.
    "AdamP": (
        AdamP,
        [
            ("default", [{"lr": 1e-2}]),
            ("weight_decay", [{"lr": 1e-2, "weight_decay": 0.1}]),
            ("layer_view", [{"lr": 1e-2, "weight_decay": 0.1, "delta": 1.0}]),
            ("channel_view", [{"lr": 1e-2, "weight_decay": 0.1, "delta": 10.0, "wd_ratio": 0.5}]),
            ("nesterov", [{"lr": 1e-2, "nesterov": True, "delta": 10.0, "weight_decay": 0.01}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2, "delta": 10.0},
                    {"lr": 3e-3, "weight_decay": 0.02, "betas": (0.8, 0.99), "delta": 1.0},
                ],
            ),
        ],
        [(1,), (7,), (6, 11), (4, 2, 3, 3)],
    ),
    # 100 steps (LONG_RUNS). The gradients' norm per group is about 6 (sizes 1, 7, 33, 64, values in [-1, 1]):
    # max_grad_norm 1 (the default) clips every step, 5 some steps, -1 none. The schedules run past t_total
    # (warmup_linear and warmup_poly are 0 there, warmup_cosine rises again). Each group is one clipping buffer.
    "BertAdam": (
        BertAdamReference,
        [
            ("default", [{"lr": 1e-2}]),
            ("no_clipping", [{"lr": 1e-2, "max_grad_norm": -1.0}]),
            ("partly_clipped_no_weight_decay", [{"lr": 1e-2, "max_grad_norm": 5.0, "weight_decay": 0.0}]),
            ("betas_e_weight_decay", [{"lr": 1e-2, "b1": 0.8, "b2": 0.99, "e": 1e-4, "weight_decay": 0.1}]),
            ("warmup_linear", [{"lr": 1e-2, "warmup": 0.1, "t_total": 80}]),
            ("linear_without_warmup", [{"lr": 1e-2, "t_total": 100}]),
            ("warmup_constant", [{"lr": 1e-2, "warmup": 0.2, "t_total": 100, "schedule": "warmup_constant"}]),
            ("warmup_cosine", [{"lr": 1e-2, "warmup": 0.1, "t_total": 70, "schedule": "warmup_cosine"}]),
            ("warmup_poly", [{"lr": 1e-2, "warmup": 0.05, "t_total": 90, "schedule": "warmup_poly"}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 3e-3, "weight_decay": 0.0, "max_grad_norm": 2.0, "t_total": 60, "warmup": 0.1,
                     "schedule": "warmup_cosine"},
                ],
            ),
        ],
    ),
    # torch.optim.Adafactor (new in torch 2.5), 100 steps (LONG_RUNS): rho = min(lr, 1/sqrt(t)) reaches lr after
    # 10^4 steps at lr 1e-2, so the large-lr cases exercise the 1/sqrt(t) branch. Tensors 1 and 2 are a (6, 11) and
    # a (3, 4, 5) param (factored over their last two dimensions; 3 is a batch), 0 and 3 vectors (variance).
    "Adafactor": (
        torch.optim.Adafactor,
        [
            ("default", [{"lr": 1e-2}]),
            ("weight_decay", [{"lr": 1e-2, "weight_decay": 0.1}]),
            ("large_lr", [{"lr": 0.5, "weight_decay": 0.05, "d": 2.0}]),
            ("eps", [{"lr": 1e-2, "eps": (1e-3, 1e-2), "beta2_decay": -0.5}]),
            ("maximize", [{"lr": 1e-2, "maximize": True}]),
            (
                "groups_none_grad",
                [
                    {"lr": 1e-2},
                    {"lr": 3e-3, "weight_decay": 0.02, "beta2_decay": -0.6, "eps": (1e-20, 1e-3)},
                ],
            ),
        ],
        [(1,), (6, 11), (3, 4, 5), (33,)],
    ),
}

# What each non-torch.optim file says about its reference (the torch.optim files have no such entry).
REFERENCES = {
    "Lion": {
        "reference": "lion_pytorch.Lion (lucidrains/lion-pytorch) %s; its state has no step; "
        "decoupled_weight_decay is a constructor argument (wd is divided by the constructor lr)",
    },
    "LAMB": {
        "reference": "tools/lamb_reference.py LambReference: apex FusedLAMB written from its formulas, with a "
        "per-param state step; max_grad_norm is global (each case's max_grad_norm; the group copies are ignored)",
    },
    "RMSpropTF": {
        "reference": "tools/rmsproptf_reference.py RMSpropTFReference: torch_npu NpuFusedRMSpropTF written from its "
        "formulas (eps inside the sqrt, square_avg starting at ones, decoupled decay p*(1 - wd) not scaled by lr), "
        "with a float32 tensor state step",
    },
    "AdamP": {
        "reference": "adamp.AdamP (clovaai/AdamP) %s, which torch_npu's NpuFusedAdamP ports; its state step is a "
        "Python int; each case's shapes give the params of more than one dimension (projected per channel row or "
        "per layer)",
    },
    "BertAdam": {
        "reference": "tools/bert_adam_reference.py BertAdamReference: torch_npu NpuFusedBertAdam written from its "
        "formulas (no bias correction, the warmup schedules, max_grad_norm clipping per (group, dtype) buffer), with "
        "a float32 tensor state step, incremented per param and read by the schedule before its increment",
    },
    "Adafactor": {
        "reference": "torch.optim.Adafactor (torch %s, _single_tensor_adafactor); each case's shapes give the params "
        "of more than one dimension (row_var and col_var over their last two dimensions, leading dimensions a "
        "batch); eps = (eps1, eps2), eps1 null: finfo(float32).eps. Not reproducible bit for bit: torch.norm and "
        "mean sum in their own order",
    },
    "LARS": {
        "reference": "tools/lars_reference.py LarsReference: apex LARC around torch.optim.SGD written from its "
        "formulas (norms in double rounded to float32, .grad untouched, per-group trust_coefficient/clip/eps); "
        "SGD's state (momentum_buffer, no step)",
    },
}


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
        if algo == "Lion":
            extra["reference"] %= importlib.metadata.version("lion-pytorch")
        if algo == "AdamP":
            extra["reference"] %= importlib.metadata.version("adamp")
        if algo == "Adafactor":
            extra["reference"] %= torch.__version__
        doc = {"algorithm": algo, **header, "steps": steps, "checkpoint_steps": checkpoint_steps, **extra,
               "cases": out_cases}
        path = os.path.join(out_dir, f"{algo.lower()}.json")
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(dump(doc) + "\n")
        print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(out_cases)} cases)")


if __name__ == "__main__":
    main()
