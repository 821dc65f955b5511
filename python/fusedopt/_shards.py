"""LAMB and LARS over DTensor shards (FSDP2, tensor parallel): their coefficients come from norms of whole tensors,
of which a rank holds a shard. The engine's two-phase step (_C.<name>_step_with_sums, the hook ZeRO-1 uses too,
src/core/step_hooks.h) hands each segment's sums over its local shard to MeshSums between its reduction pass
and its update, which adds them up over the ranks that hold the tensor's other shards: one all-reduce per
(mesh, placements) of the step, through DTensor (a Partial tensor made Replicate), so every rank gets the same
values."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ._tensors import is_dtensor, partial_over_shards


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
