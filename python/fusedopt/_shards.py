"""LAMB, LARS, BertAdam, AdamP and Adafactor over DTensor shards (FSDP2, tensor parallel): their coefficients come
from norms of whole tensors (BertAdam's: of each param group's gradients), of which a rank holds a shard. The
engine's two-phase step (_C.<name>_step_with_sums, the hook ZeRO-1 uses too for LAMB and LARS,
src/core/step_hooks.h) hands each segment's sums over its local shard to MeshSums between its reduction pass and
its update, which adds them up over the ranks that hold the tensor's other shards: one all-reduce per (mesh,
placements) of the step, through DTensor (a Partial tensor made Replicate), so every rank gets the same values.
AdamP's and Adafactor's steps (_C.<name>_step_over_shards) take params cut along their first dimension only
(shards_fit): AdamP's gathers every row's sums of the whole tensor (RowSums), Adafactor's adds up each shard's
Σp², a row-cut matrix's column sums and row factors, and ΣU² (ShardSums)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from ._tensors import is_dtensor, laid_out, local, partial_over_shards, shard_offset


class MeshSums:
    """The sums hook of one step over `params` (one per segment, in the table's order): sums(k per segment) ->
    the same with each DTensor segment's sums those of its whole tensor. Collective: every rank calls it once per
    step (join() for a rank whose step did not)."""

    def __init__(self, params: list[torch.Tensor], k: int):
        self.k, self.called = k, False
        self.groups: dict[tuple, list[int]] = {}  # (mesh, placements) -> segments
        for i, p in enumerate(params):
            if is_dtensor(p):
                self.groups.setdefault((p.device_mesh, tuple(p.placements)), []).append(i)

    def __call__(self, sums: list[float], k: int) -> list[float]:
        from torch.distributed.tensor import DTensor

        self.called = True
        out = list(sums)
        for (mesh, placements), segments in self.groups.items():
            mine = torch.tensor([sums[i * k + j] for i in segments for j in range(k)] if sums else
                                [0.0] * (len(segments) * k), dtype=torch.float64)
            parts = partial_over_shards(placements, "sum")
            total = DTensor.from_local(mine, mesh, parts, run_check=False).full_tensor().tolist()
            if sums:
                for n, i in enumerate(segments):
                    out[i * k:(i + 1) * k] = total[n * k:(n + 1) * k]
        return out

    def join(self) -> None:
        """The collectives of a step that did not call the hook (nothing to reduce on this rank)."""
        if not self.called:
            self([], self.k)


def stepped_report() -> SimpleNamespace:
    """What the engine's plain step reports, for a step through a sums hook (_C.<name>_step_with_sums reports
    nothing): it stepped, with no pre-pass and no accumulation."""
    return SimpleNamespace(stepped=True, found_inf=False, grad_norm=None, clip_coef=1.0, pending=0,
                           window_found_inf=False)


def step_with_mesh_sums(step, k: int, params: list, hypers, table, grads, codes, grad_scale: float,
                        num_threads: int):
    """One two-phase step (`step`: _C.<name>_step_with_sums, k sums per segment) over segments of which some are
    DTensor shards; returns what the engine's plain step reports. The caller has done the checks that span the
    ranks (Inf/NaN, the clipping norm) already."""
    sums = MeshSums(params, k)
    try:
        step(hypers, table, grads, codes, grad_scale, num_threads, sums)
    finally:
        sums.join()
    return stepped_report()


def _cut(p: torch.Tensor) -> bool:
    """DTensor p is cut into shards along some mesh dim (else every rank holds it whole)."""
    return any(not placement.is_replicate() for placement in p.placements)


def _cut_rows(p: torch.Tensor) -> bool:
    """DTensor p has rows (more than one dimension) and is cut into shards (between them: shards_fit)."""
    return is_dtensor(p) and p.dim() > 1 and _cut(p)


def shards_fit(p: torch.Tensor, factored: bool) -> bool:
    """The engine's step over shards takes DTensor p's (AdamP's rows, Adafactor's factors): p is cut along its first
    dimension only (every placement Replicate or Shard(0), as FSDP2's), so each rank holds whole rows of it (whole
    matrices of a batch), and for Adafactor a matrix (two dimensions) has at least 2 columns, so that every shard of
    it is a matrix as the whole is (1 x 1 matrices are stepped element-wise)."""
    from torch.distributed.tensor import Shard

    return (all(placement.is_replicate() or (type(placement) is Shard and placement.dim == 0)
                for placement in p.placements) and not (factored and p.dim() == 2 and p.shape[-1] < 2))


def factor_layout(p: torch.Tensor, key: str) -> tuple[tuple, tuple]:
    """(global shape, placements) of Adafactor's factor state[key] ("row_var", "col_var") of DTensor param p (as
    shards_fit takes it): laid out as p, but a matrix's column factors, which every rank keeps whole."""
    from torch.distributed.tensor import Replicate

    if key == "row_var":
        return tuple(p.shape[:-1]) + (1,), tuple(p.placements)
    shape = tuple(p.shape[:-2]) + (1, p.shape[-1])
    return shape, (tuple(Replicate() for _ in p.placements) if p.dim() == 2 else tuple(p.placements))


def factor_state(p: torch.Tensor, t: torch.Tensor | None, key: str, dtype: torch.dtype) -> torch.Tensor:
    """Adafactor's factor state[key] of DTensor param p as the engine needs it (factor_layout, contiguous, dtype):
    t itself, t's values laid out so (a full state dict's plain tensor, another layout's DTensor), or zeros."""
    from torch.distributed.tensor import DTensor

    shape, placements = factor_layout(p, key)
    if t is None:  # (a factor per row or column: small next to p)
        t = torch.zeros(shape, dtype=dtype, device=local(p).device)
    t = laid_out(t, p.device_mesh, placements, shape)
    if local(t).dtype != dtype or not local(t).is_contiguous():
        values = local(t).to(dtype).contiguous()
        t = DTensor.from_local(values, p.device_mesh, placements, run_check=False, shape=t.shape, stride=t.stride())
    return t


class ShardSums:
    """The hook of one Adafactor step over `params` (one per segment, in the table's order): (sums, offsets) -> the
    sums with each DTensor segment's range, sums[offsets[i]:offsets[i + 1]], added up over the ranks that hold its
    tensor's other shards, one all-reduce per (mesh, placements). Every rank's engine calls it with the same
    layout (src/core/step_hooks.h, ShardSumsHook)."""

    def __init__(self, params: list[torch.Tensor]):
        self.groups: dict[tuple, list[int]] = {}  # (mesh, placements) -> segments cut into shards
        for i, p in enumerate(params):
            if is_dtensor(p) and _cut(p):
                self.groups.setdefault((p.device_mesh, tuple(p.placements)), []).append(i)

    def __call__(self, sums: list[float], offsets: list[int]) -> list[float]:
        from torch.distributed.tensor import DTensor

        out = list(sums)
        for (mesh, placements), segments in self.groups.items():
            ranges = [range(offsets[i], offsets[i + 1]) for i in segments]
            if not any(ranges):
                continue
            mine = torch.tensor([sums[k] for r in ranges for k in r], dtype=torch.float64)
            total = DTensor.from_local(mine, mesh, partial_over_shards(placements, "sum"),
                                       run_check=False).full_tensor().tolist()
            for k, value in zip((k for r in ranges for k in r), total):
                out[k] = value
        return out


class RowSums:
    """The hook of one AdamP step over `params` (one per segment, in the table's order): (sums, offsets, k) -> each
    DTensor segment's whole tensor's row sums (k per row, in row order) from this rank's rows' (sums[offsets[i]:
    offsets[i + 1]]), gathered over the ranks as a DTensor laid out as the param's rows."""

    def __init__(self, params: list[torch.Tensor]):
        self.cut = [(i, p) for i, p in enumerate(params) if _cut_rows(p)]

    def __call__(self, sums: list[float], offsets: list[int], k: int) -> list[float]:
        from torch.distributed.tensor import DTensor

        out: list[float] = []
        for i, p in self.cut:
            mine = torch.tensor(sums[offsets[i]:offsets[i + 1]], dtype=torch.float64).view(-1, k)
            rows = DTensor.from_local(mine, p.device_mesh, p.placements, run_check=False,
                                      shape=torch.Size((p.shape[0], k)), stride=(k, 1))
            out.extend(rows.full_tensor().flatten().tolist())
        return out


def row_shards_of(params: list[torch.Tensor]) -> list[tuple[int, int, int]]:
    """Per segment, how its tensor is cut between rows (_C.adamp_step_over_shards' shards, RowShard): (the whole
    numel, its rows, the first row of this rank's shard), or (0, 0, 0) for a tensor held whole (or a vector)."""
    out = []
    for p in params:
        if not _cut_rows(p):
            out.append((0, 0, 0))
        else:
            first = shard_offset(p) // math.prod(p.shape[1:]) if p.numel() else 0
            out.append((p.numel(), p.shape[0], first))
    return out


def shards_of(params: list[torch.Tensor]) -> list[tuple[int, int, int]]:
    """Per segment, how its tensor is cut (_C.adafactor_step_over_shards' shards, FactoredShard): (the whole numel,
    a matrix's rows and columns where its rows are cut, else 0, 0), or (0, 0, 0) for a tensor held whole."""
    out = []
    for p in params:
        if not (is_dtensor(p) and _cut(p)):
            out.append((0, 0, 0))
        else:
            out.append((p.numel(),) + ((p.shape[0], p.shape[1]) if p.dim() == 2 else (0, 0)))
    return out


def step_over_shards(step, factored: bool, params: list, hypers, table, grads, codes, grad_scale: float,
                     num_threads: int):
    """AdamP's or Adafactor's step (`step`: _C.<name>_step_over_shards; `factored`: Adafactor's) over segments of
    which some are DTensor shards; returns what the engine's plain step reports. The caller has done the checks
    that span the ranks (Inf/NaN, the clipping norm) already."""
    if factored:
        step(hypers, table, grads, codes, grad_scale, num_threads, shards_of(params), ShardSums(params))
    else:
        step(hypers, table, grads, codes, grad_scale, num_threads, row_shards_of(params), RowSums(params))
    return stepped_report()
