"""A small pure-torch reference of fusedopt's LAMB (apex FusedLAMB semantics), for golden vectors and tests.

`LambReference` is written from apex's formulas (NVIDIA/apex `apex/optimizers/fused_lamb.py` `FusedLAMB.step` and
`csrc/multi_tensor_lamb.cu` stages 1 and 2), not from apex's code, which is CUDA only. Every line of `step` is one
torch op on float32 tensors, so its rounding is torch's (make_golden.py's `--exact-sqrt` monkeypatches
`torch.Tensor.sqrt`, which covers the one sqrt here). Departures from apex, all deliberate:

- The step count lives in each param's `state['step']` (a float32 0-d tensor, as torch.optim.Adam keeps it, +1 on
  every `step()` where the param has a grad) instead of apex's `group['step']` (+1 for the whole group on every
  `step()`, grads or not). The two agree while every param gets a grad on every step.
- Gradient clipping multiplies by the float32 coefficient max_grad_norm / G where apex divides by G / max_grad_norm.
  The scaled gradients differ by at most 1 ulp when max_grad_norm is a power of two (1.0, the default, and the
  goldens' 0.5); for other values a few in 10^4 differ by 2 ulps.
- Only float32 math: no fp16 moments, no amsgrad argument, no set_grad_none, and `.grad` is left untouched (apex
  overwrites it with the update).

`max_grad_norm` is global, read from `self.defaults['max_grad_norm']` as apex reads it. It is in `defaults`, so it
also appears in every group dict (and in `state_dict()['param_groups']`), but the group value is ignored.

step(), over the params p with a grad g:

    G = sqrt(sum over all groups' grads of sum(g.double()**2))          # Python double, before any update
    coef = f32(max_grad_norm) / f32(G) (a float32 division) if G > max_grad_norm, else no clipping
    per group, per param (t = state['step'] += 1, as a double):
      sg = g * coef (one float32 multiply; a copy of g without clipping)
      L2 mode (adam_w_mode=False, wd != 0): sg = sg + wd * p
      exp_avg.mul_(b1).add_(sg, alpha=b3)             b3 = 1 - b1 if grad_averaging else 1
      exp_avg_sq.mul_(b2).addcmul_(sg, sg, value=1 - b2)
      u = (exp_avg / bc1) / ((exp_avg_sq / bc2).sqrt() + eps)    bc = 1 - b**t (doubles), 1 without bias_correction
      AdamW mode (adam_w_mode=True, wd != 0): u = u + wd * p
      pn = ||p||, un = ||u|| (L2 norms accumulated in double)
      ratio = lr * (pn / un) if (use_nvlamb or wd != 0) and pn != 0 and un != 0 else lr
      p = p - ratio * u
"""

from __future__ import annotations

import math

import torch

from .._tensors import whole

__all__ = ["LambReference", "update"]


class LambReference(torch.optim.Optimizer):
    """LAMB as apex FusedLAMB computes it, in float32 torch ops (see the module docstring)."""

    def __init__(
        self,
        params,
        lr=1e-3,
        bias_correction=True,
        betas=(0.9, 0.999),
        eps=1e-6,
        weight_decay=0.01,
        adam_w_mode=True,
        grad_averaging=True,
        max_grad_norm=1.0,
        use_nvlamb=False,
    ):
        if not lr >= 0.0:
            raise ValueError(f"Invalid lr: {lr} (must be >= 0)")
        if not eps >= 0.0:
            raise ValueError(f"Invalid eps: {eps} (must be >= 0)")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid betas[{i}]: {beta} (must be in [0, 1))")
        if not weight_decay >= 0.0:
            raise ValueError(f"Invalid weight_decay: {weight_decay} (must be >= 0)")
        if not max_grad_norm >= 0.0:
            raise ValueError(f"Invalid max_grad_norm: {max_grad_norm} (must be >= 0)")
        defaults = dict(
            lr=lr,
            bias_correction=bias_correction,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            adam_w_mode=adam_w_mode,
            grad_averaging=grad_averaging,
            max_grad_norm=max_grad_norm,  # global: the group copies are ignored
            use_nvlamb=use_nvlamb,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        # Global gradient norm over every param of every group with a grad, before any update.
        total = 0.0
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("LambReference does not support sparse gradients")
                total += whole((p.grad.double() ** 2).sum()).item()
        grad_norm = math.sqrt(total)
        max_grad_norm = self.defaults["max_grad_norm"]
        coef = None
        if grad_norm > max_grad_norm:
            coef = torch.tensor(max_grad_norm, dtype=torch.float32) / torch.tensor(grad_norm, dtype=torch.float32)

        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                sg = torch.mul(g, coef) if coef is not None else g.clone()
                update(p, sg, self.state[p], group)
        return loss


def _norm(t: torch.Tensor) -> float:
    """||t|| accumulated in double (complex: of its real view)."""
    return whole((torch.view_as_real(t) if t.is_complex() else t).double().norm()).item()


def update(p: torch.Tensor, sg: torch.Tensor, state: dict, group) -> None:
    """One param's step with its (clipped) gradient sg (also fusedopt's fallback for the params its engine cannot
    take, whose gradients the step has clipped already): `group` is the param group or anything with its keys."""
    lr = group["lr"]
    beta1, beta2 = group["betas"]
    eps = group["eps"]
    wd = group["weight_decay"]
    beta3 = 1 - beta1 if group["grad_averaging"] else 1.0
    if len(state) == 0:
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    state["step"] += 1
    t = state["step"].item()

    if not group["adam_w_mode"] and wd != 0:
        sg = sg.add(p, alpha=wd)
    exp_avg.mul_(beta1).add_(sg, alpha=beta3)
    exp_avg_sq.mul_(beta2).addcmul_(sg, sg, value=1 - beta2)
    if group["bias_correction"]:
        bc1 = 1 - beta1**t
        bc2 = 1 - beta2**t
    else:
        bc1 = bc2 = 1.0
    u = (exp_avg / bc1) / ((exp_avg_sq / bc2).sqrt() + eps)
    if group["adam_w_mode"] and wd != 0:
        u.add_(p, alpha=wd)

    pn = _norm(p)
    un = _norm(u)
    if (group["use_nvlamb"] or wd != 0) and pn != 0 and un != 0:
        ratio = lr * (pn / un)
    else:
        ratio = lr
    p.add_(u, alpha=-ratio)
