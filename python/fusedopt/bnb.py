"""Twins of bitsandbytes' 8-bit optimizers (bitsandbytes 0.50.2): the same constructors (arguments, defaults,
errors), param_groups and state_dict, so that a training script swaps `bnb.optim.AdamW8bit` for
`fusedopt.FusedAdamW8bit` and a checkpoint moves between them both ways. Each is the fused class's
state_dtype=torch.uint8 (8-bit block-wise states, docs/8bit-states.md) under bitsandbytes' names: the
states are state1/state2 with absmax1/absmax2, and the step is the engine's element-wise algorithm the
bitsandbytes kernel computes:

    AdamW8bit, Adam8bit, PagedAdamW8bit, PagedAdam8bit -> adamw (Adam8bit's weight decay is decoupled too, as
    bitsandbytes');  Lion8bit, PagedLion8bit -> lion
    SGD8bit -> sgd (momentum; dampening and nesterov are not applied, as bitsandbytes)
    RMSprop8bit -> rmsprop (alpha; momentum not applied, as bitsandbytes);  Adagrad8bit -> adagrad

Params under min_8bit_size keep f32 state1/state2 (no absmax, no qmap). The quantizer rounds to the nearest
code (bitsandbytes' CUDA rule), not through the lookup table of bitsandbytes' CPU path."""

from __future__ import annotations

import torch

from . import _C
from ._base import FusedOptimizerMixin

# bitsandbytes' Optimizer8bit.state_dict moves these keys of each param's state into a nested dict under
# _WRAP (in this order), so that FSDP does not gather them.
_WRAP = "__bnb_optimizer_quant_state__"
_QUANT_KEYS = ("state1", "qmap1", "state2", "qmap2", "absmax1", "absmax2")


def _check_bnb(lr, betas, eps, weight_decay) -> tuple:
    """bitsandbytes' Optimizer1State/Optimizer2State checks, with its texts; betas may be a string "(b1, b2)"."""
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if isinstance(betas, str):
        betas = tuple(float(b) for b in betas.replace("(", "").replace(")", "").strip().split(","))
    for i in range(len(betas)):
        if not 0.0 <= betas[i] < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {betas[i]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    return betas


class _Groups8bit(torch.optim.Optimizer):
    """bitsandbytes' param groups: lr, betas, eps, weight_decay, and for the 2-state optimizers AdEMAMix's alpha,
    t_alpha and t_beta3 (unused by these classes, kept so that state_dicts match)."""

    def __init__(self, params, lr, betas, eps, weight_decay, two_state: bool):
        betas = _check_bnb(lr, betas, eps, weight_decay)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        if two_state:
            defaults.update(alpha=0.0, t_alpha=None, t_beta3=None)
        super().__init__(params, defaults)


class _Bnb8bit(FusedOptimizerMixin, _Groups8bit):
    """What the twins share: the mixin's 8-bit states under bitsandbytes' keys, its state_dict layout, and the
    mapping of its group keys onto the engine algorithm's (_engine_group)."""

    _per_tensor_state_keys = ("qmap1", "qmap2")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_algorithm" in cls.__dict__:
            # bitsandbytes' keys for the engine's slots, and its per-param step (a Python int in its state_dict;
            # the engine's counter meanwhile: for SGD step 1 is also bitsandbytes' "momentum starts as g")
            cls._slot_keys = tuple(f"state{k + 1}" for k in range(len(cls._slot_keys)))
            cls._counts_steps = True

    def __init__(self, params, lr, betas, eps, weight_decay, args, min_8bit_size, two_state: bool, **options):
        if args is not None:
            raise ValueError(f"{type(self).__name__}: args (bitsandbytes' GlobalOptimManager overrides) is not "
                             "taken; pass min_8bit_size and the hyper-parameters instead")
        # No bitsandbytes step to fall back on: a param the engine cannot take is an error.
        options.setdefault("strict", True)
        # (state_dtype may be passed, as a ZeRO-1 shard's copy of the options does, but only as what it is)
        if options.pop("state_dtype", torch.uint8) is not torch.uint8:
            raise ValueError(f"{type(self).__name__}: its states are 8-bit (state_dtype=torch.uint8); for other "
                             "state dtypes use the fusedopt.Fused* class of the algorithm")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, two_state=two_state,
                         state_dtype=torch.uint8, min_8bit_size=min_8bit_size, **options)

    def _engine_group(self, group: dict) -> dict:
        """The group as the engine algorithm's keys (torch's names of its Hyper's fields)."""
        raise NotImplementedError

    def _hyper_arguments(self, group):
        return super()._hyper_arguments(self._engine_group(group))

    def _absmax_key(self, key: str) -> str:
        return "absmax" + key[len("state"):]  # state1 -> absmax1

    def state_dict(self) -> dict:
        """bitsandbytes' layout: per param `step` (an int) and, nested under "__bnb_optimizer_quant_state__",
        state1/state2 (uint8 codes, or f32 under min_8bit_size) with qmap1 (signed map)/qmap2 (unsigned) and
        absmax1/absmax2 for 8-bit states."""
        state_dict = super().state_dict()
        maps = {"qmap1": torch.tensor(_C.dynamic_map(self._signed_map("state1")), dtype=torch.float32)}
        if len(self._slot_keys) > 1:
            maps["qmap2"] = torch.tensor(_C.dynamic_map(self._signed_map("state2")), dtype=torch.float32)
        state_dict["state"] = {i: _wrapped(entry, maps) for i, entry in state_dict["state"].items()}
        return state_dict

    def load_state_dict(self, state_dict: dict) -> None:
        """Takes bitsandbytes' layout (wrapped, as its state_dict writes it, or flat) and this class's; steps as
        ints or tensors. The qmaps are not read: they are the maps the engine uses."""
        state_dict = dict(state_dict)
        state_dict["state"] = {i: _unwrapped(entry) for i, entry in state_dict["state"].items()}
        super().load_state_dict(state_dict)


def _wrapped(entry: dict, maps: dict) -> dict:
    out = {k: v for k, v in entry.items() if k not in _QUANT_KEYS}
    if "step" in out:
        out["step"] = int(out["step"])
    quant = {}
    for key in _QUANT_KEYS:
        if key.startswith("qmap"):
            codes = entry.get("state" + key[4:])
            if isinstance(codes, torch.Tensor) and codes.dtype == torch.uint8:
                quant[key] = maps[key]
        elif key in entry:
            quant[key] = entry[key]
    if quant:
        out[_WRAP] = quant
    return out


def _unwrapped(entry):
    if not isinstance(entry, dict):
        return entry
    out = {k: v for k, v in entry.items() if k != _WRAP}
    out.update(entry.get(_WRAP, {}))
    out.pop("qmap1", None)
    out.pop("qmap2", None)
    return out


def _two_state(group: dict) -> dict:
    return {"lr": group["lr"], "betas": group["betas"], "eps": group["eps"], "weight_decay": group["weight_decay"],
            "amsgrad": False, "maximize": False}


class FusedAdamW8bit(_Bnb8bit):
    """bitsandbytes.optim.AdamW8bit, fused: AdamW (decay p *= 1 - lr * weight_decay, then the Adam step) with
    8-bit state1 (signed map) and state2 (unsigned map)."""

    _algorithm = "adamw"
    _bnb_name = "AdamW8bit"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False,
                 optim_bits=32, args=None, min_8bit_size=4096, is_paged=False, **options):
        # is_paged: bitsandbytes' unified-memory paging of CUDA states; nothing to page on the CPU (as there)
        if amsgrad:
            raise ValueError(f"{self._bnb_name} does not support amsgrad=True")
        if optim_bits != 32:
            raise ValueError(f"{self._bnb_name} only supports optim_bits=32 (default value for compatibility)")
        super().__init__(params, lr, betas, eps, weight_decay, args, min_8bit_size, True, **options)

    _engine_group = staticmethod(_two_state)


class FusedAdam8bit(FusedAdamW8bit):
    """bitsandbytes.optim.Adam8bit, fused: as FusedAdamW8bit with weight_decay=0 by default. Its weight decay
    is decoupled (AdamW's), as bitsandbytes' "adam" kernel applies it, unlike torch.optim.Adam's L2 term."""

    _bnb_name = "Adam8bit"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False,
                 optim_bits=32, args=None, min_8bit_size=4096, is_paged=False, **options):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, optim_bits, args, min_8bit_size,
                         is_paged, **options)


class FusedPagedAdamW8bit(FusedAdamW8bit):
    """bitsandbytes.optim.PagedAdamW8bit, fused: FusedAdamW8bit (paging is for CUDA memory; ignored on the CPU,
    as bitsandbytes does)."""

    _bnb_name = "PagedAdamW8bit"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False,
                 optim_bits=32, args=None, min_8bit_size=4096, **options):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, optim_bits, args, min_8bit_size, True,
                         **options)


class FusedPagedAdam8bit(FusedAdam8bit):
    """bitsandbytes.optim.PagedAdam8bit, fused: FusedAdam8bit (paging is for CUDA memory; ignored on the CPU, as
    bitsandbytes does; its is_paged argument is taken and ignored, as there)."""

    _bnb_name = "PagedAdam8bit"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False,
                 optim_bits=32, args=None, min_8bit_size=4096, is_paged=False, **options):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, optim_bits, args, min_8bit_size, True,
                         **options)


class FusedLion8bit(_Bnb8bit):
    """bitsandbytes.optim.Lion8bit, fused: p *= 1 - lr * weight_decay; p -= lr * sign(b1 m + (1 - b1) g);
    m = b2 m + (1 - b2) g, with m an 8-bit state1 (signed map)."""

    _algorithm = "lion"

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, args=None, min_8bit_size=4096,
                 is_paged=False, **options):
        super().__init__(params, lr, betas, 0.0, weight_decay, args, min_8bit_size, False, **options)

    def _engine_group(self, group):
        return {"lr": group["lr"], "betas": group["betas"], "weight_decay": group["weight_decay"], "maximize": False}


class FusedPagedLion8bit(FusedLion8bit):
    """bitsandbytes.optim.PagedLion8bit, fused: FusedLion8bit (paging is for CUDA memory; ignored on the CPU, as
    bitsandbytes does)."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, args=None, min_8bit_size=4096,
                 **options):
        super().__init__(params, lr, betas, weight_decay, args, min_8bit_size, True, **options)


class FusedSGD8bit(_Bnb8bit):
    """bitsandbytes.optim.SGD8bit, fused: SGD with momentum (g += weight_decay * p; m = g at step 1, else
    momentum * m + g; p -= lr * m) with m an 8-bit state1 (signed map). dampening and nesterov are taken and
    not applied, as bitsandbytes' kernels do (its group keeps them as betas)."""

    _algorithm = "sgd"

    def __init__(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, args=None,
                 min_8bit_size=4096, **options):
        if momentum == 0:
            raise NotImplementedError("SGD without momentum is not supported!")
        super().__init__(params, lr, (momentum, dampening), 0.0, weight_decay, args, min_8bit_size, False,
                         **options)

    def _constructor_hypers(self) -> dict:
        momentum, dampening = self.defaults["betas"]
        return {"lr": self.defaults["lr"], "momentum": momentum, "dampening": dampening}

    def _engine_group(self, group):
        return {"lr": group["lr"], "momentum": group["betas"][0], "dampening": 0.0,
                "weight_decay": group["weight_decay"], "nesterov": False, "maximize": False}


class FusedRMSprop8bit(_Bnb8bit):
    """bitsandbytes.optim.RMSprop8bit, fused: g += weight_decay * p; v = alpha v + (1 - alpha) g²;
    p -= lr g / (sqrt(v) + eps), with v an 8-bit state1 (bitsandbytes' signed map). momentum is taken and not
    applied, as bitsandbytes' kernels do; centered=True raises, as there."""

    _algorithm = "rmsprop"

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False,
                 args=None, min_8bit_size=4096, **options):
        if alpha == 0:
            raise NotImplementedError("RMSprop with alpha==0.0 is not supported!")
        if centered:
            raise NotImplementedError("Centered RMSprop is not supported!")
        super().__init__(params, lr, (alpha, momentum), eps, weight_decay, args, min_8bit_size, False, **options)

    def _engine_group(self, group):
        return {"lr": group["lr"], "alpha": group["betas"][0], "eps": group["eps"],
                "weight_decay": group["weight_decay"], "momentum": 0.0, "centered": False, "maximize": False}


class FusedAdagrad8bit(_Bnb8bit):
    """bitsandbytes.optim.Adagrad8bit, fused: g += weight_decay * p; v += g²; p -= lr g / (sqrt(v) + eps), with
    v an 8-bit state1 (bitsandbytes' signed map)."""

    _algorithm = "adagrad"

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 optim_bits=8, args=None, min_8bit_size=4096, **options):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if initial_accumulator_value != 0.0:
            raise ValueError("Initial accumulator value != 0.0 not supported!")
        if lr_decay != 0.0:
            raise ValueError("Lr Decay != 0.0 not supported!")
        if optim_bits != 8:
            raise ValueError("Adagrad8bit only supports optim_bits=8 (default value for compatibility)")
        super().__init__(params, lr, (0.0, 0.0), eps, weight_decay, args, min_8bit_size, False, **options)

    def _engine_group(self, group):
        return {"lr": group["lr"], "lr_decay": 0.0, "weight_decay": group["weight_decay"],
                "initial_accumulator_value": 0.0, "eps": group["eps"], "maximize": False}


# fusedopt's names of the twins, as fusedopt exports them.
BNB_CLASSES = {c.__name__: c for c in (FusedAdamW8bit, FusedAdam8bit, FusedPagedAdamW8bit, FusedPagedAdam8bit,
                                       FusedLion8bit, FusedPagedLion8bit, FusedSGD8bit, FusedRMSprop8bit,
                                       FusedAdagrad8bit)}
