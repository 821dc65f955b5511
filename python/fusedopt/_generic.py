"""The fused class of an algorithm of the registry that has no hand-written class in optim.py: its param groups hold
the descriptor's fields under torch's group keys (tuple keys such as betas assembled from their parts), with the
Hyper's defaults, and its constructor checks them with the engine's own rules. This is what a new algorithm gets from
its descriptor alone (docs/adding-an-optimizer.md); optim.py's classes are the ones whose reference has more to say
(torch.optim's constructors and steps, apex's, lion-pytorch's)."""

from __future__ import annotations

import inspect

import torch

from ._base import FusedOptimizerMixin
from ._hypers import group_fields


def _defaults(entry: dict) -> dict:
    """{group key: the Hyper's default} of every field of an algorithm's _C.algorithms entry."""
    hyper, defaults, parts = entry["hyper"](), {}, {}
    for f in group_fields(entry):
        value = getattr(hyper, f.name)
        value = f.choices[value] if f.kind == "choice" else value
        if f.index is None:
            defaults[f.key] = value
        else:
            parts.setdefault(f.key, {})[f.index] = value
    for key, values in parts.items():
        defaults[key] = tuple(values[i] for i in sorted(values))
    return defaults


def generic_class(name: str, entry: dict, module: str) -> type:
    """Fused<kTorchName> for algorithm `name`: the mixin over a constructor of the descriptor's group keys.

    `entry` is `name`'s entry in _C.algorithms, or in the `algorithms` of another module that binds descriptors as _C
    does (src/python/algorithm_bindings.h: the test-only algorithms, tests/algos/python_module.cc); the class steps
    with that entry's step function."""
    defaults = _defaults(entry)
    class_name = f"Fused{entry['torch_name']}"

    def __init__(self, params, **hypers):
        unknown = sorted(set(hypers) - set(defaults))
        if unknown:
            raise TypeError(f"{class_name}: unknown hyper-parameters {unknown}; it takes {sorted(defaults)}")
        torch.optim.Optimizer.__init__(self, params, {**defaults, **hypers})
        self._check_hypers(self._group_hypers())  # the engine's rules, as a reference's constructor checks

    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    __init__.__signature__ = inspect.Signature(
        [inspect.Parameter("self", keyword), inspect.Parameter("params", keyword)]
        + [inspect.Parameter(key, keyword, default=value) for key, value in defaults.items()])
    groups = type(f"_{entry['torch_name']}Groups", (torch.optim.Optimizer,),
                  {"__init__": __init__, "__module__": module,
                   "__doc__": f"{class_name}'s param groups: the descriptor's fields with the Hyper's defaults."})
    return type(class_name, (FusedOptimizerMixin, groups),
                {"_algorithm": name, "_entry": entry, "__module__": module,
                 "_sparse_message": f"fusedopt: {class_name} does not support sparse gradients",
                 "__doc__": f"The engine's {name} step (src/algos/{name}.h) with the descriptor's hyper-parameters."})
