"""step_in_backward=True: params are updated during backward(), a bucket at a time: a param's post-accumulate-grad
hook adds it to the bucket, and once the bucket holds BUCKET_BYTES of gradients (or backward ends) one engine call
updates its params and releases their gradients (p.grad = None). A training step thus never holds more than a
bucket of gradients (and the largest one), and each update runs soon after its gradients were written. The
ordinary loop (opt.zero_grad(); loss.backward(); opt.step()) runs unchanged: step() and zero_grad() find nothing
left to do. Buckets rather than single params: each engine call starts the OpenMP team, and backward's own
kernels run between them; a call per param made a transformer's step 25-35 % slower on 2 cores (measured).

Each update is the one the ordinary step computes for that param (the same segment, hyper-parameters and step
count), bit for bit; so it is defined where one param's update needs no other param's gradient. A param whose
update cannot run in a bucket (one the engine cannot take, such as float64, or a DTensor shard of LAMB or LARS,
whose norms would need a collective per bucket) keeps its gradient: step() updates it as the ordinary step does,
and a UserWarning names it once. With accumulation_steps > 1 each bucket's gradients are added into the window's
sums (the engine's f32 sums, or with DTensor params torch's, laid out as the shards) and released at once, in
every micro-batch; the window's last step() updates the params from the sums as the ordinary window does
(_accumulation.py), so an Inf/NaN anywhere in the window skips it whole. Whatever needs every gradient before
the first update is refused when the optimizer is made: global-norm clipping (max_grad_norm), a sum over tensors
(BertAdam's per-group norm), a param listed twice. A GradScaler is refused before backward: fusedopt.GradScaler's
scale() raises when its outputs' graph reaches a hooked param (refuse_scaled_backward); torch.amp.GradScaler, which
cannot be seen before its step, makes step() raise. With flatten=True params and states are the flat store's views
as in the ordinary step; gradients stay where autograd writes them (_flat.py)."""

from __future__ import annotations

import warnings
import weakref

import torch

from . import _C
from ._fallback import _user_stacklevel
from ._packing import _Packed
from ._signals import packed_anew_until_laid_out
from ._state import _roll_back
from ._tensors import is_dtensor

BUCKET_BYTES = 25 * 2**20  # of gradients per engine call (DDP's default bucket_cap_mb)

_STEPPING = weakref.WeakSet()  # the optimizers that have hooked params (refuse_scaled_backward)


def refuse_scaled_backward(outputs) -> None:
    """fusedopt.GradScaler.scale(): raises if the backward of outputs (a tensor, or lists and tuples of them) would
    reach a param that an optimizer steps inside backward: its hooks would update the param from scaled gradients
    before the scaler could unscale them or check them for Inf/NaN. Walks the autograd graph only while such an
    optimizer exists, so a scaler beside it for another model's loss works. (FSDP2's forward runs on unsharded copies
    of the params, which the graph holds instead: there step() refuses, as with torch.amp.GradScaler.)"""
    owners = {p: opt for opt in _STEPPING for p in opt._backward_hooks}
    if not owners:
        return
    nodes, seen, items = [], set(), [outputs]
    while items:
        item = items.pop()
        if isinstance(item, (list, tuple)):
            items.extend(item)
        elif isinstance(item, torch.Tensor):
            nodes.append(item.grad_fn)
            if item.grad_fn is None and item in owners:  # (a param scaled itself)
                _refuse_scaler(owners[item])
    while nodes:
        node = nodes.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node's param
        if variable is not None and variable in owners:
            _refuse_scaler(owners[variable])
        nodes.extend(following for following, _ in node.next_functions)


def _refuse_scaler(optimizer, where: str = "at scaler.scale(), before backward") -> None:
    raise RuntimeError(f"{type(optimizer).__name__}: step_in_backward=True cannot take a GradScaler: the update runs "
                       "inside backward, before the scaler could unscale the gradients or check them for Inf/NaN "
                       f"(refused {where})")


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
        if p.requires_grad and p not in self._backward_hooks:
            self._backward_hooks[p] = p.register_post_accumulate_grad_hook(self._backward_step)
            _STEPPING.add(self)

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
            bucket, left = self._split_bucket(bucket)
            if self._accumulation_steps > 1:
                done, routed = self._add_bucket(bucket, hypers)
            else:
                packed = packed_anew_until_laid_out(lambda: self._pack_bucket(bucket, hypers, undo))
                self._run_engine(packed, 1.0, False, None)
                done, routed = packed.params, packed.routed
        except BaseException:
            _roll_back(undo)
            self._accumulators.clear()
            self._accumulators.update(accumulators)
            raise
        for p in done:
            p.grad = None
        self._warn_left_for_step({**left, **routed})

    def _split_bucket(self, bucket: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict[torch.Tensor, str]]:
        """The bucket's params that are still in a group, and {param: why} of those left for step(): without
        accumulation, DTensor shards of the algorithms with sums over whole tensors, whose update in a bucket would
        need a collective per bucket (and where buckets end depends on each rank's shard bytes)."""
        stays, left = [], {}
        for p in bucket:
            place = self._places.get(p)
            if place is None:  # no longer in any group
                continue
            if is_dtensor(p) and not self._element_wise and self._accumulation_steps == 1:
                left[p] = (f"parameter {self._name(*place)}: it is a DTensor, and the '{self._algorithm}' step of "
                           "its shard needs sums over every rank's shards")
            else:
                stays.append(p)
        return stays, left

    def _warn_left_for_step(self, left: dict[torch.Tensor, str]) -> None:
        new = [why for p, why in left.items() if p not in self._warned_left]
        if new:
            self._warned_left.update(dict.fromkeys(left))
            warnings.warn(f"fusedopt: {type(self).__name__} (step_in_backward=True) cannot update these parameters "
                          f"inside backward: {'; '.join(new)}. Their gradients are kept, and step() updates them as "
                          "the ordinary step does.", stacklevel=_user_stacklevel())

    def _add_bucket(self, bucket: list[torch.Tensor], hypers: list) -> tuple[list[torch.Tensor], dict]:
        """accumulation_steps > 1: one engine call adds the bucket's gradients into their sums as the ordinary
        micro-batch does (_accumulation.py), in every micro-batch of the window: the window's last step() updates
        the params from the sums, so an Inf/NaN in any micro-batch skips the window whole, as in the ordinary
        step. Which micro-batch this is, is step()'s count: step() ends each micro-batch, taking the gradients no
        hook took. Returns the params whose gradients were taken, and {param: why} of those whose sums the
        ordinary window keeps in torch (complex, float64, ...: step() adds them)."""
        self._check_hypers(hypers)  # (what the window's last step() would refuse is refused before adding)
        if self._window_over_shards():  # (FSDP2, tensor parallel: the sums are torch's, laid out as the shards)
            grads = self._shard_grads(bucket)
            self._add_to_shard_sums(grads, 1.0)
            self._window.update(dict.fromkeys(grads))
            return list(grads), {}
        grads, sums, fresh, with_grad, routed = self._micro_batch(bucket)
        batch = (self._accumulation_steps, self._micro_batches, self._window_found_inf, grads, sums, fresh, 1.0)
        report = self._engine(_Packed(hypers), 1.0, False, micro_batch=batch)  # (no segments: it only adds)
        self._window_found_inf |= report.found_inf
        self._window.update(dict.fromkeys(with_grad))
        return list(with_grad), routed

    def _pack_bucket(self, bucket: list[torch.Tensor], hypers: list, undo: list) -> _Packed:
        """The engine's segments of the bucket's params that still have a gradient; packed.routed holds those
        that take the reference's step (left for step())."""
        packed = _Packed(hypers)
        for p in bucket:
            if p.grad is None:  # its gradient was taken away
                continue
            gi, j = self._places[p]
            needed = self._group_slots(hypers[gi])
            needed = self._needed_states(p, needed) if self._factored else needed
            row, grad_ptr, code = self._segment(p, p.grad, gi, j, needed, undo, True, hypers[gi])
            if row is None:  # (grad_ptr is why)
                packed.routed[p] = f"parameter {self._name(gi, j)}: {grad_ptr}"
                continue
            packed.params.append(p)
            packed.rows.append(row)
            packed.grads.append(grad_ptr)
            packed.codes.append(code)
        packed.table = _C.SegmentTable(packed.rows)
        return packed

    def _close_backward_step(self) -> None:
        """At step(): updates a bucket that a backward pass ended without (an interrupted pass), and refuses a
        GradScaler's step (torch.amp.GradScaler's: fusedopt's refuses at scale()): the hooks have already stepped
        with scaled gradients."""
        if self._bucket:
            self._flush_bucket()
        if self._step_in_backward and (getattr(self, "grad_scale", None) is not None
                                       or getattr(self, "found_inf", None) is not None):
            _refuse_scaler(self, "at torch.amp.GradScaler's step: backward has already updated the params from scaled "
                                 "gradients; fusedopt.GradScaler refuses at scale(), before")
