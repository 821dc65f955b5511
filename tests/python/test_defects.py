"""Regression tests of issue #11's Python items (2, 3, 4, 5, 6, 8, 11, 12, 19): duplicated and
overlapping params, rejected steps that must change nothing, bad state['step'] values, torch's empty
state for SGD without momentum, named errors, and resuming a Trainer."""

from __future__ import annotations

import math
import re

import fusedopt
import pytest
from algorithm_cases import PARITY
from conftest import BASE_KW, FUSED, NAMES, TORCH, assert_bitwise, assert_unchanged, compare_opts, snapshot

import torch

# torch.optim's for-loop over duplicated / overlapping params, with these option sets.
DUP_KW = {name: case.duplicate_params_options for name, case in PARITY.items()}


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # so that a race between chunks of two segments would show
    yield
    torch.set_num_threads(before)


def _grads(params, t):
    g = torch.Generator().manual_seed(1000 + t)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) + 0.3


def _compare(name, fus, ref):
    # With an IEEE sqrt in torch (the ieee_sqrt fixture), bit for bit, like test_parity.
    compare_opts(fus, ref, name, bitwise=True)


# ---- item 2: the same tensor twice --------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_duplicate_param_matches_torch(name, two_threads, ieee_sqrt):
    def make():
        w = torch.nn.Parameter(torch.linspace(-1, 1, 100_000))
        v = torch.nn.Parameter(torch.ones(7))
        return w, v, [w, v, w]

    w_t, v_t, ps_t = make()
    w_f, v_f, ps_f = make()
    with pytest.warns(UserWarning, match="duplicate parameters"):
        ref = TORCH[name](ps_t, foreach=False, **DUP_KW[name])
    with pytest.warns(UserWarning, match="duplicate parameters"):
        fus = FUSED[name](ps_f, **DUP_KW[name])
    for t in range(4):
        _grads([w_t, v_t], t)
        _grads([w_f, v_f], t)
        ref.step()
        fus.step()
        _compare(f"{name} step {t}", fus, ref)
    if "step" in ref.state[w_t]:
        assert float(fus.state[w_f]["step"]) == float(ref.state[w_t]["step"]) == 8.0  # once per occurrence


def test_duplicate_param_sgd_first_step_is_torchs(two_threads):
    """The issue's example: torch gives -0.2 everywhere (each occurrence starts a fresh buffer)."""
    w = torch.nn.Parameter(torch.zeros(100_000))
    with pytest.warns(UserWarning, match="duplicate parameters"):
        opt = fusedopt.FusedSGD([w, w], lr=0.1, momentum=0.9)
    w.grad = torch.ones(100_000)
    opt.step()
    assert torch.equal(w.detach(), torch.full((100_000,), -0.2))


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_duplicate_param_with_accumulation_and_clipping(name, two_threads, ieee_sqrt):
    """Accumulation adds a duplicated param's grad once (torch's .grad is one tensor). The fused
    max_grad_norm counts it once per occurrence, as torch.nn.utils.clip_grad_norm_(opt's params)
    does, and each occurrence reads the grad clipped once."""
    def make():
        w = torch.nn.Parameter(torch.linspace(-1, 1, 50_000))
        return w, [w, w]

    w_t, ps_t = make()
    w_f, ps_f = make()
    with pytest.warns(UserWarning):
        ref = TORCH[name](ps_t, foreach=False, **DUP_KW[name])
    with pytest.warns(UserWarning):
        fus = FUSED[name](ps_f, max_grad_norm=1.0, accumulation_steps=2, **DUP_KW[name])
    for t in range(3):
        mean = torch.zeros(50_000)
        for micro in range(2):
            _grads([w_f], 2 * t + micro)
            mean += w_f.grad * 0.5  # the fused accumulator: the sum of grad / k
            fus.step()
        w_t.grad = mean
        norm = torch.nn.utils.clip_grad_norm_(list(ps_t), math.inf)  # the norm only (of w twice)
        w_t.grad.mul_(torch.clamp(1.0 / (norm + 1e-6), max=1.0))  # torch's coefficient, applied once
        ref.step()
        assert fus.last_grad_norm == pytest.approx(float(norm), rel=1e-6)
        # The fused norm is summed in double: the coefficient may differ from torch's f32 one by an ulp.
        compare_opts(fus, ref, f"{name} window {t}", rtol=1e-5)


def test_duplicate_param_in_two_groups_is_torchs_error():
    w = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
        fusedopt.FusedSGD([{"params": [w]}, {"params": [w]}], lr=0.1)


def test_duplicate_param_with_flatten_matches_torch():
    w_t, w_f = (torch.nn.Parameter(torch.zeros(1000)) for _ in range(2))
    with pytest.warns(UserWarning):
        ref = torch.optim.Adam([w_t, w_t], lr=0.01, foreach=False)
    with pytest.warns(UserWarning):
        fus = fusedopt.FusedAdam([w_f, w_f], lr=0.01, flatten=True)
    for t in range(3):
        _grads([w_t], t)
        _grads([w_f], t)
        ref.step()
        fus.step()
    compare_opts(fus, ref, "flatten", rtol=1e-5)


# ---- item 3: params that overlap in memory -------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_overlapping_params_match_torch(name, two_threads, ieee_sqrt):
    def make():
        base = torch.linspace(-1, 1, 100_000)
        a = torch.nn.Parameter(base[:60_000])
        b = torch.nn.Parameter(base[40_000:])
        c = torch.nn.Parameter(torch.ones(5))
        return [a, c, b]

    ps_t, ps_f = make(), make()
    ref = TORCH[name](ps_t, foreach=False, **DUP_KW[name])
    fus = FUSED[name](ps_f, **DUP_KW[name])
    for t in range(4):
        _grads(ps_t, t)
        _grads(ps_f, t)
        ref.step()
        fus.step()
        _compare(f"{name} step {t}", fus, ref)
    assert ps_f[0].data_ptr() + 40_000 * 4 == ps_f[2].data_ptr()  # still views into one storage


def test_overlapping_params_refuse_flatten():
    base = torch.zeros(10)
    a, b = torch.nn.Parameter(base[:6]), torch.nn.Parameter(base[4:])
    with pytest.raises(ValueError, match=r"overlap in memory.*flatten=True"):
        fusedopt.FusedSGD([a, b], lr=0.1, flatten=True)


# ---- item 4: a rejected step at the accumulation boundary keeps the window -----------------------

@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_rejected_step_at_window_boundary_keeps_the_window(name):
    def make():
        return [torch.nn.Parameter(torch.linspace(-1, 1, 40_000)), torch.nn.Parameter(torch.ones(7))]

    ps_a, ps_b = make(), make()
    good = FUSED[name](ps_a, accumulation_steps=2, **BASE_KW[name])
    bad = FUSED[name](ps_b, accumulation_steps=2, **BASE_KW[name])
    for t in range(6):  # three windows; the second window's boundary is first rejected
        _grads(ps_a, t)
        _grads(ps_b, t)
        good.step()
        if t == 3:
            snap = snapshot(bad)
            bad.param_groups[0]["lr"] = float("nan")
            with pytest.raises(ValueError, match="lr"):
                bad.step()
            assert_unchanged(bad, snap, "after the rejected boundary step")
            bad.param_groups[0]["lr"] = good.param_groups[0]["lr"]
        bad.step()  # the retried call: the same micro-batch, applied with its whole window
        compare_opts(bad, good, f"{name} micro-batch {t}", bitwise=True)


# ---- item 5: a failed step rolls back state conversions ------------------------------------------

def test_failed_step_keeps_loaded_f32_states_with_bf16_state_dtype():
    p = torch.nn.Parameter(torch.randn(100))
    src = torch.optim.Adam([torch.nn.Parameter(p.detach().clone())], lr=0.01)
    src.param_groups[0]["params"][0].grad = torch.randn(100)
    src.step()
    opt = fusedopt.FusedAdam([p], lr=0.01, state_dtype=torch.bfloat16)
    opt.load_state_dict(src.state_dict())
    before = dict(opt.state[p])
    values = {k: v.clone() for k, v in before.items()}
    assert before["exp_avg"].dtype == torch.float32
    opt.param_groups[0]["lr"] = float("nan")
    p.grad = torch.randn(100)
    with pytest.raises(ValueError, match="lr"):
        opt.step()
    assert opt.state[p].keys() == before.keys()
    for k, v in before.items():
        assert opt.state[p][k] is v, k  # the same objects, dtypes and values
        assert_bitwise(v, values[k], k)
    opt.param_groups[0]["lr"] = 0.01
    opt.step()  # the retried step converts them
    assert opt.state[p]["exp_avg"].dtype == torch.bfloat16


# ---- item 6: state['step'] that no int64 can hold ------------------------------------------------

@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e30, -1e30, -1.0])
@pytest.mark.parametrize("name", ["Adam", "RMSprop", "Adagrad", "RAdam", "NAdam"])
def test_invalid_loaded_step_is_a_named_value_error(name, value):
    p = torch.nn.Parameter(torch.randn(10))
    opt = FUSED[name]([torch.nn.Parameter(torch.zeros(3)), p], **BASE_KW[name])
    p.grad = torch.randn(10)
    opt.step()
    sd = opt.state_dict()
    sd["state"][1]["step"] = torch.tensor(value)
    opt.load_state_dict(sd)
    snap = snapshot(opt)
    with pytest.raises(ValueError, match=re.escape(f"state['step'] of parameter 1 of group 0 is {value:g}")):
        opt.step()
    assert_unchanged(opt, snap, "after the rejected step")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e30])
def test_invalid_step_written_in_place_is_rejected_by_the_engine(value):
    """A value written into the live f32 counter (no load_state_dict) reaches the C++ cast, which
    must check it too (it was undefined behaviour)."""
    p = torch.nn.Parameter(torch.randn(10))
    opt = fusedopt.FusedAdam([p], lr=0.01)
    p.grad = torch.randn(10)
    opt.step()
    opt.step()  # the second step runs from the cached segment
    opt.state[p]["step"].fill_(value)
    snap = snapshot(opt)
    with pytest.raises(ValueError, match=r"invalid state\['step'\]: (nan|inf|1e\+30)"):
        opt.step()
    assert_unchanged(opt, snap, "after the rejected step")


# ---- item 8: no state where torch keeps none -----------------------------------------------------

def test_sgd_without_momentum_keeps_no_state():
    ps_t = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(4))]
    ps_f = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(4))]
    ref = torch.optim.SGD(ps_t, lr=0.1, foreach=False)
    fus = fusedopt.FusedSGD(ps_f, lr=0.1)
    for t in range(2):
        _grads(ps_t, t)
        _grads(ps_f, t)
        ref.step()
        fus.step()
    assert fus.state_dict()["state"] == ref.state_dict()["state"] == {}
    assert len(fus.state) == 0
    for a, b in zip(ps_f, ps_t):
        assert_bitwise(a.detach(), b.detach())


# ---- item 11: flatten=True with a param resized behind the grad ----------------------------------

def test_flatten_resized_param_with_stale_grad_is_a_named_value_error():
    a, b = torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(3))
    opt = fusedopt.FusedSGD([a, b], lr=0.1, flatten=True)
    a.grad, b.grad = torch.ones(5), torch.ones(3)
    opt.step()
    a.data = torch.zeros(9)  # the grad keeps its 5 elements
    with pytest.raises(ValueError, match=re.escape("the gradient of parameter 0 of group 0 has shape (5,) "
                                                   "but the parameter has (9,)")):
        opt.step()
    assert torch.equal(b.detach(), torch.full((3,), -0.1))


# ---- item 12: hyper-parameters and steps that are not one number ---------------------------------

@pytest.mark.parametrize("name,key,value,field", [(name, *defect) for name, case in PARITY.items()
                                                  for defect in case.tensor_hyper_defects])
def test_multi_element_hyper_parameter_is_named(name, key, value, field):
    ps = [torch.nn.Parameter(torch.zeros(3))]
    opt = FUSED[name]([{"params": [torch.nn.Parameter(torch.zeros(2))]}, {"params": ps}], **BASE_KW[name])
    opt.param_groups[1][key] = value
    ps[0].grad = torch.ones(3)
    snap = snapshot(opt)
    with pytest.raises((ValueError, TypeError), match=re.escape(f"param_groups[1]{field} must be a number")):
        opt.step()
    assert_unchanged(opt, snap, "after the rejected step")


def test_multi_element_step_is_named():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = fusedopt.FusedAdam([p], lr=0.1)
    opt.state[p]["step"] = torch.tensor([1.0, 2.0])
    p.grad = torch.ones(3)
    with pytest.raises(ValueError, match=re.escape("state['step'] of parameter 0 of group 0 must be a number "
                                                   "or a 1-element tensor, got a tensor of shape (2,)")):
        opt.step()


# ---- item 19: resuming a Trainer -----------------------------------------------------------------

def test_trainer_resume_continues_from_the_newest_checkpoint(tmp_path):
    data = [(torch.randn(4, 3, generator=torch.Generator().manual_seed(i)), torch.tensor([0, 1, 0, 1]))
            for i in range(4)]

    def trainer(**kw):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = fusedopt.FusedAdamW(model.parameters(), lr=1e-2)
        return fusedopt.Trainer(model, torch.nn.functional.cross_entropy, opt, progress=False, **kw)

    whole = trainer()
    full = whole.train(data, epochs=2)
    first = trainer(checkpoint_dir=tmp_path, checkpoint_every=2)
    first.train(data, epochs=2, steps=4)
    (tmp_path / "step-00000099.safetensors.tmp").write_bytes(b"")  # an interrupted save is not a checkpoint
    resumed = trainer(checkpoint_dir=tmp_path, checkpoint_every=2, resume=True)
    assert resumed.step == 4
    rest = resumed.train(data, epochs=2)
    assert rest["losses"] == full["losses"][4:]
    for a, b in zip(resumed.model.parameters(), whole.model.parameters()):
        assert torch.equal(a, b)
    fresh = trainer(checkpoint_dir=tmp_path / "empty", resume=True)  # nothing to resume: step 0
    assert fresh.step == 0
    with pytest.raises(ValueError, match="resume=True needs a checkpoint_dir"):
        trainer(resume=True)
