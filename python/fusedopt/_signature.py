"""Every fused class's published constructor: inspect.signature lists its twin's parameters with the twin's
defaults, then fusedopt's own keyword-only options (_OPTIONS), and its docstring documents each option."""

from __future__ import annotations

import inspect

import torch

from ._base import FusedOptimizerMixin

# fusedopt's own keyword-only options (FusedOptimizerMixin.__init__), as every class's docstring documents them.
_OPTIONS = {
    "master_weights": "fp16/bf16 params keep an f32 master copy (state['master_param']) and f32 optimizer "
                      "states; the param receives the rounded update. False: 16-bit params and states are "
                      "updated in their own dtype, as torch does.",
    "flatten": "params, grads and states of each dtype live in one flat buffer (see flat_grads()).",
    "max_grad_norm": "clip the global gradient norm to this inside the step (torch's clip_grad_norm_ "
                     "coefficient, folded into the update: no pass writes the gradients); a step whose gradients "
                     "hold Inf/NaN is skipped, and `last_grad_norm` is the norm. None: no clipping.",
    "norm_type": "the norm of max_grad_norm: 1, 2 or inf.",
    "accumulation_steps": "step() adds the gradients (any dtype, unscaled by a GradScaler) into f32 accumulators "
                          "and updates every k-th call with their mean: one large batch. A micro-batch with "
                          "Inf/NaN gradients skips its whole window.",
    "state_dtype": "dtype of the optimizer states (e.g. torch.bfloat16: half the memory of f32 moments); "
                   "torch.uint8: 8-bit block-wise states in bitsandbytes' format (not AdamP, Adafactor; "
                   "docs/8bit-states.md); None: the param's dtype, or f32 with master_weights.",
    "min_8bit_size": "with state_dtype=torch.uint8: params of fewer elements keep full-precision states (as "
                     "state_dtype=None), as bitsandbytes' min_8bit_size.",
    "stochastic_rounding": "16-bit states, and 16-bit params without a master copy (pure bf16 training), are "
                           "rounded stochastically, keyed on (seed, step, element index): unbiased, "
                           "reproducible, independent of threads.",
    "seed": "the seed of stochastic_rounding's noise, an int in [0, 2**64).",
    "strict": "params or steps the engine cannot take (another device or dtype, no storage of their own such as "
              "DTensors, sparse gradients, differentiable=True) are errors, instead of taking the reference's own "
              "(unfused) step with a warning.",
    "step_in_backward": "params are updated inside backward(), 25 MiB of gradients at a time, as their "
                        "post-accumulate-grad hooks fire, and their gradients released (p.grad = None): a step never "
                        "holds the whole model's gradients; step() and zero_grad() then have nothing left to do. With "
                        "accumulation_steps > 1 the gradients go into the window's sums, and its last step() updates "
                        "from them. Not with max_grad_norm or a GradScaler (docs/pytorch.md).",
}


def _twin(cls: type) -> type | None:
    """The class whose constructor cls takes: the first of its bases that is a torch optimizer and not fused
    (torch.optim.AdamW for FusedAdamW, _LambGroups for FusedLAMB; not the mixin's parts, which precede it).
    None for a class without one (_AdamLike)."""
    return next((c for c in cls.__mro__ if issubclass(c, torch.optim.Optimizer)
                 and not issubclass(c, FusedOptimizerMixin)), None)


def _publish_signature(cls: type) -> None:
    """Gives cls an __init__ whose signature is its twin's parameters, with the twin's defaults, then fusedopt's
    keyword-only options (those the twin does not take itself; norm_type goes with the mixin's max_grad_norm), and
    a docstring documenting each option, so that tools reading signatures (timm's optimizer factory, Lightning
    CLI, jsonargparse, Hydra) see them. The __init__ calls the one cls had, as before; first it checks that each
    tuple hyper-parameter (betas, etas, step_sizes, Adafactor's eps) has as many values as its default, which
    the constructors index without checking."""
    twin = _twin(cls)
    own = inspect.signature(twin.__init__).parameters
    options = [p for p in inspect.signature(FusedOptimizerMixin.__init__).parameters.values()
               if p.kind is p.KEYWORD_ONLY and p.name not in own
               and not (p.name == "norm_type" and "max_grad_norm" in own)]
    signature = inspect.Signature([p for p in own.values() if p.kind is not p.VAR_KEYWORD] + options)
    sizes = {name: len(p.default) for name, p in own.items() if isinstance(p.default, tuple)}
    init = cls.__init__  # its own (FusedLAMB) or the mixin's

    def __init__(self, *args, **kwargs):
        try:
            given = signature.bind(self, *args, **kwargs).arguments
        except TypeError:  # the constructor says what is wrong, as before
            given = {}
        for name, size in sizes.items():
            value = given.get(name, own[name].default)
            try:
                n = len(value)
            except TypeError:
                raise TypeError(f"{cls.__name__}: {name} must be a sequence of {size} values, got {value!r}") from None
            if n != size:
                raise ValueError(f"{cls.__name__}: invalid {name}: {value!r} (it must have {size} values, as the "
                                 f"default {own[name].default!r})")
        init(self, *args, **kwargs)

    # (an option missing from _OPTIONS shows undocumented: test_client_inputs.py fails, the import does not)
    args = "\n".join(f"    {p.name} ({p.annotation}, default {p.default!r}): {_OPTIONS.get(p.name, '')}" for p in options)
    reference = f"torch.optim.{twin.__name__}" if twin.__module__.startswith("torch.optim") else "its reference (above)"
    __init__.__doc__ = (f"Arguments: those of {reference}, with its defaults, then fusedopt's keyword-only "
                        f"options.\n\nArgs:\n{args}\n")
    __init__.__signature__ = signature
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__module__ = cls.__module__
    cls.__init__ = __init__
    summary = cls.__dict__.get("__doc__") or f"{reference} with a fused step() (fusedopt.optim)."
    cls.__doc__ = f"{summary}\n\n{__init__.__doc__}"
