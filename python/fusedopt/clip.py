"""torch.nn.utils.clip_grad_norm_ / clip_grad_value_ on the fused engine: the global norm is one
read of all gradients (any mix of f32/f16/bf16, accumulated in double, the same bits for any thread
count), the scaling one read-modify-write pass. Same signature and result as torch; inputs the
engine does not handle (other devices, sparse or non-dense grads, grads without storage of their own such as
DTensors, p-norms other than 1, 2, inf) go to torch's own implementation.

To clip inside the step instead (no pass that writes gradients), give the fused optimizers
max_grad_norm=."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from . import _C
from ._base import norm_type_code
from ._tensors import DTYPE_CODES, is_dense, lacks_storage


def _params(parameters) -> list[torch.Tensor]:
    if isinstance(parameters, torch.Tensor):
        return [parameters]
    return list(parameters)


def _engine_handles(grads: list[torch.Tensor]) -> bool:
    return all(g.device.type == "cpu" and not g.is_sparse and g.dtype in DTYPE_CODES
               and (g.is_contiguous() or is_dense(g)) and not lacks_storage(g) for g in grads)


def _packed(grads):
    return [(g.data_ptr(), g.numel(), DTYPE_CODES[g.dtype]) for g in grads]


def clip_grad_norm_(parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: bool | None = None) -> torch.Tensor:
    """Scales all gradients by min(1, max_norm / (total_norm + 1e-6)) and returns total_norm, the
    norm of all gradients viewed as one vector (torch.nn.utils.clip_grad_norm_)."""
    params = _params(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    try:
        code = norm_type_code(norm_type)
    except ValueError:
        code = None
    if code is None or not _engine_handles(grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite, foreach)
    if not grads:
        return torch.tensor(0.0)
    if not (float(max_norm) >= 0.0):
        raise ValueError(f"fusedopt: invalid max_norm {max_norm} (must be >= 0)")
    dtype = grads[0].dtype
    for g in grads[1:]:
        dtype = torch.promote_types(dtype, g.dtype)
    threads = torch.get_num_threads()
    non_finite, norm = _C.grad_norm(_packed(grads), code, 1.0, threads)
    if non_finite and error_if_nonfinite:
        raise RuntimeError(
            f"The total norm of order {float(norm_type)} for gradients from `parameters` is non-finite, "
            "so it cannot be clipped. To disable this error and scale the gradients by the non-finite "
            "norm anyway, set `error_if_nonfinite=False`")
    coef = _C.clip_coefficient(norm, float(max_norm))
    if coef != 1.0:
        _C.unscale_grads(_packed(grads), coef, threads)
    return torch.tensor(norm, dtype=dtype)


def clip_grad_value_(parameters: torch.Tensor | Iterable[torch.Tensor], clip_value: float,
                     foreach: bool | None = None) -> None:
    """Clamps every gradient element to [-clip_value, clip_value] (torch.nn.utils.clip_grad_value_)."""
    params = _params(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not _engine_handles(grads):
        torch.nn.utils.clip_grad_value_(params, clip_value, foreach)
        return
    if grads:  # the engine rejects a negative or NaN clip_value (ValueError)
        _C.clip_grad_value(_packed(grads), float(clip_value), torch.get_num_threads())
