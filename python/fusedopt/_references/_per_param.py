"""The step of a reference whose update reads one param at a time (AdamP, LARS, RMSpropTF): the closure, then each
param with a gradient in group order, sparse gradients refused. The class supplies `_update_param(p, group)`."""

from __future__ import annotations

import torch


class PerParamReference(torch.optim.Optimizer):
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                self._update_param(p, group)
        return loss
