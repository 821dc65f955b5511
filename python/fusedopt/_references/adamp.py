"""A small pure-torch reference of fusedopt's AdamP (clovaai's adamp.AdamP, which torch_npu's NpuFusedAdamP ports),
for tests.

`AdampReference` is clovaai's `AdamP.step` (adamp 0.3.0, `adamp/adamp.py`; shared/docs/algorithms-more.md §1.1)
written from its formulas, op for op, so that it equals `adamp.AdamP` bit for bit (tests/python/test_adamp.py
checks it). It differs only in what the fused class needs of a reference:

- `state['step']` is a float32 0-d tensor, as torch.optim keeps it (clovaai keeps a Python int); the math reads it
  as a Python number, as clovaai's does.
- The views are `reshape`s (clovaai's `view` fails on params whose memory order is not row-major).

step(), per param p with a grad g (t = state['step'] += 1):

    m = m * b1 + (1 - b1) * g;   v = v * b2 + (1 - b2) * g * g           # mul_().add_(), mul_().addcmul_()
    denom = sqrt(v) / sqrt(1 - b2**t) + eps;   step_size = lr / (1 - b1**t)
    u = (b1 * m + (1 - b1) * g) / denom if nesterov else m / denom
    wd_ratio = 1
    if p.dim() > 1:  for view in (p.reshape(size(0), -1), p.reshape(1, -1)):      # channel, then layer
        if max |cosine_similarity(view(g), view(p), dim=1, eps)| < delta / sqrt(row length):
            p_n = p / (view(p).norm(dim=1) + eps);  u -= p_n * sum_row(p_n * u);  wd_ratio = wd_ratio_arg; break
    if weight_decay > 0: p *= 1 - lr * weight_decay * wd_ratio
    p -= step_size * u
"""

from __future__ import annotations

import math

import torch.nn.functional as F

import torch

from ._per_param import PerParamReference

__all__ = ["AdampReference", "update"]


class AdampReference(PerParamReference):
    """AdamP as clovaai's adamp.AdamP computes it, in torch ops (see the module docstring). Its constructor is
    FusedAdamP's too (the fused class supplies the step and checks the arguments: _check_defaults)."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 delta: float = 0.1, wd_ratio: float = 0.1, nesterov: bool = False):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, delta=delta, wd_ratio=wd_ratio,
                        nesterov=nesterov)
        self._check_defaults(**defaults)
        super().__init__(params, defaults)

    def _check_defaults(self, **defaults):
        """clovaai's AdamP checks nothing."""

    @staticmethod
    def _channel_view(x):
        return x.reshape(x.size(0), -1)

    @staticmethod
    def _layer_view(x):
        return x.reshape(1, -1)

    @staticmethod
    def _projection(p, grad, perturb, delta, wd_ratio, eps):
        expand_size = [-1] + [1] * (len(p.shape) - 1)
        for view_func in (AdampReference._channel_view, AdampReference._layer_view):
            cosine_sim = F.cosine_similarity(view_func(grad), view_func(p), dim=1, eps=eps).abs_()
            if cosine_sim.max() < delta / math.sqrt(view_func(p).size(1)):
                p_n = p / view_func(p).norm(dim=1).view(expand_size).add_(eps)
                perturb -= p_n * view_func(p_n * perturb).sum(dim=1).view(expand_size)
                return perturb, wd_ratio
        return perturb, 1

    def _update_param(self, p, group):
        update(p, p.grad, self.state[p], group)


def update(p: torch.Tensor, grad: torch.Tensor, state: dict, group) -> None:
    """One param's step (also fusedopt's fallback for the params its engine cannot take): `group` is the param group
    or anything with its keys."""
    beta1, beta2 = group["betas"]
    if len(state) == 0:
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(p)
        state["exp_avg_sq"] = torch.zeros_like(p)
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    state["step"] += 1
    step = int(state["step"].item())
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step

    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(group["eps"])
    step_size = group["lr"] / bias_correction1
    if group["nesterov"]:
        perturb = (beta1 * exp_avg + (1 - beta1) * grad) / denom
    else:
        perturb = exp_avg / denom

    wd_ratio = 1
    if len(p.shape) > 1:
        perturb, wd_ratio = AdampReference._projection(p, grad, perturb, group["delta"], group["wd_ratio"],
                                                       group["eps"])
    if group["weight_decay"] > 0:
        p.mul_(1 - group["lr"] * group["weight_decay"] * wd_ratio)
    p.add_(perturb, alpha=-step_size)
