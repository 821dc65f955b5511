"""Every input PyTorch's own optimizer tests give an optimizer (torch.testing's optim_db: the option
sets of TestOptimRenewed, per torch.optim class), on float32, float64 and complex64 params (and a
non-contiguous one), through each fused torch.optim twin against the twin itself: same errors, and
after a few steps the same params and states (float64 params, which take torch's own step, bit for
bit)."""

from __future__ import annotations

import copy
import warnings

import fusedopt
import pytest
from conftest import assert_bitwise, assert_close

import torch

optim_db = pytest.importorskip("torch.testing._internal.common_optimizers").optim_db


def _twins():
    """(torch.optim class, fused class) for every fused class that subclasses its torch.optim twin."""
    out = []
    for name in fusedopt.__all__:
        cls = getattr(fusedopt, name)
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer):
            # (torch.optim.Adafactor's __module__ is "torch.optim" itself, the others' a submodule)
            twin = next((b for b in cls.__mro__[1:] if f"{b.__module__}.".startswith("torch.optim.")
                         and b is not torch.optim.Optimizer), None)
            if twin is not None:
                out.append((twin, cls))
    return out


def _cases():
    infos = {info.optim_cls: info for info in optim_db}
    cases = []
    for twin, fused in _twins():
        info = infos[twin]
        dtypes = [torch.float32, torch.float64] + ([torch.complex64] if info.supports_complex else [])
        for k, optim_input in enumerate(info.optim_inputs_func(device="cpu")):
            for dtype in dtypes:
                cases.append(pytest.param(twin, fused, optim_input.kwargs, dtype,
                                          id=f"{twin.__name__}-{optim_input.desc}-{str(dtype)[6:]}-{k}"))
    return cases


def _model(dtype):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(6, 5, generator=g).to(dtype)
    return [torch.nn.Parameter(weight), torch.nn.Parameter(torch.randn(5, generator=g).to(dtype)),
            torch.nn.Parameter(torch.randn(4, 7, generator=g).to(dtype).t())]  # not contiguous


def _run(cls, kwargs, dtype, steps=5):
    params = _model(dtype)
    opt = cls(params, **copy.deepcopy(kwargs))
    for t in range(steps):
        for i, p in enumerate(params):
            if (t + i) % 3 == 2:  # some params miss some steps
                p.grad = None
                continue
            g = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 * t + i)).to(dtype)
            p.grad = g + 0.1 * p.detach()
        opt.step()
    return params, opt


def _real(t):
    return torch.view_as_real(t.detach()) if t.is_complex() else t.detach()


@pytest.mark.parametrize("twin,fused,kwargs,dtype", _cases())
def test_optim_db_input_like_torch(twin, fused, kwargs, dtype):
    try:
        ref_params, ref = _run(twin, {**kwargs, "foreach": False}, dtype)
    except Exception as e:  # an input torch refuses: the fused twin refuses it the same way
        with pytest.raises(type(e)):
            _run(fused, kwargs, dtype)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the non-contiguous and float64 params take torch's step
        params, opt = _run(fused, kwargs, dtype)
    exact = dtype == torch.float64
    for i, (p, r) in enumerate(zip(params, ref_params)):
        sp, sr = opt.state[p], ref.state[r]
        assert sp.keys() == sr.keys()
        for key, a, b in [("param", p, r)] + [(k, sp[k], sr[k]) for k in sr]:
            assert a.dtype == b.dtype and a.shape == b.shape, f"{i} {key}"
            if exact or i == 2 or key == "step":  # (param 2 is not contiguous: torch's step too)
                assert_bitwise(_real(a), _real(b), f"param {i} {key}")
            else:
                assert_close(_real(a), _real(b), f"param {i} {key}", rtol=1e-5)
