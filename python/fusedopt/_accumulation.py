"""The accumulation window (accumulation_steps > 1): each micro-batch's gradients added into f32 sums, and the
window's last micro-batch stepping from them."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from ._fallback import _grad_norm
from ._packing import _Packed
from ._signals import _Skipped, packed_anew_until_laid_out
from ._state import _roll_back
from ._tensors import DTYPE_CODES, grad_shape_error, is_dtensor, local


class AccumulationWindow:
    """The FusedOptimizerMixin part that runs accumulation_steps > 1."""

    def _step_micro_batch(self, inv_scale: float, overflowed: bool, found_out) -> None:
        """accumulation_steps > 1: one engine call adds this micro-batch's gradients, unscaled and
        divided by the step count, into the f32 accumulators and, on the window's last micro-batch,
        updates from them (the core's TrainingStep with a MicroBatch): the window's mean gradient.
        A window where some micro-batch held Inf/NaN is skipped whole; a micro-batch that torch's
        GradScaler found overflowing is not added. A rejected call changes nothing, the window
        included, and can be retried. Params that take the reference's step (_route) have their
        sums here, in their own dtype (`_torch_sums`); the reference steps them from those when the
        engine steps."""
        if self._window_over_shards():
            self._add_micro_batch_over_shards(inv_scale, overflowed, found_out)
            return
        accumulators = dict(self._accumulators)  # put back if this call is rejected: it made none
        try:
            self._add_micro_batch(inv_scale, overflowed, found_out)
        except BaseException:
            self._accumulators.clear()
            self._accumulators.update(accumulators)
            raise

    def _window_over_shards(self) -> bool:
        """Whether the window runs over shards (_add_micro_batch_over_shards): with any DTensor param."""
        return any(is_dtensor(p) for g in self.param_groups for p in g["params"])

    def _add_micro_batch(self, inv_scale: float, overflowed: bool, found_out) -> None:
        closes = self._micro_batches + 1 == self._accumulation_steps
        if not closes:
            # The hyper-parameters the window's last call will be refused for are refused now, so a
            # micro-batch is never counted into a window that cannot close.
            self._check_hypers(self._group_hypers())
        grads, sums, fresh, with_grad, routed = [], [], [], {}, {}
        if not overflowed:  # (with_grad holds the grad tensors: flatten=True may replace p.grad below)
            grads, sums, fresh, with_grad, routed = self._micro_batch()
        torch_sums, torch_inf = dict(self._torch_sums), False  # committed with the engine's window
        if routed:
            if self._max_grad_norm != math.inf:
                raise ValueError("fusedopt: max_grad_norm with accumulation_steps > 1 needs every parameter on the "
                                 f"fused path; {'; '.join(routed.values())}")
            self._warn_routed(routed)
            for p in routed:  # sum += grad * inv_scale / k, as the engine's accumulators
                add = p.grad * (inv_scale / self._accumulation_steps)
                if add.device.type != "meta":  # (a meta tensor has no values: shape-only, as torch steps it)
                    torch_inf |= not bool(torch.isfinite(add.coalesce().values() if add.is_sparse else add).all())
                torch_sums[p] = add if p not in torch_sums else torch_sums[p] + add
        batch = (self._accumulation_steps, self._micro_batches, self._window_found_inf or overflowed or torch_inf,
                 grads, sums, fresh, inv_scale)
        undo: list = []
        try:
            packed = _Packed([])
            if closes:
                window = {**self._window, **dict.fromkeys(with_grad)}
                sums = {p: self._accumulators[p] for p in window}  # the step reads the sums
                packed = packed_anew_until_laid_out(lambda: self._pack(self._group_hypers(), undo, sums))

            def engine():
                report = self._engine(packed, 1.0, False, micro_batch=batch)
                if (overflowed or torch_inf or report.found_inf) and found_out is not None:
                    found_out.fill_(1.0)
                self._micro_batches, self._window_found_inf = report.pending, report.window_found_inf
                self._window = {} if closes else {**self._window, **dict.fromkeys(with_grad)}
                self._torch_sums = {} if closes else torch_sums
                if closes:
                    self.last_grad_norm = report.grad_norm
                    if not report.stepped:
                        raise _Skipped  # (the window is over: the routed params' step is undone too)

            if closes and torch_sums and not batch[2]:
                # torch's step first, after the engine's checks of the hyper-parameters: a failure of
                # either (or a window the engine skips) puts the routed params back (see _torch_step).
                self._check_hypers(packed.hypers)
                self._torch_step(torch_sums, then=engine)
            else:
                engine()
        except BaseException as e:
            _roll_back(undo)
            if not isinstance(e, _Skipped):
                raise

    def _add_micro_batch_over_shards(self, inv_scale: float, overflowed: bool, found_out) -> None:
        """accumulation_steps > 1 with DTensor params (FSDP2, tensor parallel): the window's rules, with each rank
        adding its shards. This micro-batch's gradients go into sums laid out as the params (f32, DTensors for
        DTensor params): grad * (inv_scale / k), the factor rounded once to f32, the first addition in a window
        overwriting; one that torch's GradScaler found overflowing is not added. With fusedopt.GradScaler an
        Inf/NaN in any rank's shard of a micro-batch (one check over every rank's shards) skips the window whole.
        The window's last micro-batch updates from the sums by the ordinary step, whose clipping norm and checks
        span the ranks and whose routed params take the reference's step on the sums. The hyper-parameters are
        checked before anything is added, so a rejected call changes nothing."""
        self._check_hypers(self._group_hypers())
        grads = {} if overflowed else self._shard_grads()
        # (the 2-norm: a NaN survives its sum over the ranks, where a max may drop it)
        found_inf = found_out is not None and bool(grads) and not math.isfinite(_grad_norm(list(grads.values()), 2))
        self._add_to_shard_sums(grads, inv_scale)
        if found_inf:
            found_out.fill_(1.0)
        self._window = {**self._window, **dict.fromkeys(grads)}
        self._window_found_inf |= found_inf
        self._micro_batches += 1
        if self._micro_batches < self._accumulation_steps:
            return
        window, skipped = self._window, self._window_found_inf
        self._micro_batches, self._window, self._window_found_inf = 0, {}, False
        self.last_grad_norm = None
        if window and not skipped:
            self._update(1.0, None, grads={p: self._accumulators[p] for p in window})

    def _shard_grads(self, params: list[torch.Tensor] | None = None) -> dict[torch.Tensor, torch.Tensor]:
        """{param: its gradient} of the params with one, checked before any sum changes: over every param, or over
        `params` (step_in_backward's bucket)."""
        grads: dict[torch.Tensor, torch.Tensor] = {}
        for gi, j, p in self._entries(params):
            g = p.grad
            if g is None or p in grads:
                continue
            if g.shape != p.shape:
                raise grad_shape_error(self._name(gi, j), g, p)
            if g.is_sparse:
                raise RuntimeError(f"parameter {self._name(gi, j)}: accumulation_steps > 1 with DTensor params "
                                   "takes dense gradients")
            grads[p] = g
        return grads

    def _add_to_shard_sums(self, grads: dict[torch.Tensor, torch.Tensor], inv_scale: float) -> None:
        """sum = grad * (inv_scale / k), the factor rounded once to f32, each rank on its shards; a sum's first
        addition in the window overwrites it."""
        factor = float(torch.tensor(inv_scale / self._accumulation_steps, dtype=torch.float32))
        for p, g in grads.items():
            acc = self._accumulators.get(p)
            if p not in self._window or acc is None or acc.shape != p.shape:
                acc = self._accumulators[p] = torch.empty_like(
                    p, dtype=torch.promote_types(p.dtype, torch.float32), memory_format=torch.preserve_format)
                local(acc).copy_(local(g)).mul_(factor)
            else:
                local(acc).add_(local(g), alpha=factor)

    def _entries(self, params: list[torch.Tensor] | None) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(group index, index in the group, param) of every param, or of `params` that are still in a group."""
        if params is None:
            return ((gi, j, p) for gi, group in enumerate(self.param_groups) for j, p in enumerate(group["params"]))
        return ((*self._places[p], p) for p in params if p in self._places)

    def _micro_batch(self, params: list[torch.Tensor] | None = None) -> tuple:
        """accumulation_steps > 1: this micro-batch's gradients (checked; each as its engine tuple),
        the address of each one's f32 accumulator (created if missing), whether the accumulator
        starts in this window, {param: its gradient} of the params with one, and {param: why} of
        those that take the reference's step. Over every param, or over `params` (step_in_backward's
        bucket) that are still in a group."""
        grads, sums, fresh = [], [], []
        with_grad: dict[torch.Tensor, torch.Tensor] = {}
        routed: dict[torch.Tensor, str] = {}
        for gi, j, p in self._entries(params):
            g = p.grad
            if g is None or p in with_grad or p in routed:  # a duplicated param's grad is one gradient
                continue
            if g.shape != p.shape:  # (one set through .data): the engine would add it into p's sum
                raise grad_shape_error(self._name(gi, j), g, p)
            route = self._route(p, g, gi, j) or ("it is complex" if p.is_complex() else None)
            if route is not None:
                routed[p] = f"parameter {self._name(gi, j)}: {route}"
                continue
            code = DTYPE_CODES[g.dtype]
            acc = self._accumulators.get(p)
            if acc is None or acc.shape != p.shape:
                acc = torch.empty_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
                self._accumulators[p] = acc
            with_grad[p] = g
            grads.append((g.data_ptr(), g.numel(), code))
            sums.append(acc.data_ptr())
            fresh.append(0 if p in self._window else 1)
        return grads, sums, fresh, with_grad, routed
