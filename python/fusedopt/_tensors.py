"""How fusedopt sees torch tensors: dtype codes of the C++ engine and the checks a tensor must pass
before its address may be handed to it."""

from __future__ import annotations

import math
import sys

import torch

# fusedopt::DType codes (include/fusedopt/dtype.h).
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
SUPPORTED = "float32, float16 and bfloat16"


def dtype_code(t: torch.Tensor, what: str) -> int:
    code = DTYPE_CODES.get(t.dtype)
    if code is None:
        raise TypeError(f"fusedopt: {what} has dtype {t.dtype}; supported dtypes are {SUPPORTED}")
    return code


def is_dtensor(t) -> bool:
    """t is a DTensor (FSDP2's fully_shard, tensor parallel). None exists before torch.distributed.tensor is imported,
    so the common case costs one dict lookup."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose memory holds t's elements on this rank: a DTensor's local shard (an alias, which the engine
    updates in place), else t."""
    return t._local_tensor if is_dtensor(t) else t


def mark(p: torch.Tensor) -> tuple[int, int]:
    """(address, version counter) of p's memory on this rank: what changes when p is written behind the
    optimizer's back (a DTensor's shard is written by FSDP2 itself, not through the wrapper)."""
    t = local(p)
    return t.data_ptr(), t._version


def whole(t: torch.Tensor) -> torch.Tensor:
    """t as one plain tensor: a DTensor gathered (a collective; for a reduction's result, the reduction across the
    ranks, which DTensor's item() and bool() skip: they read this rank's partial value), else t."""
    return t.full_tensor() if is_dtensor(t) else t


def partial_over_shards(placements, op: str) -> list:
    """The placements of a per-rank partial result (a shard's norm or sums) of a tensor laid out by `placements`:
    Partial(op) along every mesh dim the tensor is sharded along (Shard, and FSDP's _StridedShard of a tensor-
    parallel shard, which is no Shard to is_shard()), Replicate along the others, whose ranks hold the same
    values and must not add them twice."""
    from torch.distributed.tensor import Partial, Replicate

    return [Replicate() if placement.is_replicate() else Partial(op) for placement in placements]


def shard_of(t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A state t (of p's shape) for DTensor param p: t itself when it is a DTensor laid out as p, else a DTensor of
    p's mesh and placements holding t's values, e.g. a plain tensor of the whole state loaded from a torch.save'd
    state_dict (this rank keeps its slice of it), or a DTensor of other placements (gathered first: a collective,
    which every rank runs alike, as it loaded alike)."""
    return laid_out(t, p.device_mesh, p.placements, p.shape, p.stride())


def laid_out(t: torch.Tensor, mesh, placements, shape, stride: tuple | None = None) -> torch.Tensor:
    """t's values (of `shape`'s number of elements) as a DTensor of that shape, mesh and placements (and stride;
    default: contiguous): t itself when it is one, else this rank's piece of them (a DTensor of other placements is
    gathered first: a collective, which every rank runs alike)."""
    placements = tuple(placements)
    if is_dtensor(t) and t.device_mesh == mesh and tuple(t.placements) == placements and t.shape == shape:
        return t
    from torch.distributed.tensor import DTensor, distribute_tensor

    values = t.full_tensor() if is_dtensor(t) else t
    # (src_data_rank None: each rank cuts its own piece, no communication; a copy, as the shard is updated in
    # place and must not write into the loaded tensor, which may be another optimizer's live state)
    piece = distribute_tensor(values.reshape(shape), mesh, placements, src_data_rank=None).to_local()
    return DTensor.from_local(piece.clone(memory_format=torch.contiguous_format), mesh, placements,
                              run_check=False, shape=torch.Size(shape),
                              stride=_contiguous_strides(shape) if stride is None else stride)


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for n in reversed(tuple(shape)):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def dtensor_route_reason(p: torch.Tensor, g: torch.Tensor) -> tuple[type, str] | None:
    """As route_reason and grad_route_reason together, for a DTensor param p and its gradient g: the engine
    steps p's local shard with g's, which must be a DTensor of the same mesh and placements (then its shard is
    laid out as p's)."""
    if not is_dtensor(g):
        return TypeError, f"it is a DTensor but its gradient is a {type(g).__name__}"
    if g.device_mesh != p.device_mesh or g.placements != p.placements:
        return ValueError, (f"its gradient's placements {g.placements} (mesh {g.device_mesh}) are not the "
                            f"parameter's {p.placements} (mesh {p.device_mesh})")
    return route_reason(local(p)) or grad_route_reason(local(g), local(p))


def route_reason(p: torch.Tensor) -> tuple[type, str] | None:
    """Why the engine cannot update parameter p in place, as (the error strict=True raises, the
    reason), or None. Such a param takes torch's own step (FusedOptimizerMixin._torch_step).
    Complex64 params are updated as their real views, as torch does."""
    if p.device.type != "cpu":
        return RuntimeError, f"it is on {p.device}, and this build of fusedopt runs on the CPU only"
    if p.dtype not in DTYPE_CODES and p.dtype != torch.complex64:
        return TypeError, f"its dtype is {p.dtype}; the engine takes {SUPPORTED} (and complex64)"
    if lacks_storage(p):
        return TypeError, (f"it is a {type(p).__name__} without storage of its own (as FSDP2's and tensor "
                           "parallel's DTensors are)")
    if not (p.is_contiguous() or is_dense(p)):
        return ValueError, f"it is not dense in memory (shape {tuple(p.shape)}, strides {p.stride()})"
    return None


def grad_route_reason(g: torch.Tensor, p: torch.Tensor) -> tuple[type, str] | None:
    """As route_reason, for p's gradient g (of p's shape) at one step."""
    if g.is_sparse:
        return RuntimeError, "its gradient is sparse"
    if g.device != p.device:
        return RuntimeError, f"its gradient is on {g.device}"
    if lacks_storage(g):
        return TypeError, f"its gradient is a {type(g).__name__} without storage of its own"
    if (g.dtype != p.dtype) if p.is_complex() else (g.dtype not in DTYPE_CODES):
        return TypeError, f"its gradient has dtype {g.dtype}"
    if g.numel() > 1 and g.stride() != p.stride() and not (g.is_contiguous() and p.is_contiguous()):
        return ValueError, f"its gradient has strides {g.stride()} but the parameter has {p.stride()}"
    return None


def lacks_storage(t: torch.Tensor) -> bool:
    """t has elements but no memory of its own to hand to the engine: a wrapper subclass such as a DTensor
    (FSDP2's fully_shard, tensor parallel; its local shard is another tensor) reports a device, a dtype and a
    layout the engine takes, but data_ptr() 0."""
    try:
        return t.numel() > 0 and t.data_ptr() == 0
    except RuntimeError:  # no storage at all (e.g. a fake or functional tensor)
        return True


def route_error(route: tuple[type, str], name: str) -> Exception:
    """strict=True: the error for a param that cannot take the fused path."""
    kind, reason = route
    return kind(f"fusedopt: parameter {name} cannot be updated by the fused engine: {reason} (strict=True)")


def check_param(p: torch.Tensor, name: str) -> None:
    """strict=True: a parameter the engine cannot take fails when it joins the optimizer."""
    route = route_reason(local(p))  # (a DTensor: its shard; the step checks the rest, _route)
    if route is not None:
        raise route_error(route, name)


def is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: sorted by stride, each stride is the product of the smaller sizes."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def check_same_layout(t: torch.Tensor, p: torch.Tensor, what: str) -> None:
    """A grad or state is read element by element alongside its param: same shape, same strides."""
    if t.shape != p.shape:
        raise ValueError(f"fusedopt: {what} has shape {tuple(t.shape)} but its parameter has {tuple(p.shape)}")
    if t.device != p.device:
        raise RuntimeError(f"fusedopt: {what} is on {t.device} but its parameter is on {p.device}")
    if t.numel() > 1 and t.stride() != p.stride() and not (t.is_contiguous() and p.is_contiguous()):
        raise ValueError(
            f"fusedopt: {what} has strides {t.stride()} but its parameter has {p.stride()}; "
            "fusedopt needs them to match"
        )


def grad_shape_error(name: str, g: torch.Tensor, p: torch.Tensor) -> ValueError:
    return ValueError(f"fusedopt: the gradient of parameter {name} has shape {tuple(g.shape)} but the parameter "
                      f"has {tuple(p.shape)}")


def number_error(what: str, value, index: int | None = None) -> Exception:
    """The error for a hyper-parameter or state['step'] that float() refused; with index, for a tuple
    hyper-parameter (betas) that has no element [index]."""
    if index is not None:
        kind = ValueError if hasattr(value, "__len__") else TypeError
        return kind(f"fusedopt: {what} has no value at index {index}: {value!r}")
    if isinstance(value, torch.Tensor):
        return ValueError(f"fusedopt: {what} must be a number or a 1-element tensor, got a tensor of shape "
                          f"{tuple(value.shape)}")
    return TypeError(f"fusedopt: {what} must be a number or a 1-element tensor, got {value!r}")


def first_overlap(tensors: list[torch.Tensor]) -> tuple[int, int] | None:
    """Indices of two dense tensors whose memory overlaps, or None. Sorted by start address, some
    overlapping pair is always a neighbouring one."""
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), k)
                   for k, t in enumerate(tensors) if t.numel() and not lacks_storage(t))
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            return a, b
    return None


def shard_offset(p) -> int:
    """The index, in DTensor p's elements in row-major order, of its local shard's first element. The shard's
    elements are consecutive there under Shard(0), so their stochastic rounding noise is that of the whole tensor
    in one process; under other placements it depends on the world size (docs/fsdp2.md)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, starts = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    strides = [math.prod(p.shape[d + 1:]) for d in range(len(p.shape))]
    return sum(start * stride for start, stride in zip(starts, strides))
