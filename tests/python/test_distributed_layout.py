"""fusedopt.distributed.DistributedOptimizer(zero=1) shards as the C++ fusedopt::DistributedOptimizer does, and
steps LAMB and LARS with their norms over whole tensors.

Layout: on 1, 2 and 3 gloo ranks (tests/python/dist_harness.py), each rank's shard pieces (state_dict's "zero"
slices, the sizes of its state tensors) and where the params lie in the flat buffers must be what the C++
fusedopt::ShardLayout (bound as _C.ShardLayout, the class the C++ optimizer builds its layout with) computes
from the same tensor specs, world size and bucket size, element for element.

LAMB and LARS: zero=1 cuts tensors across ranks; each piece's sums (||w||^2 and the update's) are completed
over every rank before the coefficients. With the same gradients on every rank (so the all-reduced gradients
are the same bits at every zero level) and shards of whole chunks (a model of at least 8 * P * 32768
elements), zero=1's params equal zero=0's bit for bit, as the C++ DistributedOptimizer's do; with a small
model (shards of 256 elements) and each rank's share of the batch, they stay within 1e-6 of a one-process
step on the whole batch."""

from __future__ import annotations

import fusedopt
import fusedopt.distributed
import pytest
import torch.distributed as dist
from dist_harness import run_ranks
from fusedopt import _C

import torch

pytestmark = pytest.mark.xdist_group("distributed")

WORLDS = (1, 2, 3)
STEPS = 4
BATCH = 12  # divisible by every world size
# name: (param shapes, the index where the second param group starts (None: one group), dtypes, bucket_mb)
LAYOUTS = {
    "mlp-one-bucket": ([(600, 64), (600,), (4, 600), (4,)], None, None, 25.0),
    "mlp-small-buckets": ([(600, 64), (600,), (4, 600), (4,)], None, None, 0.05),
    "two-groups": ([(300, 130), (300,), (7, 300), (7,), (5,)], 2, None, 0.1),
    "large-whole-chunks": ([(1024, 800), (1024,), (3, 1024)], None, None, 1.0),
    "mixed-dtypes": ([(200, 64), (200,), (10, 200), (10,)], None, [torch.float32, torch.bfloat16] * 2, 0.02),
}
KW = {"LAMB": dict(lr=1e-2, weight_decay=0.01), "LARS": dict(lr=0.1, momentum=0.9, weight_decay=1e-4)}


def _params(shapes, dtypes) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    dtypes = dtypes or [torch.float32] * len(shapes)
    return [torch.nn.Parameter(torch.randn(s).to(d)) for s, d in zip(shapes, dtypes)]


def _groups(params, split) -> list[dict]:
    if split is None:
        return [{"params": params}]
    return [{"params": params[:split]}, {"params": params[split:], "lr": 5e-3}]


def rank_layouts() -> dict:
    """Per layout: each param's offset in its flat buffer, the buckets, and this rank's shard pieces."""
    out = {}
    for name, (shapes, split, dtypes, bucket_mb) in LAYOUTS.items():
        params = _params(shapes, dtypes)
        opt = fusedopt.distributed.DistributedOptimizer(fusedopt.FusedAdamW(_groups(params, split), lr=1e-3),
                                                        zero=1, bucket_mb=bucket_mb)
        for p in params:
            p.grad = torch.ones_like(p)  # a step allocates the shard's state
        opt.step()
        where = {}
        for f in opt._flats:
            for p in f.params:
                index = next(i for i, q in enumerate(params) if q is p)
                where[index] = (str(f.dtype), (p.data_ptr() - f.flat_param.data_ptr()) // p.element_size())
        shard = opt.state_dict()
        out[name] = {"where": where,
                     "buckets": {str(f.dtype): [(b.begin, b.shard) for b in f.buckets] for f in opt._flats},
                     "slices": [tuple(s) for s in shard["zero"]["slices"]],
                     "state_numel": [shard["state"][n]["exp_avg"].numel() for n in range(len(shard["zero"]["slices"]))],
                     "consolidated": opt.consolidate_state_dict(to=0)}
    # Another bucket size on rank 1 (so other buckets): every rank refuses it, rather than pairing different
    # elements in the collectives.
    params = _params(*LAYOUTS["mlp-small-buckets"][0:1], None)
    try:
        fusedopt.distributed.DistributedOptimizer(fusedopt.FusedAdamW(params), zero=1,
                                                  bucket_mb=0.1 if dist.get_rank() == 1 else 0.05)
        out["bucket_mb_error"] = None
    except ValueError as e:
        out["bucket_mb_error"] = str(e)
    return out


@pytest.fixture(scope="module", params=WORLDS)
def layouts(request) -> tuple[int, list[dict]]:
    return request.param, run_ranks("test_distributed_layout:rank_layouts", request.param, timeout=240)


def _expected(shapes, split, dtypes, bucket_mb, world: int):
    """The C++ layout of each dtype's params: {dtype: (offsets by param index, [(begin, shard)], per rank the
    pieces (param index, start, stop))}."""
    dtypes = [str(d) for d in (dtypes or [torch.float32] * len(shapes))]
    groups = [0 if split is None or i < split else 1 for i in range(len(shapes))]
    out = {}
    for dtype in dict.fromkeys(dtypes):
        members = [i for i, d in enumerate(dtypes) if d == dtype]
        specs = [(torch.Size(shapes[i]).numel(), groups[i], 0, 0) for i in members]
        layout = _C.ShardLayout(specs, 1 if split is None else 2, world, int(bucket_mb * 2**20))
        pieces = []
        for rank in range(world):
            mine = []
            for begin, shard, _ in layout.buckets:
                lo = begin + rank * shard
                hi = min(lo + shard, layout.numel)
                if lo < hi:
                    mine += [(members[t], first, first + n) for t, first, n in layout.slices_in(lo, hi)]
            pieces.append(mine)
        out[dtype] = ({members[t]: o for t, o in enumerate(layout.offsets)},
                      [(begin, shard) for begin, shard, _ in layout.buckets], pieces)
    return out


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_zero1_shards_are_the_cpp_layout(layouts, name):
    world, ranks = layouts
    shapes, split, dtypes, bucket_mb = LAYOUTS[name]
    expected = _expected(shapes, split, dtypes, bucket_mb, world)
    for rank, got in enumerate(ranks):
        got = got[name]
        assert got["buckets"] == {d: e[1] for d, e in expected.items()}, f"rank {rank}"
        for index, (dtype, offset) in got["where"].items():
            assert offset == expected[dtype][0][index], f"rank {rank}: param {index}"
        # The shard optimizer's params are grouped by the wrapped optimizer's groups: the same pieces, in
        # the flat order of each group.
        pieces = sorted(p for e in expected.values() for p in e[2][rank])
        assert sorted(got["slices"]) == pieces, f"rank {rank}"
        assert got["state_numel"] == [stop - start for _, start, stop in got["slices"]]
    # Every element is in exactly one rank's shard: the consolidated state is whole.
    consolidated = ranks[0][name]["consolidated"]
    assert ranks[-1][name]["consolidated"] is None or world == 1
    params = _params(shapes, dtypes)
    for i, p in enumerate(params):
        assert consolidated["state"][i]["exp_avg"].shape == p.shape


def test_ranks_with_other_bucket_sizes_refuse_together(layouts):
    world, ranks = layouts
    for rank in ranks:
        if world == 1:
            assert rank["bucket_mb_error"] is None
        else:
            assert "rank 1 holds other params than rank 0" in rank["bucket_mb_error"]


def _big_model() -> torch.nn.Module:
    torch.manual_seed(0)  # 8 * 3 * 32768 elements and more: shards of whole chunks at every world size here
    return torch.nn.Sequential(torch.nn.Linear(64, 12800), torch.nn.Tanh(), torch.nn.Linear(12800, 4))


def _small_model() -> torch.nn.Module:
    torch.manual_seed(0)  # one weight is over the engine's 32768-element chunk
    return torch.nn.Sequential(torch.nn.Linear(64, 600), torch.nn.Tanh(), torch.nn.Linear(600, 4))


def _tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)  # 256 elements, one 256-element shard: the other ranks' shards are padding only
    return torch.nn.Linear(64, 4, bias=False)


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, 64, generator=g), torch.randn(BATCH, 4, generator=g)


def _train(model, opt, rank: int, world: int, shared: bool) -> None:
    """STEPS steps on this rank's share of each batch (shared: the whole batch on every rank)."""
    for step in range(STEPS):
        x, y = _data(step)
        if not shared:
            share = BATCH // world
            x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def rank_whole_tensor_norms() -> dict:
    """LAMB and LARS at zero=0 and zero=1: the big and tiny models with every rank's gradients the same (the
    big one also accumulating over 2 micro-batches), the small one with each rank's share of the batch."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for algo in KW:
        for size, make, shared, options in (("big", _big_model, True, {}), ("small", _small_model, False, {}),
                                            ("tiny", _tiny_model, True, {}),
                                            ("accumulate", _big_model, True, {"accumulation_steps": 2})):
            for zero in (0, 1):
                model = make()
                inner = getattr(fusedopt, f"Fused{algo}")(model.parameters(), **KW[algo], **options)
                opt = fusedopt.distributed.DistributedOptimizer(inner, zero=zero, bucket_mb=0.5)
                _train(model, opt, rank, world, shared)
                out[f"{algo}-{size}-zero{zero}"] = [p.detach().clone() for p in model.parameters()]
                if size == "big":
                    out[f"{algo}-state-zero{zero}"] = opt.consolidate_state_dict(to=0)
    return out


@pytest.fixture(scope="module", params=WORLDS)
def norms(request) -> tuple[int, list[dict]]:
    return request.param, run_ranks("test_distributed_layout:rank_whole_tensor_norms", request.param, timeout=300)


def _one_process(algo: str) -> list[torch.Tensor]:
    model = _small_model()
    opt = getattr(fusedopt, f"Fused{algo}")(model.parameters(), **KW[algo])
    _train(model, opt, 0, 1, True)
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("algo", list(KW))
def test_zero1_takes_lamb_and_lars_with_whole_tensor_norms(norms, algo):
    world, ranks = norms
    for rank in ranks[1:]:
        for key, params in rank.items():
            if "state" in key:
                continue
            assert all(torch.equal(a, b) for a, b in zip(params, ranks[0][key])), f"{key}: the ranks' params differ"
    # Whole-chunk shards and the same gradients: zero=1 is zero=0, bit for bit; and so with one rank holding
    # every piece (the tiny model: each tensor's sums are that rank's own).
    for size in ("big", "tiny", "accumulate"):
        for a, b in zip(ranks[0][f"{algo}-{size}-zero1"], ranks[0][f"{algo}-{size}-zero0"], strict=True):
            assert torch.equal(a, b), f"{algo} {size}: zero=1 differs from zero=0 ({(a - b).abs().max():.3g})"
    # And so are the states, gathered whole from the shards.
    sharded, whole = ranks[0][f"{algo}-state-zero1"], ranks[0][f"{algo}-state-zero0"]
    assert sharded["state"].keys() == whole["state"].keys()
    for i, entry in whole["state"].items():
        assert sharded["state"][i].keys() == entry.keys()
        for key, value in entry.items():
            assert torch.equal(torch.as_tensor(sharded["state"][i][key]), torch.as_tensor(value)), (i, key)
    # Each rank's share of the batch: both within 1e-6 of one process on the whole batch.
    expected = _one_process(algo)
    for zero in (0, 1):
        for a, e in zip(ranks[0][f"{algo}-small-zero{zero}"], expected, strict=True):
            error = torch.linalg.vector_norm(a.double() - e.double()) / torch.linalg.vector_norm(e.double())
            assert error <= 1e-6, f"zero={zero} on {world} rank(s): relative difference {error:.3g}"
