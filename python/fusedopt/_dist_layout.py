"""Where fusedopt.distributed's gradients and params lie: flat buffers of one dtype, cut into the buckets each
collective reduces.

zero=0 lays the params out as DistributedDataParallel does: in reverse registration order (backward makes the
last layers' gradients first), a new flat buffer when the dtype changes or bucket_mb is full, each buffer one
bucket. zero=1 takes the C++ layer's layout, fusedopt::ShardLayout (include/fusedopt/distributed.h, bound as
_C.ShardLayout): the params of each dtype group by group in one flat range, cut into buckets of P equal
shards (of whole chunks where the model is large enough), rank r owning shard r of every bucket. Its shards
are the ones fusedopt::DistributedOptimizer holds, element for element, and the whole-tensor sums of LAMB and
LARS add up in the C++ order (_dist_shard.py). With 8-bit states each param starts on a 256-element block edge
(ShardLayout's tensor_align), which the C++ optimizer, without 8-bit states, never asks for."""

from __future__ import annotations

import torch

from . import _C


class Flat:
    """Params of one dtype laid end to end in `flat_grad` at `offsets` (and with zero=1 in `flat_param`, which
    the params then view), `numel` elements with the padding (and with 8-bit states at zero=1, the gaps that
    start each param on a block edge: zeros that nothing reads)."""

    def __init__(self, dtype: torch.dtype, params: list[torch.Tensor], offsets: list[int], numel: int):
        self.dtype = dtype
        self.params = params
        self.offsets = offsets
        self.numel = numel
        self.flat_grad = torch.zeros(numel, dtype=dtype)
        self.grad_views = [self.flat_grad[o:o + p.numel()].view(p.shape) for o, p in zip(offsets, params)]
        self.flat_param: torch.Tensor | None = None
        self.sums: torch.Tensor | None = None  # f32 gradient sums of an accumulation window
        self.layout = None  # zero=1: its _C.ShardLayout
        self.buckets: list[Bucket] = []
        self.buckets_of: list[list[Bucket]] = [[] for _ in params]  # per param: the buckets it has elements in

    def view(self, k: int, flat: torch.Tensor) -> torch.Tensor:
        """Param k's place in `flat` (flat_param, flat_grad or sums), in its shape."""
        p = self.params[k]
        return flat[self.offsets[k]:self.offsets[k] + p.numel()].view(p.shape)

    def add_bucket(self, begin: int, shard: int, world: int) -> None:
        """The bucket [begin, begin + world * shard): world shards of `shard` elements."""
        b = Bucket(self, begin, shard, world)
        for k, p in enumerate(self.params):
            if self.offsets[k] < b.end and b.begin < self.offsets[k] + p.numel():
                b.params.append(k)
                self.buckets_of[k].append(b)
        self.buckets.append(b)


class Bucket:
    """One collective's range of a Flat: [begin, end), world shards of `shard` elements; `params`, the indices
    of the Flat's params with elements in it."""

    def __init__(self, flat: Flat, begin: int, shard: int, world: int):
        self.flat = flat
        self.begin = begin
        self.shard = shard
        self.end = begin + world * shard
        self.params: list[int] = []
        self.ready = 0  # params whose gradient reached its slot in this backward
        self.work = None  # the in-flight all_reduce

    def grad(self) -> torch.Tensor:
        return self.flat.flat_grad[self.begin:self.end]

    def param(self) -> torch.Tensor:
        return self.flat.flat_param[self.begin:self.end]

    def shard_of(self, rank: int) -> tuple[int, int]:
        """Rank's shard as a range of the flat, without the padding past the params (possibly empty)."""
        lo = self.begin + rank * self.shard
        return lo, max(lo, min(lo + self.shard, self.flat.layout.numel))


def data_parallel_flats(params: list[torch.Tensor], cap: int, world: int) -> list[Flat]:
    """zero=0: a Flat per bucket, in reverse registration order, a new one when the dtype changes or the
    bucket is full (bucket_mb: `cap` bytes), each padded to a multiple of world."""
    groups, current, size = [], [], 0
    for p in reversed(params):
        if current and (p.dtype != current[0].dtype or size + p.numel() * p.element_size() > cap):
            groups.append(current)
            current, size = [], 0
        current.append(p)
        size += p.numel() * p.element_size()
    groups.append(current)
    flats = []
    for members in groups:
        offsets, total = [], 0
        for p in members:
            offsets.append(total)
            total += p.numel()
        numel = -(-total // world) * world
        flat = Flat(members[0].dtype, members, offsets, numel)
        flat.add_bucket(0, numel // world, world)
        flats.append(flat)
    return flats


def sharded_flats(params: list[torch.Tensor], group_of: list[int], num_groups: int, cap: int,
                  world: int, tensor_align: int = 1) -> list[Flat]:
    """zero=1: a Flat per dtype (in the order of their first param) laid out by _C.ShardLayout: params in
    registration order (group by group: `params` is), each starting at a multiple of tensor_align, buckets of
    `cap` bytes of f32 gradient (as DistributedOptions::bucket_bytes counts them), shards aligned as its
    shard_align = 0 picks."""
    flats = []
    for dtype in dict.fromkeys(p.dtype for p in params):
        members = [i for i, p in enumerate(params) if p.dtype == dtype]
        layout = shard_layout([params[i] for i in members], [group_of[i] for i in members], num_groups,
                              world, cap, tensor_align=tensor_align)
        flat = Flat(dtype, [params[i] for i in members], list(layout.offsets), layout.padded)
        flat.layout = layout
        for begin, shard, _ in layout.buckets:
            flat.add_bucket(begin, shard, world)
        flats.append(flat)
    return flats


def shard_layout(params: list[torch.Tensor], groups: list[int], num_groups: int, world: int, bucket_bytes: int,
                 align: int = 0, tensor_align: int = 1):
    """The _C.ShardLayout of these params (with their group indices), as the C++ DistributedOptimizer builds
    it from TensorSpecs. Rows and columns are left 0: they only matter to the algorithms zero=1 refuses."""
    return _C.ShardLayout([(p.numel(), g, 0, 0) for p, g in zip(params, groups)], num_groups, world,
                          bucket_bytes, align, tensor_align)


def shard_slices(flats: list[Flat], rank: int) -> list[tuple[Flat, int, int, int, int]]:
    """zero=1: the params' pieces in rank's shards, in flat order, as (flat, its bucket's index over all
    flats, param index in the flat, first element of the param, number of elements)."""
    out, bucket_index = [], 0
    for flat in flats:
        for b in flat.buckets:
            lo, hi = b.shard_of(rank)
            if lo < hi:
                for k, first, n in flat.layout.slices_in(lo, hi):
                    out.append((flat, bucket_index, k, first, n))
            bucket_index += 1
    return out
