"""step_in_backward=True: params are updated during backward(), a bucket at a time: a param's post-accumulate-grad
hook adds it to the bucket, and once the bucket holds BUCKET_BYTES of gradients (or backward ends) one engine call
updates its params and releases their gradients (p.grad = None). A training step thus never holds more than a
bucket of gradients (and the largest one), and each update runs soon after its gradients were written. The
ordinary loop (opt.zero_grad(); loss.backward(); opt.step()) runs unchanged: step() and zero_grad() find nothing
left to do. Buckets rather than single params: each engine call starts the OpenMP team, and backward's own
kernels run between them; a call per param made a transformer's step 25-35 % slower on 2 cores (measured).

Each update is the one the ordinary step computes for that param (the same segment, hyper-parameters and step
count), bit for bit; so it is defined where one param's update needs no other param's gradient. With
accumulation_steps > 1 each bucket's gradients are added into the window's f32 sums (released at once, as
without accumulation), and the backward before the window's last step() updates the params from them; step()
still ends each micro-batch (_accumulation.py), taking what no hook took. Whatever needs every gradient first is
refused when the optimizer is made: global-norm clipping (max_grad_norm), a sum over tensors (BertAdam's
per-group norm), a param listed twice. A GradScaler cannot be seen before backward runs: step() raises when one
calls it. With flatten=True params and states are the flat store's views as in the ordinary step; gradients stay
where autograd writes them (_flat.py)."""

from __future__ import annotations

import torch

from . import _C
from ._packing import _Packed
from ._signals import packed_anew_until_laid_out
from ._state import _roll_back
from ._tensors import is_dtensor

BUCKET_BYTES = 25 * 2**20  # of gradients per engine call (DDP's default bucket_cap_mb)


class BackwardStep:
    """The FusedOptimizerMixin part that steps params from backward's hooks."""

    def _init_backward_step(self, enabled: bool) -> None:
        """Checks the options against step_in_backward and hooks every param (called once the groups exist)."""
        self._step_in_backward = bool(enabled)
        if not self._step_in_backward:
            return
        name = type(self).__name__
        if self._max_grad_norm != float("inf"):
            raise ValueError(f"{name}: step_in_backward=True cannot clip by max_grad_norm: the global norm needs "
                             "every gradient before the first update (clip each param's gradient with a hook "
                             "instead, or step after backward)")
        if _C.algorithms[self._algorithm]["sums_across_tensors"]:
            raise ValueError(f"{name}: step_in_backward=True needs updates of one tensor at a time; "
                             f"{self._algorithm}'s reads sums over all of a group's gradients")
        for group in self.param_groups:
            for p in group["params"]:
                self._hook(p)

    def _hook(self, p: torch.Tensor) -> None:
        if self._duplicates:
            raise ValueError(f"{type(self).__name__}: step_in_backward=True steps each param once per backward; "
                             "a param listed twice would be stepped twice by step()")
        if self._accumulation_steps > 1 and (is_dtensor(p) or p.is_complex()):
            raise ValueError(f"{type(self).__name__}: step_in_backward=True with accumulation_steps="
                             f"{self._accumulation_steps} takes real plain tensors, not a {type(p).__name__} of "
                             f"{p.dtype} (accumulate such params with the ordinary step)")
        if p.requires_grad and p not in self._backward_hooks:
            self._backward_hooks[p] = p.register_post_accumulate_grad_hook(self._backward_step)

    def _backward_step(self, p: torch.Tensor) -> None:
        """The hook: p joins the bucket, which is updated when full; the first hook of a backward pass queues the
        update of what is left in the bucket when the pass ends."""
        if p.grad is None:
            return
        if not self._bucket:
            torch.autograd.Variable._execution_engine.queue_callback(self._flush_bucket)
        self._bucket.append(p)
        self._bucket_bytes += p.grad.numel() * p.grad.element_size()
        if self._bucket_bytes >= BUCKET_BYTES:
            self._flush_bucket()

    def _flush_bucket(self) -> None:
        """One engine call for the bucket's params, then their gradients released. A failed update leaves the
        params, their states and their gradients as they were (and its exception leaves backward)."""
        bucket, self._bucket, self._bucket_bytes = self._bucket, [], 0
        if self._places is None:
            self._places = {q: (gi, j) for gi, group in enumerate(self.param_groups)
                            for j, q in enumerate(group["params"])}
        hypers = self._group_hypers()
        undo: list = []
        accumulators = dict(self._accumulators)  # put back if this call is rejected: it made none
        try:
            if self._accumulation_steps > 1:
                done = self._add_bucket(bucket, hypers, undo)
            else:
                packed = packed_anew_until_laid_out(lambda: self._pack_bucket(bucket, hypers, undo))
                self._run_engine(packed, 1.0, False, None)
                done = packed.params
        except BaseException:
            _roll_back(undo)
            self._accumulators.clear()
            self._accumulators.update(accumulators)
            raise
        for p in done:
            p.grad = None

    def _add_bucket(self, bucket: list[torch.Tensor], hypers: list, undo: list) -> list[torch.Tensor]:
        """accumulation_steps > 1: one engine call adds the bucket's gradients into their sums as the ordinary
        micro-batch does (_accumulation.py) and, in the backward before the window's last step(), updates the
        bucket's params from them. Which micro-batch this is, is step()'s count: step() ends each micro-batch,
        taking the gradients no hook took and updating the window's params that no hook updated. An Inf/NaN in
        an earlier micro-batch skips the window whole, as the ordinary step does; one in the last micro-batch
        skips its bucket and every later one (the buckets before it have already been updated). Returns the
        params whose gradients were taken."""
        grads, sums, fresh, with_grad, routed = self._micro_batch(bucket)
        if routed:
            raise RuntimeError(f"fusedopt: step_in_backward: {next(iter(routed.values()))}")
        closes = self._micro_batches + 1 == self._accumulation_steps
        packed = _Packed(hypers)
        if closes:
            window_sums = {p: self._accumulators[p] for p in with_grad}
            packed = packed_anew_until_laid_out(lambda: self._pack_bucket(list(with_grad), hypers, undo, window_sums))
        else:
            self._check_hypers(hypers)  # (the engine checks them only when the window closes)
        batch = (self._accumulation_steps, self._micro_batches, self._window_found_inf, grads, sums, fresh, 1.0)
        report = self._engine(packed, 1.0, False, micro_batch=batch)
        self._window_found_inf |= report.found_inf
        for p in with_grad:  # (a param updated here is not updated again when step() closes the window)
            if closes:
                self._window.pop(p, None)
            else:
                self._window[p] = None
        return list(with_grad)

    def _pack_bucket(self, bucket: list[torch.Tensor], hypers: list, undo: list,
                     sums: dict[torch.Tensor, torch.Tensor] | None = None) -> _Packed:
        """The engine's segments of the bucket's params that are still in a group and still have a gradient,
        each reading p.grad, or its window's sum (sums[p]) when given."""
        packed = _Packed(hypers)
        for p in bucket:
            place = self._places.get(p)
            g = p.grad if sums is None else sums.get(p)
            if place is None or g is None:  # no longer in any group, or its gradient was taken away
                continue
            gi, j = place
            needed = self._group_slots(hypers[gi])
            needed = self._needed_states(p, needed) if self._factored else needed
            row, grad_ptr, code = self._segment(p, g, gi, j, needed, undo, sums is None, hypers[gi])
            if row is None:  # (grad_ptr is why)
                raise RuntimeError(f"fusedopt: step_in_backward: parameter {self._name(gi, j)}: {grad_ptr}")
            packed.params.append(p)
            packed.rows.append(row)
            packed.grads.append(grad_ptr)
            packed.codes.append(code)
        packed.table = _C.SegmentTable(packed.rows)
        return packed

    def _close_backward_step(self) -> None:
        """At step(): updates a bucket that a backward pass ended without (an interrupted pass), and refuses a
        GradScaler's step: the hooks have already stepped with scaled gradients."""
        if self._bucket:
            self._flush_bucket()
        if self._step_in_backward and (getattr(self, "grad_scale", None) is not None
                                       or getattr(self, "found_inf", None) is not None):
            raise RuntimeError(f"{type(self).__name__}: step_in_backward=True cannot take a GradScaler: the update "
                               "ran inside backward, before the scaler could unscale the gradients or check them "
                               "for Inf/NaN")
