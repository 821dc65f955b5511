"""Regression tests of issue #29's items 2, 5, 6 and 12: what clients hand the fused optimizers that torch (or
the class's reference) takes.

- item 2: DTensor params and grads (FSDP2's fully_shard, tensor parallel) have no storage of their own; the
  fused step takes their local shards (issue #32, test_fsdp2.py), fusedopt.clip_grad_norm_/clip_grad_value_
  take torch's own path, and both GradScalers work with them. Checked against torch on the same DTensors.
- item 5: every class's signature is its twin's (names, kinds, defaults) followed by fusedopt's keyword-only
  options, which its docstring documents; a factory that filters kwargs by signature (timm, HF) works.
- item 6: meta-device params step as torch steps them (shape only), with max_grad_norm and accumulation too.
- item 12: a tuple hyper-parameter (betas, etas, step_sizes, Adafactor's eps) of the wrong length is a
  ValueError naming it and its value, at construction and at the step of a param group given one.
"""

from __future__ import annotations

import inspect
import re
import warnings

import fusedopt
import pytest
from algorithm_cases import CASES
from conftest import BASE_KW, assert_unchanged, run_isolated, snapshot

import torch

CLASSES = {n[len("Fused"):]: getattr(fusedopt, n) for n in fusedopt.__all__ if n.startswith("Fused")}
TWINS = {case.name: case.torch for case in CASES.values() if case.torch}  # the classes whose reference is torch.optim's


# The constructors of the references: torch.optim's twins', or as the reference's library defines it (fusedopt takes
# them as they are; algorithm_cases.py's reference_init).
REFERENCES = {case.name: case.torch.__init__ if case.torch else case.reference_init for case in CASES.values()}
# fusedopt's own keyword-only options and their defaults (docs/pytorch.md, optim.py).
OPTIONS = {"master_weights": False, "flatten": False, "max_grad_norm": None, "norm_type": 2.0, "accumulation_steps": 1,
           "state_dtype": None, "min_8bit_size": 4096, "stochastic_rounding": False, "seed": 0, "strict": False, "step_in_backward": False}


def _expected_options(name: str) -> dict:
    # FusedLAMB and FusedBertAdam take their reference's max_grad_norm, and no norm_type (they clip by L2 only).
    own = inspect.signature(REFERENCES[name]).parameters
    return {k: v for k, v in OPTIONS.items() if k not in own and not (k == "norm_type" and "max_grad_norm" in own)}


def _shape(sig: inspect.Signature) -> list:
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def _params(device="cpu"):
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(device)) for s in ((5, 3), (4,))]


def _grads(params, t: int):
    g = torch.Generator().manual_seed(100 + t)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) + 0.3).to(p.device)


# ---- item 5: signatures -------------------------------------------------------------------------

@pytest.mark.parametrize("name", CLASSES)
def test_signature_is_the_references_then_fusedopts_options(name):
    cls = CLASSES[name]
    reference = [q for q in _shape(inspect.signature(REFERENCES[name])) if q[1] is not inspect.Parameter.VAR_KEYWORD]
    options = [(k, inspect.Parameter.KEYWORD_ONLY, v) for k, v in _expected_options(name).items()]
    assert _shape(inspect.signature(cls.__init__)) == reference + options
    assert _shape(inspect.signature(cls)) == reference[1:] + options  # (without self)


@pytest.mark.parametrize("name", CLASSES)
def test_docstring_documents_every_option(name):
    cls = CLASSES[name]
    for doc in (inspect.getdoc(cls), inspect.getdoc(cls.__init__)):
        for option in _expected_options(name):
            assert re.search(rf"^\s+{option} \(.+\): \S", doc, re.M), f"{name}: {option} is not documented:\n{doc}"


@pytest.mark.parametrize("name", TWINS)
def test_factory_filtering_kwargs_by_signature(name):
    """timm's create_optimizer / HF's optimizer factory pass only the kwargs the class's signature lists."""
    wanted = dict(lr=0.0123, weight_decay=0.02, eps=1e-5, betas=(0.8, 0.9), momentum=0.5, alpha=0.9, max_grad_norm=0.5,
                  accumulation_steps=1, foreach=False)

    def create(cls, params):
        accepted = inspect.signature(cls).parameters  # (and of the kind of its default: Adafactor's eps is a pair)
        return cls(params, **{k: v for k, v in wanted.items()
                              if k in accepted and isinstance(accepted[k].default, tuple) == isinstance(v, tuple)})

    fused, ref = create(CLASSES[name], _params()), create(TWINS[name], _params())
    fused_group = {k: v for k, v in fused.param_groups[0].items() if k != "params"}
    assert fused_group == {k: v for k, v in ref.param_groups[0].items() if k != "params"}
    assert fused_group["lr"] == 0.0123
    _grads([p for g in fused.param_groups for p in g["params"]], 0)
    fused.step()
    assert fused.last_grad_norm is not None  # max_grad_norm reached the fused class


def test_positional_arguments_map_as_in_the_reference():
    ps = _params()
    adam = fusedopt.FusedAdam(ps, 0.5, (0.8, 0.9), 1e-4, 0.1, True)
    assert adam.param_groups[0] | {"params": None} == torch.optim.Adam(_params(), 0.5, (0.8, 0.9), 1e-4, 0.1,
                                                                        True).param_groups[0] | {"params": None}
    # apex's order: ..., set_grad_none, max_grad_norm, use_nvlamb
    lamb = fusedopt.FusedLAMB(_params(), 1e-3, True, (0.9, 0.999), 1e-6, 0.01, False, True, True, False, 0.25, True)
    assert (lamb.defaults["max_grad_norm"], lamb.defaults["use_nvlamb"], lamb.set_grad_none) == (0.25, True, False)
    with pytest.raises(TypeError, match="bogus"):
        fusedopt.FusedAdamW(_params(), bogus=1)


# ---- item 12: tuple hyper-parameters of the wrong length --------------------------------------------

TUPLE_HYPERS = [(name, key) for name, cls in CLASSES.items()
                for key, p in inspect.signature(REFERENCES[name]).parameters.items() if isinstance(p.default, tuple)]


def test_tuple_hyper_parameters_found():
    assert {(n, k) for n, k in TUPLE_HYPERS} >= {(case.name, k) for case in CASES.values() for k in case.tuple_hypers}


@pytest.mark.parametrize("name,key", TUPLE_HYPERS)
def test_short_tuple_is_a_value_error_at_construction(name, key):
    short = inspect.signature(REFERENCES[name]).parameters[key].default[1:]
    with pytest.raises(ValueError, match=rf"{key}: {re.escape(repr(short))}"):
        CLASSES[name](_params(), **{key: short})
    with pytest.raises(TypeError, match=rf"{key} must be a sequence of 2 values, got 0.5"):
        CLASSES[name](_params(), **{key: 0.5})


@pytest.mark.parametrize("name,key", TUPLE_HYPERS)
def test_short_tuple_in_a_param_group_is_a_value_error_at_step(name, key):
    """torch's add_param_group does not check the group's values; the step names the group and the value, and
    changes nothing."""
    ps = _params()
    opt = CLASSES[name](ps[:1])
    short = tuple(opt.defaults[key][:1])
    opt.add_param_group({"params": ps[1:]})
    _grads(ps, 0)
    opt.step()  # both params have state now
    opt.param_groups[1][key] = short
    _grads(ps, 1)
    snap = snapshot(opt)
    message = rf"param_groups\[1\]\['{key}'\] has no value at index 1: {re.escape(repr(short))}"
    with pytest.raises(ValueError, match=message):
        opt.step()
    assert_unchanged(opt, snap, name)
    fresh = CLASSES[name](ps[:1])
    fresh.add_param_group({"params": ps[1:], key: short})
    with pytest.raises(ValueError, match=message):
        fresh.step()
    assert not fresh.state


# ---- item 6: meta-device params ---------------------------------------------------------------------

def _states(opt):
    """Per param (in order): {key: (shape, dtype, device, value if on the CPU)}."""
    out = []
    for p in (p for g in opt.param_groups for p in g["params"]):
        out.append({k: (tuple(v.shape), v.dtype, v.device.type, v.tolist() if v.device.type == "cpu" else None)
                    for k, v in opt.state.get(p, {}).items() if isinstance(v, torch.Tensor)})
    return out


def _meta_run(make, clip=None, calls=1):
    """Two steps on meta params (each of `calls` step() calls, clipping first when clip is given); the state
    it leaves, or the error it raised."""
    ps = _params("meta")
    try:
        opt = make(ps)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the note that meta params take torch's step)
            for t in range(2):
                for _ in range(calls):
                    _grads(ps, t)
                    if clip is not None:
                        torch.nn.utils.clip_grad_norm_(ps, clip)
                    opt.step()
    except Exception as e:
        return type(e)
    assert all(p.device.type == "meta" for p in ps)
    return _states(opt)


@pytest.mark.parametrize("option", ["default", "max_grad_norm", "accumulation_steps"])
@pytest.mark.parametrize("name", TWINS)
def test_meta_params_step_as_torch(name, option):
    """torch's step on meta params creates states of the right shapes (its step counts on the CPU); so must the
    fused class's, with its own clipping (torch: clip_grad_norm_, which runs on meta) and accumulation (torch: one
    step per window). Where torch's step raises on meta (a step that reads values), so does fusedopt's."""
    kw = dict(BASE_KW.get(name, {}))
    fused_kw = {"max_grad_norm": {"max_grad_norm": 1.0}, "accumulation_steps": {"accumulation_steps": 2}}.get(option, {})
    ref = _meta_run(lambda ps: TWINS[name](ps, foreach=False, **kw), clip=1.0 if option == "max_grad_norm" else None)
    got = _meta_run(lambda ps: CLASSES[name](ps, **kw, **fused_kw), calls=2 if option == "accumulation_steps" else 1)
    assert got == ref


@pytest.mark.parametrize("name,kw", [("Lion", {}), ("RMSpropTF", dict(momentum=0.5, centered=True)),
                                     ("BertAdam", dict(lr=1e-3, max_grad_norm=0.0))])
def test_meta_params_of_reference_classes(name, kw):
    """The classes whose reference step runs on meta params (the others' read values: LAMB's trust ratio, LARS's,
    AdamP's projection test): states as the same class creates on the CPU."""
    got = _meta_run(lambda ps: CLASSES[name](ps, **kw))
    ps = _params()
    opt = CLASSES[name](ps, **kw)
    for t in range(2):
        _grads(ps, t)
        opt.step()
    # the same states, on meta but for the step counts
    cpu = [{k: v if k == "step" else v[:2] + ("meta", None) for k, v in s.items()} for s in _states(opt)]
    assert got == cpu


# ---- item 2: DTensor params and grads -------------------------------------------------------------------

_DTENSOR = r'''
import os, tempfile, warnings
import torch, torch.distributed as dist
import fusedopt
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor


def params(placement):
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(distribute_tensor(torch.randn(s, generator=g), mesh, [placement]))
            for s in ((6, 3), (4,))]


def grads(ps, t, placement, scale=1.0, inf=False):
    g = torch.Generator().manual_seed(100 + t)
    for p in ps:
        v = (torch.randn(p.shape, generator=g) + 0.3) * scale
        if inf:
            v[0] = float("inf")
        p.grad = distribute_tensor(v, mesh, [placement])


def close(a, b, what):
    # the fused AdamW and torch's differ by torch's fp32 sqrt, which is not correctly rounded
    assert type(a) is type(b), (what, type(a), type(b))
    if isinstance(a, DTensor):
        assert a.placements == b.placements, what
        a, b = a.full_tensor(), b.full_tensor()
    a, b = a.detach().double(), b.detach().double()
    assert torch.linalg.vector_norm(a - b) <= 1e-6 * torch.linalg.vector_norm(b), what


def compare(fo, to, fps, tps, what):
    for i, (p, q) in enumerate(zip(fps, tps)):
        close(p, q, f"{what}: param {i}")
        assert fo.state[p].keys() == to.state[q].keys(), what
        for k in to.state[q]:
            close(fo.state[p][k], to.state[q][k], f"{what}: param {i} state {k}")


store = tempfile.NamedTemporaryFile(delete=False)
store.close()
dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
try:
    mesh = init_device_mesh("cpu", (1,))
    for placement in (Replicate(), Shard(0)):
        # clip_grad_norm_ / clip_grad_value_, and both GradScalers (unscale_ + clip, or the step's own check;
        # an Inf in step 1 skips it)
        for fused_scaler in (True, False):
            for explicit_unscale in (True, False):
                fps, tps = params(placement), params(placement)
                fo, to = fusedopt.FusedAdamW(fps, lr=0.1), torch.optim.AdamW(tps, lr=0.1, foreach=False)
                fs = fusedopt.GradScaler() if fused_scaler else torch.amp.GradScaler("cpu")
                ts = torch.amp.GradScaler("cpu")
                for t in range(3):
                    for ps, opt, scaler, clip in ((fps, fo, fs, fusedopt.clip_grad_norm_),
                                                  (tps, to, ts, torch.nn.utils.clip_grad_norm_)):
                        scale = float(scaler.scale(torch.ones(())))
                        grads(ps, t, placement, scale, inf=t == 1)
                        if explicit_unscale:
                            scaler.unscale_(opt)
                            clip(ps, 0.5)
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            scaler.step(opt)
                        scaler.update()
                    assert fs.get_scale() == ts.get_scale()
                    compare(fo, to, fps, tps, f"scaler fused={fused_scaler} unscale_={explicit_unscale} step {t}")
        fps, tps = params(placement), params(placement)
        grads(fps, 0, placement, 3.0)
        grads(tps, 0, placement, 3.0)
        fusedopt.clip_grad_value_(fps, 0.5)
        torch.nn.utils.clip_grad_value_(tps, 0.5)
        for p, q in zip(fps, tps):
            assert torch.equal(p.grad.full_tensor(), q.grad.full_tensor()), "clip_grad_value_"
        # strict=True: the fused step takes DTensors where its update is element-wise, or its whole-tensor sums
        # are added up over the ranks (AdamP's and Adafactor's of params cut along their first dimension); a
        # param cut along its columns is an error naming it for AdamP (its per-row projection)
        fps = params(placement)
        grads(fps, 0, placement)
        for cls in (fusedopt.FusedAdamW, fusedopt.FusedAdamP, fusedopt.FusedAdafactor):
            cls(fps, strict=True).step()
        fps = [torch.nn.Parameter(distribute_tensor(torch.randn(6, 3), mesh, [Shard(1)]))]
        grads(fps, 0, Shard(1))
        try:
            fusedopt.FusedAdamP(fps, strict=True).step()
            raise AssertionError("strict=True took a DTensor cut along its columns for AdamP")
        except TypeError as e:
            assert "parameter 0 of group 0" in str(e) and "reduces over whole tensors" in str(e), e
finally:
    dist.destroy_process_group()
    os.unlink(store.name)
print("dtensor checks passed")
'''


def test_dtensor_params_with_scalers_clipping_and_strict():
    """A 1-process gloo group in a fresh interpreter (no default group leaks into other tests); Replicate and
    Shard(0) DTensors: both GradScalers and the clipping functions against torch's; strict=True. (Several ranks,
    every class, FSDP2 models and DCP: test_fsdp2.py.)"""
    out = run_isolated(_DTENSOR, timeout=300)
    assert out.returncode == 0 and "dtensor checks passed" in out.stdout, out.stdout + out.stderr[-3000:]
