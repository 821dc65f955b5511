"""The reference steps of the fused classes whose reference is not in torch.optim (lion-pytorch's Lion, apex's
FusedLAMB and LARC, torch_npu's RMSpropTF and BertAdam, clovaai's AdamP): the step of the params the engine cannot
take (float64, strided views, other devices; see _fallback.TorchFallback). A class with a torch.optim twin falls back
on its twin's own step instead. Each is a method of its class (`_reference_step = lamb_step`): `opt` is the
optimizer, whose param groups the fallback has cut down to those params.

The per-param updates are those of the references the tests and golden vectors use (lamb.py, lars.py, rmsproptf.py,
adamp.py, bert_adam.py here; tools/<name>_reference.py re-exports them): one implementation of each. Lion's is
lion-pytorch's own update, which needs no reference of ours."""

from __future__ import annotations

import torch

from . import adamp, bert_adam, lamb, lars, rmsproptf


def _numbers(opt, group: dict) -> dict:
    """`group` with its hyper-parameters as the engine reads them (floats: a 1-element tensor lr as its value), for
    the references, which compute with plain numbers."""
    h, numbers, parts = opt._hyper(group), dict(group), {}
    for f in opt._fields:
        if f.kind == "choice":
            continue  # (the group keeps the name: bert_adam.schedule_factor reads it)
        if f.index is None:
            numbers[f.key] = getattr(h, f.name)
        else:
            parts.setdefault(f.key, {})[f.index] = getattr(h, f.name)
    for key, values in parts.items():
        numbers[key] = tuple(values[i] for i in range(len(values)))
    return numbers


def _each_param(opt):
    """(param, its group as numbers) for every param with a gradient."""
    for group in opt.param_groups:
        numbers = _numbers(opt, group)
        for p in group["params"]:
            if p.grad is not None:
                yield p, numbers


def lion_step(opt):
    """lion-pytorch's update_fn, op for op, for the params the engine cannot take."""
    for g in opt.param_groups:
        h = opt._hyper(g)
        for p in g["params"]:
            if p.grad is None:
                continue
            grad = -p.grad if h.maximize else p.grad
            state = opt.state[p]
            if len(state) == 0:
                state["exp_avg"] = torch.zeros_like(p)
            m = state["exp_avg"]
            p.mul_(1.0 - h.lr * h.weight_decay)
            p.add_(m.clone().mul_(h.beta1).add(grad, alpha=1.0 - h.beta1).sign_(), alpha=-h.lr)
            m.mul_(h.beta2).add_(grad, alpha=1.0 - h.beta2)


def bert_adam_step(opt):
    """NpuFusedBertAdam's step (bert_adam.py's update) for the params the engine cannot take: per (group, dtype) the
    gradient norm (in double) and its clip factor, then each param's update; the clipped gradient is a new tensor
    (.grad is left as it is). A param with an f32 master copy is updated through it."""
    for group in opt.param_groups:
        numbers = _numbers(opt, group)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in dict.fromkeys(group["params"]):
            if p.grad is not None:
                by_dtype.setdefault(p.dtype, []).append(p)
        for params in by_dtype.values():
            clip = None
            if numbers["max_grad_norm"] > 0:
                norms = torch.stack([torch.linalg.vector_norm(p.grad, dtype=torch.float64).cpu() for p in params])
                coef = numbers["max_grad_norm"] / (torch.linalg.vector_norm(norms).float() + 1e-6)
                if coef < 1.0:
                    clip = coef
            for p in params:
                bert_adam.update(p, p.grad if clip is None else p.grad * clip.to(p.device), opt.state[p], numbers)


def lamb_step(opt):
    """apex FusedLAMB's per-tensor update (lamb.py); the step has clipped the gradients already."""
    for p, group in _each_param(opt):
        lamb.update(p, p.grad, opt.state[p], group)


def rmsproptf_step(opt):
    """NpuFusedRMSpropTF's per-tensor update (rmsproptf.py)."""
    for p, group in _each_param(opt):
        rmsproptf.update(p, p.grad, opt.state[p], group)


def lars_step(opt):
    """LARC's scaling and torch.optim.SGD's step (lars.py), the norms in double rounded to the param's (real) dtype."""
    for p, group in _each_param(opt):
        lars.update(p, p.grad, opt.state, group)


def adamp_step(opt):
    """clovaai's AdamP.step (adamp.py)."""
    for p, group in _each_param(opt):
        adamp.update(p, p.grad, opt.state[p], group)
