"""FSDP2 and DTensor params (issue #32): the fused step runs on each rank's local shards.

Every rank runs in its own process of a gloo group (dist_harness.run_ranks: bounded by a timeout, cleaned up).
References: the same fused class on plain tensors in one process (the engine steps a shard as it steps the whole
tensor, so the params and states must be the same bits), torch.optim's twin under the same FSDP2 model, and the
one-process run for DCP checkpoints saved at one world size and loaded at another."""

from __future__ import annotations

import copy
import math
import warnings

import fusedopt
import pytest
from algorithm_cases import CASES
from dist_harness import run_ranks

import torch

# (shape, placement) of the DTensor params: uneven rows (3 + 2, 2 + 2 + 1), fewer rows than 3 ranks (an empty
# shard), a vector, one tensor over 4096 elements, columns (tensor parallel's Shard(1)) and a replicated one.
SHAPES = [((5, 3), "shard0"), ((2, 4), "shard0"), ((7,), "shard0"), ((64, 80), "shard0"), ((4, 6), "shard1"),
          ((3,), "replicate"), ((3, 4, 5), "shard0")]  # (the last: a batch of matrices, cut between them)
STEPS = 4


# Options that make a class's whole-tensor terms matter: LARS's default clip=True caps its trust ratio at 1 with
# these gradients, so that the norms would not show.
OPTIONS = {"lars": dict(clip=False, momentum=0.9, weight_decay=1e-4),
           # AdamP: a delta at which some tensors take the channel projection, some the layer's, some none
           "adamp": dict(lr=0.01, delta=1.0, weight_decay=0.1)}


def _kw(name: str, case) -> dict:
    return {**case.defaults, **case.required_options, **OPTIONS.get(name, {})}


def _placement(kind: str):
    from torch.distributed.tensor import Replicate, Shard

    return {"shard0": Shard(0), "shard1": Shard(1), "replicate": Replicate()}[kind]


def _grad(shape, step: int, k: int) -> torch.Tensor:
    """The whole gradient of param k at a step, the same on every rank."""
    g = torch.Generator().manual_seed(1000 * step + k)
    return torch.randn(shape, generator=g) + 0.2


def _states(opt, p) -> dict:
    """p's state as (type name, placements or None, whole value)."""
    out = {}
    for key, v in opt.state[p].items():
        if isinstance(v, torch.Tensor) and hasattr(v, "placements"):
            out[key] = ("DTensor", tuple(v.placements), v.full_tensor())
        else:
            out[key] = (type(v).__name__, None, v.clone() if isinstance(v, torch.Tensor) else v)
    return out


# ---- ranks -----------------------------------------------------------------------------------------------------

def rank_every_class() -> dict:
    """Every class on DTensor params of SHAPES and, in this process, on plain tensors of the same values."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    out = {"clip norms": {}}
    # clipping by the 1-norm and the inf-norm (2: rank_fsdp2_models): the norm of the whole gradients
    for norm_type in (1.0, math.inf):
        g = torch.Generator().manual_seed(0)
        whole = [torch.randn(shape, generator=g) for shape, _ in SHAPES]
        dps = [torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [_placement(kind)]))
               for w, (_, kind) in zip(whole, SHAPES)]
        pps = [torch.nn.Parameter(w.clone()) for w in whole]
        kw = dict(lr=0.01, max_grad_norm=0.5, norm_type=norm_type)
        sharded, plain = fusedopt.FusedAdamW(dps, **kw), fusedopt.FusedAdamW(pps, **kw)
        norms = []
        for t in range(2):
            for k, (dp, pp) in enumerate(zip(dps, pps)):
                pp.grad = _grad(pp.shape, t, k)
                dp.grad = distribute_tensor(pp.grad.clone(), mesh, dp.placements)
            sharded.step()
            plain.step()
            norms.append((sharded.last_grad_norm, plain.last_grad_norm))
        out["clip norms"][norm_type] = {"norms": norms,
                                        "params": [(dp.full_tensor(), pp.detach().clone()) for dp, pp in zip(dps, pps)]}
    for name, case in CASES.items():
        g = torch.Generator().manual_seed(0)
        whole = [torch.randn(shape, generator=g) for shape, _ in SHAPES]
        dps = [torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [_placement(kind)]))
               for w, (_, kind) in zip(whole, SHAPES)]
        pps = [torch.nn.Parameter(w.clone()) for w in whole]
        sharded, plain = case.fused(dps, **_kw(name, case)), case.fused(pps, **_kw(name, case))
        refused = None  # the error of a reference step that DTensor's ops refused, and whether it changed nothing
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for t in range(STEPS):
                for k, (dp, pp) in enumerate(zip(dps, pps)):
                    pp.grad = _grad(pp.shape, t, k)
                    dp.grad = distribute_tensor(pp.grad.clone(), mesh, dp.placements)
                before = [dp.full_tensor() for dp in dps]
                try:
                    sharded.step()
                except RuntimeError as e:
                    refused = (str(e), all(torch.equal(a, dp.full_tensor()) for a, dp in zip(before, dps)))
                    break
                plain.step()
        out[name] = {
            "refused": refused,
            "routed": [str(w.message) for w in caught if "reference's own" in str(w.message)],
            "params": [(dp.full_tensor(), pp.detach().clone()) for dp, pp in zip(dps, pps)],
            "placements": [tuple(dp.placements) for dp in dps],
            "states": [(_states(sharded, dp), _states(plain, pp)) for dp, pp in zip(dps, pps)],
        }
    return out


def rank_accumulation() -> dict:
    """accumulation_steps=2 over DTensor params (uneven rows, columns, replicated) against the same class on plain
    tensors in one process, 3 windows of the same whole gradients, clipping active: AdamW (element-wise), LAMB
    (norms over the ranks), Adafactor (sums over the ranks; its Shard(1) param the reference's step on whole
    copies). Then fusedopt.GradScaler with an Inf
    in the last rank's shard of window 2's first micro-batch: that window is skipped on every rank; and a
    state_dict taken mid-window loads into a fresh optimizer, which closes the window as the first would."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rank, last = dist.get_rank(), dist.get_world_size() - 1
    makers = {"adamw": lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, max_grad_norm=2.0, accumulation_steps=2),
              "lamb": lambda ps: fusedopt.FusedLAMB(ps, lr=0.01, accumulation_steps=2),
              "adafactor": lambda ps: fusedopt.FusedAdafactor(ps, lr=0.01, accumulation_steps=2)}
    out = {}

    def pair():
        g = torch.Generator().manual_seed(0)
        whole = [torch.randn(shape, generator=g) for shape, _ in SHAPES]
        dps = [torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [_placement(kind)]))
               for w, (_, kind) in zip(whole, SHAPES)]
        return dps, [torch.nn.Parameter(w.clone()) for w in whole]

    def give(dps, pps, t, scale=1.0):
        for k, (dp, pp) in enumerate(zip(dps, pps)):
            pp.grad = _grad(pp.shape, t, k)
            dp.grad = distribute_tensor(pp.grad * scale, mesh, dp.placements)

    for name, make in makers.items():
        dps, pps = pair()
        sharded, plain = make(dps), make(pps)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for t in range(6):
                give(dps, pps, t)
                sharded.step()
                plain.step()
        out[name] = {"params": [(dp.full_tensor(), pp.detach().clone()) for dp, pp in zip(dps, pps)],
                     "norms": (sharded.last_grad_norm, plain.last_grad_norm)}

    dps, pps = pair()
    sharded = fusedopt.FusedAdamW(dps, lr=0.01, accumulation_steps=2)
    scaler = fusedopt.GradScaler(init_scale=1024.0)
    scaler.scale(torch.zeros(()))  # (its scale is made at the first scale(), as a loss would be scaled)
    after = []
    for t in range(6):
        give(dps, pps, t, scaler.get_scale())
        if t == 2 and rank == last:
            dps[3].grad._local_tensor.view(-1)[0] = math.inf
        scaler.step(sharded)
        scaler.update()
        after.append([dp.full_tensor() for dp in dps])
    out["scaler"] = {"after": after, "scale": scaler.get_scale()}

    dps, pps = pair()
    first = fusedopt.FusedAdamW(dps, lr=0.01, accumulation_steps=2)
    give(dps, pps, 0)
    first.step()
    give(dps, pps, 1)
    first.step()
    give(dps, pps, 2)
    first.step()  # (mid-window)
    second = fusedopt.FusedAdamW(dps, lr=0.01, accumulation_steps=2)
    second.load_state_dict(copy.deepcopy(first.state_dict()))
    before = [dp.full_tensor().detach() for dp in dps]
    give(dps, pps, 3)
    second.step()
    closed_by_second = [dp.full_tensor() for dp in dps]
    with torch.no_grad():
        for dp, b in zip(dps, before):
            dp.copy_(distribute_tensor(b, mesh, dp.placements))
    first.step()
    out["mid-window state_dict"] = [(a, dp.full_tensor()) for a, dp in zip(closed_by_second, dps)]
    return out


# 8-bit states over 2 ranks: every shard a whole number of 256-element blocks (8 rows x 64, 2 rows x 128; a
# replicated 32 x 16 whole on each rank), and a vector under min_8bit_size (f32 states)
SHAPES_8BIT = [((16, 64), "shard0"), ((4, 128), "shard0"), ((32, 16), "replicate"), ((7,), "shard0")]


def rank_8bit() -> dict:
    """8-bit states (state_dtype=torch.uint8, and bitsandbytes' twin) on DTensor params, against the same class on
    the whole tensors in one process; a state_dict taken after 2 steps, loaded into a fresh optimizer (over other
    values of the params) and continued."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    out = {}
    makers = {"uint8": lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, state_dtype=torch.uint8, min_8bit_size=256),
              "twin": lambda ps: fusedopt.FusedAdamW8bit(ps, lr=0.01, min_8bit_size=256),
              "lamb": lambda ps: fusedopt.FusedLAMB(ps, lr=0.01, state_dtype=torch.uint8, min_8bit_size=256)}
    for name, make in makers.items():
        g = torch.Generator().manual_seed(0)
        whole = [torch.randn(shape, generator=g) for shape, _ in SHAPES_8BIT]
        dps = [torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [_placement(kind)]))
               for w, (_, kind) in zip(whole, SHAPES_8BIT)]
        pps = [torch.nn.Parameter(w.clone()) for w in whole]
        sharded, plain = make(dps), make(pps)
        resumed = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for t in range(4):
                if t == 2:  # a state_dict round trip at the same world size
                    saved = copy.deepcopy(sharded.state_dict())
                    entry = dict(saved["state"][0])  # (the twin's: bitsandbytes' nested layout)
                    entry.update(entry.pop("__bnb_optimizer_quant_state__", {}))
                    kinds = {k: (type(v).__name__, str(v.dtype)) for k, v in entry.items()
                             if isinstance(v, torch.Tensor)}
                    resumed = make(dps)
                    resumed.load_state_dict(saved)
                    sharded = resumed
                for k, (dp, pp) in enumerate(zip(dps, pps)):
                    pp.grad = _grad(pp.shape, t, k)
                    dp.grad = distribute_tensor(pp.grad.clone(), mesh, dp.placements)
                sharded.step()
                plain.step()
        state = sharded.state[dps[0]]
        out[name] = {"routed": [str(w.message) for w in caught if "reference's own" in str(w.message)],
                     "params": [(dp.full_tensor(), pp.detach().clone()) for dp, pp in zip(dps, pps)],
                     "codes": {k: type(v).__name__ for k, v in state.items() if isinstance(v, torch.Tensor)
                               and v.dtype == torch.uint8},
                     "saved kinds": kinds}
    return out


def _mlp(mesh, dtype=torch.float32, **policies):
    """A small MLP, fully_shard-ed on `mesh` with `policies` (mp_policy, offload_policy); unsharded for mesh None."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5), torch.nn.Tanh(),
                            torch.nn.Linear(5, 2)).to(dtype)
    if mesh is None:
        return m
    for part in (m[0], m[2], m[4], m):
        fully_shard(part, mesh=mesh, **policies)
    return m


def rank_fsdp2_models() -> dict:
    """Models under fully_shard, trained as users write it (per-rank batches), with the fused classes and their torch
    twins; flatten=True; bf16 compute (MixedPrecisionPolicy); clipping and fusedopt.GradScaler with an Inf on one
    rank only."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy
    from torch.distributed.tensor import distribute_tensor

    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    bf16 = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
    offload = {"offload_policy": CPUOffloadPolicy(pin_memory=False)}  # (pinning needs an accelerator)
    # run -> (fused class, reference, the fused model's policies, the reference model's)
    runs = {
        "adamw": (lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, weight_decay=0.1),
                  lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=False), {}, {}),
        "sgd": (lambda ps: fusedopt.FusedSGD(ps, lr=0.05, momentum=0.9, nesterov=True),
                lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, foreach=False), {}, {}),
        "adamw flatten": (lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, weight_decay=0.1, flatten=True),
                          lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, weight_decay=0.1), {}, {}),
        "adam bf16 compute": (lambda ps: fusedopt.FusedAdam(ps, lr=0.01),
                              lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=False), bf16, bf16),
        "adamw cpu offload": (lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, weight_decay=0.1),
                              lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, weight_decay=0.1), offload, {}),
        "adamw step_in_backward": (lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, weight_decay=0.1, step_in_backward=True),
                                   lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, weight_decay=0.1), {}, {}),
        # LARS's norms in backward would be a collective per bucket, where buckets end by each rank's shard bytes:
        # its shards keep their gradients for step() (a warning says so)
        "lars step_in_backward": (lambda ps: fusedopt.FusedLARS(ps, lr=0.01, step_in_backward=True),
                                  lambda ps: fusedopt.FusedLARS(ps, lr=0.01), {}, {}),
        # with accumulation the hooks add the shards' gradients into the window's sums (LARS's too: the window's
        # last step() updates)
        "adamw accumulation step_in_backward": (
            lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, accumulation_steps=3, step_in_backward=True),
            lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, accumulation_steps=3), {}, {}),
        "lars accumulation step_in_backward": (
            lambda ps: fusedopt.FusedLARS(ps, lr=0.01, accumulation_steps=3, step_in_backward=True),
            lambda ps: fusedopt.FusedLARS(ps, lr=0.01, accumulation_steps=3), {}, {}),
    }
    out = {}
    for run, (fused, reference, fused_policies, reference_policies) in runs.items():
        fm, rm = _mlp(mesh, **fused_policies), _mlp(mesh, **reference_policies)
        fo, ro = fused(fm.parameters()), reference(rm.parameters())
        torch.manual_seed(1 + rank)
        for _ in range(20):
            x = torch.randn(4, 6)
            for m, opt in ((fm, fo), (rm, ro)):
                opt.zero_grad()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    m(x).square().sum().backward()
                if m is fm and run.endswith("step_in_backward"):  # (updated in backward: gradients released)
                    out[f"{run}: grads left"] = [p.grad is not None for p in fm.parameters()]
                    out[f"{run}: warnings"] = out.get(f"{run}: warnings", []) + [str(w.message) for w in caught if "fusedopt" in str(w.message)]
                opt.step()
        out[run] = [(p.full_tensor(), q.full_tensor(), str(p.dtype)) for p, q in zip(fm.parameters(), rm.parameters())]

    # a whole (plain-tensor) state dict of the one-process optimizer loads into the sharded one: each rank keeps
    # its part of every state, as DTensors of the param's layout, and the next steps are the one-process ones
    fm = _mlp(mesh)
    pm = _mlp(None)
    fo = fusedopt.FusedAdamW(fm.parameters(), lr=0.01)
    po = fusedopt.FusedAdamW(pm.parameters(), lr=0.01)
    for t in range(4):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(t))
        pm(x).square().sum().backward()
        po.step()
        if t == 1:
            fo.load_state_dict(copy.deepcopy(po.state_dict()))  # (as saved and loaded: not po's live tensors)
            with torch.no_grad():
                for p, q in zip(fm.parameters(), pm.parameters()):
                    p.copy_(distribute_tensor(q.detach(), mesh, p.placements))
        if t >= 2:
            for p, q in zip(fm.parameters(), pm.parameters()):
                p.grad = distribute_tensor(q.grad, mesh, p.placements)
            fo.step()
        po.zero_grad()
    out["whole state dict"] = [(p.full_tensor(), q.detach().clone(), type(fo.state[p]["exp_avg"]).__name__)
                               for p, q in zip(fm.parameters(), pm.parameters())]

    # a full state dict (StateDictOptions(full_state_dict=True): DSD gathers every state) set into a fresh optimizer
    # of the same model: the run continues as the uninterrupted one, bit for bit
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True)
    fm, um = _mlp(mesh), _mlp(mesh)
    fo, uo = fusedopt.FusedAdamW(fm.parameters(), lr=0.01), fusedopt.FusedAdamW(um.parameters(), lr=0.01)
    for t in range(4):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(t))
        if t == 2:
            saved = get_optimizer_state_dict(fm, fo, options=full)
            fm.zero_grad(set_to_none=True)  # (as at a start: DSD initializes the fresh optimizer's state first)
            fo = fusedopt.FusedAdamW(fm.parameters(), lr=0.01)
            set_optimizer_state_dict(fm, fo, saved, options=full)
        for m, opt in ((fm, fo), (um, uo)):
            opt.zero_grad()
            m(x).square().sum().backward()
            opt.step()
    out["full state dict"] = [(p.full_tensor(), q.full_tensor()) for p, q in zip(fm.parameters(), um.parameters())]

    # bf16 params with f32 master copies (master_weights=True): against the same class on the unsharded model in
    # one process, stepped with the gathered gradients
    fm, pm = _mlp(mesh, torch.bfloat16), _mlp(None, torch.bfloat16)
    fo = fusedopt.FusedAdamW(fm.parameters(), lr=0.01, weight_decay=0.1, master_weights=True)
    po = fusedopt.FusedAdamW(pm.parameters(), lr=0.01, weight_decay=0.1, master_weights=True)
    for _ in range(10):
        fo.zero_grad()
        fm(torch.randn(4, 6).to(torch.bfloat16)).float().square().sum().backward()
        for p, q in zip(fm.parameters(), pm.parameters()):
            q.grad = p.grad.full_tensor()
        fo.step()
        po.step()
    out["bf16 masters"] = [(p.full_tensor(), q.detach().clone(), fo.state[p]["master_param"].full_tensor(),
                            po.state[q]["master_param"].clone()) for p, q in zip(fm.parameters(), pm.parameters())]

    # tensor parallel: a column-parallel layer (Shard(0) weight and bias) feeding a row-parallel one (Shard(1)
    # weight, replicated bias), every rank on the same batch; against torch's twin on the same model, and the
    # fused class on the unsharded model in one process
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    def tp_model(parallel: bool):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
        return parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()}) if parallel else m

    fm, rm, pm = tp_model(True), tp_model(True), tp_model(False)
    fo = fusedopt.FusedAdamW(fm.parameters(), lr=0.01, weight_decay=0.1)
    ro = torch.optim.AdamW(rm.parameters(), lr=0.01, weight_decay=0.1, foreach=False)
    po = fusedopt.FusedAdamW(pm.parameters(), lr=0.01, weight_decay=0.1)
    for t in range(10):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(t))
        for m, opt in ((fm, fo), (rm, ro), (pm, po)):
            opt.zero_grad()
            m(x).square().sum().backward()
            opt.step()
    out["tensor parallel"] = [(p.full_tensor(), q.full_tensor(), r.detach().clone(), tuple(map(repr, p.placements)))
                              for p, q, r in zip(fm.parameters(), rm.parameters(), pm.parameters())]

    # every class with a torch.optim twin, under its defaults of the tests, against that twin on the same model
    twins = {}
    for name, case in CASES.items():
        if case.torch is None:
            continue
        fm, rm = _mlp(mesh), _mlp(mesh)
        fo, ro = case.fused(fm.parameters(), **_kw(name, case)), case.torch(rm.parameters(), **_kw(name, case))
        torch.manual_seed(1 + rank)
        error, fused_steps = None, 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(20):
                x = torch.randn(4, 6)
                for m, opt in ((fm, fo), (rm, ro)):
                    opt.zero_grad()
                    m(x).square().sum().backward()
                if error is None:
                    try:
                        ro.step()
                    except RuntimeError as e:  # torch's own step refusing a DTensor op: nothing to compare
                        error = str(e)
                fo.step()
                fused_steps += 1
        twins[name] = {"error": error, "sqrt_free": case.sqrt_free, "fused steps": fused_steps,
                       "finite": all(bool(torch.isfinite(p.full_tensor()).all()) for p in fm.parameters()),
                       "routed": [str(w.message) for w in caught if "reference's own" in str(w.message)],
                       "params": [(p.full_tensor(), q.full_tensor()) for p, q in zip(fm.parameters(), rm.parameters())]}
    out["twins"] = twins

    # clipping and fusedopt.GradScaler: the norm and the Inf check span the ranks; an Inf on rank 1 alone skips
    # the step on every rank. The reference: the same class in one process on the whole gradients.
    fm = _mlp(mesh)
    torch.manual_seed(0)
    plain = [torch.nn.Parameter(p.full_tensor().detach().clone()) for p in fm.parameters()]
    fo = fusedopt.FusedAdamW(fm.parameters(), lr=0.01, max_grad_norm=0.5)
    po = fusedopt.FusedAdamW(plain, lr=0.01, max_grad_norm=0.5)
    scaler = fusedopt.GradScaler(init_scale=1024.0)
    scales, skipped = [], []
    for t in range(4):
        fo.zero_grad()
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(t))  # every rank: one batch
        scaler.scale(fm(x).square().sum()).backward()
        if t == 2 and rank == 1:
            next(fm.parameters()).grad._local_tensor[0, 0] = math.inf
        for p, q in zip(fm.parameters(), plain):
            q.grad = p.grad.full_tensor() / scaler.get_scale() if t != 2 else None
        before = [p.full_tensor() for p in fm.parameters()]
        scaler.step(fo)
        scaler.update()
        if t != 2:
            po.step()
        scales.append(scaler.get_scale())
        skipped.append(all(torch.equal(a, p.full_tensor()) for a, p in zip(before, fm.parameters())))
    out["clip and scaler"] = {"params": [(p.full_tensor(), q.detach().clone()) for p, q in zip(fm.parameters(), plain)],
                              "scales": scales, "skipped": skipped}
    return out


def _against_one_process(fm, pm, make, reload_at: int | None = None) -> list:
    """`make`'s optimizer on the distributed model fm and on the unsharded model pm, 5 steps of the same batch on
    every rank, pm's gradients gathered from fm's; at step reload_at fm's optimizer is made anew from pm's state dict
    (plain tensors). Returns per param (fm's whole values, pm's, fm's placements)."""
    fo, po = make(fm.parameters()), make(pm.parameters())
    for t in range(5):
        if t == reload_at:  # each rank cuts its piece of every state
            fo = make(fm.parameters())
            fo.load_state_dict(copy.deepcopy(po.state_dict()))
        fo.zero_grad()
        fm(torch.randn(4, 6, generator=torch.Generator().manual_seed(t))).square().sum().backward()
        for p, q in zip(fm.parameters(), pm.parameters()):
            q.grad = p.grad.full_tensor()
        fo.step()
        po.step()
    return [(p.full_tensor(), q.detach().clone(), tuple(map(repr, p.placements)))
            for p, q in zip(fm.parameters(), pm.parameters())]


def rank_hsdp() -> dict:
    """HSDP on 4 ranks: fully_shard over a 2-D mesh (2 replicas x 2 shards: placements (Replicate(), Shard(0))),
    every rank on the same batch; LAMB (per-tensor norms) and AdamW with clipping against the same classes on the
    unsharded model in one process, stepped with the gathered gradients."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    out = {}
    for name, make in {"lamb": lambda ps: fusedopt.FusedLAMB(ps, lr=0.01),
                       "adamw clip": lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, max_grad_norm=0.5)}.items():
        fm = _mlp(mesh)
        out[name] = _against_one_process(fm, _mlp(None), make)
    # LAMB's trust ratio is a quotient of norms, blind to a factor both would share: the sums hook itself, on this
    # rank's sums (1 and rank + 1 per tensor), adds them up over the 2 shards of the tensor, not the 2 replicas
    from fusedopt._shards import MeshSums

    params = list(fm.parameters())
    rank = torch.distributed.get_rank()
    out["sums"] = MeshSums(params, 2)([1.0, rank + 1.0] * len(params), 2)
    out["shard rank"] = mesh.get_local_rank("shard")

    # FSDP x TP on the same 2 x 2 mesh: tensor parallel within each pair, fully_shard across them (2-D placements
    # such as (Shard(0), Shard(1))), every rank on the same batch; LAMB and clipped AdamW against one process
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for name, make in {"fsdp x tp lamb": lambda ps: fusedopt.FusedLAMB(ps, lr=0.01),
                       "fsdp x tp adamw clip": lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, max_grad_norm=0.5)}.items():
        torch.manual_seed(0)
        fm = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
        pm = copy.deepcopy(fm)
        parallelize_module(fm, mesh2["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(fm, mesh=mesh2["dp"])
        out[name] = _against_one_process(fm, pm, make, reload_at=3)
    return out


def _dcp_model(mesh):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 5), torch.nn.Linear(5, 2))
    for part in (*m, m):
        fully_shard(part, mesh=mesh)
    return m


def _dcp_steps(m, opt, start: int, stop: int, mesh) -> None:
    """Steps with the whole gradient of step t set by hand: the same for every world size."""
    from torch.distributed.tensor import distribute_tensor

    for t in range(start, stop):
        for k, p in enumerate(m.parameters()):
            p.grad = distribute_tensor(_grad(p.shape, t, k), mesh, p.placements)
        opt.step()


def _dcp_classes():
    return {"adamw": lambda ps: fusedopt.FusedAdamW(ps, lr=0.01, weight_decay=0.1),
            "torch_adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=False),
            "nadam": lambda ps: fusedopt.FusedNAdam(ps, lr=0.01),
            "sgd": lambda ps: fusedopt.FusedSGD(ps, lr=0.05, momentum=0.9),
            "adafactor": lambda ps: fusedopt.FusedAdafactor(ps, lr=0.01)}


def rank_dcp_save(path: str) -> dict:
    """STEPS steps, then dcp.save of the model and the optimizer (every class of _dcp_classes); returns what
    get_optimizer_state_dict gave, described, and whether a fresh optimizer's state dict left the params alone."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    out = {}
    for name, make in _dcp_classes().items():
        m = _dcp_model(mesh)
        opt = make(m.parameters())
        before = [p.full_tensor() for p in m.parameters()]
        get_optimizer_state_dict(m, opt)  # a fresh optimizer: torch's _init_optim_state steps it with lr 0
        untouched = all(torch.equal(a, p.full_tensor()) for a, p in zip(before, m.parameters()))
        m = _dcp_model(mesh)  # (that step counted: train afresh)
        opt = make(m.parameters())
        _dcp_steps(m, opt, 0, STEPS, mesh)
        osd = get_optimizer_state_dict(m, opt)
        dcp.save({"model": get_model_state_dict(m), "optim": osd}, checkpoint_id=f"{path}/{name}")
        described = {fqn: {k: (type(v).__name__, tuple(getattr(v, "placements", ())), v.dtype, tuple(v.shape))
                           for k, v in entry.items()} for fqn, entry in osd["state"].items()}
        out[name] = {"untouched": untouched, "state": described,
                     "groups": [sorted(g) for g in osd["param_groups"]]}
    return out


def rank_dcp_load(path: str) -> dict:
    """dcp.load of rank_dcp_save's checkpoints into fresh models and optimizers at this world size, then STEPS more
    steps; the whole params."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    out = {}
    for name, make in _dcp_classes().items():
        m = _dcp_model(mesh)
        with torch.no_grad():  # other values: the checkpoint must restore them
            for p in m.parameters():
                p.mul_(0.5)
        opt = make(m.parameters())
        sd = {"model": get_model_state_dict(m), "optim": get_optimizer_state_dict(m, opt)}
        dcp.load(sd, checkpoint_id=f"{path}/{name}")
        set_model_state_dict(m, sd["model"])
        set_optimizer_state_dict(m, opt, sd["optim"])
        _dcp_steps(m, opt, STEPS, 2 * STEPS, mesh)
        out[name] = [p.full_tensor() for p in m.parameters()]
        out[f"{name} steps"] = [float(opt.state[p]["step"]) for p in m.parameters() if "step" in opt.state[p]]
    return out


# ---- tests -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=[2, 3])
def every_class(request) -> list[dict]:
    return run_ranks("test_fsdp2:rank_every_class", request.param, timeout=300)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("norm_type", [1.0, math.inf])
def test_clipping_by_other_norms_spans_the_shards(every_class, norm_type):
    """max_grad_norm with norm_type 1 and inf over DTensor params (an empty shard at 3 ranks): the norm of the whole
    gradients, as the one-process run finds it (1e-12), the same on every rank, and the params within 1e-6."""
    for rank in every_class:
        got = rank["clip norms"][norm_type]
        for sharded, plain in got["norms"]:
            assert abs(sharded - plain) <= 1e-12 * plain, (sharded, plain)
        for sharded, plain in got["params"]:
            assert _relative(sharded, plain) <= 1e-6
    assert len({str(r["clip norms"][norm_type]["norms"]) for r in every_class}) == 1


@pytest.mark.parametrize("name", list(CASES))
def test_every_class_steps_dtensor_shards_as_one_process(every_class, name):
    """The element-wise classes step each rank's shard in the fused pass: params and states are the bits of the same
    class on the whole tensors, the states DTensors with the param's placements (as torch.optim makes them), the
    step counts plain tensors. LAMB, LARS and BertAdam step their shards fused too, each tensor's sums added up
    over the ranks (BertAdam's then per param group): within 1e-6 of the one-process run; AdamP and Adafactor as
    _expect_steps_over_shards says."""
    ranks = every_class
    for rank in ranks[1:]:
        for (a, _), (b, _) in zip(rank[name]["params"], ranks[0][name]["params"]):
            assert _bits_equal(a, b), "the ranks' params differ"
    got = ranks[0][name]
    element_wise = fusedopt._C.algorithms[name]["element_wise"]
    if name in ("adamp", "adafactor"):
        _expect_steps_over_shards(got)
        return
    assert not got["routed"], got["routed"]
    for k, ((sharded, plain), placements, (dstates, pstates)) in enumerate(
            zip(got["params"], got["placements"], got["states"])):
        # (LAMB's, LARS's and BertAdam's norms add the shards' sums: the one-process sums within their rounding)
        same = _bits_equal if element_wise else lambda a, b: _relative(a, b) <= 1e-6
        assert same(sharded, plain), f"param {k} {SHAPES[k]}"
        assert dstates.keys() == pstates.keys(), (k, dstates.keys(), pstates.keys())
        for key, (kind, where, value) in dstates.items():
            if key == "step" or pstates[key][0] != "Tensor" or value.dim() == 0:
                assert kind == pstates[key][0] and torch.equal(torch.as_tensor(value), torch.as_tensor(pstates[key][2]))
                continue
            assert kind == "DTensor" and where == placements, (k, key, kind, where)
            assert same(value, pstates[key][2]), f"param {k} state {key}"


def _expect_steps_over_shards(got: dict) -> None:
    """AdamP and Adafactor step the shards of params cut along their first dimension (Shard(0), Replicate) fused:
    AdamP from every row's sums of the whole tensor (gathered over the ranks), Adafactor with each shard's Σp², a
    matrix's column sums and row factors and ΣU² added up over the ranks: the one-process run within the rounding
    of those sums (1e-6), the states laid out as the param but Adafactor's col_var of a matrix, replicated (every
    rank keeps it whole). The Shard(1) param takes the reference's step on whole copies (1e-5)."""
    from torch.distributed.tensor import Replicate

    assert got["refused"] is None, got["refused"]
    assert len(got["routed"]) == 1 and "parameter 4 of group 0" in got["routed"][0], got["routed"]
    assert not any(f"parameter {k} of group 0" in got["routed"][0]
                   for k, (_, kind) in enumerate(SHAPES) if kind != "shard1"), got["routed"]
    for k, ((sharded, plain), placements, (dstates, pstates)) in enumerate(
            zip(got["params"], got["placements"], got["states"])):
        (shape, kind) = SHAPES[k]
        assert _relative(sharded, plain) <= (1e-5 if kind == "shard1" else 1e-6), f"param {k} {shape}"
        if kind == "shard1":
            continue
        assert dstates.keys() == pstates.keys(), (k, dstates.keys(), pstates.keys())
        for key, (state_kind, where, value) in dstates.items():
            if key == "step":
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(pstates[key][2]))
                continue
            want = (Replicate(),) if key == "col_var" and len(shape) == 2 else placements
            assert state_kind == "DTensor" and where == want, (k, key, state_kind, where)
            assert _relative(value, pstates[key][2]) <= 1e-6, (k, key)


@pytest.fixture(scope="module", params=[2, 3])
def accumulation(request) -> list[dict]:
    return run_ranks("test_fsdp2:rank_accumulation", request.param, timeout=300)


@pytest.mark.parametrize("name", ["adamw", "lamb", "adafactor"])
def test_accumulation_over_dtensor_shards_as_one_process(accumulation, name):
    """accumulation_steps=2 over DTensor params: each rank adds its shards' gradients into sums laid out as the
    params, and the window's last micro-batch steps from them, clipping by the norm over every rank's sums: the
    same class on plain tensors within 1e-6 (Adafactor, whose Shard(1) param takes the reference's step on whole
    copies: 1e-5), the same on every rank."""
    for rank in accumulation[1:]:
        for (a, _), (b, _) in zip(rank[name]["params"], accumulation[0][name]["params"]):
            assert _bits_equal(a, b), "the ranks' params differ"
    got = accumulation[0][name]
    for k, (sharded, plain) in enumerate(got["params"]):
        assert _relative(sharded, plain) <= (1e-5 if name == "adafactor" else 1e-6), (k, SHAPES[k])
    if name == "adamw":  # clipping was active, on the norm of the whole sums
        sharded_norm, plain_norm = got["norms"]
        assert sharded_norm > 2.0 and abs(sharded_norm - plain_norm) <= 1e-9 * plain_norm, got["norms"]


def test_accumulation_over_dtensor_shards_skips_a_window_with_an_inf_on_one_rank(accumulation):
    """fusedopt.GradScaler with an Inf in one rank's shard of window 2's first micro-batch: window 2 updates nothing
    on any rank, windows 1 and 3 do; the scale is halved once. A state_dict taken mid-window (DTensor sums) loads
    into a fresh optimizer, which closes that window as the first one does, bit for bit."""
    for rank in accumulation:
        after = rank["scaler"]["after"]
        unchanged = [all(torch.equal(a, b) for a, b in zip(after[t], after[t - 1])) for t in range(1, 6)]
        assert unchanged == [False, True, True, True, False], unchanged  # (steps 1, 3 close windows 1, 2, 5: 3)
        assert rank["scaler"]["scale"] == accumulation[0]["scaler"]["scale"]
        for a, b in rank["mid-window state_dict"]:
            assert _bits_equal(a, b)


@pytest.fixture(scope="module")
def fsdp2_models() -> list[dict]:
    return run_ranks("test_fsdp2:rank_fsdp2_models", 2, timeout=300)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def test_fsdp2_models_train_as_with_torchs_optimizers(fsdp2_models):
    """fully_shard models trained for 20 steps on per-rank batches: fused == torch's twin bit for bit where the rule
    has no square root (SGD), within 1e-6 otherwise (torch's fp32 sqrt is not correctly rounded); flatten=True (the
    DTensor shards stay where FSDP2 keeps them) == flatten=False bit for bit; with bf16 compute the optimizer steps
    the f32 shards; CPUOffloadPolicy(pin_memory=False), which torch 2.13 runs on a CPU-only host, == no offload
    bit for bit (the step is the CPU-resident sharded step either way); step_in_backward=True (each bucket of
    shards updated from the post-accumulate-grad hooks once FSDP2 has reduce-scattered its gradients) == the
    ordinary step bit for bit, no gradient left; LARS's shards, whose norms would need a collective per bucket,
    keep their gradients for step() with one warning naming them, and equal the ordinary step bit for bit; with
    accumulation_steps=3 the hooks add every shard's gradient (LARS's too) into the window's sums and release it,
    and the windows equal the ordinary ones bit for bit."""
    got = fsdp2_models[0]
    assert got["adamw step_in_backward: grads left"] == [False] * len(got["adamw step_in_backward"])
    assert got["adamw step_in_backward: warnings"] == []
    assert got["lars step_in_backward: grads left"] == [True] * len(got["lars step_in_backward"])
    lars_warnings = got["lars step_in_backward: warnings"]
    assert len(lars_warnings) == 1 and "cannot update these parameters inside backward" in lars_warnings[0]
    assert lars_warnings[0].count("it is a DTensor, and the 'lars' step") == len(got["lars step_in_backward"])
    for run in ("adamw accumulation step_in_backward", "lars accumulation step_in_backward"):
        assert got[f"{run}: grads left"] == [False] * len(got[run]) and got[f"{run}: warnings"] == [], run
    in_backward = [run for run in got if run.endswith(" step_in_backward")]
    for run in ("adamw", "sgd", "adamw flatten", "adam bf16 compute", "adamw cpu offload", *in_backward):
        for k, (fused, reference, dtype) in enumerate(got[run]):
            assert dtype == "torch.float32"
            if run in ("sgd", "adamw flatten", "adamw cpu offload", *in_backward):
                assert _bits_equal(fused, reference), (run, k)
            else:
                assert _relative(fused, reference) <= 1e-6, (run, k)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.torch is not None])
def test_every_torch_twin_under_fsdp2(fsdp2_models, name):
    """FSDP2 + each class with a torch.optim twin against FSDP2 + that twin (foreach=False), 20 steps on per-rank
    batches: bit for bit where the rule has no square root, within 1e-6 otherwise; no param takes the reference's
    step. torch 2.13's own Rprop and Adafactor steps raise on Shard(0) DTensors (in-place ops DTensor cannot
    shard): nothing to compare there, but the fused classes train on for the 20 steps (test_every_class_...
    compares them with one process)."""
    got = fsdp2_models[0]["twins"][name]
    assert got["fused steps"] == 20 and got["finite"], got["fused steps"]
    if got["error"] is not None:  # (the fused class trained on: test_every_class_... compares it with one process)
        assert name in ("adafactor", "rprop") and "in-place operations" in got["error"], got["error"]
        return
    assert not got["routed"], got["routed"]
    for k, (fused, reference) in enumerate(got["params"]):
        if got["sqrt_free"]:
            assert _bits_equal(fused, reference), k
        else:
            assert _relative(fused, reference) <= 1e-6, k


def test_bf16_params_with_f32_masters_step_as_one_process(fsdp2_models):
    """bf16 params under FSDP2 with master_weights=True: the f32 master copies are DTensors of the param's layout,
    and params and masters are the bits of the same class on the unsharded model stepped with the same
    gradients."""
    for k, (param, plain, master, plain_master) in enumerate(fsdp2_models[0]["bf16 masters"]):
        assert param.dtype == torch.bfloat16 and master.dtype == torch.float32
        assert _bits_equal(param, plain) and _bits_equal(master, plain_master), k


def test_a_whole_state_dict_loads_into_the_sharded_optimizer(fsdp2_models):
    """A state_dict of plain tensors (the one-process optimizer's) loaded into the optimizer of the FSDP2 model:
    the states become DTensors of the params' layout, and the next steps equal the one-process run bit for bit."""
    for k, (sharded, plain, kind) in enumerate(fsdp2_models[0]["whole state dict"]):
        assert kind == "DTensor" and _bits_equal(sharded, plain), k


def test_a_full_state_dict_of_dsd_resumes_bit_for_bit(fsdp2_models):
    """get_optimizer_state_dict(..., StateDictOptions(full_state_dict=True)) gathers the states; set into a fresh
    optimizer with the same options, the run continues as the uninterrupted one, bit for bit."""
    for k, (resumed, uninterrupted) in enumerate(fsdp2_models[0]["full state dict"]):
        assert _bits_equal(resumed, uninterrupted), k


def test_tensor_parallel_mlp_trains_as_one_process(fsdp2_models):
    """ColwiseParallel / RowwiseParallel layers on 2 ranks: the fused AdamW within 1e-6 of torch's on the same
    DTensors, and within 1e-5 of the fused class on the unsharded model (the row-parallel matmul's partial sums
    are added across the ranks, so the gradients differ from one process by rounding)."""
    rows = fsdp2_models[0]["tensor parallel"]
    assert [r[3] for r in rows] == [("Shard(dim=0)",), ("Shard(dim=0)",), ("Shard(dim=1)",), ("Replicate()",)]
    for fused, reference, one_process, _ in rows:
        assert _relative(fused, reference) <= 1e-6
        assert _relative(fused, one_process) <= 1e-5


def test_clipping_and_the_scaler_span_the_ranks(fsdp2_models):
    """max_grad_norm and fusedopt.GradScaler under FSDP2: the norm is the whole gradients' (equal to the one-process
    run within 1e-6), and an Inf in one rank's shard skips the step on both ranks, which halve their scale alike."""
    a, b = (r["clip and scaler"] for r in fsdp2_models)
    assert a["skipped"] == b["skipped"] == [False, False, True, False]
    assert a["scales"] == b["scales"] and a["scales"][2] == a["scales"][1] / 2
    for sharded, plain in a["params"]:
        assert _relative(sharded, plain) <= 1e-6


def test_8bit_states_on_dtensor_shards():
    """8-bit states of DTensor params: the codes a DTensor of the param's layout, each shard quantized in blocks
    from its own first element (so where every shard is a whole number of blocks, the one-process run bit for bit,
    with the small vector's f32 states too); the state_dict holds their f32 values as DTensors (no absmax, which
    counts each rank's blocks), and loading it continues the run bit for bit. The bitsandbytes twin alike; and LAMB,
    whose trust ratios add up the shards' sums (in another order than one process: within 1e-6)."""
    got = run_ranks("test_fsdp2:rank_8bit", 2, timeout=300)[0]
    for name in ("uint8", "twin", "lamb"):
        run = got[name]
        assert not run["routed"], run["routed"]
        assert set(run["codes"].values()) == {"DTensor"} and run["codes"], run["codes"]
        kinds = run["saved kinds"]
        states = ("state1", "state2") if name == "twin" else ("exp_avg", "exp_avg_sq")
        assert all(kinds[key] == ("DTensor", "torch.float32") for key in states), kinds
        assert not any("absmax" in key for key in kinds), kinds
        for k, (sharded, plain) in enumerate(run["params"]):
            if name == "lamb":
                assert _relative(sharded, plain) <= 1e-6, k
            else:
                assert _bits_equal(sharded, plain), (name, k)


def test_hsdp_norms_count_each_shard_once():
    """On a 2-D mesh (HSDP: replicated x sharded) the per-tensor sums (LAMB's hook) and the clipping norm add up the
    shards over the sharded dim only: the hook's totals are the two shards' sums, and LAMB and clipped AdamW are the
    one-process run within 1e-6, on every rank. The same under FSDP x TP (fully_shard across pairs of ranks that
    split each layer: placements sharded along both mesh dims), whose optimizers load the one-process state dict
    (plain tensors) midway."""
    ranks = run_ranks("test_fsdp2:rank_hsdp", 4, timeout=300)
    for r, rank in enumerate(ranks):
        # ranks r and r ^ 1 hold the two shards of one replica (the mesh is [[0, 1], [2, 3]])
        assert rank["shard rank"] == r % 2
        tensors = len(rank["lamb"])
        assert rank["sums"] == [2.0, (r + 1) + (r ^ 1) + 1.0] * tensors, rank["sums"]
        for name in ("lamb", "adamw clip", "fsdp x tp lamb", "fsdp x tp adamw clip"):
            params = rank[name]
            for sharded, plain, placements in params:
                if name.startswith("fsdp x tp"):  # (FSDP's dim of a TP shard is a _StridedShard)
                    assert len(placements) == 2 and "Shard(dim=0" in placements[0], placements
                else:
                    assert placements == ("Replicate()", "Shard(dim=0)"), placements
                assert _relative(sharded, plain) <= 1e-6, name


@pytest.fixture(scope="module")
def dcp_runs(tmp_path_factory) -> dict:
    path = str(tmp_path_factory.mktemp("dcp"))
    saved = run_ranks("test_fsdp2:rank_dcp_save", 2, args=(path,), timeout=300)
    loaded = {n: run_ranks("test_fsdp2:rank_dcp_load", n, args=(path,), timeout=300)[0] for n in (3, 1)}
    return {"saved": saved[0], "loaded": loaded}


def _one_process_dcp_run(name: str) -> list[torch.Tensor]:
    """_dcp_classes()[name] on the unsharded model for 2 * STEPS steps of the same gradients."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 5), torch.nn.Linear(5, 2))
    opt = _dcp_classes()[name](m.parameters())
    for t in range(2 * STEPS):
        for k, p in enumerate(m.parameters()):
            p.grad = _grad(p.shape, t, k)
        opt.step()
    return [p.detach() for p in m.parameters()]


@pytest.mark.parametrize("name", ["adamw", "nadam", "sgd", "adafactor"])
def test_dcp_checkpoint_saved_at_two_ranks_continues_at_three_and_one(dcp_runs, name):
    """Saved with dcp.save at 2 ranks, loaded at 3 and at 1 (resharded by DCP), continued: the one-process run of the
    same steps, bit for bit (Adafactor too: its row factors resharded as the params, a matrix's column factors
    replicated). get_optimizer_state_dict gives torch.optim's layout (keys, DTensor states with the
    params' placements, dtypes), and its first call on a fresh optimizer (a step with lr 0) moves no param."""
    want = _one_process_dcp_run(name)
    for world, loaded in dcp_runs["loaded"].items():
        for k, (a, b) in enumerate(zip(loaded[name], want, strict=True)):
            assert _bits_equal(a, b), (world, k)
        assert all(step == 2 * STEPS for step in loaded[f"{name} steps"]), (world, loaded[f"{name} steps"])
    saved = dcp_runs["saved"]
    assert saved[name]["untouched"]
    if name == "adamw":  # torch's AdamW saved the same model
        assert saved[name]["state"] == saved["torch_adamw"]["state"]
        assert saved[name]["groups"] == saved["torch_adamw"]["groups"]
