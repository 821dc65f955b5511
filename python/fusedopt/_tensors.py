"""How fusedopt sees torch tensors: dtype codes of the C++ engine and the checks a tensor must pass
before its address may be handed to it."""

from __future__ import annotations

import torch

# fusedopt::DType codes (include/fusedopt/dtype.h).
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
SUPPORTED = "float32, float16 and bfloat16"


def dtype_code(t: torch.Tensor, what: str) -> int:
    code = DTYPE_CODES.get(t.dtype)
    if code is None:
        raise TypeError(f"fusedopt: {what} has dtype {t.dtype}; supported dtypes are {SUPPORTED}")
    return code


def check_param(p: torch.Tensor, name: str) -> None:
    """Checks a parameter when it joins the optimizer, so a bad one fails at construction."""
    if p.device.type != "cpu":
        raise RuntimeError(
            f"fusedopt: parameter {name} is on {p.device}, but this build of fusedopt runs on the CPU only"
        )
    if p.is_complex():
        raise TypeError(f"fusedopt: parameter {name} is complex ({p.dtype}); supported dtypes are {SUPPORTED}")
    dtype_code(p, f"parameter {name}")
    check_dense(p, f"parameter {name}")


def check_dense(t: torch.Tensor, what: str) -> None:
    """The engine walks memory linearly: a tensor must cover one dense block (any dimension order,
    e.g. channels_last)."""
    if t.is_contiguous() or is_dense(t):
        return
    raise ValueError(
        f"fusedopt: {what} is not dense in memory (shape {tuple(t.shape)}, strides {t.stride()}); "
        "pass a contiguous tensor"
    )


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


def number_error(what: str, value) -> Exception:
    """The error for a hyper-parameter or state['step'] that float() refused."""
    if isinstance(value, torch.Tensor):
        return ValueError(f"fusedopt: {what} must be a number or a 1-element tensor, got a tensor of shape "
                          f"{tuple(value.shape)}")
    return TypeError(f"fusedopt: {what} must be a number or a 1-element tensor, got {value!r}")


def first_overlap(tensors: list[torch.Tensor]) -> tuple[int, int] | None:
    """Indices of two dense tensors whose memory overlaps, or None. Sorted by start address, some
    overlapping pair is always a neighbouring one."""
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), k)
                   for k, t in enumerate(tensors) if t.numel())
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            return a, b
    return None
