"""Data-parallel training and ZeRO-1 on torch.distributed (gloo on the CPU):

    dist.init_process_group("gloo")                    # launched by torchrun --nproc-per-node 2
    opt = fusedopt.distributed.DistributedOptimizer(fusedopt.FusedAdamW(model.parameters(), lr=1e-3), zero=1)
    loss_fn(model(x), y).backward()                    # hooks reduce each full bucket during backward
    opt.step()
    opt.zero_grad()

No DistributedDataParallel wrapper is needed: the optimizer owns the gradient reduction. Its params are cut
into buckets of one dtype (zero=0: bucket_mb each, in reverse registration order as DDP fills them: the last
layers' gradients are ready first; zero=1: below). A post-accumulate-grad hook copies each gradient,
pre-scaled by 1/world_size, into its bucket slot and makes p.grad that slot; a bucket's all_reduce starts as
soon as every param with elements in it is there, behind the rest of backward. When backward returns, every
bucket has landed: p.grad is the average over the ranks, as under DDP, so anything between backward and step
(torch.amp.GradScaler's overflow check, clip_grad_norm_, logging) sees the same gradients on every rank, and
every rank makes the same decisions from them.

zero=0: the wrapped optimizer steps every param on every rank (identical inputs, a deterministic engine:
identical params). zero=1 (ZeRO-1): the params lie as the C++ fusedopt::DistributedOptimizer lays them out
(fusedopt::ShardLayout: group by group in one flat range per dtype, buckets of bucket_mb of f32 gradient, each
world_size equal shards: _dist_layout.py); a rank holds optimizer state and f32 masters only for the slices of
params in its shards, steps them (the same fused engine over slice views of the params; LAMB's and LARS's
per-tensor norms summed over every rank's slices, as the C++ step does: _dist_shard.py) and all_gathers the
params. Overflow and the clipping norm are computed from the full averaged gradients, so all ranks agree
without another collective. On gloo, reduce_scatter is an all_reduce followed by a slice (docs/distributed.md
has the measurement): zero=1 all-reduces too and keeps p.grad the full average.

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
from ._dist_layout import Bucket, Flat, data_parallel_flats, sharded_flats
from ._dist_shard import Shard
from ._dist_state import cut_state, merge_shards
from ._tensors import DTYPE_CODES

__all__ = ["DistributedOptimizer"]


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps a fused optimizer (any fusedopt.Fused* class) for data-parallel training on a torch.distributed
    process group: see the module's docstring. zero: 0 (every rank holds all state) or 1 (state sharded: LAMB
    and LARS too, not AdamP, BertAdam or Adafactor); bucket_mb: the size of a gradient bucket (zero=1: in f32
    gradient bytes, as the C++ DistributedOptions::bucket_bytes counts them); process_group: default the world."""

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
        self._shard: Shard | None = None  # zero=1

        params = self._check_params(optimizer)
        # torch.optim.Optimizer's own set-up (hooks, step patching), then the wrapped optimizer's groups and state
        # in its place: LR schedulers and GradScaler see and change the wrapped optimizer's param_groups.
        super().__init__([{"params": params}], optimizer.defaults)
        self.param_groups = optimizer.param_groups
        self.defaults = optimizer.defaults
        self._step_supports_amp_scaling = True
        self._group_sizes = [len(g["params"]) for g in optimizer.param_groups]

        cap = int(bucket_mb * 2**20)
        if zero == 1:
            group_of = {}
            for gi, g in enumerate(optimizer.param_groups):
                for p in g["params"]:
                    group_of.setdefault(p, gi)
            # 8-bit states: each param starts on a block edge, so that every slice edge is one of its blocks'
            # edges and a slice's blocks and absmax are the whole tensor's (docs/8bit-states.md)
            tensor_align = _C.quant_block if optimizer._state_dtype_option is torch.uint8 else 1
            self._flats = sharded_flats(params, [group_of[p] for p in params], len(optimizer.param_groups), cap,
                                        self._world, tensor_align)
        else:
            self._flats = data_parallel_flats(params, cap, self._world)
        self._buckets: list[Bucket] = [b for f in self._flats for b in f.buckets]
        local_ranks = self._check_layout(optimizer)
        self._share_cpus(local_ranks)
        optimizer._accumulation_steps = 1  # the window is kept here: its sums are reduced before the update
        with torch.no_grad():  # every rank starts from rank 0's params
            if zero == 1:
                self._flatten_params()
                for f in self._flats:
                    dist.broadcast(f.flat_param, self._global_rank(0), group=process_group)
                self._shard = Shard(optimizer, self._flats, self._rank, self._world, process_group)
            else:
                for p in params:
                    dist.broadcast(p.data, self._global_rank(0), group=process_group)
        shard = self._shard.optimizer if self._shard is not None else None
        self.state = shard.state if shard is not None else optimizer.state
        # Through a weak reference: a model wrapped anew does not keep feeding an optimizer it no longer uses.
        # One closure per param, over its bucket and slot: the hook runs for every param in every backward.
        me = weakref.ref(self)

        def hook_of(f: Flat, k: int):
            def hook(p: torch.Tensor) -> None:
                optimizer = me()
                if optimizer is not None:
                    optimizer._grad_ready(p, f, k)
            return hook

        self._hooks = [p.register_post_accumulate_grad_hook(hook_of(f, k))
                       for f in self._flats for k, p in enumerate(f.params)]
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
        if self._zero == 1 and not _C.zero_one[optimizer._algorithm]["shards"]:
            raise ValueError(f"fusedopt.distributed: zero=1 needs an update that works element by element or on "
                             f"per-tensor sums; {type(optimizer).__name__} reads whole tensors (per-row sums, sums "
                             "across tensors or factors) and cannot step a slice of one: use zero=0")
        return params

    def _check_layout(self, optimizer) -> int:
        """Every rank must hold the same params in the same order (else buckets would pair different tensors):
        a hash of the layout, all-gathered; every rank names the first rank that differs. Returns the number
        of ranks on this host (LOCAL_WORLD_SIZE where torchrun set it, else counted from the hosts' names,
        gathered with the layout)."""
        text = repr((self._zero, type(optimizer).__name__, self._group_sizes,
                     [(f.dtype, [tuple(p.shape) for p in f.params], list(f.offsets),
                       [(b.begin, b.shard) for b in f.buckets]) for f in self._flats]))
        mine = torch.tensor([zlib.crc32(text.encode()), zlib.crc32(socket.gethostname().encode())],
                            dtype=torch.int64)
        hashes = [torch.zeros_like(mine) for _ in range(self._world)]
        dist.all_gather(hashes, mine, group=self._group)
        differ = [r for r, h in enumerate(hashes) if int(h[0]) != int(hashes[0][0])]
        if differ:
            raise ValueError(f"fusedopt.distributed: rank {differ[0]} holds other params than rank 0 (their "
                             "number, order, shapes or dtypes, or another optimizer, zero level or bucket_mb); "
                             "every rank must wrap the same model")
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
        for f in self._flats:
            f.flat_param = torch.zeros(f.numel, dtype=f.dtype)
            for k, p in enumerate(f.params):
                view = f.view(k, f.flat_param)
                view.copy_(p.detach())
                p.data = view

    # ---- backward ------------------------------------------------------------------------------------------
    def _grad_ready(self, p: torch.Tensor, f: Flat, k: int) -> None:
        """Post-accumulate-grad hook: p's gradient is final for this backward; f.grad_views[k] is its slot; the
        buckets it completes start their all_reduce."""
        if self._accumulation_steps > 1 or not self._sync:
            return  # reduced as f32 sums at the window's last step(), or by a later backward (no_sync)
        g, view = p.grad, f.grad_views[k]
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
        for b in f.buckets_of[k]:
            b.ready += 1
            if b.ready == len(b.params):
                b.work = dist.all_reduce(b.grad(), group=self._group, async_op=True)

    def _backward_done(self) -> None:
        """End of backward: buckets with a param that took no part start now (its slot holds zeros), then every
        reduction is waited for."""
        self._queued = False
        missing, seen = [], set()
        for b in self._buckets:
            if b.work is None:
                for k in b.params:
                    p, view = b.flat.params[k], b.flat.grad_views[k]
                    if (p.grad is None or p.grad.data_ptr() != view.data_ptr()) and id(p) not in seen:
                        seen.add(id(p))  # (a param in two buckets)
                        view.zero_()
                        missing.append(p)
                b.work = dist.all_reduce(b.grad(), group=self._group, async_op=True)
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
            full = [(f.flat_grad.data_ptr(), f.numel, DTYPE_CODES[f.dtype]) for f in self._flats]
        else:
            grads = [p.grad for f in self._flats for p in f.params if p.grad is not None]
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
            for f in self._flats:
                if f.sums is None:
                    f.sums = torch.zeros(f.numel, dtype=torch.float32)
                else:
                    f.sums.zero_()
        if torch_inf:
            self._window_skip = True
        else:
            scale = inv_scale / (k * self._world)
            for f in self._flats:
                for j, p in enumerate(f.params):
                    if p.grad is not None:
                        f.view(j, f.sums).add_(p.grad, alpha=scale)
        if found_out is not None and overflowed:
            found_out.fill_(1.0)
        self._micro_batches += 1
        if self._micro_batches < k:
            return
        self._micro_batches = 0
        works = [dist.all_reduce(f.sums, group=self._group, async_op=True) for f in self._flats]
        for w in works:
            w.wait()
        if self._window_skip:
            return
        sums = {p: f.view(j, f.sums) for f in self._flats for j, p in enumerate(f.params)}
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
                full = [(f.flat_grad.data_ptr(), f.numel, DTYPE_CODES[f.dtype]) for f in self._flats]
            else:
                full = [(f.sums.data_ptr(), f.numel, DTYPE_CODES[torch.float32]) for f in self._flats]
            non_finite, norm = _C.grad_norm(full, inner._norm_code, inv_scale, torch.get_num_threads())
            inner.last_grad_norm = norm if clip else None
            if non_finite:
                if found_out is not None:
                    found_out.fill_(1.0)
                return
        scale = inv_scale
        if clip:
            inner.last_grad_norm = norm
            coef = _C.clip_coefficient(norm, inner._max_grad_norm, inner._clip_rule)
            scale = float(torch.tensor(inv_scale, dtype=torch.float32) * torch.tensor(coef, dtype=torch.float32))
        try:
            grads = None if sums is None else {q: f.sums[a:a + q.numel()] for q, _, f, a in self._shard.grads}
            self._shard.update(scale, grads, inner)
        finally:
            # Also after this rank's update raised (its slices unchanged): the other ranks wait in the gather.
            self._gather_params()

    def _gather_params(self) -> None:
        works = []
        for b in self._buckets:
            bucket = b.param()
            mine = bucket[self._rank * b.shard:(self._rank + 1) * b.shard].clone()
            # .data: the gather's write does not bump the params' version counters (which would restart the
            # f32 masters from the params: see FusedOptimizerMixin._segment)
            works.append(dist.all_gather_single(bucket.data, mine, group=self._group, async_op=True))
        for w in works:
            w.wait()

    def _check_unchanged(self) -> None:
        """Params added, or (zero=1) moved out of their bucket by user code (p.data = ...), since wrapping."""
        if [len(g["params"]) for g in self._inner.param_groups] != self._group_sizes:
            raise RuntimeError("fusedopt.distributed: a parameter or group was added to the optimizer after "
                               "DistributedOptimizer wrapped it; build the optimizer with every param first")
        if self._zero == 1:
            for f in self._flats:
                for k, p in enumerate(f.params):
                    view = f.view(k, f.flat_param)
                    if p.data_ptr() != view.data_ptr():
                        view.copy_(p.detach())
                        p.data = view
                        if self._shard.optimizer is not None:
                            self._shard.optimizer.resync_master_weights()

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
        own = sum(f.sums.numel() * 4 for f in self._flats if f.sums is not None)
        if self._zero == 0:
            return self._inner.state_bytes() + own
        shard = self._shard.optimizer
        return (shard.state_bytes() if shard is not None else 0) + own

    def state_dict(self) -> dict:
        """zero=0: the wrapped optimizer's. zero=1: this rank's shard, its params the slices, with their place
        in "zero" (world_size, rank, and per slice: the param's index in the wrapped optimizer, start, stop);
        consolidate_state_dict gives a plain torch-format state_dict."""
        if self._zero == 0:
            return self._inner.state_dict()
        shard = self._shard.optimizer
        shard = shard.state_dict() if shard is not None else {"state": {}, "param_groups": []}
        return {"state": shard["state"], "param_groups": self._inner.state_dict()["param_groups"],
                "zero": {"world_size": self._world, "rank": self._rank, "slices": list(self._shard.meta)}}

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
        state = merge_shards(shards, params, self._state_key_kinds())
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
                    tuple(s) for s in zero["slices"]] != [tuple(s) for s in self._shard.meta]:
                raise ValueError(f"fusedopt.distributed: a shard of rank {zero['rank']} of {zero['world_size']} "
                                 f"does not fit rank {self._rank} of {self._world}; load the result of "
                                 "consolidate_state_dict to change the world size")
            shard_state = state_dict["state"]
        else:
            shard_state = cut_state(self._decoded_8bit(state_dict["state"]), self._shard.meta,
                                    self._state_key_kinds())
        self._inner.load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        shard = self._shard.optimizer
        if shard is not None:
            groups = shard.state_dict()["param_groups"]
            for gi, g in zip(self._shard.groups, groups):
                g.update({k: v for k, v in self._inner.param_groups[gi].items()
                          if k not in ("params", "param_names")})
            shard.load_state_dict({"state": shard_state, "param_groups": groups})

    def _decoded_8bit(self, state: dict) -> dict:
        """A whole state with 8-bit codes, for a wrapped optimizer without 8-bit states: the codes decoded to f32
        before they are cut (their blocks need not start where this layout's slices do), as one process decodes
        them at its next step."""
        inner = self._inner
        if inner._state_dtype_option is torch.uint8:
            return state
        out = {}
        for i, entry in state.items():
            entry = dict(entry)
            for key in inner._slot_keys:
                codes, absmax = entry.get(key), entry.get(inner._absmax_key(key))
                if isinstance(codes, torch.Tensor) and codes.dtype == torch.uint8 and absmax is not None:
                    del entry[inner._absmax_key(key)]
                    entry[key] = inner._dequantized(codes, absmax, key, f"state '{key}' of parameter {i}")
            out[i] = entry
        return out

    def _state_key_kinds(self) -> dict[str, str]:
        """The state keys merge_shards and cut_state do not cut element by element: 8-bit absmax ("blocks") and
        bitsandbytes' maps ("whole")."""
        inner = self._inner
        kinds = dict.fromkeys(inner._per_tensor_state_keys, "whole")
        if inner._state_dtype_option is torch.uint8:
            kinds.update(dict.fromkeys((inner._absmax_key(k) for k in inner._slot_keys), "blocks"))
        return kinds

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
