"""The Python package lists no algorithm of its own: its classes, their Hyper from a param group, the trainer's and
checkpoints' names and the references' updates come from the registry (_C.algorithms, the C++ descriptors) and from
one implementation each. These tests check that what is derived is what the hand-written lists used to say."""

from __future__ import annotations

import sys
from pathlib import Path

import fusedopt
import pytest
from algorithm_cases import CASES
from fusedopt import _C
from fusedopt._names import algorithm_name, optimizer_name

import torch

ALGORITHMS = list(_C.algorithms)


def test_every_algorithm_of_the_registry_has_its_public_class_in_the_registrys_order():
    classes = [name for name in fusedopt.__all__ if name.startswith("Fused")]
    assert classes == [f"Fused{_C.algorithms[a]['torch_name']}" for a in ALGORITHMS]
    for name in classes:
        assert isinstance(getattr(fusedopt, name), type)


def _optimizer(algorithm: str) -> torch.optim.Optimizer:
    cls = getattr(fusedopt, f"Fused{_C.algorithms[algorithm]['torch_name']}")
    return cls([torch.nn.Parameter(torch.ones(4, 3))], **CASES[algorithm].required_options)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_hyper_holds_the_groups_values_at_the_descriptors_keys(algorithm):
    """Every field the descriptor maps is read from its group key (and tuple index) as the engine takes it."""
    opt = _optimizer(algorithm)
    group = opt.param_groups[0]
    h = opt._hyper(group)
    for f in _C.algorithms[algorithm]["fields"]:
        if f["optional"] and f["key"] not in group:
            continue
        value = group[f["key"]] if f["index"] < 0 else group[f["key"]][f["index"]]
        if value is None and f["nullable"]:
            continue
        if f["choices"]:
            value = list(f["choices"]).index(value)
        assert getattr(h, f["name"]) == (bool(value) if isinstance(getattr(h, f["name"]), bool) else value), f


def test_the_hyper_of_a_bad_choice_or_number_names_the_field():
    opt = _optimizer("bert_adam")
    opt.param_groups[0]["schedule"] = "warmup_nope"
    with pytest.raises(ValueError, match="Invalid schedule parameter: warmup_nope"):
        opt.step()
    opt = fusedopt.FusedAdam([torch.nn.Parameter(torch.ones(3))])
    opt.param_groups[0]["betas"] = (0.9,)
    opt.param_groups[0]["params"][0].grad = torch.ones(3)
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['betas'\] has no value at index 1"):
        opt.step()


def test_steps_are_counted_where_the_descriptor_says():
    for algorithm in ALGORITHMS:
        cls = type(_optimizer(algorithm))
        assert cls._counts_steps == _C.algorithms[algorithm]["counts_steps"]
    assert [a for a in ALGORITHMS if not _C.algorithms[a]["counts_steps"]] == [
        a for a, case in CASES.items() if not case.counts_steps]


# What trainer.py's hand list said (the registry's names of the torch.optim twins), and the twin it missed (its fused
# class was "fused<name>" in traces).
_OLD_NAMES = {case.torch: algorithm for algorithm, case in CASES.items() if case.torch is not None}


@pytest.mark.parametrize("cls", list(_OLD_NAMES))
def test_a_torch_optimizer_and_its_fused_twin_have_one_name(cls):
    p = [torch.nn.Parameter(torch.ones(3))]
    torch_opt = cls(p, lr=1e-3)
    fused = getattr(fusedopt, f"Fused{cls.__name__}")(p, lr=1e-3)
    assert optimizer_name(torch_opt) == optimizer_name(fused) == _OLD_NAMES[cls]
    assert algorithm_name(torch_opt) == algorithm_name(fused) == _OLD_NAMES[cls]


@pytest.mark.parametrize("algorithm", [a for a, case in CASES.items() if case.torch is None])
def test_a_fused_class_without_a_torch_twin_has_the_engines_name(algorithm):
    opt = _optimizer(algorithm)
    assert optimizer_name(opt) == CASES[algorithm].fused.__name__.lower()  # e.g. "fusedlamb"
    assert algorithm_name(opt) == algorithm


@pytest.mark.parametrize("name", [a for a, case in CASES.items() if case.tools_reference])
def test_tools_references_are_the_packages(name):
    """tools/<name>_reference.py re-exports the package's reference: one implementation, which the fused class's
    fallback step runs too."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    tool = __import__(f"{name}_reference")
    package = __import__(f"fusedopt._references.{name}", fromlist=["_"])
    assert tool.__all__ and all(getattr(tool, n) is getattr(package, n) for n in tool.__all__)


# Hand-written classes whose reference reads a field otherwise than the descriptor's generic reading, fills a state
# otherwise, clips by default (FusedLAMB: apex's max_grad_norm) or routes params the engine could take: not compared.
_ODD = {algorithm for algorithm, case in CASES.items() if case.generic_class_differs}


@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a not in _ODD])
def test_an_algorithm_without_a_class_of_its_own_gets_one_from_its_descriptor(algorithm):
    """generic_class (what a new algorithm's descriptor alone gives): the descriptor's group keys with the Hyper's
    defaults, the engine's checks in the constructor, and the same steps and state as the hand-written class."""
    from fusedopt._generic import generic_class

    entry = _C.algorithms[algorithm]
    generic = generic_class(algorithm, entry, __name__)
    hand = type(_optimizer(algorithm))
    torch.manual_seed(0)
    shapes = [(5, 3), (7,)]
    p_h = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    p_g = [torch.nn.Parameter(t.detach().clone()) for t in p_h]
    h = hand(p_h, lr=1e-2)
    keys = set(generic([torch.nn.Parameter(torch.ones(1))]).defaults)
    g = generic(p_g, **{k: v for k, v in h.defaults.items() if k in keys})
    for _ in range(3):
        for a, b in zip(p_h, p_g):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        h.step()
        g.step()
    for a, b in zip(p_h, p_g):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert sorted(h.state[a]) == sorted(g.state[b])
    with pytest.raises(ValueError, match="lr"):
        generic([torch.nn.Parameter(torch.ones(1))], lr=-1.0)
    with pytest.raises(TypeError, match="unknown hyper-parameters"):
        generic([torch.nn.Parameter(torch.ones(1))], no_such_key=1.0)
