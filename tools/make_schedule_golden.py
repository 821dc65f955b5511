#!/usr/bin/env python3
"""Writes the torch.optim.lr_scheduler golden sequences under tests/golden/schedules/ (checked by
tests/schedule_test.cc against fusedopt's closed-form schedules, include/fusedopt/schedule.h).

Run from the repository root with the project venv:

    .venv/bin/python tools/make_schedule_golden.py

Every case builds a torch optimizer over two param groups (one dummy parameter each, with their own lr),
attaches the scheduler, and steps `opt.step(); sched.step()` STEPS times, as a training loop does. It records
each group's lr (and, for OneCycleLR with cycle_momentum, its momentum or betas[0]) at step 0, i.e. right
after the scheduler's construction (torch's last_epoch = 0), and after every sched.step(). These are torch's
own recursive (chainable) values, not its closed forms. One file per scheduler class; each case describes its
scheduler in "spec" (the keyword arguments given), which the C++ test turns into a fusedopt::Schedule, and
"torch_defaults" holds the defaults from torch's signatures for the arguments a spec leaves out. The output
is deterministic (keys sorted, floats as Python's repr).
"""

import argparse
import inspect
import json
import math
import os
import warnings

import torch
from torch.optim import lr_scheduler as S

GROUP_LRS = [0.1, 0.03]
OPTIMIZERS = {"SGD": torch.optim.SGD, "Adam": torch.optim.Adam, "AdamW": torch.optim.AdamW}


def spec(kind, **kwargs):
    return {"type": kind, "kwargs": kwargs}


def sequential(schedulers, milestones):
    return {"type": "SequentialLR", "schedulers": schedulers, "milestones": milestones}


def case(name, sched, steps, optimizer="SGD", **optimizer_kwargs):
    return {"name": name, "spec": sched, "steps": steps, "optimizer": optimizer,
            "optimizer_kwargs": optimizer_kwargs}


SGD_MOMENTUM = {"momentum": 0.9}

# file name -> cases. Edge parameters: factors at the ends of their ranges, total_iters / T_max / step_size
# of 1, stepping past the end of a schedule, repeated or zero milestones.
CASES = {
    "constant_lr": [
        case("defaults", spec("ConstantLR"), 30),
        case("half_for_10", spec("ConstantLR", factor=0.5, total_iters=10), 30),
        case("factor_one", spec("ConstantLR", factor=1.0, total_iters=4), 12),
        case("total_iters_1", spec("ConstantLR", factor=0.1, total_iters=1), 12),
    ],
    "linear_lr": [
        case("defaults", spec("LinearLR"), 30),
        case("warmup_10", spec("LinearLR", start_factor=0.1, total_iters=10), 40),
        case("decay_to_zero", spec("LinearLR", start_factor=1.0, end_factor=0.0, total_iters=20), 40),
        # torch's recursion leaves a rounding residue (~1e-16 * lr, of either sign) where the closed form is 0.
        case("decay_to_zero_residue", spec("LinearLR", start_factor=0.35, end_factor=0.0, total_iters=13), 20),
        case("partial", spec("LinearLR", start_factor=0.25, end_factor=0.5, total_iters=7), 30),
        case("total_iters_1", spec("LinearLR", start_factor=0.01, total_iters=1), 10),
        case("tiny_start_long", spec("LinearLR", start_factor=1e-3, total_iters=100), 120),
    ],
    "cosine_annealing_lr": [
        case("t_max_30", spec("CosineAnnealingLR", T_max=30), 30),
        case("eta_min_past_end", spec("CosineAnnealingLR", T_max=10, eta_min=1e-3), 45),
        case("t_max_1", spec("CosineAnnealingLR", T_max=1, eta_min=1e-4), 10),
        case("t_max_100", spec("CosineAnnealingLR", T_max=100, eta_min=1e-5), 120),
        case("eta_min_zero_past_end", spec("CosineAnnealingLR", T_max=7), 30),
    ],
    "step_lr": [
        case("half_every_7", spec("StepLR", step_size=7, gamma=0.5), 40),
        case("every_step", spec("StepLR", step_size=1, gamma=0.9), 60),
        case("default_gamma", spec("StepLR", step_size=30), 100),
    ],
    "multi_step_lr": [
        case("two", spec("MultiStepLR", milestones=[10, 25]), 40),
        case("zero_and_repeated", spec("MultiStepLR", milestones=[0, 5, 5, 12], gamma=0.5), 30),
        case("one", spec("MultiStepLR", milestones=[3], gamma=0.3), 10),
    ],
    "exponential_lr": [
        case("gamma_095", spec("ExponentialLR", gamma=0.95), 120),
        case("gamma_1", spec("ExponentialLR", gamma=1.0), 20),
        case("gamma_05", spec("ExponentialLR", gamma=0.5), 40),
    ],
    "polynomial_lr": [
        case("defaults", spec("PolynomialLR"), 12),
        case("square", spec("PolynomialLR", total_iters=20, power=2.0), 30),
        case("sqrt", spec("PolynomialLR", total_iters=30, power=0.5), 40),
        case("power_0", spec("PolynomialLR", total_iters=6, power=0.0), 10),
    ],
    "sequential_lr": [
        # The usual warmup + cosine recipe (fusedopt::WarmupCosine), stepped past its end.
        case("warmup_cosine", sequential([spec("LinearLR", start_factor=0.1, total_iters=5),
                                          spec("CosineAnnealingLR", T_max=25, eta_min=1e-4)], [5]), 40),
        case("warmup_cosine_defaults", sequential([spec("LinearLR", total_iters=10),
                                                   spec("CosineAnnealingLR", T_max=90)], [10]), 100),
        case("three_parts", sequential([spec("LinearLR", start_factor=0.2, total_iters=4),
                                        spec("ExponentialLR", gamma=0.9),
                                        spec("StepLR", step_size=3, gamma=0.5)], [4, 12]), 30),
        case("constant_poly_multistep", sequential([spec("ConstantLR", factor=0.5, total_iters=3),
                                                    spec("PolynomialLR", total_iters=8, power=2.0),
                                                    spec("MultiStepLR", milestones=[2, 4], gamma=0.5)],
                                                   [5, 10]), 30),
        case("cosine_first", sequential([spec("CosineAnnealingLR", T_max=10, eta_min=1e-3),
                                         spec("LinearLR", start_factor=0.5, end_factor=0.1, total_iters=6)],
                                        [8]), 25),
        case("milestone_zero", sequential([spec("ConstantLR", factor=0.5),
                                           spec("ExponentialLR", gamma=0.8)], [0]), 15),
        case("single", sequential([spec("ExponentialLR", gamma=0.9)], []), 15),
    ],
    "one_cycle_lr": [
        case("cos_sgd_momentum", spec("OneCycleLR", max_lr=[0.1, 0.05], total_steps=50), 50,
             **SGD_MOMENTUM),
        case("linear_sgd_momentum", spec("OneCycleLR", max_lr=[0.1, 0.05], total_steps=50,
                                         anneal_strategy="linear"), 50, **SGD_MOMENTUM),
        case("three_phase_cos", spec("OneCycleLR", max_lr=[0.2, 0.1], total_steps=60, three_phase=True), 60,
             **SGD_MOMENTUM),
        case("three_phase_linear", spec("OneCycleLR", max_lr=[0.2, 0.1], total_steps=37, pct_start=0.25,
                                        anneal_strategy="linear", three_phase=True, div_factor=10.0,
                                        final_div_factor=100.0), 37, **SGD_MOMENTUM),
        case("adam_beta1", spec("OneCycleLR", max_lr=[0.01, 0.003], total_steps=40, pct_start=0.2,
                                base_momentum=0.8, max_momentum=0.9), 40, optimizer="Adam"),
        case("adamw_beta1_linear", spec("OneCycleLR", max_lr=[0.01, 0.003], total_steps=33,
                                        anneal_strategy="linear"), 33, optimizer="AdamW"),
        case("no_momentum", spec("OneCycleLR", max_lr=[0.1, 0.05], total_steps=30, cycle_momentum=False), 30),
        case("pct_start_0", spec("OneCycleLR", max_lr=[0.1, 0.05], total_steps=20, pct_start=0.0), 20,
             **SGD_MOMENTUM),
        case("pct_start_fraction", spec("OneCycleLR", max_lr=[0.1, 0.05], total_steps=7, pct_start=0.1), 7,
             **SGD_MOMENTUM),
        case("total_steps_1", spec("OneCycleLR", max_lr=[0.1, 0.05], total_steps=1), 1, **SGD_MOMENTUM),
        # Phase 1 has zero length: torch divides by zero at step total_steps (recorded as next_step_raises).
        case("pct_start_1", spec("OneCycleLR", max_lr=[0.1, 0.05], total_steps=10, pct_start=1.0), 9,
             **SGD_MOMENTUM),
    ],
}


def types_in(s):
    if s["type"] == "SequentialLR":
        return {t for sub in s["schedulers"] for t in types_in(sub)}
    return {s["type"]}


def torch_defaults(kind):
    """The scheduler's keyword defaults from torch's signature (None-valued and last_epoch left out)."""
    params = inspect.signature(getattr(S, kind).__init__).parameters
    return {k: p.default for k, p in params.items()
            if p.default is not inspect.Parameter.empty and p.default is not None and k != "last_epoch"}


def build(opt, s):
    if s["type"] == "SequentialLR":
        return S.SequentialLR(opt, [build(opt, sub) for sub in s["schedulers"]], milestones=s["milestones"])
    return getattr(S, s["type"])(opt, **s["kwargs"])


def momentum_key(opt, s):
    """Which group value OneCycleLR cycles, or None."""
    if s["type"] != "OneCycleLR" or not s["kwargs"].get("cycle_momentum", True):
        return None
    return "betas[0]" if "betas" in opt.defaults else "momentum"


def read(group, key):
    return float(group["betas"][0]) if key == "betas[0]" else float(group[key])


def run_case(c):
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in GROUP_LRS]
    opt = OPTIMIZERS[c["optimizer"]]([{"params": [p], "lr": lr} for p, lr in zip(params, GROUP_LRS)],
                                     **c["optimizer_kwargs"])
    sched = build(opt, c["spec"])
    key = momentum_key(opt, c["spec"])
    lrs = [[] for _ in GROUP_LRS]
    momenta = [[] for _ in GROUP_LRS]

    def record():
        for gi, g in enumerate(opt.param_groups):
            lrs[gi].append(float(g["lr"]))
            if key:
                momenta[gi].append(read(g, key))

    record()
    for _ in range(c["steps"]):
        for p in params:
            p.grad = torch.zeros_like(p)
        opt.step()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any scheduler warning means the protocol is off
            sched.step()
        record()
    # Whether torch refuses one more step (OneCycleLR past total_steps; pct_start=1 at total_steps).
    opt.step()
    try:
        sched.step()
        next_step_raises = None
    except (ValueError, ZeroDivisionError) as e:
        next_step_raises = type(e).__name__
    for seq in lrs + momenta:
        if not all(math.isfinite(x) for x in seq):
            raise RuntimeError(f"{c['name']}: non-finite value")
    out = {"name": c["name"], "optimizer": c["optimizer"], "optimizer_kwargs": c["optimizer_kwargs"],
           "group_lrs": GROUP_LRS, "spec": c["spec"], "steps": c["steps"], "lr": lrs,
           "next_step_raises": next_step_raises}
    if key:
        out["momentum_key"] = key
        out["momentum"] = momenta
    return out


def dump(obj, indent=0):
    """JSON with objects and lists of containers one item per line, and lists of scalars on one line."""
    pad = " " * indent
    inner = " " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {dump(obj[k], indent + 1)}" for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(x, (dict, list)) for x in obj):
        items = [inner + dump(x, indent + 1) for x in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj, allow_nan=False, separators=(",", ":"))


def main():
    parser = argparse.ArgumentParser(description="Writes torch lr_scheduler golden sequences.")
    parser.add_argument("--out", default=os.path.join("tests", "golden", "schedules"), help="output folder")
    out_dir = parser.parse_args().out
    os.makedirs(out_dir, exist_ok=True)
    for file_name, cases in CASES.items():
        out_cases = [run_case(c) for c in cases]
        kinds = sorted({t for c in cases for t in types_in(c["spec"])})
        doc = {"generator": "tools/make_schedule_golden.py", "torch_version": torch.__version__,
               "torch_defaults": {k: torch_defaults(k) for k in kinds},
               "protocol": "lr (and momentum) of each param group at step 0 (after the scheduler's "
                           "construction) and after each of `steps` rounds of opt.step(); sched.step()",
               "cases": out_cases}
        path = os.path.join(out_dir, f"{file_name}.json")
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(dump(doc) + "\n")
        print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(out_cases)} cases)")


if __name__ == "__main__":
    main()
