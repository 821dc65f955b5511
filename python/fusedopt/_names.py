"""What an optimizer's algorithm is called, one policy for the trainer's traces (otherData.optimizer) and the
checkpoints' "algorithm": the registry's name of the torch.optim class it is (a fused class is its twin: FusedAdamW
and torch.optim.AdamW are both "adamw"), the engine's name of a fused class without a twin ("lion"), or else the
class name in lower case. The torch.optim classes and their names come from the registry (_C.algorithms: each
descriptor's kTorchName), not from a list of their own."""

from __future__ import annotations

import torch

from . import _C
from ._base import FusedOptimizerMixin
from .distributed import DistributedOptimizer

# (torch.optim class, the registry's name) of every algorithm with a torch.optim twin, most derived first (torch
# 2.13's AdamW is an Adam).
_TORCH_CLASSES = tuple(sorted(
    ((cls, name) for name, cls in ((name, getattr(torch.optim, entry["torch_name"], None))
                                   for name, entry in _C.algorithms.items()) if isinstance(cls, type)),
    key=lambda pair: -len(pair[0].__mro__)))


def unwrap(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The fused optimizer inside a fusedopt.distributed.DistributedOptimizer, or the optimizer itself."""
    return optimizer._inner if isinstance(optimizer, DistributedOptimizer) else optimizer


def optimizer_name(optimizer: torch.optim.Optimizer) -> str:
    """sgd, adam, adamw, rmsprop, ... (the registry's name of the torch.optim class it is), or the class name."""
    optimizer = unwrap(optimizer)
    for cls, name in _TORCH_CLASSES:
        if isinstance(optimizer, cls):
            return name
    return type(optimizer).__name__.lower()


def algorithm_name(optimizer: torch.optim.Optimizer) -> str:
    """The algorithm a state_dict belongs to: a fused class and its torch.optim twin share it (their state_dicts
    are interchangeable); a fused class without a twin (FusedLion, ...) has the engine's name for it, as the C++
    checkpoints (fusedopt::pt included) write it."""
    name = optimizer_name(optimizer)
    if name == type(optimizer).__name__.lower() and isinstance(optimizer, FusedOptimizerMixin):
        return optimizer._algorithm
    return name
