"""Data-parallel training and ZeRO-1 on torch.distributed (gloo on the CPU):

    dist.init_process_group("gloo")                    # launched by torchrun --nproc-per-node 2
    opt = fusedopt.distributed.DistributedOptimizer(fusedopt.FusedAdamW(model.parameters(), lr=1e-3), zero=1)
    loss_fn(model(x), y).backward()                    # hooks reduce each full bucket during backward
    opt.step()
    opt.zero_grad()

No DistributedDataParallel wrapper is needed: the optimizer owns the gradient reduction. Its params are cut
into buckets of one dtype (bucket_mb each, in reverse registration order as DDP fills them: the last layers'
gradients are ready first). A post-accumulate-grad hook copies each gradient, pre-scaled by 1/world_size, into
its bucket slot and makes p.grad that slot; a full bucket's all_reduce starts at once, behind the rest of
backward. When backward returns, every bucket has landed: p.grad is the average over the ranks, as under DDP,
so anything between backward and step (torch.amp.GradScaler's overflow check, clip_grad_norm_, logging) sees
the same gradients on every rank, and every rank makes the same decisions from them.

zero=0: the wrapped optimizer steps every param on every rank (identical inputs, a deterministic engine:
identical params). zero=1 (ZeRO-1): each bucket is split into world_size equal shards; a rank holds optimizer
state and f32 masters only for the slices of params in its shards, steps them (the same fused engine over
slice views of the params) and all_gathers the params. Overflow and the clipping norm are computed from the
full averaged gradients, so all ranks agree without another collective. On gloo, reduce_scatter is an
all_reduce followed by a slice (docs/distributed.md has the measurement): zero=1 all-reduces too and keeps
p.grad the full average.

accumulation_steps=k (an option of the wrapped optimizer) keeps its meaning: step() after each micro-batch adds
its gradients (unscaled by the GradScaler, over k) into f32 sums, with no communication; the window's last
step() all-reduces the sums and updates from them.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import warnings
import weakref
import zlib
from typing import Any, Callable

import torch.distributed as dist

import torch

from . import _C
from ._base import FusedOptimizerMixin
from ._tensors import DTYPE_CODES

__all__ = ["DistributedOptimizer"]


class _Bucket:
    """Params of one dtype, laid end to end in `flat_grad` (and with zero=1 in `flat_param`, which the params
    then view), padded to a multiple of world_size so that it splits into equal shards."""

    def __init__(self, dtype: torch.dtype, params: list[torch.Tensor], world_size: int):
        self.dtype = dtype
        self.params = params
        self.offsets = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.numel = -(-total // world_size) * world_size
        self.flat_grad = torch.zeros(self.numel, dtype=dtype)
        self.grad_views = [self.flat_grad[o:o + p.numel()].view(p.shape) for o, p in zip(self.offsets, params)]
        self.flat_param: torch.Tensor | None = None
        self.sums: torch.Tensor | None = None  # f32 gradient sums of an accumulation window
        self.ready = 0  # params whose gradient reached its slot in this backward
        self.work = None  # the in-flight all_reduce


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps a fused optimizer (any fusedopt.Fused* class) for data-parallel training on a torch.distributed
    process group: see the module's docstring. zero: 0 (every rank holds all state) or 1 (state sharded);
    bucket_mb: the size of a gradient bucket; process_group: default the world."""

    def __init__(self, optimizer: FusedOptimizerMixin, *, zero: int = 0, bucket_mb: float = 25.0,
                 process_group: dist.ProcessGroup | None = None):
        if not isinstance(optimizer, FusedOptimizerMixin):
            raise TypeError(f"fusedopt.distributed.DistributedOptimizer wraps a fusedopt.Fused* optimizer, "
                            f"not {type(optimizer).__name__}")
        if zero not in (0, 1) or isinstance(zero, bool):
            raise ValueError(f"Invalid zero: {zero!r} (0: data parallel, 1: ZeRO-1 sharded state)")
        if not (isinstance(bucket_mb, (int, float)) and not isinstance(bucket_mb, bool) and bucket_mb > 0):
            raise ValueError(f"Invalid bucket_mb: {bucket_mb!r} (a size in MiB > 0)")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("fusedopt.distributed.DistributedOptimizer: the default process group is not "
                               "initialized; call torch.distributed.init_process_group('gloo') first")
        if optimizer._flat is not None:
            raise ValueError("fusedopt.distributed.DistributedOptimizer: the wrapped optimizer has flatten=True; "
                             "the gradient buckets are already flat: pass flatten=False")
        self._built = False  # torch.optim.Optimizer.__init__ calls add_param_group
        self._inner = optimizer
        self._group = process_group
        self._rank = dist.get_rank(process_group)
        self._world = dist.get_world_size(process_group)
        self._zero = zero
        self._accumulation_steps = optimizer._accumulation_steps
        self._micro_batches = 0  # of the accumulation window so far
        self._window_skip = False  # torch's GradScaler found a micro-batch of this window overflowing
        self._shard: FusedOptimizerMixin | None = None
        # per shard param: (the slice view, its gradient slot, its bucket, its offset in the bucket)
        self._shard_grads: list[tuple[torch.Tensor, torch.Tensor, _Bucket, int]] = []

        params = self._check_params(optimizer)
        # torch.optim.Optimizer's own set-up (hooks, step patching), then the wrapped optimizer's groups and state
        # in its place: LR schedulers and GradScaler see and change the wrapped optimizer's param_groups.
        super().__init__([{"params": params}], optimizer.defaults)
        self.param_groups = optimizer.param_groups
        self.defaults = optimizer.defaults
        self._step_supports_amp_scaling = True
        self._group_sizes = [len(g["params"]) for g in optimizer.param_groups]

        self._buckets = self._make_buckets(params, int(bucket_mb * 2**20))
        local_ranks = self._check_layout(optimizer)
        self._share_cpus(local_ranks)
        optimizer._accumulation_steps = 1  # the window is kept here: its sums are reduced before the update
        with torch.no_grad():  # every rank starts from rank 0's params
            if zero == 1:
                self._flatten_params()
                for b in self._buckets:
                    dist.broadcast(b.flat_param, self._global_rank(0), group=process_group)
                self._shard = self._make_shard(optimizer)
            else:
                for p in params:
                    dist.broadcast(p.data, self._global_rank(0), group=process_group)
        self.state = self._shard.state if self._shard is not None else optimizer.state
        # Through a weak reference: a model wrapped anew does not keep feeding an optimizer it no longer uses.
        # One closure per param, over its bucket and slot: the hook runs for every param in every backward.
        me = weakref.ref(self)

        def hook_of(b: _Bucket, view: torch.Tensor):
            def hook(p: torch.Tensor) -> None:
                optimizer = me()
                if optimizer is not None:
                    optimizer._grad_ready(p, b, view)
            return hook

        self._hooks = [p.register_post_accumulate_grad_hook(hook_of(b, view))
                       for b in self._buckets for p, view in zip(b.params, b.grad_views)]
        self._queued = False  # the end-of-backward callback is queued for the backward now running
        self._sync = True  # False inside no_sync()
        self._built = True

    def _global_rank(self, rank: int) -> int:
        return rank if self._group is None else dist.get_global_rank(self._group, rank)

    # ---- set-up --------------------------------------------------------------------------------------------
    def _check_params(self, optimizer) -> list[torch.Tensor]:
        seen, params = set(), []
        for gi, group in enumerate(optimizer.param_groups):
            for j, p in enumerate(group["params"]):
                name = optimizer._name(gi, j)
                if p.device.type != "cpu":
                    raise ValueError(f"fusedopt.distributed: parameter {name} is on {p.device}; the fused engine "
                                     "and the gloo group take CPU tensors")
                if id(p) in seen or not p.requires_grad:
                    continue
                if p.is_sparse or not p.is_contiguous():
                    raise ValueError(f"fusedopt.distributed: parameter {name} is not a dense contiguous tensor")
                if (self._zero == 1 or self._accumulation_steps > 1) and p.dtype not in DTYPE_CODES:
                    raise ValueError(f"fusedopt.distributed: parameter {name} has dtype {p.dtype}; zero=1 and "
                                     "accumulation_steps > 1 take float32, float16 and bfloat16 params")
                seen.add(id(p))
                params.append(p)
        if not params:
            raise ValueError("fusedopt.distributed: the optimizer has no parameter that requires grad")
        if self._zero == 1 and not _C.algorithms[optimizer._algorithm]["sliceable"]:
            raise ValueError(f"fusedopt.distributed: zero=1 needs an update that works element by element; "
                             f"{type(optimizer).__name__} reads whole tensors (per-tensor norms, rows or factors) "
                             "and cannot step a slice of one: use zero=0")
        return params

    def _make_buckets(self, params: list[torch.Tensor], cap: int) -> list[_Bucket]:
        """Buckets in reverse registration order (DDP's: backward makes the last layers' gradients first), a
        new one when the dtype changes or the bucket is full."""
        buckets, current, size = [], [], 0
        for p in reversed(params):
            if current and (p.dtype != current[0].dtype or size + p.numel() * p.element_size() > cap):
                buckets.append(_Bucket(current[0].dtype, current, self._world))
                current, size = [], 0
            current.append(p)
            size += p.numel() * p.element_size()
        buckets.append(_Bucket(current[0].dtype, current, self._world))
        return buckets

    def _check_layout(self, optimizer) -> int:
        """Every rank must hold the same params in the same order (else buckets would pair different tensors):
        a hash of the layout, all-gathered; every rank names the first rank that differs. Returns the number
        of ranks on this host (LOCAL_WORLD_SIZE where torchrun set it, else counted from the hosts' names,
        gathered with the layout)."""
        text = repr((self._zero, type(optimizer).__name__, self._group_sizes,
                     [(b.dtype, [tuple(p.shape) for p in b.params]) for b in self._buckets]))
        mine = torch.tensor([zlib.crc32(text.encode()), zlib.crc32(socket.gethostname().encode())],
                            dtype=torch.int64)
        hashes = [torch.zeros_like(mine) for _ in range(self._world)]
        dist.all_gather(hashes, mine, group=self._group)
        differ = [r for r, h in enumerate(hashes) if int(h[0]) != int(hashes[0][0])]
        if differ:
            raise ValueError(f"fusedopt.distributed: rank {differ[0]} holds other params than rank 0 (their "
                             "number, order, shapes or dtypes, or another optimizer or zero level); every rank "
                             "must wrap the same model")
        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        if local.isdigit() and int(local) > 0:
            return int(local)
        return sum(int(h[1]) == int(mine[1]) for h in hashes)

    def _share_cpus(self, local_ranks: int) -> None:
        """torch's threads (which the engine's steps take too), lowered to this rank's share of the host's CPUs
        unless OMP_NUM_THREADS chose: every rank of a host would otherwise run a thread per CPU, and their
        OpenMP threads, spinning while idle, take the CPUs from each other (docs/distributed.md)."""
        choice = threads_per_rank(os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads(),
                                  len(os.sched_getaffinity(0)), local_ranks)
        if choice is None:
            return
        torch.set_num_threads(choice)
        global _announced
        if self._rank == 0 and not _announced:
            _announced = True
            print(f"fusedopt.distributed: {choice} thread(s) per rank ({len(os.sched_getaffinity(0))} CPU(s) "
                  f"shared by {local_ranks} rank(s) on this host; OMP_NUM_THREADS chooses another count)",
                  file=sys.stderr)

    def _flatten_params(self) -> None:
        """zero=1: each param becomes a view into its bucket's flat_param, which the all_gather writes."""
        for b in self._buckets:
            b.flat_param = torch.zeros(b.numel, dtype=b.dtype)
            for k, p in enumerate(b.params):
                view = b.flat_param[b.offsets[k]:b.offsets[k] + p.numel()].view(p.shape)
                view.copy_(p.detach())
                p.data = view

    def _make_shard(self, optimizer) -> FusedOptimizerMixin | None:
        """The optimizer of this rank's shards: the same class and options over views of the slices of params
        that lie in them, group by group; its state is shard-sized."""
        index = {p: i for i, p in enumerate(q for g in optimizer.param_groups for q in g["params"])}
        group_of = {p: gi for gi, g in enumerate(optimizer.param_groups) for p in g["params"]}
        slices: list[list] = [[] for _ in optimizer.param_groups]
        self._shard_meta = []  # (param index in the wrapped optimizer, start, stop) per shard param, in order
        for b in self._buckets:
            size = b.numel // self._world
            lo, hi = self._rank * size, (self._rank + 1) * size
            for k, p in enumerate(b.params):
                a, e = max(lo, b.offsets[k]), min(hi, b.offsets[k] + p.numel())
                if a < e:
                    slices[group_of[p]].append((p, a - b.offsets[k], e - b.offsets[k], b, a))
        groups, offsets = [], {}
        for gi, items in enumerate(slices):
            hyper = {k: v for k, v in optimizer.param_groups[gi].items() if k not in ("params", "param_names")}
            views = []
            for p, start, stop, b, a in items:
                q = b.flat_param[a:a + stop - start]
                q.requires_grad_(True)
                views.append(q)
                offsets[q] = optimizer._global_offset(p) + start
                self._shard_grads.append((q, b.flat_grad[a:a + stop - start], b, a))
                self._shard_meta.append((index[p], start, stop))
            groups.append({"params": views, **hyper})
        if not offsets:
            return None  # a tiny model on many ranks: this rank's shards hold only padding
        shard = type(optimizer)([g for g in groups if g["params"]], **_shard_options(optimizer))
        shard._offsets = offsets  # stochastic rounding keyed on each element's index in the whole model
        self._shard_groups = [gi for gi, g in enumerate(groups) if g["params"]]
        return shard

    # ---- backward ------------------------------------------------------------------------------------------
    def _grad_ready(self, p: torch.Tensor, b: _Bucket, view: torch.Tensor) -> None:
        """Post-accumulate-grad hook: p's gradient is final for this backward; `view` is its slot in bucket b."""
        if self._accumulation_steps > 1 or not self._sync:
            return  # reduced as f32 sums at the window's last step(), or by a later backward (no_sync)
        g = p.grad
        if g.is_sparse:
            raise RuntimeError(f"fusedopt.distributed: parameter of shape {tuple(p.shape)} has a sparse gradient; "
                               "the buckets take dense gradients")
        if g.data_ptr() == view.data_ptr():
            view.mul_(1.0 / self._world)  # accumulated in place into its slot (zero_grad(set_to_none=False))
        else:
            torch.mul(g, 1.0 / self._world, out=view)
            p.grad = view
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        b.ready += 1
        if b.ready == len(b.params):
            b.work = dist.all_reduce(b.flat_grad, group=self._group, async_op=True)

    def _backward_done(self) -> None:
        """End of backward: buckets with a param that took no part start now (its slot holds zeros), then every
        reduction is waited for."""
        self._queued = False
        missing = []
        for b in self._buckets:
            if b.work is None:
                for p, view in zip(b.params, b.grad_views):
                    if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                        view.zero_()
                        missing.append(p)
                b.work = dist.all_reduce(b.flat_grad, group=self._group, async_op=True)
        for b in self._buckets:
            b.work.wait()
            b.work, b.ready = None, 0
        if missing:
            self._missing = missing

    @contextlib.contextmanager
    def no_sync(self):
        """DistributedDataParallel.no_sync(): backward passes inside add into p.grad locally, with no
        communication; the first backward after it reduces the sum. For accumulation over micro-batches that
        call backward() several times and step() once (with step() after each, use accumulation_steps)."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    # ---- the step ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)
        found_out = getattr(self, "_found_inf_out", None)
        grad_scale = getattr(self, "grad_scale", None)
        inv_scale = 1.0 if grad_scale is None else 1.0 / float(grad_scale)
        try:
            self._check_step(found_inf is not None and found_out is None)
            error = None
        except RuntimeError as e:
            error = e
        seen_inf = found_inf is not None and float(found_inf) != 0.0
        non_finite, norm = False, None
        if error is None and not seen_inf:
            non_finite, norm = self._check_grads(inv_scale, found_out)
        overflowed = self._agree(error, seen_inf or non_finite, grad_scale)
        if overflowed and found_inf is not None and not seen_inf:
            warnings.warn(f"fusedopt.distributed: rank {self._rank}'s torch.amp.GradScaler did not see the Inf/NaN "
                          "another rank's gradients hold (changed there after backward): every rank skipped this "
                          "step, but this rank's scale did not back off, and the next step refuses ranks whose "
                          "scales differ; fusedopt.GradScaler checks every rank's gradients", stacklevel=2)
        if self._accumulation_steps > 1:
            self._micro_batch(inv_scale, seen_inf, overflowed, found_out)
            return loss
        if overflowed:
            if found_out is not None:
                found_out.fill_(1.0)
            return loss
        # The overflow check is done (and agreed): the update's own pre-pass runs only to clip.
        if self._zero == 0:
            self._inner._update(inv_scale, None)
        else:
            self._shard_update(inv_scale, None, None, norm)
        return loss

    def _check_step(self, torch_scaler: bool) -> None:
        """What makes this rank refuse the step (RuntimeError), before anything is read or changed."""
        self._check_unchanged()
        missing = self.__dict__.pop("_missing", None)
        if missing:
            raise RuntimeError(f"fusedopt.distributed: {len(missing)} parameter(s) (the first of shape "
                               f"{tuple(missing[0].shape)}) took no part in this backward on rank {self._rank}; "
                               "every parameter the optimizer holds must get a gradient in every backward, as "
                               "under DistributedDataParallel (or set requires_grad=False on it)")
        if self._accumulation_steps > 1 and torch_scaler and self._world > 1:
            raise RuntimeError("fusedopt.distributed: accumulation_steps > 1 with torch.amp.GradScaler: its "
                               "overflow check reads each rank's own micro-batch gradients before step(), so "
                               "the ranks' scales would drift apart; use fusedopt.GradScaler, whose check "
                               "runs in the step over every rank's gradients")

    def _check_grads(self, inv_scale: float, found_out) -> tuple[bool, float | None]:
        """(non-finite, clipping norm or None) of the gradients this step reads, where a decision rests on them:
        fusedopt.GradScaler's overflow flag, or (without accumulation) clipping. With zero=1 the norm is the
        one the update clips with; zero=0's wrapped optimizer takes its own from the same gradients."""
        clip = self._inner._max_grad_norm != math.inf and self._accumulation_steps == 1
        if found_out is None and not clip:
            return False, None
        if self._zero == 1 and self._accumulation_steps == 1:  # the reduced buckets, which the shards read
            full = [(b.flat_grad.data_ptr(), b.numel, DTYPE_CODES[b.dtype]) for b in self._buckets]
        else:
            grads = [p.grad for b in self._buckets for p in b.params if p.grad is not None]
            if not all(g.dtype in DTYPE_CODES and g.is_contiguous() and not g.is_sparse for g in grads):
                return any(not bool(torch.isfinite(g).all()) for g in grads), None  # outside the engine
            full = [(g.data_ptr(), g.numel(), DTYPE_CODES[g.dtype]) for g in grads]
        if self._zero == 1 and clip:
            non_finite, norm = _C.grad_norm(full, self._inner._norm_code, inv_scale, torch.get_num_threads())
            return non_finite, norm
        return _C.has_non_finite(full, torch.get_num_threads()), None

    def _agree(self, error: RuntimeError | None, non_finite: bool, grad_scale) -> bool:
        """One small all_reduce, in every step() on every rank, so that every rank takes the same branch (and
        so enters the same collectives): raises on every rank when any rank refused the step or the ranks'
        GradScaler scales differ; returns whether any rank's gradients hold Inf/NaN (or its GradScaler found
        some), the step every rank then skips."""
        if self._world == 1:
            if error is not None:
                raise error
            return non_finite
        scale = 0.0 if grad_scale is None else float(grad_scale)
        flags = torch.zeros(self._world + 3, dtype=torch.float64)
        flags[self._rank] = error is not None
        flags[-3:] = torch.tensor([non_finite, scale, -scale], dtype=torch.float64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._group)
        if error is not None:
            raise error
        rejected = flags[:self._world].nonzero()
        if len(rejected):
            raise RuntimeError(f"fusedopt.distributed: rank {int(rejected[0])} rejected this step (its error says "
                               "why); no rank stepped")
        if grad_scale is not None and float(flags[-2]) != -float(flags[-1]):
            raise RuntimeError(f"fusedopt.distributed: the ranks' GradScaler scales differ ({-float(flags[-1]):g} "
                               f"to {float(flags[-2]):g}; {scale:g} on rank {self._rank}): an earlier overflow "
                               "check disagreed across ranks (torch.amp.GradScaler reads each rank's own "
                               "gradients); no rank stepped. Use fusedopt.GradScaler")
        return bool(flags[-3])

    def agree_found_inf(self, found_inf: torch.Tensor) -> None:
        """found_inf (a GradScaler's flag, filled by this rank's unscale_) set to the maximum over the ranks: a
        collective, called on every rank by fusedopt.GradScaler's unscale_, so every rank's scale backs off."""
        if self._world > 1:
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=self._group)

    def _micro_batch(self, inv_scale: float, torch_inf: bool, overflowed: bool, found_out) -> None:
        """accumulation_steps > 1, as one process does it: each micro-batch's gradients, unscaled and over k,
        added into f32 sums (over k * world_size here: the all-reduce then gives the mean); Inf/NaN in them
        skips the window, and a micro-batch that torch's GradScaler found overflowing is left out and skips it.
        The window's last step() all-reduces the sums and updates from them. fusedopt.GradScaler learns each
        micro-batch's overflow over all ranks (step()'s agreement), so every rank's scale moves alike."""
        k = self._accumulation_steps
        if self._micro_batches == 0:
            self._window_skip = False
            for b in self._buckets:
                if b.sums is None:
                    b.sums = torch.zeros(b.numel, dtype=torch.float32)
                else:
                    b.sums.zero_()
        if torch_inf:
            self._window_skip = True
        else:
            scale = inv_scale / (k * self._world)
            for b in self._buckets:
                for j, p in enumerate(b.params):
                    if p.grad is not None:
                        b.sums[b.offsets[j]:b.offsets[j] + p.numel()].view(p.shape).add_(p.grad, alpha=scale)
        if found_out is not None and overflowed:
            found_out.fill_(1.0)
        self._micro_batches += 1
        if self._micro_batches < k:
            return
        self._micro_batches = 0
        works = [dist.all_reduce(b.sums, group=self._group, async_op=True) for b in self._buckets]
        for w in works:
            w.wait()
        if self._window_skip:
            return
        sums = {p: b.sums[b.offsets[j]:b.offsets[j] + p.numel()].view(p.shape)
                for b in self._buckets for j, p in enumerate(b.params)}
        # Inf/NaN in the sums (all-reduced: the same on every rank) skips the window on every rank.
        check = found_out if found_out is not None else torch.zeros(1)
        if self._zero == 0:
            self._inner._update(1.0, check, sums)
        else:
            self._shard_update(1.0, check, sums)

    def _shard_update(self, inv_scale: float, found_out, sums: dict | None, norm: float | None = None) -> None:
        """zero=1: overflow and the clipping norm from the full gradients (the same on every rank: the sums
        are all-reduced, and for the buckets step() agreed on overflow and passes their norm), this rank's
        slices stepped, the params all-gathered."""
        inner = self._inner
        clip = inner._max_grad_norm != math.inf
        if norm is None and (clip or found_out is not None):
            if sums is None:
                full = [(b.flat_grad.data_ptr(), b.numel, DTYPE_CODES[b.dtype]) for b in self._buckets]
            else:
                full = [(b.sums.data_ptr(), b.numel, DTYPE_CODES[torch.float32]) for b in self._buckets]
            non_finite, norm = _C.grad_norm(full, inner._norm_code, inv_scale, torch.get_num_threads())
            inner.last_grad_norm = norm if clip else None
            if non_finite:
                if found_out is not None:
                    found_out.fill_(1.0)
                return
        scale = inv_scale
        if clip:
            inner.last_grad_norm = norm
            coef = _C.clip_coefficient(norm, inner._max_grad_norm)
            scale = float(torch.tensor(inv_scale, dtype=torch.float32) * torch.tensor(coef, dtype=torch.float32))
        try:
            if self._shard is not None:
                # LR schedules change the wrapped optimizer's groups
                for gi, si in zip(self._shard_groups, self._shard.param_groups):
                    for key, value in inner.param_groups[gi].items():
                        if key not in ("params", "param_names"):
                            si[key] = value
                grads = None
                if sums is None:
                    for q, g, _, _ in self._shard_grads:
                        q.grad = g
                else:
                    grads = {q: b.sums[a:a + q.numel()] for q, _, b, a in self._shard_grads}
                try:
                    self._shard._update(scale, None, grads)
                finally:
                    for q, _, _, _ in self._shard_grads:
                        q.grad = None
        finally:
            # Also after this rank's update raised (its slices unchanged): the other ranks wait in the gather.
            self._gather_params()

    def _gather_params(self) -> None:
        works = []
        for b in self._buckets:
            size = b.numel // self._world
            mine = b.flat_param[self._rank * size:(self._rank + 1) * size].clone()
            # .data: the gather's write does not bump the params' version counters (which would restart the
            # f32 masters from the params: see FusedOptimizerMixin._segment)
            works.append(dist.all_gather_single(b.flat_param.data, mine, group=self._group, async_op=True))
        for w in works:
            w.wait()

    def _check_unchanged(self) -> None:
        """Params added, or (zero=1) moved out of their bucket by user code (p.data = ...), since wrapping."""
        if [len(g["params"]) for g in self._inner.param_groups] != self._group_sizes:
            raise RuntimeError("fusedopt.distributed: a parameter or group was added to the optimizer after "
                               "DistributedOptimizer wrapped it; build the optimizer with every param first")
        if self._zero == 1:
            for b in self._buckets:
                for k, p in enumerate(b.params):
                    view = b.flat_param[b.offsets[k]:b.offsets[k] + p.numel()]
                    if p.data_ptr() != view.data_ptr():
                        view.copy_(p.detach().reshape(-1))
                        p.data = view.view(p.shape)
                        if self._shard is not None:
                            self._shard.resync_master_weights()

    # ---- the rest of the torch.optim.Optimizer API ---------------------------------------------------------
    @property
    def last_grad_norm(self) -> float | None:
        """The global gradient norm the last step saw (with max_grad_norm), the same on every rank."""
        return self._inner.last_grad_norm

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._inner.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        if not self._built:  # torch.optim.Optimizer.__init__'s own call
            return super().add_param_group(param_group)
        raise RuntimeError("fusedopt.distributed: DistributedOptimizer cannot take a param group after it was "
                           "built; build the optimizer with every param first")

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds: moments, f32 masters, accumulation sums."""
        own = sum(b.sums.numel() * 4 for b in self._buckets if b.sums is not None)
        if self._zero == 0:
            return self._inner.state_bytes() + own
        return (self._shard.state_bytes() if self._shard is not None else 0) + own

    def state_dict(self) -> dict:
        """zero=0: the wrapped optimizer's. zero=1: this rank's shard, its params the slices, with their place
        in "zero" (world_size, rank, and per slice: the param's index in the wrapped optimizer, start, stop);
        consolidate_state_dict gives a plain torch-format state_dict."""
        if self._zero == 0:
            return self._inner.state_dict()
        shard = self._shard.state_dict() if self._shard is not None else {"state": {}, "param_groups": []}
        return {"state": shard["state"], "param_groups": self._inner.state_dict()["param_groups"],
                "zero": {"world_size": self._world, "rank": self._rank, "slices": list(self._shard_meta)}}

    def consolidate_state_dict(self, to: int = 0) -> dict | None:
        """The whole optimizer's state_dict in torch's format (each state tensor whole, in its param's shape),
        returned on rank `to` (None on the others): torch.optim's twin or a one-process fused optimizer loads
        it, and so does a DistributedOptimizer at any world size. A collective: every rank calls it."""
        if self._zero == 0:
            return self._inner.state_dict() if self._rank == to else None
        mine = self.state_dict()
        shards = [None] * self._world if self._rank == to else None
        dist.gather_object(mine, shards, dst=self._global_rank(to), group=self._group)
        if self._rank != to:
            return None
        params = [p for g in self._inner.param_groups for p in g["params"]]
        pieces: dict[int, dict[str, list]] = {}
        for shard in shards:
            for n, (i, start, stop) in enumerate(shard["zero"]["slices"]):
                for key, value in shard["state"].get(n, {}).items():
                    pieces.setdefault(i, {}).setdefault(key, []).append((start, stop, value))
        state = {}
        for i, keys in pieces.items():
            p = params[i]
            state[i] = {}
            for key, parts in keys.items():
                parts.sort(key=lambda part: part[0])
                value = parts[0][2]
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    value = torch.cat([v.reshape(-1) for _, _, v in parts]).view(p.shape)
                state[i][key] = value
        return {"state": state, "param_groups": mine["param_groups"]}

    def load_state_dict(self, state_dict: dict) -> None:
        """A state_dict of this world size and rank (state_dict()), or a whole one (consolidate_state_dict, or
        any torch-format state_dict of the same params), which zero=1 cuts into this rank's slices."""
        if self._zero == 0:
            if "zero" in state_dict:
                raise ValueError("fusedopt.distributed: this is one rank's shard of a zero=1 state_dict; load "
                                 "the result of consolidate_state_dict")
            self._inner.load_state_dict(state_dict)
            return
        zero = state_dict.get("zero")
        if zero is not None:
            if zero["world_size"] != self._world or zero["rank"] != self._rank or [
                    tuple(s) for s in zero["slices"]] != [tuple(s) for s in self._shard_meta]:
                raise ValueError(f"fusedopt.distributed: a shard of rank {zero['rank']} of {zero['world_size']} "
                                 f"does not fit rank {self._rank} of {self._world}; load the result of "
                                 "consolidate_state_dict to change the world size")
            shard_state = state_dict["state"]
        else:
            shard_state = {}
            for n, (i, start, stop) in enumerate(self._shard_meta):
                entry = state_dict["state"].get(i)
                if entry is None:
                    continue
                shard_state[n] = {key: (value.reshape(-1)[start:stop].clone()
                                        if isinstance(value, torch.Tensor) and value.dim() > 0 else value)
                                  for key, value in entry.items()}
        self._inner.load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        if self._shard is not None:
            groups = self._shard.state_dict()["param_groups"]
            for gi, g in zip(self._shard_groups, groups):
                g.update({k: v for k, v in self._inner.param_groups[gi].items()
                          if k not in ("params", "param_names")})
            self._shard.load_state_dict({"state": shard_state, "param_groups": groups})

    def __repr__(self) -> str:
        return (f"DistributedOptimizer(zero={self._zero}, rank {self._rank} of {self._world}, "
                f"{len(self._buckets)} bucket(s), {self._inner!r})")


_announced = False  # the thread choice is printed once per process


def threads_per_rank(omp_num_threads: str | None, threads: int, cpus: int, local_ranks: int) -> int | None:
    """The thread count for one of `local_ranks` processes sharing `cpus` CPUs that now runs `threads`: its
    share, max(1, cpus // local_ranks), where that is fewer; None (leave it) when OMP_NUM_THREADS is set
    (torchrun sets 1 per process), the user's choice."""
    if omp_num_threads is not None:
        return None
    share = max(1, cpus // local_ranks)
    return share if share < threads else None


def _shard_options(optimizer: FusedOptimizerMixin) -> dict:
    """The constructor options of the shard optimizer: the wrapped one's, but for clipping and accumulation,
    which DistributedOptimizer does over all ranks."""
    stochastic, seed = optimizer._rounding
    return {"master_weights": optimizer._master_weights, "state_dtype": optimizer._state_dtype_option,
            "stochastic_rounding": stochastic, "seed": seed, "strict": optimizer._strict}
