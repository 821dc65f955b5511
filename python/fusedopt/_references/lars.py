"""A small pure-torch reference of fusedopt's LARS (NVIDIA apex LARC around torch.optim.SGD), for golden vectors
and tests.

`LarsReference` is written from the formulas of apex's `apex/parallel/LARC.py` `LARC.step` (removed from apex by
cb65b8e; shared/docs/algorithms-more.md §3.2) wrapped around torch 2.13's `_single_tensor_sgd`, not from apex's
code. LARC sets the inner optimizer's weight decay to 0 for its step and applies the decay itself. Every line of
`step` is one torch op on float32 tensors (the 0-d norms included), so its rounding is torch's. Departures from
LARC, all deliberate:

- The norms are the float64 norms of the tensors rounded once to their dtype (float32) (LARC's `torch.norm(p.data)`
  accumulates in float32, in ATen's reduction order, which may differ from that in its last bit). fusedopt's
  engine sums the same squares in double (in another fixed order), so the two agree bit for bit but for ties.
- `.grad` is left untouched: LARC overwrites `p.grad` with the scaled gradient; here it goes into a new tensor.
- The hyper-parameters are per group (LARC's `trust_coefficient`, `clip` and `eps` are one value per wrapper), and
  SGD's `maximize` is not taken (under LARC it would also negate the decay LARC adds).

step(), per group, per param p with a grad g (lr, momentum, dampening, wd, nesterov, tc, clip, eps of its group):

    pn, gn = f32(||p||), f32(||g||)                               # 0-d float32 tensors
    d = g
    if pn != 0 and gn != 0:                                       # 0-d tensor comparisons (NaN != 0)
        adaptive_lr = tc * pn / (gn + pn * wd + eps)              # float32 tensor ops
        if clip: adaptive_lr = min(adaptive_lr / lr, 1)           # Python min: NaN stays NaN
        d = g + wd * p;  d *= adaptive_lr                         # LARC: p.grad += wd * p; p.grad *= adaptive_lr
    (otherwise d = g: no weight decay this step)
    torch.optim.SGD with weight_decay 0 on d:
        momentum != 0: buf = clone(d) on the param's first step, else buf.mul_(momentum).add_(d, alpha=1-dampening)
                       d = d.add(buf, alpha=momentum) if nesterov else buf
        p.add_(d, alpha=-lr)

The state is torch.optim.SGD's: `momentum_buffer` only (no step count), created on the param's first step with a
grad while momentum != 0, so a LarsReference state_dict is a LARC(SGD) one.

`LarcSGD` is LARC itself as apex wrote it (float32 torch.norm, .grad overwritten) around a real
torch.optim.SGD(foreach=False): what the tests check LarsReference against, and what bench/torch_bench.py times.
"""

from __future__ import annotations

import torch

from .._tensors import whole
from ._per_param import PerParamReference

__all__ = ["LarcSGD", "LarsReference", "update"]


class LarsReference(PerParamReference):
    """LARS as apex LARC around torch.optim.SGD computes it, in float32 torch ops (see the module docstring). Its
    constructor is FusedLARS's too (the fused class supplies the step and checks more: _check_defaults)."""

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, trust_coefficient: float = 0.02,
                 clip: bool = True, eps: float = 1e-8):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        trust_coefficient=trust_coefficient, clip=clip, eps=eps)
        self._check_defaults(**defaults)
        super().__init__(params, defaults)

    def _check_defaults(self, lr, momentum, dampening, weight_decay, nesterov, **_):
        """torch.optim.SGD's checks and texts; LARC checks nothing."""
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def _update_param(self, p, group):
        update(p, p.grad, self.state, group)


def _norm(t: torch.Tensor) -> torch.Tensor:
    """The float64 norm of a tensor (complex: of its real view), rounded once to the tensor's (real) dtype: a 0-d
    tensor (of a DTensor: its shards' norms reduced, a plain tensor)."""
    real = torch.view_as_real(t) if t.is_complex() else t
    return whole(torch.linalg.vector_norm(real, dtype=torch.float64)).to(real.dtype)


def update(p: torch.Tensor, d: torch.Tensor, states, group) -> None:
    """One param's step with gradient d (also fusedopt's fallback for the params its engine cannot take): `states` is
    the optimizer's state (p's entry is made only with momentum, as torch.optim.SGD's), `group` the param group or
    anything with its keys."""
    lr = group["lr"]
    momentum = group["momentum"]
    dampening = group["dampening"]
    wd = group["weight_decay"]
    # LARC
    param_norm = _norm(p)
    grad_norm = _norm(d)
    if param_norm != 0 and grad_norm != 0:
        adaptive_lr = group["trust_coefficient"] * param_norm / (grad_norm + param_norm * wd + group["eps"])
        if group["clip"]:
            adaptive_lr = min(adaptive_lr / lr, 1)
        d = d + wd * p
        d *= adaptive_lr
    # torch.optim.SGD, _single_tensor_sgd with weight_decay 0
    if momentum != 0:
        state = states[p]
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = torch.clone(d).detach()
            state["momentum_buffer"] = buf
        else:
            buf.mul_(momentum).add_(d, alpha=1 - dampening)
        if group["nesterov"]:
            d = d.add(buf, alpha=momentum)
        else:
            d = buf
    p.add_(d, alpha=-lr)


class LarcSGD:
    """apex LARC's step as written, wrapped around torch.optim.SGD(params, foreach=False, **sgd_kw): the norms are
    torch.norm's float32 results, the scaled gradient is written into p.grad, and the group's weight decay is set
    to 0 for the inner step and restored after it."""

    def __init__(self, params, trust_coefficient=0.02, clip=True, eps=1e-8, **sgd_kw):
        self.optim = torch.optim.SGD(params, foreach=False, **sgd_kw)
        self.trust_coefficient, self.clip, self.eps = trust_coefficient, clip, eps
        self.param_groups, self.state = self.optim.param_groups, self.optim.state

    @torch.no_grad()
    def step(self):
        weight_decays = []
        for group in self.optim.param_groups:
            weight_decay = group.get("weight_decay", 0)
            weight_decays.append(weight_decay)
            group["weight_decay"] = 0
            for p in group["params"]:
                if p.grad is None:
                    continue
                param_norm = torch.norm(p.data)
                grad_norm = torch.norm(p.grad.data)
                if param_norm != 0 and grad_norm != 0:
                    adaptive_lr = self.trust_coefficient * param_norm / (grad_norm + param_norm * weight_decay + self.eps)
                    if self.clip:
                        adaptive_lr = min(adaptive_lr / group["lr"], 1)
                    p.grad.data += weight_decay * p.data
                    p.grad.data *= adaptive_lr
        self.optim.step()
        for group, weight_decay in zip(self.optim.param_groups, weight_decays):
            group["weight_decay"] = weight_decay
