"""step_in_backward=True (python/fusedopt/_in_backward.py): the ordinary loop, with each param updated inside
backward from its post-accumulate-grad hook and its gradient released. Every algorithm whose updates are one
tensor at a time gives the ordinary step's params and states bit for bit (f32, bf16 with f32 masters, 8-bit
states; with accumulation windows too); what needs every gradient first is refused before anything changes; a process's peak memory drops by
the gradients it no longer holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import fusedopt
import pytest
from algorithm_cases import CASES
from fusedopt import _C
from fusedopt._in_backward import BUCKET_BYTES

import torch

STEPS = 4
PER_TENSOR = [name for name in CASES if not _C.algorithms[name]["sums_across_tensors"]]
VARIANTS = {"f32": {}, "bf16_masters": {"master_weights": True}, "uint8_states": {"state_dtype": torch.uint8},
            "flatten": {"flatten": True}, "flatten_uint8_states": {"flatten": True, "state_dtype": torch.uint8}}


def _model(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)  # the first weight (5120 elements) is over min_8bit_size: 8-bit states where asked
    return torch.nn.Sequential(torch.nn.Linear(64, 80), torch.nn.Tanh(), torch.nn.Linear(80, 4)).to(dtype)


def _train(name: str, variant: str, in_backward: bool, accumulation: int = 1):
    """STEPS steps, or with accumulation two windows and one micro-batch of a third (its sums in the state dict)."""
    dtype = torch.bfloat16 if variant == "bf16_masters" else torch.float32
    model = _model(dtype)
    # (no global clipping: FusedLAMB's default, apex's max_grad_norm=1, needs every gradient first)
    opt = CASES[name].fused(model.parameters(), **{**CASES[name].defaults, "max_grad_norm": None},
                            **VARIANTS[variant], step_in_backward=in_backward, accumulation_steps=accumulation)
    for step in range(STEPS if accumulation == 1 else 2 * accumulation + 1):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 64, generator=g).to(dtype), torch.randn(16, 4, generator=g).to(dtype)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if in_backward:
            assert all(p.grad is None for p in model.parameters()), "a gradient outlived its update"
        opt.step()
    if in_backward and opt._flat is not None:  # the gradients never went into a flat buffer
        with pytest.raises(RuntimeError, match="no flat gradient"):
            opt.flat_grads()
        assert all("grad" not in block.buffers for block in opt._flat._blocks.values())
    return [p.detach().clone() for p in model.parameters()], opt.state_dict()


def _assert_same(got: tuple, want: tuple) -> None:
    """Params and state dicts (states, and an accumulation window's sums) equal bit for bit."""
    (params, state), (want_params, want_state) = got, want
    for a, b in zip(params, want_params, strict=True):
        assert torch.equal(a, b)
    assert state.keys() == want_state.keys()
    assert state["state"].keys() == want_state["state"].keys()
    for i, entry in want_state["state"].items():
        assert entry.keys() == state["state"][i].keys()
        for key, value in entry.items():
            got = state["state"][i][key]
            assert torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value, key
    if "fusedopt_window" in want_state:
        window, want_window = state["fusedopt_window"], want_state["fusedopt_window"]
        assert window["sums"].keys() == want_window["sums"].keys()
        assert all(torch.equal(window["sums"][i], sum_) for i, sum_ in want_window["sums"].items())
        assert window["torch_sums"].keys() == want_window["torch_sums"].keys()  # (params with the reference's step)
        assert all(torch.equal(window["torch_sums"][i], sum_) for i, sum_ in want_window["torch_sums"].items())
        assert sorted(window["window"]) == sorted(want_window["window"])  # (in backward: the order the hooks ran)
        rest = {"sums": None, "torch_sums": None, "window": None}
        assert {**window, **rest} == {**want_window, **rest}


@pytest.mark.parametrize("accumulation", [1, 3])
@pytest.mark.parametrize("name, variant", [(name, variant) for name in PER_TENSOR for variant in VARIANTS
                                           if "state_dtype" not in VARIANTS[variant]
                                           or _C.algorithms[name]["quantizable"]])
def test_bit_identical_to_the_ordinary_step(name, variant, accumulation):
    _assert_same(_train(name, variant, True, accumulation), _train(name, variant, False, accumulation))


def test_accumulation_windows_with_params_missing_from_micro_batches():
    """accumulation_steps=3 over micro-batches that reach different params: a branch used only in each window's
    first micro-batch (updated from its sum by the window's last step(), since no hook updates it in the last
    backward), a frozen param unfrozen after the optimizer was made (no hook: step() takes its gradient), and an
    Inf/NaN in a window's first micro-batch (the window is skipped whole). The same bits as the ordinary window."""
    results = []
    for in_backward in (True, False):
        torch.manual_seed(0)
        trunk, branch, head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)
        head.weight.requires_grad_(False)
        params = [*trunk.parameters(), *branch.parameters(), *head.parameters()]
        opt = fusedopt.FusedAdam(params, lr=1e-2, accumulation_steps=3, step_in_backward=in_backward)
        head.weight.requires_grad_(True)
        for step in range(9):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(4, 8, generator=g)
            if step == 3:
                x[0, 0] = float("inf")  # the second window's first micro-batch: that window is skipped
            h = trunk(x).tanh()
            if step % 3 == 0:
                h = h + branch(h)
            opt.zero_grad()
            head(h).square().mean().backward()
            if in_backward:
                assert all(p.grad is None for p in params if p is not head.weight)
                assert head.weight.grad is not None
            opt.step()
        results.append(([p.detach().clone() for p in params], opt.state_dict()))
    steps = [int(s["step"]) for s in results[1][1]["state"].values()]
    assert steps == [2] * len(params), f"two of the three windows should have stepped every param: {steps}"
    _assert_same(*results)


def test_flatten_steps_a_gradient_left_for_step_where_it_is():
    """A param frozen when the optimizer was made has no hook: unfrozen later, its gradient reaches step(), which
    steps it as the ordinary step does, reading it where it is (no flat gradient buffer appears)."""
    results = []
    for in_backward in (True, False):
        model = _model()
        model[2].weight.requires_grad_(False)
        opt = fusedopt.FusedAdamW(model.parameters(), flatten=True, step_in_backward=in_backward)
        model[2].weight.requires_grad_(True)
        for step in range(STEPS):
            g = torch.Generator().manual_seed(step)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(torch.randn(16, 64, generator=g)),
                                         torch.randn(16, 4, generator=g)).backward()
            assert (model[2].weight.grad is not None) and (model[0].weight.grad is None) == in_backward
            opt.step()
        results.append([p.detach().clone() for p in model.parameters()])
        if in_backward:
            assert all("grad" not in block.buffers for block in opt._flat._blocks.values())
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("options, message", [
    ({"max_grad_norm": 1.0}, "max_grad_norm"),
])
def test_options_that_need_every_gradient_are_refused(options, message):
    model = _model()
    with pytest.raises(ValueError, match=message):
        fusedopt.FusedAdamW(model.parameters(), step_in_backward=True, **options)
    model[0].weight.grad = None
    torch.nn.functional.mse_loss(model(torch.randn(2, 64)), torch.randn(2, 4)).backward()
    assert model[0].weight.grad is not None, "a refused optimizer left a hook behind"


@pytest.mark.filterwarnings("ignore:fusedopt. FusedAdamW updates these parameters with the reference's own")
@pytest.mark.parametrize("accumulation", [1, 3])
def test_params_the_engine_cannot_take_keep_their_gradients_for_step(accumulation):
    """A float64 param (the reference's step) and, with accumulation, a complex64 one (its window's sums are kept in
    torch) cannot be updated in a bucket: one UserWarning names them, their gradients outlive backward, and step()
    updates them as the ordinary step does. Without accumulation the engine takes the complex param in backward (as
    its real view). Params, states and the open window's sums are the ordinary step's bit for bit."""
    results = []
    for in_backward in (True, False):
        torch.manual_seed(0)
        lin = torch.nn.Linear(8, 8)
        w64 = torch.nn.Parameter(torch.randn(8, 8, dtype=torch.float64))
        wc = torch.nn.Parameter(torch.randn(8, dtype=torch.complex64))
        params = [*lin.parameters(), w64, wc]
        opt = fusedopt.FusedAdamW(params, lr=1e-2, accumulation_steps=accumulation, step_in_backward=in_backward)
        messages = []
        for step in range(2 * accumulation + 1):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
            opt.zero_grad()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ((lin(x).double() @ w64).square().mean() + (x.to(torch.complex64) * wc).abs().mean()).backward()
            messages += [str(w.message) for w in caught if "inside backward" in str(w.message)]
            if in_backward:
                left = [p.grad is not None for p in params]
                assert left == [False, False, True, accumulation > 1], left
            opt.step()
        if in_backward:
            assert len(messages) == 1, messages
            assert "parameter 2 of group 0: its dtype is torch.float64" in messages[0], messages[0]
            assert ("parameter 3 of group 0: it is complex" in messages[0]) == (accumulation > 1), messages[0]
        results.append(([p.detach().clone() for p in params], opt.state_dict()))
    _assert_same(*results)


def test_an_inf_in_a_windows_last_micro_batch_skips_it_whole(monkeypatch):
    """accumulation_steps=3, a bucket per param (so the head's bucket is done before the trunk's gradients exist),
    and a NaN in the trunk's gradients only, in the second window's last micro-batch: the window is skipped whole,
    head included, as in the ordinary step. The same bits as the ordinary window."""
    monkeypatch.setattr(fusedopt._in_backward, "BUCKET_BYTES", 1)
    results = []
    for in_backward in (True, False):
        torch.manual_seed(0)
        trunk, head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)
        params = [*trunk.parameters(), *head.parameters()]
        opt = fusedopt.FusedAdamW(params, lr=1e-2, accumulation_steps=3, step_in_backward=in_backward)
        for step in range(9):
            h = trunk(torch.randn(4, 8, generator=torch.Generator().manual_seed(step)))
            if step == 5:  # the second window's last micro-batch
                h.register_hook(lambda g: g * float("nan"))
            opt.zero_grad()
            head(h.tanh()).square().mean().backward()
            opt.step()
        results.append(([p.detach().clone() for p in params], opt.state_dict()))
    steps = [int(s["step"]) for s in results[0][1]["state"].values()]
    assert steps == [2] * len(params), f"the second window should have been skipped for every param: {steps}"
    _assert_same(*results)


def test_adafactors_eps1_from_a_group_of_several_dtypes_is_refused():
    """eps1=None is finfo(dtype).eps of the group's first param with a gradient, which backward may not have made
    when a bucket is updated: with a group of several dtypes the first backward raises, changing nothing. With eps1
    given, or with accumulation (the window's last step() updates, when every gradient is in), it is taken."""
    for eps, accumulation in (((None, 1e-3), 1), ((1e-30, 1e-3), 1), ((None, 1e-3), 2)):
        model = _model()
        model[2].bfloat16()
        before = [p.detach().clone() for p in model.parameters()]
        opt = fusedopt.FusedAdafactor(model.parameters(), eps=eps, step_in_backward=True,
                                      accumulation_steps=accumulation)
        loss = model[2](model[1](model[0](torch.randn(2, 64))).bfloat16()).float().square().mean()
        if eps[0] is not None or accumulation > 1:
            loss.backward()
            assert all(p.grad is None for p in model.parameters())
            continue
        with pytest.raises(ValueError, match=r"step_in_backward=True with eps=\(None, ...\) takes a group of params "
                                             "of one dtype"):
            loss.backward()
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)) and not opt.state


def test_sums_across_tensors_are_refused():
    name = next(n for n in CASES if _C.algorithms[n]["sums_across_tensors"])
    with pytest.raises(ValueError, match="sums over all of a group's gradients"):
        CASES[name].fused(_model().parameters(), **{"lr": 1e-3, **CASES[name].defaults}, max_grad_norm=None,
                          step_in_backward=True)


def _loss(model: torch.nn.Module) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(torch.randn(2, 64)), torch.randn(2, 4))


@pytest.mark.parametrize("form", ["tensor", "nested"])
def test_fusedopt_grad_scaler_is_refused_before_backward(form):
    model, other = _model(), _model()
    opt = fusedopt.FusedAdamW(model.parameters(), step_in_backward=True)
    before = [p.detach().clone() for p in model.parameters()]
    loss = _loss(model)
    with pytest.raises(RuntimeError, match=r"FusedAdamW: step_in_backward=True cannot take a GradScaler: .* "
                                           r"\(refused at scaler.scale\(\), before backward\)"):
        fusedopt.GradScaler().scale(loss if form == "tensor" else [_loss(other), (loss,)])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)) and not opt.state
    assert all(p.grad is None for p in model.parameters())


def test_torch_grad_scaler_is_refused_at_its_step():
    model = _model()
    opt = fusedopt.FusedAdamW(model.parameters(), step_in_backward=True)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(_loss(model)).backward()
    with pytest.raises(RuntimeError, match="cannot take a GradScaler: .*refused at torch.amp.GradScaler's step"):
        scaler.step(opt)


def test_a_grad_scaler_for_another_model_works_beside_it(ieee_sqrt):
    """Only a loss whose backward reaches a param stepped in backward is refused: another model's loss, scaled
    beside it, steps as torch.optim.AdamW does under torch.amp.GradScaler (bit for bit with an IEEE sqrt in
    torch: conftest.ieee_sqrt)."""
    stepped, scaled, twin = _model(), _model(), _model()
    in_backward = fusedopt.FusedAdamW(stepped.parameters(), step_in_backward=True)
    opt, reference = fusedopt.FusedAdamW(scaled.parameters()), torch.optim.AdamW(twin.parameters())
    fused_scaler, torch_scaler = fusedopt.GradScaler(), torch.amp.GradScaler("cpu")
    for step in range(3):
        torch.manual_seed(step)
        _loss(stepped).backward()
        assert all(p.grad is None for p in stepped.parameters()) and in_backward.state
        for model, optimizer, scaler in ((scaled, opt, fused_scaler), (twin, reference, torch_scaler)):
            torch.manual_seed(100 + step)
            scaler.scale(_loss(model)).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(scaled.parameters(), twin.parameters(), strict=True))


def test_params_added_later_and_copies_step_in_backward():
    import copy
    model = _model()
    opt = fusedopt.FusedAdamW(list(model[0].parameters()), step_in_backward=True)
    opt.add_param_group({"params": list(model[2].parameters())})
    twin = copy.deepcopy((model, opt))
    for m, o in ((model, opt), twin):
        torch.nn.functional.mse_loss(m(torch.ones(2, 64)), torch.zeros(2, 4)).backward()
        assert all(p.grad is None for p in m.parameters())
        assert all(o.state[p]["step"] == 1 for p in m.parameters())
    for a, b in zip(model.parameters(), twin[0].parameters()):
        assert torch.equal(a, b)


_PEAK = r"""
import json, sys, time, torch, fusedopt
torch.set_num_threads(2)
torch.manual_seed(0)
in_backward, accumulation = sys.argv[1] == "1", int(sys.argv[2])
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(12)])  # 50.4 M params
opt = fusedopt.FusedAdamW(model.parameters(), lr=1e-4, step_in_backward=in_backward, accumulation_steps=accumulation)
x = torch.randn(8, 2048)
times = []
for step in range(4):
    start = time.perf_counter()
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
    times.append(time.perf_counter() - start)
params = sum(p.numel() for p in model.parameters())
# VmHWM: this address space's peak (getrusage's ru_maxrss would count the pytest worker's RSS at the vfork)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"maxrss_kb": hwm, "params": params,
                  "largest": max(p.numel() for p in model.parameters()), "step_s": sorted(times[1:])[1],
                  "checksum": float(sum(p.double().sum() for p in model.parameters()))}))
"""


def _peak(in_backward: bool, accumulation: int) -> dict:
    # A fixed mmap threshold: every large tensor is its own mapping, returned to the system when freed, so that
    # the peak RSS counts live tensors (glibc's default threshold rises after the first free, and freed tensors
    # then stay in the heap, where the peak depends on its fragmentation).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    out = subprocess.run([sys.executable, "-c", _PEAK, "1" if in_backward else "0", str(accumulation)], capture_output=True, text=True,
                         timeout=300, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.xdist_group("memory")
@pytest.mark.parametrize("accumulation", [1, 2])
def test_peak_memory_drops_by_the_gradients_it_no_longer_holds(accumulation):
    """Separate processes, 4 steps of a 50 M-param model: with step_in_backward at most a bucket of gradients
    (fusedopt._in_backward.BUCKET_BYTES) and the param being finished exist at a time, so the peak RSS is lower by
    all the gradients but those. With accumulation both hold the window's f32 sums besides."""
    ordinary, hooked = _peak(False, accumulation), _peak(True, accumulation)
    assert hooked["checksum"] == ordinary["checksum"], "the two runs trained differently"
    saved_kb = (ordinary["maxrss_kb"] - hooked["maxrss_kb"])
    held_kb = (BUCKET_BYTES + ordinary["largest"] * 4) / 1024
    grads_kb = ordinary["params"] * 4 / 1024
    assert saved_kb >= 0.9 * (grads_kb - held_kb), (
        f"peak lower by {saved_kb / 1024:.0f} MiB; gradients: {grads_kb / 1024:.0f} MiB, {held_kb / 1024:.0f} of them held")
