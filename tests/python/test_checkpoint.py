"""fusedopt.save_checkpoint / load_checkpoint (issue #16): resume bit for bit in a fresh process for every fused
algorithm; every corruption class refused with a clear error and no change; durable writes (SIGKILL at random
instants, a file-size limit); the defects new-user testing found in the Trainer's checkpoints."""

from __future__ import annotations

import os
import random
import re
import resource
import signal
import subprocess
import sys
import time

import fusedopt
import pytest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ALGOS = [name for name in fusedopt.__all__ if name.startswith("Fused")]
KW = {"FusedSGD": dict(momentum=0.9), "FusedLARS": dict(momentum=0.9)}
# f32; bf16 params with f32 masters and stochastic rounding; a dynamic loss scale and an LR schedule; a
# checkpoint inside an accumulation window (accumulation_steps=3, saved after 4 micro-batches).
VARIANTS = ("f32", "bf16_masters", "scaled_scheduled", "mid_window")
FIRST, REST = 4, 5  # micro-batches before the checkpoint, and after it


def _model(seed: int = 0, dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(dtype)


def _setup(algo: str, variant: str, seed: int = 0):
    dtype = torch.bfloat16 if variant == "bf16_masters" else torch.float32
    model = _model(seed, dtype)
    kw = dict(KW.get(algo, {}), lr=1e-2)
    if variant == "bf16_masters":
        kw.update(master_weights=True, stochastic_rounding=True, seed=3)
    if variant == "mid_window":
        kw.update(accumulation_steps=3)
    opt = getattr(fusedopt, algo)(model.parameters(), **kw)
    scaler = fusedopt.GradScaler(init_scale=2.0**8, growth_interval=2) if variant == "scaled_scheduled" else None
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.7) if variant == "scaled_scheduled" else None
    return model, opt, scaler, sched


def _train(model, opt, scaler, sched, steps: range) -> None:
    dtype = next(model.parameters()).dtype
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 12, generator=g).to(dtype), torch.randn(8, 3, generator=g).to(dtype)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        opt.zero_grad()
        if sched is not None:
            sched.step()


def resume_all(directory: str) -> None:
    """In a fresh process: every scenario's checkpoint loaded into objects built with another seed, then trained
    REST more micro-batches; the params and optimizer state are torch.saved for the test to compare."""
    for algo in ALGOS:
        for variant in VARIANTS:
            model, opt, scaler, sched = _setup(algo, variant, seed=1)
            fusedopt.load_checkpoint(opt, f"{directory}/{algo}-{variant}.safetensors", model=model, scaler=scaler,
                                     scheduler=sched)
            _train(model, opt, scaler, sched, range(FIRST, FIRST + REST))
            torch.save({"params": list(model.parameters()), "state": opt.state_dict()["state"]},
                       f"{directory}/{algo}-{variant}.pt")


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    directory = tmp_path_factory.mktemp("resume")
    whole = {}
    for algo in ALGOS:
        for variant in VARIANTS:
            model, opt, scaler, sched = _setup(algo, variant)
            _train(model, opt, scaler, sched, range(FIRST))
            fusedopt.save_checkpoint(opt, directory / f"{algo}-{variant}.safetensors", model=model, scaler=scaler,
                                     scheduler=sched)
            _train(model, opt, scaler, sched, range(FIRST, FIRST + REST))
            whole[algo, variant] = (list(model.parameters()), opt.state_dict()["state"])
    subprocess.run([sys.executable, "-c", f"import test_checkpoint; test_checkpoint.resume_all({str(directory)!r})"],
                   cwd=HERE, check=True, timeout=300, env={**os.environ, "PYTHONPATH": HERE})
    return directory, whole


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("algo", ALGOS)
def test_resume_in_a_fresh_process_is_bit_exact(resumed, algo, variant):
    directory, whole = resumed
    got = torch.load(directory / f"{algo}-{variant}.pt", weights_only=False)
    params, state = whole[algo, variant]
    for a, b in zip(got["params"], params, strict=True):
        assert torch.equal(a, b)
    assert got["state"].keys() == state.keys()
    for i in state:
        for key, value in state[i].items():
            assert torch.equal(torch.as_tensor(got["state"][i][key]), torch.as_tensor(value)), (i, key)


# ---- refusals: a clear error, and nothing changed ------------------------------------------------------------

def _snapshot(model, opt) -> list[torch.Tensor]:
    tensors = [p.detach().clone() for p in model.parameters()]
    for s in opt.state.values():
        tensors += [v.clone() for v in s.values() if isinstance(v, torch.Tensor)]
    return tensors


def _assert_unchanged(before, model, opt):
    after = _snapshot(model, opt)
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))


@pytest.fixture
def saved(tmp_path):
    model, opt, scaler, sched = _setup("FusedAdamW", "scaled_scheduled")
    _train(model, opt, scaler, sched, range(3))
    path = tmp_path / "ckpt.safetensors"
    fusedopt.save_checkpoint(opt, path, model=model, scaler=scaler, scheduler=sched)
    return path


def _target():
    model, opt, scaler, sched = _setup("FusedAdamW", "scaled_scheduled", seed=5)
    _train(model, opt, scaler, sched, range(2))
    return model, opt, scaler, sched


def test_every_single_byte_flip_is_refused_and_changes_nothing(saved):
    data = saved.read_bytes()
    model, opt, scaler, sched = _target()
    before = _snapshot(model, opt)
    rng = random.Random(0)
    for _ in range(40):
        position = rng.randrange(len(data))
        damaged = bytearray(data)
        damaged[position] ^= 1 << rng.randrange(8)
        saved.write_bytes(bytes(damaged))
        with pytest.raises(ValueError, match=re.escape(str(saved))):
            fusedopt.load_checkpoint(opt, saved, model=model, scaler=scaler, scheduler=sched)
    _assert_unchanged(before, model, opt)


@pytest.mark.parametrize("content, message", [
    (b"", "empty or truncated"),
    (b"step,loss\n1,2.5\n", ""),  # a text file
    (None, "truncated"),  # the first half of a real checkpoint
])
def test_empty_text_and_truncated_files_are_refused_clearly(saved, content, message):
    saved.write_bytes(saved.read_bytes()[: len(saved.read_bytes()) // 2] if content is None else content)
    model, opt, scaler, sched = _target()
    before = _snapshot(model, opt)
    with pytest.raises(ValueError, match=re.escape(str(saved)) + ".*" + message):
        fusedopt.load_checkpoint(opt, saved, model=model, scaler=scaler, scheduler=sched)
    _assert_unchanged(before, model, opt)


def test_another_algorithm_layout_or_missing_part_is_refused(saved, tmp_path):
    model, opt, scaler, sched = _target()
    before = _snapshot(model, opt)
    sgd = fusedopt.FusedSGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="a checkpoint of FusedAdamW \\(adamw\\); this optimizer is FusedSGD"):
        fusedopt.load_checkpoint(sgd, saved, model=model)
    wider = torch.nn.Sequential(torch.nn.Linear(12, 17), torch.nn.Tanh(), torch.nn.Linear(17, 3))
    with pytest.raises(ValueError, match=r"parameter 0 is float32 of shape \(16, 12\) in the checkpoint, float32 of "
                                         r"shape \(17, 12\) here"):
        fusedopt.load_checkpoint(fusedopt.FusedAdamW(wider.parameters()), saved, model=wider)
    plain = tmp_path / "plain.safetensors"
    fusedopt.save_checkpoint(opt, plain)  # no model, scaler or scheduler in it
    fresh = _target()
    for what in ("model", "scaler", "scheduler"):
        with pytest.raises(ValueError, match=f"holds no {what} state"):
            fusedopt.load_checkpoint(fresh[1], plain, **{what: {"model": fresh[0], "scaler": fresh[2],
                                                                   "scheduler": fresh[3]}[what]})
    _assert_unchanged(before, model, opt)


def test_a_torch_optimizer_loads_a_fused_checkpoint(saved):
    model, opt, scaler, sched = _setup("FusedAdamW", "scaled_scheduled")
    fusedopt.load_checkpoint(opt, saved, model=model, scaler=scaler, scheduler=sched)
    twin = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fusedopt.load_checkpoint(twin, saved)
    for i, s in twin.state_dict()["state"].items():
        for key, value in s.items():
            assert torch.equal(value, opt.state_dict()["state"][i][key])


# ---- durable writes ---------------------------------------------------------------------------------------

def _marked(i: int):
    model = _model()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(i))
    return model, fusedopt.FusedSGD(model.parameters(), lr=0.1)


def test_sigkill_at_random_instants_never_leaves_a_torn_checkpoint(tmp_path):
    """A child saves checkpoints 1, 2, 3, ... to one path and reports each on a pipe; it is killed at a random
    instant, 200 times. After each kill the file verifies and is the last reported one or the next."""
    path = tmp_path / "ckpt.safetensors"
    model, opt = _marked(0)
    fusedopt.save_checkpoint(opt, path, model=model, extra={"i": 0})
    rng, last, deadline, mid_write = random.Random(1), 0, time.monotonic() + 120, 0
    model, opt = _marked(0)
    for trial in range(200):
        assert time.monotonic() < deadline, f"trial {trial}: over the time bound"
        temporaries = sum(".tmp." in name for name in os.listdir(tmp_path))
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the writer
            os.close(read)
            i = last
            while True:
                i += 1
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(float(i))
                fusedopt.save_checkpoint(opt, path, model=model, extra={"i": i})
                os.write(write, f"{i}\n".encode())
        os.close(write)
        time.sleep(rng.uniform(0.0, 0.03))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        mid_write += sum(".tmp." in name for name in os.listdir(tmp_path)) > temporaries  # killed inside a save
        with os.fdopen(read) as f:
            reported = [int(line) for line in f.read().split()]
        last = max(reported, default=last)
        loaded, _ = _marked(-1)
        extra = fusedopt.load_checkpoint(fusedopt.FusedSGD(loaded.parameters(), lr=0.1), path, model=loaded)
        assert extra["i"] in (last, last + 1), (trial, extra["i"], last)
        assert all(torch.all(p == extra["i"]) for p in loaded.parameters()), "a torn checkpoint"
        last = extra["i"]
    assert last > 0 and mid_write >= 20, (last, mid_write)  # saves completed, and kills landed inside saves


def test_a_file_size_limit_fails_the_save_clearly_and_keeps_the_old_checkpoint(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    model, opt = _marked(1)
    fusedopt.save_checkpoint(opt, path, model=model, extra={"i": 1})
    size = path.stat().st_size
    pid = os.fork()
    if pid == 0:  # a child with a file-size limit below one checkpoint: EFBIG, as a full disk gives ENOSPC
        code = 1
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))
            try:
                fusedopt.save_checkpoint(opt, path, model=model, extra={"i": 2})
            except OSError as e:
                code = 0 if e.errno == 27 and str(path) in str(e) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the save did not fail with EFBIG naming the path"
    loaded, _ = _marked(-1)
    assert fusedopt.load_checkpoint(fusedopt.FusedSGD(loaded.parameters(), lr=0.1), path, model=loaded)["i"] == 1
    assert sorted(os.listdir(tmp_path)) == ["ckpt.safetensors"], "a temporary file was left behind"


# ---- the Trainer's checkpoints (the defects found by new-user testing) --------------------------------------

def _trainer(tmp_path, optimizer="FusedAdamW", **kw):
    model = _model()
    opt = getattr(fusedopt, optimizer)(model.parameters(), lr=1e-2)
    return fusedopt.Trainer(model, torch.nn.functional.mse_loss, opt, progress=False, **kw)


def _data(n: int = 4):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 12, generator=g), torch.randn(8, 3, generator=g)) for _ in range(n)]


def test_trainer_load_failures_change_nothing(tmp_path):
    sgd = _trainer(tmp_path, "FusedSGD", checkpoint_dir=tmp_path / "sgd", checkpoint_every=2)
    sgd.train(_data())
    adamw = _trainer(tmp_path)
    adamw.train(_data(2))
    before, step = _snapshot(adamw.model, adamw.optimizer), adamw.step
    with pytest.raises(ValueError, match="FusedSGD"):
        adamw.load_checkpoint(tmp_path / "sgd" / "step-00000004.safetensors")
    _assert_unchanged(before, adamw.model, adamw.optimizer)
    assert adamw.step == step


def test_trainer_refuses_an_unwritable_checkpoint_dir_before_training(tmp_path):
    (tmp_path / "a-file").write_bytes(b"")
    with pytest.raises(OSError, match="checkpoint_dir=.*a-file/ckpt.* is not writable"):
        _trainer(tmp_path, checkpoint_dir=tmp_path / "a-file" / "ckpt", checkpoint_every=1)


def test_trainer_keeps_the_last_k_cleans_stale_temporaries_and_resumes_from_the_newest_that_verifies(tmp_path):
    stale = tmp_path / ".step-00000002.safetensors.tmp.12345.0"
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"half a checkpoint")
    first = _trainer(tmp_path, checkpoint_dir=tmp_path, checkpoint_every=1, keep_last=2)
    assert not stale.exists()
    first.train(_data(4))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["step-00000003.safetensors", "step-00000004.safetensors"]
    newest = tmp_path / names[-1]
    newest.write_bytes(newest.read_bytes()[:-1])  # torn by a crash the durable write cannot prevent (the disk)
    with pytest.warns(UserWarning, match="skipping checkpoint .*step-00000004.safetensors.*truncated|checksum"):
        resumed = _trainer(tmp_path, checkpoint_dir=tmp_path, resume=True)
    assert resumed.step == 3


def test_tensors_of_every_size_and_dtype_load_in_place(tmp_path):
    """Odd-sized narrow tensors before wide ones would leave the wide ones misaligned: the writer puts the widest
    dtypes first, so each tensor is viewed where it lies."""
    model, opt = _marked(2)
    extra = {"flags": torch.tensor([True, False, True]), "bytes": torch.arange(3, dtype=torch.uint8),
             "half": torch.tensor([1.5, 2.5, 3.5], dtype=torch.bfloat16), "wide": torch.arange(3, dtype=torch.int64),
             "scalar": torch.tensor(7.25), "empty": torch.zeros(0, 4)}
    fusedopt.save_checkpoint(opt, tmp_path / "c.safetensors", model=model, extra=extra)
    loaded = fusedopt.load_checkpoint(opt, tmp_path / "c.safetensors", model=model)
    for key, value in extra.items():
        assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
