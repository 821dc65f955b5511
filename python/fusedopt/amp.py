"""fusedopt.GradScaler: torch.amp.GradScaler (same API, defaults and update policy: init 65536,
growth 2, backoff 0.5, interval 2000) whose gradient passes run in the C++ engine.

With a fused optimizer, scaler.step(opt) leaves the overflow check to the optimizer's fused pre-pass:
one read of all gradients finds Inf/NaN (and the global norm, for max_grad_norm=), then the update
unscales and clips each gradient as it reads it, or is skipped on overflow, leaving params and
states untouched. An explicit unscale_() (e.g. before fusedopt.clip_grad_norm_) is one fused
read-modify-write pass over all gradients. torch.amp.GradScaler("cpu") drives the fused optimizers
too, with a separate check pass before the step.

An optimizer with step_in_backward=True updates params inside backward, before a scaler could unscale or check
their gradients: scale() refuses outputs whose backward would reach such a param, before anything changes
(torch.amp.GradScaler can only refuse at its step, after the update)."""

from __future__ import annotations

from torch.amp.grad_scaler import OptState

import torch

from . import _C
from ._base import FusedOptimizerMixin
from ._in_backward import refuse_scaled_backward
from ._tensors import DTYPE_CODES, lacks_storage
from .distributed import DistributedOptimizer


class GradScaler(torch.amp.GradScaler):
    def __init__(self, device: str = "cpu", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True):
        super().__init__(device, init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)

    def scale(self, outputs):
        if self._enabled:
            refuse_scaled_backward(outputs)
        return super().scale(outputs)

    def step(self, optimizer, *args, **kwargs):
        state = self._per_optimizer_states[id(optimizer)] if self._enabled else None
        if (state is None or "closure" in kwargs or not isinstance(optimizer, (FusedOptimizerMixin, DistributedOptimizer))
                or state["stage"] is not OptState.READY):
            # torch's path: other optimizers, or grads already unscaled by an explicit unscale_().
            return super().step(optimizer, *args, **kwargs)
        self._check_scale_growth_tracker("step")
        found_inf = torch.zeros(1, dtype=torch.float32, device=self._scale.device)
        optimizer.grad_scale = self._scale
        optimizer._found_inf_out = found_inf  # the step's pre-pass reports overflow here
        try:
            retval = optimizer.step(*args, **kwargs)
        finally:
            del optimizer.grad_scale
            del optimizer._found_inf_out
        state["found_inf_per_device"] = {found_inf.device: found_inf}
        state["stage"] = OptState.STEPPED
        return retval

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        out = self._unscale_local_grads(optimizer, inv_scale, found_inf, allow_fp16)
        if isinstance(optimizer, DistributedOptimizer):
            # Every rank calls unscale_ (and the check before step): the scale backs off on every rank
            # when one rank's gradients hold Inf/NaN, so the ranks' scales stay equal.
            optimizer.agree_found_inf(found_inf)
        return out

    def _unscale_local_grads(self, optimizer, inv_scale, found_inf, allow_fp16):
        grads = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if not allow_fp16 and g.dtype == torch.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                if (g.is_sparse or g.device.type != "cpu" or g.dtype not in DTYPE_CODES or not g.is_contiguous()
                        or lacks_storage(g)):
                    # Outside what the engine handles: torch's own per-device, per-dtype passes.
                    return super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
                grads.append((g.data_ptr(), g.numel(), DTYPE_CODES[g.dtype]))
        scale = float(inv_scale)
        threads = torch.get_num_threads()
        if scale == 1.0:  # step()'s check before a fused step: read only
            bad = _C.has_non_finite(grads, threads)
        else:
            bad = _C.unscale_grads(grads, scale, threads)
        if bad:
            found_inf.fill_(1.0)
        return {found_inf.device: found_inf}
