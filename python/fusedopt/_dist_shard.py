"""The optimizer of one rank's ZeRO-1 shards (fusedopt.distributed, zero=1): the wrapped optimizer's class and
options over views of the pieces of params in this rank's shards (_dist_layout.shard_slices), its state
shard-sized.

An element-wise update steps a piece exactly as it steps the whole tensor. LAMB's and LARS's coefficients come
from norms over whole tensors: their shard steps through _C's <name>_step_with_sums, whose hook (the one the
C++ DistributedOptimizer's ZeRO-1 step uses, src/core/step_hooks.h) replaces each piece's sums with its
tensor's, added up over every rank's pieces: each rank's sums packed, all-gathered and added in the order of the
flat range (bucket, then rank) by _C.ShardSums, the code fusedopt::DistributedOptimizer::WholeTensorSums runs:
with shards of whole chunks, the one-process sums bit for bit."""

from __future__ import annotations

import math

import torch.distributed as dist

import torch

from . import _C
from ._dist_layout import Flat, shard_slices
from ._shards import stepped_report


class Shard:
    """This rank's shard optimizer (`optimizer`, None when its shards hold only padding) and where its params
    lie: per shard param, in order, (its view, its gradient slot, its Flat, its offset in the Flat); `meta`
    (param index in the wrapped optimizer, start, stop); `groups`, the wrapped optimizer's group of each of
    its groups; `sums`, the whole-tensor sums of LAMB and LARS (None for the element-wise algorithms)."""

    def __init__(self, optimizer, flats: list[Flat], rank: int, world: int, process_group):
        index, group_of = {}, {}  # a param's position in the wrapped optimizer's groups, and its group
        for i, (gi, q) in enumerate((gi, q) for gi, g in enumerate(optimizer.param_groups) for q in g["params"]):
            index.setdefault(q, i)
            group_of.setdefault(q, gi)
        per_group: list[list] = [[] for _ in optimizer.param_groups]
        for flat, bucket, k, first, n in shard_slices(flats, rank):
            per_group[group_of[flat.params[k]]].append((flat, bucket, k, first, n))
        tensor_ids = {}  # every param of every flat, numbered in flat order (the sums' tensor index)
        for flat in flats:
            for p in flat.params:
                tensor_ids[p] = len(tensor_ids)
        self.grads: list[tuple[torch.Tensor, torch.Tensor, Flat, int]] = []
        self.meta: list[tuple[int, int, int]] = []
        keys: list[tuple[int, int]] = []  # per shard param: (tensor index, bucket index) for the sums
        groups, offsets, whole_numels = [], {}, {}
        for gi, items in enumerate(per_group):
            hyper = {k: v for k, v in optimizer.param_groups[gi].items() if k not in ("params", "param_names")}
            views = []
            for flat, bucket, k, first, n in items:
                p, a = flat.params[k], flat.offsets[k] + first
                q = flat.flat_param[a:a + n]
                q.requires_grad_(True)
                views.append(q)
                offsets[q] = optimizer._global_offset(p) + first  # stochastic rounding keyed on the whole model
                whole_numels[q] = p.numel()  # 8-bit states or not: the whole tensor's size decides
                self.grads.append((q, flat.flat_grad[a:a + n], flat, a))
                self.meta.append((index[p], first, first + n))
                keys.append((tensor_ids[p], bucket))
            groups.append({"params": views, **hyper})
        self.groups = [gi for gi, g in enumerate(groups) if g["params"]]
        entry = _C.zero_one[optimizer._algorithm]
        step = entry["step_with_sums"]
        self.sums = None
        if step is not None:
            self.sums = TensorSums(keys, entry["reductions"], sum(len(f.buckets) for f in flats),
                                   len(tensor_ids), rank, world, process_group)
        self.optimizer = None
        if offsets:  # else a tiny model on many ranks: this rank's shards hold only padding
            cls = type(optimizer) if step is None else _with_sums(type(optimizer), step, self.sums)
            self.optimizer = cls([g for g in groups if g["params"]], **_shard_options(optimizer))
            self.optimizer._offsets = offsets
            self.optimizer._whole_numels = whole_numels

    def update(self, scale: float, grads: dict | None, inner) -> None:
        """Steps this rank's pieces from their gradient slots (or grads[view]: f32 sums), every gradient read as
        grad * scale, with the wrapped optimizer's current hyper-parameters. Collective with LAMB and LARS:
        every rank completes the sums once, also when it has nothing to step or its step raised."""
        if self.sums is not None:
            self.sums.called = False
        try:
            if self.optimizer is not None:
                # LR schedules change the wrapped optimizer's groups
                for gi, si in zip(self.groups, self.optimizer.param_groups):
                    for key, value in inner.param_groups[gi].items():
                        if key not in ("params", "param_names"):
                            si[key] = value
                if grads is None:
                    for q, g, _, _ in self.grads:
                        q.grad = g
                try:
                    self.optimizer._update(scale, None, grads)
                finally:
                    for q, _, _, _ in self.grads:
                        q.grad = None
        finally:
            if self.sums is not None and not self.sums.called:
                self.sums([], self.sums.k)  # the other ranks' collective: join it


class TensorSums:
    """The hook of a LAMB or LARS shard step: sums(piece sums, k) -> each piece's tensor's sums over every
    rank (collective). keys: per piece (segment), its tensor's index and its bucket's; k: sums per piece. The
    packing, the order of the additions and the unpacking are the C++ layer's (_C.ShardSums,
    src/distributed/shard_sums.h); only the gather is torch.distributed's."""

    def __init__(self, keys: list[tuple[int, int]], k: int, buckets: int, tensors: int, rank: int, world: int,
                 process_group):
        self.plan = _C.ShardSums(keys, buckets, tensors, k)
        self.pieces, self.k = len(keys), k
        self.rank, self.world, self.group = rank, world, process_group
        self.called = False

    def __call__(self, sums: list[float], k: int) -> list[float]:
        self.called = True
        if k != self.k or len(sums) not in (0, self.pieces * k):
            raise RuntimeError(f"fusedopt.distributed: {len(sums)} sums of {k} for {self.pieces} pieces of "
                               f"{self.k} (internal error)")
        partial = torch.zeros(self.world, self.plan.per_rank, dtype=torch.float64)
        mine = partial[self.rank]
        if sums:  # else this rank stepped nothing (it joins the others' collective): zeros
            self.plan.pack(sums, mine.data_ptr(), mine.numel())
        if self.world > 1:
            dist.all_gather_into_tensor(partial.view(-1), mine.clone(), group=self.group)
        return self.plan.add(self.world, partial.data_ptr(), partial.numel())


def _with_sums(cls, step, sums: TensorSums):
    """cls, its engine step replaced by `step` (an <algorithm>_step_with_sums of _C) calling `sums` between the
    reduction and the update. The shard's steps run no pre-pass (DistributedOptimizer clips and checks over
    every rank) and no accumulation (kept by DistributedOptimizer)."""
    plain = cls._engine_step

    def engine_step(hypers, table, grads, codes, grad_scale, num_threads, max_norm=math.inf, norm_type=2,
                    clip_rule=0, check=False, wave_ends=None, micro_batch=None):
        if not grads:  # a check of the hyper-parameters with an empty table: no step, no collective
            return plain(hypers, table, grads, codes, grad_scale, num_threads, max_norm, norm_type, clip_rule,
                         check)
        if check or max_norm != math.inf or micro_batch is not None or (wave_ends and len(wave_ends) > 1):
            raise RuntimeError("fusedopt.distributed: a ZeRO-1 shard step takes no pre-pass, accumulation or "
                               "waves (internal error)")
        step(hypers, table, grads, codes, grad_scale, num_threads, sums)
        return stepped_report()

    return type(cls.__name__, (cls,), {"_engine_step": staticmethod(engine_step), "_engine_prepare": None,
                                       "__module__": cls.__module__, "__qualname__": cls.__qualname__})


def _shard_options(optimizer) -> dict:
    """The constructor options of the shard optimizer: the wrapped one's, but for clipping and accumulation,
    which DistributedOptimizer does over all ranks."""
    stochastic, seed = optimizer._rounding
    return {**optimizer._constructor_hypers(), "max_grad_norm": None,
            "master_weights": optimizer._master_weights, "state_dtype": optimizer._state_dtype_option,
            "min_8bit_size": optimizer._min_8bit_size, "stochastic_rounding": stochastic, "seed": seed,
            "strict": optimizer._strict}
