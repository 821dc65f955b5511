"""A small pure-torch reference of fusedopt's BertAdam (torch_npu NpuFusedBertAdam semantics), for golden vectors
and tests.

`BertAdamReference` is written from the formulas of torch_npu's `NpuFusedBertAdam._group_step` and
`_clip_grad_norm_` (Ascend/pytorch `torch_npu/optim/npu_fused_bert_adam.py`, a port of HF pytorch-pretrained-bert's
`BertAdam`; see shared/docs/algorithms-more.md §1.2), not from its code, which runs on the NPU only. Every update
line is one torch op on float32 tensors, so its rounding is torch's on the CPU (make_golden.py's `--exact-sqrt`
monkeypatches `torch.Tensor.sqrt`, the one sqrt here). The deprecated `(Number, Tensor)` overloads of the NPU code
are written in their `alpha=` / `value=` forms, which compute the same.

step(), per group, per dtype d of the group's params with a grad (the NPU's flat buffer of that group and dtype):

    if max_grad_norm > 0:                             # the group's value (the NPU: the constructor's)
        n = ||cat(grads)||, summed in float64, rounded to float32 (float64 grads: kept in float64)
        c = max_grad_norm / (n + 1e-6)
        if c < 1: grad.mul_(c) for each grad                          # in place: .grad holds the clipped grad
    per param (s = state['step'] before this step):
        exp_avg.mul_(b1).add_(grad, alpha=1 - b1)
        exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        update = exp_avg / (exp_avg_sq.sqrt() + e)                    # no bias correction
        if weight_decay > 0: update += weight_decay * p
        lr_s = lr * schedule(s / t_total, warmup) if t_total != -1 else lr
        p.add_(-(lr_s * update))
        state['step'] += 1

Departures from the NPU class, all deliberate (fusedopt does the same; docs/numerics.md):

- `state['step']` is a float32 0-d tensor, +1 on every `step()` where the param has a grad, and it is the step the
  schedule reads (HF's BertAdam does this per param; the NPU never increments the per-param step and keeps one
  combined step per buffer, so a resumed run restarts its schedule).
- The schedules: warmup -1 ("no warmup") counts as 0, as HF's do (the NPU's warmup_linear then gives (1 - x) / 2);
  warmup_cosine uses math.cos (the NPU's torch.cos of a float raises TypeError); warmup_poly is 0 from x = 1 on
  (the NPU's (1 - x) ** 0.5 is complex after it).
- max_grad_norm is read per group (HF) instead of once from the constructor (the NPU); the same unless a group sets
  its own. No NPU error suffixes, no dtype or set_to_none restrictions.
- The buffer's norm is summed in float64 and rounded once to float32 (the NPU sums `grad.float().abs().pow(2)` in
  float32 on the device, in an order of its own); the clip factor is then the NPU's float32 tensor ops.
"""

from __future__ import annotations

import math

from torch.optim.optimizer import required

import torch

from .._tensors import whole

__all__ = ["BertAdamReference", "SCHEDULES", "schedule_factor", "update"]

SCHEDULES = ("warmup_linear", "warmup_constant", "warmup_cosine", "warmup_poly")


def schedule_factor(schedule: str, x: float, warmup: float) -> float:
    """The factor of lr at progress x = s / t_total."""
    warmup = max(warmup, 0.0)
    if x < warmup:
        return x / warmup
    if schedule == "warmup_constant":
        return 1.0
    if schedule == "warmup_cosine":
        return 0.5 * (1.0 + math.cos(math.pi * x))
    if schedule == "warmup_poly":
        return (1.0 - x) ** 0.5 if x < 1.0 else 0.0
    return max((x - 1.0) / (warmup - 1.0), 0.0)


class BertAdamReference(torch.optim.Optimizer):
    """BertAdam as torch_npu's NpuFusedBertAdam computes it, in float32 torch ops (see the module docstring). Its
    constructor is FusedBertAdam's too (the fused class supplies the step and checks more: _check_defaults)."""

    def __init__(self, params, lr=required, warmup=-1, t_total=-1, schedule="warmup_linear", b1=0.9, b2=0.999,
                 e=1e-6, weight_decay=0.01, max_grad_norm=1.0):
        defaults = dict(lr=lr, schedule=schedule, warmup=warmup, t_total=t_total, b1=b1, b2=b2, e=e,
                        weight_decay=weight_decay, max_grad_norm=max_grad_norm)
        self._check_defaults(**defaults)
        super().__init__(params, defaults)

    def _check_defaults(self, lr, warmup, schedule, b1, b2, e, **_):
        """The NPU class's checks and texts (without its error-code suffix)."""
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if (warmup < 0.0 and warmup != -1) or warmup >= 1.0:
            raise ValueError(f"Invalid warmup: {warmup}")
        if schedule not in SCHEDULES:
            raise ValueError(f"Invalid schedule parameter: {schedule}")
        if b1 < 0.0 or b1 >= 1.0:
            raise ValueError(f"Invalid b1 parameter: {b1}")
        if b2 < 0.0 or b2 >= 1.0:
            raise ValueError(f"Invalid b2 parameter: {b2}")
        if e < 0.0:
            raise ValueError(f"Invalid epsilon value: {e}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            buffers: dict[torch.dtype, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is not None:
                    buffers.setdefault(p.dtype, []).append(p)
            for params in buffers.values():
                if group["max_grad_norm"] > 0:
                    flat = torch.cat([p.grad.reshape(-1) for p in params])
                    # The norm correctly rounded to the NPU's grad.float() (f16/f32 there; float64 stays
                    # float64): the device's own summation order is unknown, and a float32 sum on the CPU
                    # would be neither its nor exact.
                    total_norm = whole(torch.linalg.vector_norm(flat, dtype=torch.float64)).to(
                        torch.promote_types(flat.dtype, torch.float32))
                    clip_coef = group["max_grad_norm"] / (total_norm + 1e-6)
                    if clip_coef < 1.0:
                        for p in params:
                            p.grad.mul_(clip_coef)
                for p in params:
                    update(p, p.grad, self.state[p], group)
        return loss


def update(p: torch.Tensor, grad: torch.Tensor, state: dict, group) -> None:
    """One param's step with gradient grad, clipped already (also fusedopt's fallback for the params its engine cannot
    take): `group` is the param group or anything with its keys. A param with an f32 master copy
    (state['master_param'], fusedopt's master_weights=True) is updated through it: its states are the master's
    dtype, and the param receives the rounded result."""
    target = state.get("master_param", p)
    if "step" not in state:
        state["step"] = torch.tensor(0.0)
    for key in ("exp_avg", "exp_avg_sq"):
        if key not in state:
            state[key] = torch.zeros_like(target, memory_format=torch.preserve_format)
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    grad = grad.to(exp_avg.dtype)
    b1, b2 = group["b1"], group["b2"]
    exp_avg.mul_(b1).add_(grad, alpha=1 - b1)
    exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    update = exp_avg / (exp_avg_sq.sqrt() + group["e"])
    if group["weight_decay"] > 0.0:
        update += group["weight_decay"] * target
    s = state["step"].item()
    if group["t_total"] != -1:
        lr_scheduled = group["lr"] * schedule_factor(group["schedule"], s / group["t_total"], group["warmup"])
    else:
        lr_scheduled = group["lr"]
    target.add_(-(lr_scheduled * update).to(target.dtype))
    if target is not p:
        p.copy_(target)
    state["step"] += 1
