"""A run that moves between C++ and Python through checkpoints continues bit for bit.

The C++ legs are tests/checkpoint_interop.cc (a fusedopt::Optimizer<> that owns its params): C++ trains 2
micro-batches and saves; Python loads that file into the fused class (params included), trains 2 more and saves;
C++ loads the Python file, trains 2 more and saves. Every param and state tensor of the last file equals those
of one C++ run of 6 micro-batches, bit for bit, and Python's state after its leg equals C++'s after 4: f32, bf16
params with f32 masters, and 8-bit states (codes and absmax). The gradients are the same values on both sides (the
C++ program's hash, computed here with numpy)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import fusedopt
import numpy as np
import pytest
from algorithm_cases import CASES
from fusedopt import _C

import torch

INTEROP = Path(_C.__file__).resolve().parents[2] / "bin" / "checkpoint_interop"
SHAPES = [(300,), (12, 10), (7,)]  # groups: the first two, then the last (the C++ program's tensors)

# The algorithms tests/checkpoint_interop.cc trains, by the registry's name (its first argument).
CLASSES = {name: case.fused for name, case in CASES.items() if case.checkpoint_interop}


def value(seed: int, index: np.ndarray) -> np.ndarray:
    """checkpoint_interop.cc's Value(seed, i): splitmix64's finalizer, to [-1, 1) in double, then f32."""
    with np.errstate(over="ignore"):
        z = (np.uint64(seed) << np.uint64(32)) + index.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return ((z >> np.uint64(40)).astype(np.float64) / float(1 << 23) - 1.0).astype(np.float32)


def cpp(*args) -> None:
    assert INTEROP.exists(), f"{INTEROP} is built with the release build (scripts/build)"
    done = subprocess.run([str(INTEROP), *map(str, args)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def tensors(path) -> dict[str, torch.Tensor]:
    return fusedopt.read_checkpoint(path).tensors


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


# sr (pure bf16, stochastic rounding) for an algorithm with torch's step count and those without one, whose noise
# follows state['rounding_step'] (the others' scalar states, 0-d f32, are cast to the bf16 params' dtype by torch's
# load_state_dict, as NAdam's mu_product in the libtorch test below).
_SR = ("adamw", "lion", "sgd")


@pytest.mark.parametrize("algo, precision", [(algo, precision) for algo in sorted(CLASSES)
                                             for precision in ("f32", "bf16", "q8", "sr")
                                             if precision != "sr" or algo in _SR])
def test_cpp_python_cpp_equals_one_cpp_run(tmp_path, algo, precision):
    if precision == "q8" and not _C.algorithms[algo].get("quantizable", False):
        pytest.skip(f"{algo} takes no 8-bit states")
    dtype = torch.bfloat16 if precision in ("bf16", "sr") else torch.float32
    cpp(algo, precision, 6, tmp_path / "whole.safetensors")
    cpp(algo, precision, 2, tmp_path / "a.safetensors")
    cpp(algo, precision, 4, tmp_path / "four.safetensors")

    # Python: other initial params and hyper-parameters; the file restores both.
    params = [torch.nn.Parameter(torch.full(s, 0.5, dtype=dtype)) for s in SHAPES]
    kw = {"bf16": {"master_weights": True}, "q8": {"state_dtype": torch.uint8, "min_8bit_size": 100},
          "sr": {"stochastic_rounding": True, "seed": 7}}.get(precision, {})
    kw.update(CASES[algo].checkpoint_interop_options)
    opt = CLASSES[algo]([{"params": params[:2]}, {"params": params[2:]}], lr=0.123, **kw)
    extra = fusedopt.load_checkpoint(opt, tmp_path / "a.safetensors")
    offsets = np.cumsum([0] + [int(np.prod(s)) for s in SHAPES])
    for k in range(extra["micro_batches"], extra["micro_batches"] + 2):
        for p, s, o in zip(params, SHAPES, offsets):
            p.grad = torch.from_numpy(value(1000 + k, np.arange(o, o + int(np.prod(s))))).view(s).to(dtype)
        opt.step()
    fusedopt.save_checkpoint(opt, tmp_path / "b.safetensors", extra={"micro_batches": 4})
    cpp(algo, precision, 2, tmp_path / "c.safetensors", tmp_path / "b.safetensors")

    four, python = tensors(tmp_path / "four.safetensors"), tensors(tmp_path / "b.safetensors")
    for name, t in four.items():
        if name.startswith("param.") or name.endswith(("exp_avg", "exp_avg_sq", "master_param", "momentum_buffer",
                                                       "row_var", "col_var", "variance", "mu_product", "eta", "mu",
                                                       "ax", "prev", "step_size", "_absmax")):
            assert name in python, f"{name} missing from Python's checkpoint"
            assert torch.equal(bits(python[name]), bits(t)), name
    whole, resumed = tensors(tmp_path / "whole.safetensors"), tensors(tmp_path / "c.safetensors")
    assert whole.keys() == resumed.keys()
    for name, t in whole.items():
        assert torch.equal(bits(resumed[name]), bits(t)), name


def test_a_python_checkpoint_with_a_model_is_refused_by_the_cpp_optimizer(tmp_path):
    """The C++ Optimizer owns its params; a file whose params are a model's says so."""
    model = torch.nn.Linear(3, 2)
    fusedopt.save_checkpoint(fusedopt.FusedAdamW(model.parameters()), tmp_path / "m.safetensors", model=model)
    done = subprocess.run([str(INTEROP), "adamw", "f32", "1", tmp_path / "x.safetensors", tmp_path / "m.safetensors"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "groups of [2] params; this one has [2,1]" in done.stderr or "holds no params" in done.stderr, done.stderr


FUSEDOPT = INTEROP.parent / "fusedopt"
TINY = ["train", "--model", "mobilenet_v1", "--image-size", "8", "--num-classes", "10", "--batch-size", "2",
        "--warmup", "0", "--steps", "4", "--optimizer", "adamw", "--accumulation-steps", "2", "--threads", "1"]


def fusedopt_cli(*args) -> subprocess.CompletedProcess:
    done = subprocess.run([str(FUSEDOPT), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.parametrize("state_dtype", ["f32", "q8"])
def test_fusedopt_train_resumes_bit_for_bit_and_python_reads_its_checkpoints(tmp_path, state_dtype):
    """`fusedopt train --checkpoint-dir --checkpoint-every --resume`: a run resumed from its checkpoint at update 2
    (a damaged newer one skipped) ends where the uninterrupted run ends, bit for bit; fusedopt.read_checkpoint reads
    the files and load_checkpoint takes their optimizer state into the Python twin. q8 (--state-dtype): the same with
    8-bit states, the codes and absmax included."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    tiny = (*TINY, "--state-dtype", state_dtype)
    fusedopt_cli(*tiny, "--checkpoint-dir", whole, "--checkpoint-every", 2, "--quiet")
    assert sorted(p.name for p in whole.iterdir()) == ["step-00000004.safetensors", "step-00000008.safetensors"]
    resumed.mkdir()
    (resumed / "step-00000004.safetensors").write_bytes((whole / "step-00000004.safetensors").read_bytes())
    (resumed / "step-00000006.safetensors").write_bytes(b"not a checkpoint")
    done = fusedopt_cli(*tiny, "--checkpoint-dir", resumed, "--checkpoint-every", 2, "--resume")
    assert "skipping checkpoint" in done.stderr and "step-00000006.safetensors" in done.stderr
    assert f"resuming from {resumed / 'step-00000004.safetensors'} (update 2)" in done.stderr
    a, b = tensors(whole / "step-00000008.safetensors"), tensors(resumed / "step-00000008.safetensors")
    assert a.keys() == b.keys() and any(k.startswith("model.") for k in a)
    for name, t in a.items():
        assert torch.equal(bits(b[name]), bits(t)), name
    ckpt = fusedopt.read_checkpoint(whole / "step-00000008.safetensors")
    assert (ckpt.meta["algorithm"], ckpt.meta["optimizer_class"]) == ("adamw", "fusedopt::pt::AdamW")
    assert ckpt.get("extra") == {"updates": 4, "step": 8}
    # The optimizer part in Python: params of the model's shapes, in its order.
    shapes = [tuple(s) for s, _ in ckpt.meta["layout"][1]]
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    opt = fusedopt.FusedAdamW(params, state_dtype=torch.uint8 if state_dtype == "q8" else None)
    fusedopt.load_checkpoint(opt, whole / "step-00000008.safetensors")
    state = opt.state_dict()["state"]
    codes = [k for k, t in ckpt.tensors.items() if t.dtype == torch.uint8]
    assert bool(codes) == (state_dtype == "q8") and all(k + "_absmax" in ckpt.tensors for k in codes)
    for i in range(len(params)):
        for key in ("exp_avg", "exp_avg_sq", "step", "exp_avg_absmax", "exp_avg_sq_absmax"):
            if f"state.{i}.{key}" in ckpt.tensors:
                assert torch.equal(state[i][key], ckpt.tensors[f"state.{i}.{key}"]), (i, key)


def test_python_reads_and_loads_the_shard_sets_of_fusedopt_train_dist(tmp_path):
    """`fusedopt train --dist` writes a shard set per checkpoint (here the one rank of a plain process; the MPI tests
    assemble sets of 2 and 3 ranks). fusedopt.read_checkpoint and load_checkpoint take the path it was saved at: the
    set assembled is the file `fusedopt ckpt consolidate` writes, and its state loads into the Python class."""
    saved_at = tmp_path / "step-00000002.safetensors"
    fusedopt_cli("train", "--dist", "--zero", 1, *TINY[1:9], "--warmup", 0, "--steps", 2, "--threads", 1,
                 "--checkpoint-dir", tmp_path, "--checkpoint-every", 2, "--quiet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002.rank0-of-1.safetensors"]
    ckpt = fusedopt.read_checkpoint(saved_at)
    assert ckpt.meta["optimizer_class"] == "fusedopt::DistributedOptimizer<adamw> zero=1" and "shard" not in ckpt.meta
    fusedopt_cli("ckpt", "consolidate", saved_at, "-o", tmp_path / "whole.safetensors")
    whole = tensors(tmp_path / "whole.safetensors")
    assert whole.keys() == ckpt.tensors.keys()
    for name, t in whole.items():
        assert torch.equal(bits(ckpt.tensors[name]), bits(t)), name
    params = [torch.nn.Parameter(torch.zeros(tuple(s))) for s, _ in ckpt.meta["layout"][1]]
    opt = fusedopt.FusedAdamW(params)
    assert fusedopt.load_checkpoint(opt, saved_at)["updates"] == 2
    state = opt.state_dict()["state"]
    for i, p in enumerate(params):
        assert torch.equal(p.detach().reshape(-1), whole[f"param.{i}"].reshape(-1)), i
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state[i][key].reshape(-1), whole[f"state.{i}.{key}"].reshape(-1)), (i, key)


INTEROP_PT = INTEROP.parent / "checkpoint_interop_pt"
# The algorithms checkpoint_interop_pt.cc trains, by the registry's name (its first argument).
PT_CLASSES = {name: case.fused for name, case in CASES.items() if case.libtorch_checkpoint_interop}


def pt_model() -> torch.nn.Sequential:
    """checkpoint_interop_pt.cc's model, under the same state_dict names (0.weight, 0.bias, 2.weight, 2.bias)."""
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


# sr runs where the Python leg's load keeps every state as it is: torch's load_state_dict casts NAdam's f32 mu_product
# to a bf16 param's dtype. SGD's and Lion's noise follows state['rounding_step'] on both sides.
@pytest.mark.parametrize("name, precision", [(name, precision) for name in sorted(PT_CLASSES)
                                             for precision in ("f32", "q8", "sr", "acc", "acc64")
                                             if (precision != "sr" or name != "nadam")
                                             and (precision != "acc" or name in ("adamw", "sgd"))
                                             and (precision != "acc64" or name == "sgd")])
def test_libtorch_python_libtorch_equals_one_libtorch_run(tmp_path, name, precision):
    """A libtorch model with a fusedopt::pt optimizer trains 2 steps and saves; Python loads that file into the same
    model and the fused class, trains 2 more on the same batches and saves; libtorch loads the Python file and trains
    2 more. The model and the optimizer state equal those of one libtorch run of 6 steps, bit for bit, and Python's
    after its leg equal libtorch's after 4 (checkpoint_interop_pt.cc; both sides run one thread). q8: the weights'
    states are 8-bit codes with their absmax on both sides (the biases, under min_8bit_size 10, f32). sr: a bf16 model
    stepped with stochastic rounding (seed 7) on both sides: the noise follows the run across the languages. acc:
    accumulation_steps 5 on both sides: each leg ends inside a window, whose f32 sums the files carry, and the first
    window spans all three legs. acc64: the same with a float64 model, whose params take torch's own step (SGD's
    for-loop step is the same in both languages) on sums kept in torch, which the files carry."""
    def run(steps, out, *given):
        done = subprocess.run([str(INTEROP_PT), name + ("" if precision == "f32" else ":" + precision), str(steps), str(out),
                               *map(str, given)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    run(6, tmp_path / "whole.safetensors")
    run(4, tmp_path / "four.safetensors")
    run(2, tmp_path / "a.safetensors")
    dtype = {"sr": torch.bfloat16, "acc64": torch.float64}.get(precision, torch.float32)
    model = pt_model().to(dtype)
    kw = {"q8": {"state_dtype": torch.uint8, "min_8bit_size": 10},
          "sr": {"stochastic_rounding": True, "seed": 7}, "acc": {"accumulation_steps": 5},
          "acc64": {"accumulation_steps": 5}}.get(precision, {})
    opt = PT_CLASSES[name](model.parameters(), **kw)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = fusedopt.load_checkpoint(opt, tmp_path / "a.safetensors", model=model)["steps"]
        for k in range(start, start + 2):
            x = torch.from_numpy(value(2000 + k, np.arange(24))).view(4, 6).to(dtype)
            target = torch.from_numpy(value(3000 + k, np.arange(12))).view(4, 3).to(dtype)
            torch.nn.functional.mse_loss(model(x), target).backward()
            opt.step()
            opt.zero_grad()
    finally:
        torch.set_num_threads(threads)
    fusedopt.save_checkpoint(opt, tmp_path / "b.safetensors", model=model, extra={"steps": start + 2})
    run(2, tmp_path / "c.safetensors", tmp_path / "b.safetensors")

    four, python = tensors(tmp_path / "four.safetensors"), tensors(tmp_path / "b.safetensors")
    whole, resumed = tensors(tmp_path / "whole.safetensors"), tensors(tmp_path / "c.safetensors")
    assert any(k.startswith("model.") for k in whole) and any(k.startswith("state.") for k in whole)
    assert whole.keys() == resumed.keys()
    if precision == "q8":  # the first weight's states are codes with their absmax, the first bias's are not
        absmax = [k for k in whole if k.startswith("state.0.") and k.endswith("_absmax")]
        assert absmax and all(whole[k.removesuffix("_absmax")].dtype == torch.uint8 for k in absmax)
        assert not any(k.startswith("state.1.") and k.endswith("_absmax") for k in whole)
    if precision.startswith("acc"):  # 6 and 4 micro-batches: both files inside a window, with its sums
        sums = "torch_sum" if precision == "acc64" else "accumulator"
        assert all(f"{sums}.{i}" in whole and f"{sums}.{i}" in four for i in range(4))
    for name_, t in four.items():
        assert torch.equal(bits(python[name_]), bits(t)), f"after 4 steps: {name_}"
    for name_, t in whole.items():
        assert torch.equal(bits(resumed[name_]), bits(t)), f"after 6 steps: {name_}"
