"""fusedopt.distributed.DistributedOptimizer on 2 gloo ranks (tests/python/dist_harness.py starts them).

The reference is torch.optim's twin in one process on the whole batch: each rank trains on its half, so the
average of the ranks' gradients is the whole batch's mean gradient, and every option (clipping, a loss
scaler whose injected Inf on one rank makes every rank skip, accumulation over micro-batches of a quarter of
the batch) must give the one-process run's params. Process starts dominate the cost: one run_ranks call
trains every case, and the tests read its results."""

from __future__ import annotations

import contextlib
import io
import math
import os

import fusedopt
import fusedopt.distributed
import pytest
import torch.distributed as dist
from dist_harness import run_ranks

import torch

# Its ranks run once, on one xdist worker (scripts/test: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("distributed")

STEPS = 20
BATCH = 16
INF_STEP = 5  # the step whose loss is Inf on rank 1 only, in the cases with a scaler
CASES = {  # name: (algorithm, zero, variant)
    f"{algo}-zero{zero}-{variant}": (algo, zero, variant)
    for algo in ("AdamW", "SGD") for zero in (0, 1)
    for variant in ("clip", "torch_scaler", "fused_scaler", "accumulate", "accumulate_scaler", "schedule", "no_sync")
}
# "schedule": a torch LR scheduler on the DistributedOptimizer, and zero_grad(set_to_none=False), so that the
# gradients accumulate in place in their bucket slots. "no_sync": two backward passes per step, the first
# under opt.no_sync() (DDP's way to accumulate).
KW = {"AdamW": dict(lr=1e-2, weight_decay=0.1), "SGD": dict(lr=0.05, momentum=0.9, nesterov=True)}
TRAINER_STEPS = 6
TWINS = [("FusedAdam8bit", dict(lr=1e-2)), ("FusedLion8bit", dict(lr=1e-3, weight_decay=0.1)),
         ("FusedSGD8bit", dict(lr=1e-2, momentum=0.9)), ("FusedRMSprop8bit", dict(lr=1e-3, alpha=0.9)),
         ("FusedAdagrad8bit", dict(lr=1e-2)), ("FusedPagedAdamW8bit", dict(lr=1e-2))]
MAX_NORM = 0.05  # below the gradients' norm: clipping is active at every step


def _model() -> torch.nn.Module:
    torch.manual_seed(0)  # one weight is over the engine's 32768-element chunk
    return torch.nn.Sequential(torch.nn.Linear(64, 600), torch.nn.Tanh(), torch.nn.Linear(600, 4))


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, 64, generator=g), torch.randn(BATCH, 4, generator=g)


def _options(variant: str) -> dict:
    options = {"max_grad_norm": MAX_NORM} if variant in ("clip", "accumulate") else {}
    if variant.startswith("accumulate"):
        options["accumulation_steps"] = 2
    return options


def _train(model, opt, variant: str, rank: int, world: int, steps: int, first: int = 0) -> None:
    """`steps` steps on this rank's share of each batch (micro-batches of half of it with accumulation)."""
    scaler = None
    if variant in ("torch_scaler",):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    elif variant in ("fused_scaler", "accumulate_scaler"):
        scaler = fusedopt.GradScaler(init_scale=2.0**10)
    micro = 2 if variant.startswith("accumulate") or variant == "no_sync" else 1
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5) if variant == "schedule" else None
    for step in range(first, first + steps):
        x, y = _data(step)
        share = BATCH // world
        dtype = next(model.parameters()).dtype
        x, y = (t[rank * share:(rank + 1) * share].to(dtype) for t in (x, y))
        for m in range(micro):
            part = slice(m * share // micro, (m + 1) * share // micro)
            loss = torch.nn.functional.mse_loss(model(x[part]), y[part])
            if scaler is not None and step == INF_STEP and rank == world - 1 and m == micro - 1:
                loss = loss * math.inf
            if variant == "no_sync":
                with opt.no_sync() if m == 0 else contextlib.nullcontext():
                    (loss / micro).backward()
                continue
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            opt.zero_grad(set_to_none=schedule is None)
        if variant == "no_sync":
            opt.step()
            opt.zero_grad()
        if schedule is not None:
            schedule.step()


def _reference(algo: str, variant: str, steps: int = STEPS) -> torch.nn.Module:
    """torch.optim in one process on the whole batch; the scaler cases skip INF_STEP."""
    model = _model()
    opt = getattr(torch.optim, algo)(model.parameters(), foreach=False, **KW[algo])
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5) if variant == "schedule" else None
    for step in range(steps):
        x, y = _data(step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        if "clip" in variant or variant == "accumulate":
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        if not ("scaler" in variant and step == INF_STEP):
            opt.step()
        opt.zero_grad()
        if schedule is not None:
            schedule.step()
    return model


def _fused(algo: str, model, **options):
    return getattr(fusedopt, f"Fused{algo}")(model.parameters(), **KW[algo], **options)


def rank_cases(resume_state: dict, checkpoint_dir: str) -> dict:
    """Every case of CASES, then the state and resume checks; returns what the tests compare."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {"params": {}, "state_bytes": {}}
    for name, (algo, zero, variant) in CASES.items():
        model = _model()
        opt = fusedopt.distributed.DistributedOptimizer(_fused(algo, model, **_options(variant)), zero=zero,
                                                        bucket_mb=0.05)  # several buckets
        _train(model, opt, variant, rank, world, STEPS)
        out["params"][name] = [p.detach().clone() for p in model.parameters()]
        if variant == "clip":
            out["state_bytes"][name] = opt.state_bytes()
        if variant == "clip" and algo == "AdamW":
            out[f"state_dict-zero{zero}"] = opt.consolidate_state_dict(to=0)
    # bf16 params with f32 masters and stochastic rounding: zero=1's slices step exactly as zero=0's whole tensors.
    for zero in (0, 1):
        model = _model().to(torch.bfloat16)
        opt = fusedopt.distributed.DistributedOptimizer(
            _fused("AdamW", model, master_weights=True, stochastic_rounding=True, seed=7), zero=zero, bucket_mb=0.05)
        _train(model, opt, "plain", rank, world, STEPS // 2)
        out[f"bf16-zero{zero}"] = [p.detach().clone() for p in model.parameters()]
        out[f"bf16-masters-zero{zero}"] = opt.consolidate_state_dict(to=0)
        # pure bf16 SGD, whose noise follows state['rounding_step'] (torch's SGD counts no steps)
        model = _model().to(torch.bfloat16)
        opt = fusedopt.distributed.DistributedOptimizer(_fused("SGD", model, stochastic_rounding=True, seed=7),
                                                        zero=zero, bucket_mb=0.05)
        _train(model, opt, "plain", rank, world, STEPS // 2)
        out[f"bf16-sgd-zero{zero}"] = [p.detach().clone() for p in model.parameters()]
        out[f"bf16-sgd-state-zero{zero}"] = opt.state_dict() if zero == 0 else opt.consolidate_state_dict(to=0)
    # 8-bit states (both weights': the second, of 2400 elements, starts at element 39168 and is cut by shard
    # edges; the biases are under min_8bit_size): zero=0 steps whole tensors on every rank; zero=1's slices start
    # on block edges, so it steps them as zero=0 does. Its shards merged, and a whole state cut into them and
    # merged again, are the whole state.
    for name, make in (("8bit", lambda m: fusedopt.FusedAdamW8bit(m.parameters(), **KW["AdamW"], min_8bit_size=1024)),
                       ("uint8", lambda m: _fused("SGD", m, state_dtype=torch.uint8, min_8bit_size=1024))):
        for zero in (0, 1):
            model = _model()
            opt = fusedopt.distributed.DistributedOptimizer(make(model), zero=zero, bucket_mb=0.05)
            _train(model, opt, "plain", rank, world, STEPS // 2)
            out[f"{name}-zero{zero}"] = [p.detach().clone() for p in model.parameters()]
            out[f"{name}-state-zero{zero}"] = opt.state_dict() if zero == 0 else opt.consolidate_state_dict(to=0)
            out["state_bytes"][f"{name}-zero{zero}"] = opt.state_bytes()
        opt.load_state_dict(out[f"{name}-state-zero0"])
        out[f"{name}-reloaded"] = opt.consolidate_state_dict(to=0)
    # The whole 8-bit state into zero=1 without 8-bit states: decoded, then cut.
    model = _model()
    opt = fusedopt.distributed.DistributedOptimizer(_fused("SGD", model), zero=1, bucket_mb=0.05)
    opt.load_state_dict(out["uint8-state-zero0"])
    out["uint8-into-f32"] = opt.consolidate_state_dict(to=0)
    # Every bitsandbytes twin at zero=1 (built with constructor arguments its checks take) steps as at zero=0.
    for cls, kw in TWINS:
        for zero in (0, 1):
            model = _model()
            opt = fusedopt.distributed.DistributedOptimizer(
                getattr(fusedopt, cls)(model.parameters(), min_8bit_size=1024, **kw), zero=zero, bucket_mb=0.05)
            _train(model, opt, "plain", rank, world, 3)
            out[f"{cls}-zero{zero}"] = [p.detach().clone() for p in model.parameters()]
    # Resume 1 -> 2: a one-process run's params and state_dict, loaded into 2 ranks with zero=1.
    model = _model()
    with torch.no_grad():
        for p, saved in zip(model.parameters(), resume_state["params"]):
            p.copy_(saved)
    opt = fusedopt.distributed.DistributedOptimizer(_fused("AdamW", model), zero=1)
    opt.load_state_dict(resume_state["state_dict"])
    _train(model, opt, "plain", rank, world, STEPS // 2, first=STEPS // 2)
    out["resumed"] = [p.detach().clone() for p in model.parameters()]
    # Resume 2 -> 1: the state consolidated after half the steps (the test continues in one process).
    model = _model()
    opt = fusedopt.distributed.DistributedOptimizer(_fused("AdamW", model), zero=1)
    _train(model, opt, "plain", rank, world, STEPS // 2)
    out["half"] = ([p.detach().clone() for p in model.parameters()], opt.consolidate_state_dict(to=0))
    # fusedopt.Trainer(distributed=...): zero=1 through the Trainer, rank 0 writing the checkpoint.
    model = _model()
    share = BATCH // world
    data = [tuple(t[rank * share:(rank + 1) * share] for t in _data(step)) for step in range(TRAINER_STEPS)]
    trainer = fusedopt.Trainer(model, torch.nn.functional.mse_loss, _fused("AdamW", model), distributed={"zero": 1},
                               progress=False, checkpoint_dir=checkpoint_dir, checkpoint_every=TRAINER_STEPS)
    trainer.train(data)
    out["trainer"] = [p.detach().clone() for p in model.parameters()]
    # no_sync: the backward inside leaves each rank its own gradient; the next one reduces the sum.
    model = _model()
    opt = fusedopt.distributed.DistributedOptimizer(_fused("SGD", model))
    x, y = _data(0)
    with opt.no_sync():
        torch.nn.functional.mse_loss(model(x[rank::world]), y[rank::world]).backward()
    local = model[0].weight.grad.clone()
    torch.nn.functional.mse_loss(model(x[rank::world]), y[rank::world]).backward()
    out["no_sync_grads"] = (local, model[0].weight.grad.clone())
    out["errors"] = _rank_errors(rank)
    return out


def _rank_errors(rank: int) -> dict:
    errors = {}
    model = _model()
    if rank == 1:  # another model on rank 1: every rank refuses it
        model = torch.nn.Sequential(torch.nn.Linear(64, 601))
    try:
        fusedopt.distributed.DistributedOptimizer(_fused("AdamW", model))
    except ValueError as e:
        errors["layout"] = str(e)
    # AdamP's sums run per row (LAMB's and LARS's per tensor, which zero=1 completes over the ranks).
    for why, make, zero in (("sliceable", lambda m: fusedopt.FusedAdamP(m.parameters()), 1),
                            ("flatten", lambda m: _fused("AdamW", m, flatten=True), 0),
                            ("device", lambda m: _fused("AdamW", m.to("meta")), 0)):
        try:
            fusedopt.distributed.DistributedOptimizer(make(_model()), zero=zero)
        except ValueError as e:
            errors[why] = str(e)
    model = _model()
    opt = fusedopt.distributed.DistributedOptimizer(_fused("AdamW", model))
    opt._inner.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    try:
        opt.step()
    except RuntimeError as e:
        errors["added"] = str(e)
    return errors


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="module")
def ranks(checkpoint_dir) -> list[dict]:
    model = _model()  # the one-process first half of the 1 -> 2 resume
    opt = _fused("AdamW", model)
    _train(model, opt, "plain", 0, 1, STEPS // 2)
    resume = {"params": [p.detach().clone() for p in model.parameters()], "state_dict": opt.state_dict()}
    return run_ranks("test_distributed:rank_cases", 2, args=(resume, checkpoint_dir), timeout=300)


def _assert_close(actual: list[torch.Tensor], expected: list[torch.Tensor], rtol: float = 1e-6) -> None:
    """Relative difference of each tensor as a vector, ||a - e|| / ||e||, in double."""
    for a, e in zip(actual, expected, strict=True):
        error = torch.linalg.vector_norm(a.double() - e.double()) / torch.linalg.vector_norm(e.double())
        assert error <= rtol, f"relative difference {error:.3g} (shape {tuple(e.shape)})"


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_equal_one_process(ranks, case):
    algo, zero, variant = CASES[case]
    for a, b in zip(ranks[0]["params"][case], ranks[1]["params"][case]):
        assert torch.equal(a, b), "the ranks' params differ"
    expected = [p.detach() for p in _reference(algo, variant).parameters()]
    _assert_close(ranks[0]["params"][case], expected)


def test_zero1_holds_about_half_the_state(ranks):
    for rank in ranks:
        zero0, zero1 = rank["state_bytes"]["AdamW-zero0-clip"], rank["state_bytes"]["AdamW-zero1-clip"]
        assert zero1 <= 0.55 * zero0, (zero0, zero1)


def test_consolidated_state_loads_into_torch_and_steps_like_the_unsharded_run(ranks):
    sharded, unsharded = ranks[0]["state_dict-zero1"], ranks[0]["state_dict-zero0"]
    assert ranks[1]["state_dict-zero1"] is None
    for i, entry in unsharded["state"].items():  # (before torch's step advances the loaded 'step' tensors)
        for key in ("exp_avg", "exp_avg_sq"):
            _assert_close([sharded["state"][i][key]], [entry[key]])
        assert float(sharded["state"][i]["step"]) == float(entry["step"]) == STEPS
    results = []
    for state_dict in (sharded, unsharded):
        model = _model()
        with torch.no_grad():
            for p, saved in zip(model.parameters(), ranks[0]["params"]["AdamW-zero0-clip"]):
                p.copy_(saved)
        opt = torch.optim.AdamW(model.parameters(), foreach=False, **KW["AdamW"])
        opt.load_state_dict(state_dict)
        x, y = _data(STEPS)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        results.append([p.detach().clone() for p in model.parameters()])
    _assert_close(results[0], results[1])


def test_resume_one_rank_to_two_and_two_to_one(ranks):
    expected = [p.detach() for p in _reference("AdamW", "plain").parameters()]
    _assert_close(ranks[0]["resumed"], expected)
    params, state_dict = ranks[0]["half"]
    model = _model()
    with torch.no_grad():
        for p, saved in zip(model.parameters(), params):
            p.copy_(saved)
    opt = _fused("AdamW", model)
    opt.load_state_dict(state_dict)
    _train(model, opt, "plain", 0, 1, STEPS // 2, first=STEPS // 2)
    _assert_close([p.detach() for p in model.parameters()], expected)


def test_no_sync_reduces_nothing_until_the_next_backward(ranks):
    (local0, reduced0), (local1, reduced1) = ranks[0]["no_sync_grads"], ranks[1]["no_sync_grads"]
    assert not torch.equal(local0, local1)
    assert torch.equal(reduced0, reduced1)
    _assert_close([reduced0], [local0 + local1])  # (2 * local + 2 * local) / 2 ranks


def test_errors_across_ranks(ranks):
    for rank in ranks:
        assert "rank 1 holds other params than rank 0" in rank["errors"]["layout"]
        assert "added to the optimizer after" in rank["errors"]["added"]
        assert "FusedAdamP reads whole tensors" in rank["errors"]["sliceable"]
        assert "flatten=True" in rank["errors"]["flatten"]
        assert "is on meta" in rank["errors"]["device"]


def test_8bit_states_with_zero0_equal_one_process(ranks):
    """FusedAdamW8bit under zero=0 against FusedAdamW8bit in one process on the whole batch: the same on both
    ranks, and as close to the one-process run as the averaged gradients' rounding allows (a code may flip)."""
    for a, b in zip(ranks[0]["8bit-zero0"], ranks[1]["8bit-zero0"], strict=True):
        assert torch.equal(a, b), "the ranks' params differ"
    model = _model()
    opt = fusedopt.FusedAdamW8bit(model.parameters(), **KW["AdamW"], min_8bit_size=1024)
    _train(model, opt, "plain", 0, 1, STEPS // 2)
    assert opt.state[model[2].weight]["state1"].dtype == torch.uint8
    _assert_close(ranks[0]["8bit-zero0"], [p.detach() for p in model.parameters()], rtol=1e-5)


def _assert_states_equal(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, dict):
            _assert_states_equal(actual[key], value)
        elif isinstance(value, torch.Tensor):
            assert actual[key].dtype == value.dtype and torch.equal(actual[key], value), key
        else:
            assert actual[key] == value, key


def test_zero1_shards_8bit_states_as_zero0_steps_them(ranks):
    """zero=1 with 8-bit states (FusedAdamW8bit, and FusedSGD with state_dtype=torch.uint8) against zero=0: the
    same params bit for bit, its consolidated state the whole one (codes, absmax, bitsandbytes' qmaps), also
    after a whole state was cut into its shards."""
    for name in ("8bit", "uint8"):
        for rank in ranks:
            for a, b in zip(rank[f"{name}-zero0"], rank[f"{name}-zero1"], strict=True):
                assert torch.equal(a, b), f"{name}: zero=1 stepped otherwise"
        whole = ranks[0][f"{name}-state-zero0"]["state"]
        assert any(v.dtype == torch.uint8 for entry in whole.values() for v in _tensors(entry)), "no 8-bit state"
        _assert_states_equal(ranks[0][f"{name}-state-zero1"]["state"], whole)
        _assert_states_equal(ranks[0][f"{name}-reloaded"]["state"], whole)
        for rank in ranks:  # each rank holds about half of the codes and absmax
            zero0, zero1 = rank["state_bytes"][f"{name}-zero0"], rank["state_bytes"][f"{name}-zero1"]
            assert zero1 <= 0.6 * zero0, (name, zero0, zero1)


def test_8bit_state_loads_into_zero1_without_8bit_states(ranks):
    """A whole state of 8-bit codes (FusedSGD with state_dtype=torch.uint8) loaded at zero=1 into FusedSGD with
    f32 states: the codes decoded to the values they stand for, then cut into the slices."""
    whole, loaded = ranks[0]["uint8-state-zero0"]["state"], ranks[0]["uint8-into-f32"]["state"]
    for i, entry in whole.items():
        codes = entry["momentum_buffer"]
        if codes.dtype != torch.uint8:
            assert torch.equal(loaded[i]["momentum_buffer"], codes)
            continue
        values = torch.empty(codes.shape, dtype=torch.float32)
        absmax = entry["momentum_buffer_absmax"]
        fusedopt._C.dequantize(codes.data_ptr(), absmax.data_ptr(), codes.numel(), True, values.data_ptr())
        assert "momentum_buffer_absmax" not in loaded[i]
        assert torch.equal(loaded[i]["momentum_buffer"], values), i


@pytest.mark.parametrize("cls", [cls for cls, _ in TWINS])
def test_every_8bit_twin_steps_at_zero1_as_at_zero0(ranks, cls):
    for rank in ranks:
        for a, b in zip(rank[f"{cls}-zero0"], rank[f"{cls}-zero1"], strict=True):
            assert torch.equal(a, b), cls


def _tensors(entry: dict) -> list[torch.Tensor]:
    return [t for v in entry.values() for t in (_tensors(v) if isinstance(v, dict) else [v])
            if isinstance(t, torch.Tensor)]


def test_zero1_slices_step_as_whole_tensors_with_masters_and_stochastic_rounding(ranks):
    for rank in ranks:
        for name in ("bf16", "bf16-sgd"):
            for a, b in zip(rank[f"{name}-zero0"], rank[f"{name}-zero1"], strict=True):
                assert a.dtype == torch.bfloat16 and torch.equal(a, b), name
    for zero in (0, 1):
        counts = [float(entry["rounding_step"]) for entry in ranks[0][f"bf16-sgd-state-zero{zero}"]["state"].values()]
        assert counts == [STEPS // 2] * 4, zero
    zero0, zero1 = ranks[0]["bf16-masters-zero0"], ranks[0]["bf16-masters-zero1"]
    for i, entry in zero0["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "master_param"):
            assert torch.equal(zero1["state"][i][key], entry[key]), key


def test_errors_in_one_process():
    model = _model()
    with pytest.raises(RuntimeError, match="process group is not initialized"):
        fusedopt.distributed.DistributedOptimizer(_fused("AdamW", model))
    with pytest.raises(TypeError, match="wraps a fusedopt.Fused"):
        fusedopt.distributed.DistributedOptimizer(torch.optim.AdamW(model.parameters()))
    with pytest.raises(ValueError, match="Invalid zero"):
        fusedopt.distributed.DistributedOptimizer(_fused("AdamW", model), zero=2)


def test_trainer_distributed(ranks, checkpoint_dir):
    expected = [p.detach() for p in _reference("AdamW", "plain", TRAINER_STEPS).parameters()]
    for rank in ranks:
        _assert_close(rank["trainer"], expected)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), **KW["AdamW"])
    # the whole state, consolidated from both ranks' shards, loads into torch's AdamW
    fusedopt.load_checkpoint(opt, f"{checkpoint_dir}/step-{TRAINER_STEPS:08d}.safetensors", model=model)
    _assert_close([p.detach() for p in model.parameters()], expected)
    assert [float(s["step"]) for s in opt.state.values()] == [TRAINER_STEPS] * 4


def test_state_bytes_of_a_fused_optimizer():
    model = _model()
    opt = fusedopt.FusedAdamW(model.parameters(), accumulation_steps=2)
    assert opt.state_bytes() == 0
    torch.nn.functional.mse_loss(model(_data(0)[0]), _data(0)[1]).backward()
    opt.step()  # the first micro-batch: f32 sums only
    numel = sum(p.numel() for p in model.parameters())
    assert opt.state_bytes() == 4 * numel
    opt.step()  # the update: exp_avg, exp_avg_sq and a 4-byte step per param, besides the sums
    assert opt.state_bytes() == 4 * numel + 2 * 4 * numel + 4 * len(list(model.parameters()))


def rank_threads() -> tuple[int, int, str]:
    """torch's thread count before and after wrapping (OMP_NUM_THREADS unset), and what the rank printed."""
    before = torch.get_num_threads()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        fusedopt.distributed.DistributedOptimizer(_fused("SGD", _model()))
    return before, torch.get_num_threads(), stderr.getvalue()


def test_ranks_on_one_host_share_its_cpus():
    """Both ranks on this host, no OMP_NUM_THREADS: each takes max(1, cpus // 2) threads where torch's default
    is more (a thread per CPU in each), and rank 0 says so, once."""
    cpus = len(os.sched_getaffinity(0))
    results = run_ranks("test_distributed:rank_threads", 2, threads=None, timeout=120)
    for rank, (before, after, printed) in enumerate(results):
        share = max(1, cpus // 2)
        assert after == min(before, share)
        if rank == 0 and share < before:
            assert printed == (f"fusedopt.distributed: {share} thread(s) per rank ({cpus} CPU(s) shared by 2 "
                               "rank(s) on this host; OMP_NUM_THREADS chooses another count)\n")
        else:
            assert printed == ""


def test_threads_per_rank_choice():
    choose = fusedopt.distributed.threads_per_rank
    assert choose(None, 2, 2, 2) == 1  # the 2-core host with 2 ranks
    assert choose(None, 16, 16, 3) == 5
    assert choose(None, 1, 2, 2) is None  # already at most its share
    assert choose(None, 4, 2, 4) == 1  # more ranks than CPUs: 1 each
    assert choose("2", 16, 16, 2) is None  # OMP_NUM_THREADS (torchrun's 1 per process) is the user's choice
    assert choose(None, 8, 8, 1) is None  # alone on its host
