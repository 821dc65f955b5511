"""The five fused optimizers. Each one *is* its torch.optim twin (a subclass), so it takes the same
arguments with the same defaults and errors, keeps the same param_groups and state (per-param
state['step'], torch's state keys and dtypes) and exchanges state_dicts with torch both ways; only
step() is replaced by one fused pass over all parameters (see _base.py).

Extra keyword arguments:
  master_weights=True  fp16/bf16 params keep an f32 master copy (state['master_param']) and f32
                       optimizer states; the param receives the rounded update. Default False:
                       16-bit params and states are updated in their own dtype, as torch does.
  flatten=True         params, grads and states of each dtype live in one flat buffer (_flat.py).
  max_grad_norm=x      clip the global gradient norm to x inside the step (torch's clip_grad_norm_
                       coefficient, folded into the update: no pass writes the gradients); a step
                       whose gradients hold Inf/NaN is skipped. `opt.last_grad_norm` is the norm.
  norm_type=2.0        the norm of max_grad_norm: 1, 2 or inf.
  accumulation_steps=k step() adds the gradients (any dtype, unscaled by a GradScaler) into f32
                       accumulators and updates every k-th call with their mean: one large batch.
                       A micro-batch with Inf/NaN gradients skips its whole window.
  state_dtype=dtype    dtype of the optimizer states (e.g. torch.bfloat16: half the memory of f32
                       moments); default: the param's dtype, or f32 with master_weights.
  stochastic_rounding=True, seed=0
                       16-bit states, and 16-bit params without a master copy (pure bf16 training),
                       are rounded stochastically, keyed on (seed, step, element index): unbiased,
                       reproducible, independent of threads.
"""

from __future__ import annotations

import torch

from . import _C
from ._base import FusedOptimizerMixin
from ._base import group_number as _f  # hyper-parameters may be 1-element tensors (lr, betas)


class FusedSGD(FusedOptimizerMixin, torch.optim.SGD):
    _engine_step = staticmethod(_C.sgd_step)
    _slot_keys = ("momentum_buffer",)
    _counts_steps = False
    _sparse_message = "SGD does not support sparse gradients"

    def _hyper(self, g):
        return _C.SgdHyper(lr=_f(g, "lr"), momentum=_f(g, "momentum"), dampening=_f(g, "dampening"),
                           weight_decay=_f(g, "weight_decay"), nesterov=bool(g["nesterov"]),
                           maximize=bool(g["maximize"]))

    def _needed_slots(self, g):
        return (_f(g, "momentum") != 0.0,)


class _AdamLike(FusedOptimizerMixin):
    _engine_step = staticmethod(_C.adam_step)
    _slot_keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")

    def _hyper(self, g):
        return _C.AdamHyper(lr=_f(g, "lr"), beta1=_f(g, "betas", 0), beta2=_f(g, "betas", 1), eps=_f(g, "eps"),
                            weight_decay=_f(g, "weight_decay"), amsgrad=bool(g["amsgrad"]),
                            maximize=bool(g["maximize"]),
                            decoupled_weight_decay=bool(g.get("decoupled_weight_decay", False)))

    def _needed_slots(self, g):
        return (True, True, bool(g["amsgrad"]))


class FusedAdam(_AdamLike, torch.optim.Adam):
    _sparse_message = "Adam does not support sparse gradients, please consider SparseAdam instead"


class FusedAdamW(_AdamLike, torch.optim.AdamW):
    _sparse_message = FusedAdam._sparse_message  # torch 2.13's AdamW is an Adam and says the same


class FusedRMSprop(FusedOptimizerMixin, torch.optim.RMSprop):
    _engine_step = staticmethod(_C.rmsprop_step)
    _slot_keys = ("square_avg", "momentum_buffer", "grad_avg")
    _sparse_message = "RMSprop does not support sparse gradients"

    def _hyper(self, g):
        return _C.RmspropHyper(lr=_f(g, "lr"), alpha=_f(g, "alpha"), eps=_f(g, "eps"),
                               weight_decay=_f(g, "weight_decay"), momentum=_f(g, "momentum"),
                               centered=bool(g["centered"]), maximize=bool(g["maximize"]))

    def _needed_slots(self, g):
        return (True, _f(g, "momentum") > 0.0, bool(g["centered"]))


class FusedAdagrad(FusedOptimizerMixin, torch.optim.Adagrad):
    _engine_step = staticmethod(_C.adagrad_step)
    _slot_keys = ("sum",)
    _sparse_message = "fusedopt: FusedAdagrad does not support sparse gradients; use torch.optim.Adagrad"

    def _hyper(self, g):
        return _C.AdagradHyper(lr=_f(g, "lr"), lr_decay=_f(g, "lr_decay"),
                               weight_decay=_f(g, "weight_decay"),
                               initial_accumulator_value=_f(g, "initial_accumulator_value"),
                               eps=_f(g, "eps"), maximize=bool(g["maximize"]))

    def _needed_slots(self, g):
        return (True,)

    def _initial_state_value(self, key):
        # torch 2.13 fills a new 'sum' with the constructor's value, whatever the group says.
        return _f(self.defaults, "initial_accumulator_value") if key == "sum" else 0.0
