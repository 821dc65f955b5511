"""A small pure-torch reference of fusedopt's RMSpropTF (torch_npu NpuFusedRMSpropTF semantics), for golden vectors
and tests.

`RMSpropTFReference` is written from the formulas of torch_npu's `NpuFusedRMSpropTF._group_step`
(Ascend/pytorch `torch_npu/optim/npu_fused_rmsprop_tf.py`, a port of an older timm `RMSpropTF`; see
shared/docs/algorithms-more.md §1.4), not from its code, which runs on the NPU only (and timm's own class needs
torchvision). Every line of `step` is one torch op on float32 tensors, so its rounding is torch's on the CPU
(make_golden.py's `--exact-sqrt` monkeypatches `torch.Tensor.sqrt_`, which covers the one sqrt here). The
deprecated `(Number, Tensor)` overloads of the NPU code are written in their `alpha=` / `value=` forms, which
compute the same. Departures from the NPU class, all deliberate:

- `state['step']` is a float32 0-d tensor (as torch.optim keeps it), +1 on every `step()` where the param has a
  grad, instead of the NPU's Python int (which its math never reads).
- Each param is updated on its own (the NPU combines a group's params into one flat buffer per dtype first; the
  per-element formula is the same). No NPU error suffixes, no dtype or set_to_none restrictions.

step(), per group, per param p with a grad g (t = state['step'] += 1):

    state on first use: square_avg = ones, momentum_buffer = zeros (momentum > 0), grad_avg = zeros (centered)
    if wd != 0:   decoupled_decay: p.add_(p, alpha=-wd)             # p·(1 - wd), NOT scaled by lr
                  else:            g = g.add(p, alpha=wd)
    square_avg.add_(g.pow(2) - square_avg, alpha=1 - alpha)
    centered:     grad_avg.add_(g - grad_avg, alpha=1 - alpha)
                  avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).add(eps).sqrt_()
    else:         avg = square_avg.add(eps).sqrt_()                  # eps inside the sqrt
    momentum > 0: buf.mul_(momentum)
                  lr_in_momentum:  buf.addcdiv_(g, avg, value=lr); p.add_(-buf)
                  else:            buf.addcdiv_(g, avg);           p.add_(buf, alpha=-lr)
    else:         p.addcdiv_(g, avg, value=-lr)
"""

from __future__ import annotations

import torch

from ._per_param import PerParamReference

__all__ = ["RMSpropTFReference", "update"]


class RMSpropTFReference(PerParamReference):
    """RMSpropTF as torch_npu's NpuFusedRMSpropTF computes it, in float32 torch ops (see the module docstring). Its
    constructor is FusedRMSpropTF's too (the fused class supplies the step)."""

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.9, eps: float = 1e-10, weight_decay: float = 0,
                 momentum: float = 0.0, centered: bool = False, decoupled_decay: bool = False,
                 lr_in_momentum: bool = True):
        # The NPU class's checks and texts (without its error-code suffix).
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered,
                        decoupled_decay=decoupled_decay, lr_in_momentum=lr_in_momentum)
        super().__init__(params, defaults)

    def _update_param(self, p, group):
        update(p, p.grad, self.state[p], group)


def update(p: torch.Tensor, grad: torch.Tensor, state: dict, group) -> None:
    """One param's step (also fusedopt's fallback for the params its engine cannot take): `group` is the param group
    or anything with its keys. A missing state entry is created when it is first needed (a state loaded from a run
    without momentum gains its buffer when momentum is turned on)."""
    lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
    wd, momentum = group["weight_decay"], group["momentum"]
    if "step" not in state:
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
    if "square_avg" not in state:
        state["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)
    if momentum > 0 and "momentum_buffer" not in state:
        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    if group["centered"] and "grad_avg" not in state:
        state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    state["step"] += 1
    square_avg = state["square_avg"]

    if wd != 0:
        if group["decoupled_decay"]:
            p.add_(p, alpha=-wd)
        else:
            grad = grad.add(p, alpha=wd)
    square_avg.add_(grad.pow(2) - square_avg, alpha=1 - alpha)
    if group["centered"]:
        grad_avg = state["grad_avg"]
        grad_avg.add_(grad - grad_avg, alpha=1 - alpha)
        avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).add(eps).sqrt_()
    else:
        avg = square_avg.add(eps).sqrt_()
    if momentum > 0:
        buf = state["momentum_buffer"]
        buf.mul_(momentum)
        if group["lr_in_momentum"]:
            buf.addcdiv_(grad, avg, value=lr)
            p.add_(-buf)
        else:
            buf.addcdiv_(grad, avg)
            p.add_(buf, alpha=-lr)
    else:
        p.addcdiv_(grad, avg, value=-lr)
