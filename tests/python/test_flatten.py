"""flatten=True: params, grads and states of each dtype become views into one flat buffer; training
must be bit-identical to the non-flat optimizer (and so to torch), and every way user code swaps
tensors out must be noticed."""

from __future__ import annotations

import copy
import gc

import fusedopt
import pytest
from conftest import (
    BASE_KW,
    FUSED,
    NAMES,
    SQRT_FREE,
    TORCH,
    assert_bitwise,
    clone_params,
    compare_opts,
    groups_of,
    make_params,
    run,
    set_grads,
)

import torch

BF16_SIZES = [(3,), (100,), (2, 9)]


def _mixed_params(seed=0):
    """fp32 params (sizes of conftest.SIZES) followed by bf16 params."""
    return make_params(seed) + make_params(seed + 1, torch.bfloat16, sizes=BF16_SIZES)


def _groups(ps, name):
    # group 2 mixes dtypes: the last fp32 param and the bf16 ones
    return groups_of(ps, name)


def _trio(name, seed=0, params=_mixed_params):
    """(params, optimizer) for: flat fused, non-flat fused, torch."""
    p_flat = params(seed)
    p_plain = clone_params(p_flat)
    p_torch = clone_params(p_flat)
    flat = FUSED[name](_groups(p_flat, name), flatten=True, **BASE_KW[name])
    plain = FUSED[name](_groups(p_plain, name), **BASE_KW[name])
    tor = TORCH[name](_groups(p_torch, name), foreach=False, **BASE_KW[name])
    return (p_flat, flat), (p_plain, plain), (p_torch, tor)


def _check_layout(params):
    """Params of one dtype: views into one storage, in param order, 64-byte aligned, not
    overlapping."""
    by_dtype = {}
    for p in params:
        by_dtype.setdefault(p.dtype, []).append(p)
    storages = set()
    for ps in by_dtype.values():
        base = ps[0].untyped_storage().data_ptr()
        assert base not in storages
        storages.add(base)
        end = 0
        for p in ps:
            assert p.untyped_storage().data_ptr() == base, "all params of a dtype share one buffer"
            assert p.is_contiguous()
            start = p.data_ptr() - base
            assert start >= end, "params are laid out in order without overlap"
            assert p.data_ptr() % 64 == 0
            end = start + p.numel() * p.element_size()
        assert ps[0].untyped_storage().nbytes() >= end
    return len(by_dtype)


def _check_grads_flat(params):
    for dtype in {p.dtype for p in params}:
        bases = {p.grad.untyped_storage().data_ptr() for p in params if p.dtype == dtype and p.grad is not None}
        assert len(bases) <= 1, "grads of one dtype live in one buffer"


@pytest.mark.parametrize("name", NAMES)
def test_params_become_views_of_one_buffer(name):
    ps = _mixed_params()
    values = [p.detach().clone() for p in ps]
    ids = [id(p) for p in ps]
    opt = FUSED[name](_groups(ps, name), flatten=True, **BASE_KW[name])
    assert [id(p) for g in opt.param_groups for p in g["params"]] == ids  # same Parameter objects
    for p, v in zip(ps, values):
        assert_bitwise(p.detach(), v, "values kept")
        assert isinstance(p, torch.nn.Parameter) and p.requires_grad
    assert _check_layout(ps) == 2
    run(opt, ps, 3, skip=lambda t, i: True)  # every param steps (Adagrad's eager state moves in then)
    _check_grads_flat(ps)
    for key in {k for st in opt.state.values() for k, v in st.items() if isinstance(v, torch.Tensor) and v.numel() > 1}:
        for dtype in (torch.float32, torch.bfloat16):
            bases = {opt.state[p][key].untyped_storage().data_ptr() for p in ps
                     if p.dtype == dtype and key in opt.state.get(p, {})}
            assert len(bases) <= 1, f"state {key} of dtype {dtype} lives in one buffer"


@pytest.mark.parametrize("name", NAMES)
def test_flat_training_matches_plain_bitwise(name):
    (pf, flat), (pp, plain), (pt, tor) = _trio(name)
    run(flat, pf, 40)
    run(plain, pp, 40)
    compare_opts(flat, plain, f"{name} flat vs plain", bitwise=True)
    _check_layout(pf)
    # and torch (fp32 part with the parity tolerance) through the plain fused optimizer
    run(tor, pt, 40)
    for j, (a, r) in enumerate(zip(pf, pt)):
        if a.dtype == torch.float32:
            if name in SQRT_FREE:
                assert_bitwise(a.detach(), r.detach(), f"param {j}")
            else:
                torch.testing.assert_close(a.detach(), r.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_zero_grad_set_to_none_false_zeros_flat_grads(name):
    (pf, flat), (pp, plain), (pt, tor) = _trio(name)
    run(flat, pf, 3)
    run(plain, pp, 3)
    # after a step the grads are views into the flat grad buffer: zeroed in place (one memset)
    grad_ptrs = [None if p.grad is None else p.grad.data_ptr() for p in pf]
    _check_grads_flat(pf)
    flat.zero_grad(set_to_none=False)
    for p, ptr in zip(pf, grad_ptrs):
        if ptr is None:
            assert p.grad is None, "a None grad stays None (torch's rule)"
        else:
            assert p.grad is not None and p.grad.data_ptr() == ptr and not p.grad.any()
    # fresh grads that are not flat views yet are zeroed too (and put into the buffer)
    set_grads(pf, 3)
    flat.zero_grad(set_to_none=False)
    for p in pf:
        assert p.grad is None or (not p.grad.any() and p.grad.shape == p.shape and p.grad.dtype == p.dtype)
    _check_grads_flat(pf)
    # accumulate into the zeroed flat grads as backward() would, then step
    for t in (3, 4):
        set_grads(pp, t)
        for p, q in zip(pf, pp):
            if q.grad is None:
                p.grad = None
            elif p.grad is None:
                p.grad = q.grad.clone()
            else:
                p.grad.add_(q.grad)
        flat.step()
        plain.step()
        flat.zero_grad(set_to_none=False)
        plain.zero_grad(set_to_none=False)
    compare_opts(flat, plain, f"{name} after zero_grad(False)", bitwise=True)


@pytest.mark.parametrize("name", NAMES)
def test_replaced_param_is_recombined(name):
    (pf, flat), (pp, plain), _ = _trio(name)
    run(flat, pf, 5)
    run(plain, pp, 5)
    g = torch.Generator().manual_seed(42)
    for j in (0, 2, 6):  # fp32 size 1, fp32 size 40000, bf16
        new = torch.randn(pf[j].shape, generator=g).to(pf[j].dtype)
        pf[j].data = new.clone()
        pp[j].data = new.clone()
    old_ptr = pf[2].data_ptr()
    run(flat, pf, 5, start=5)
    run(plain, pp, 5, start=5)
    compare_opts(flat, plain, f"{name} replaced param", bitwise=True)
    assert pf[2].data_ptr() != old_ptr, "the replaced param went back into the flat buffer"
    _check_layout(pf)


@pytest.mark.parametrize("name", NAMES)
def test_replaced_grad_is_recombined(name):
    (pf, flat), (pp, plain), _ = _trio(name)
    run(flat, pf, 3)
    run(plain, pp, 3)
    for t in range(3, 8):
        set_grads(pf, t)  # assigns brand-new grad tensors (p.grad = ...) every step
        set_grads(pp, t)
        if t == 5:
            # and in-place edits of a grad that is already a flat view must be seen too
            for ps in (pf, pp):
                ps[2].grad.mul_(0.5)
        flat.step()
        plain.step()
        _check_grads_flat(pf)
    compare_opts(flat, plain, f"{name} replaced grads", bitwise=True)


@pytest.mark.parametrize("name", NAMES)
def test_set_to_none_and_fresh_backward(name):
    torch.manual_seed(3)
    models = [torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
              for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    flat = FUSED[name](models[0].parameters(), flatten=True, **BASE_KW[name])
    plain = FUSED[name](models[1].parameters(), **BASE_KW[name])
    _check_layout(list(models[0].parameters()))
    x, y = torch.randn(64, 6), torch.randn(64, 4)
    for it in range(12):
        for m, o in zip(models, (flat, plain)):
            o.zero_grad(set_to_none=(it % 3 != 2))  # mostly None + fresh backward, sometimes zeroed
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            o.step()
    compare_opts(flat, plain, f"{name} fresh backward", bitwise=True)
    _check_grads_flat(list(models[0].parameters()))


@pytest.mark.parametrize("name", NAMES)
def test_flat_state_dict_round_trips_with_torch(name):
    (pf, flat), _, (pt, tor) = _trio(name, params=make_params)
    run(flat, pf, 8)
    run(tor, pt, 8)
    # fused (flat) -> torch: continue both, compare with the parity tolerance
    p_t2 = clone_params(pf)
    tor2 = TORCH[name](_groups(p_t2, name), foreach=False, **BASE_KW[name])
    tor2.load_state_dict(copy.deepcopy(flat.state_dict()))
    # torch -> fused (flat)
    p_f2 = clone_params(pt)
    flat2 = FUSED[name](_groups(p_f2, name), flatten=True, **BASE_KW[name])
    flat2.load_state_dict(copy.deepcopy(tor.state_dict()))
    run(flat, pf, 8, start=8)
    run(tor2, p_t2, 8, start=8)
    run(tor, pt, 8, start=8)
    run(flat2, p_f2, 8, start=8)
    compare_opts(flat, tor2, f"{name} flat -> torch", bitwise=(name in SQRT_FREE))
    compare_opts(flat2, tor, f"{name} torch -> flat", bitwise=(name in SQRT_FREE))
    _check_layout(p_f2)
    # loaded states were moved into the flat buffers
    for key in {k for st in flat2.state.values() for k, v in st.items() if isinstance(v, torch.Tensor) and v.dim()}:
        bases = {flat2.state[p][key].untyped_storage().data_ptr() for p in p_f2 if key in flat2.state.get(p, {})}
        assert len(bases) == 1, f"loaded state {key} is not in one flat buffer"


@pytest.mark.parametrize("name", NAMES)
def test_add_param_group_with_flatten(name):
    (pf, flat), (pp, plain), _ = _trio(name)
    run(flat, pf, 5)
    run(plain, pp, 5)
    extra_f = [torch.nn.Parameter(torch.randn(300)), torch.nn.Parameter(torch.randn(5).bfloat16())]
    extra_p = clone_params(extra_f)
    flat.add_param_group({"params": extra_f, "lr": 0.02})
    plain.add_param_group({"params": extra_p, "lr": 0.02})
    _check_layout(pf + extra_f)
    run(flat, pf + extra_f, 5, start=5)
    run(plain, pp + extra_p, 5, start=5)
    compare_opts(flat, plain, f"{name} add_param_group", bitwise=True)


@pytest.mark.parametrize("name", NAMES)
def test_params_outlive_the_optimizer(name):
    torch.manual_seed(5)
    models = [torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
              for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    x, y = torch.randn(32, 5), torch.randn(32, 3)

    def train(m, o, n):
        for _ in range(n):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()

    opt = FUSED[name](models[0].parameters(), flatten=True, **BASE_KW[name])
    ref = FUSED[name](models[1].parameters(), **BASE_KW[name])
    train(models[0], opt, 5)
    train(models[1], ref, 5)
    del opt
    gc.collect()
    for _ in range(3):  # churn the allocator: freed memory would now be reused
        junk = [torch.randn(4096) for _ in range(64)]
        del junk
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert_bitwise(a.detach(), b.detach(), "param after del opt")
    # the model keeps training, with a torch optimizer and with a new fused one
    t0 = torch.optim.SGD(models[0].parameters(), lr=0.1, momentum=0.9)
    t1 = torch.optim.SGD(models[1].parameters(), lr=0.1, momentum=0.9)
    train(models[0], t0, 5)
    train(models[1], t1, 5)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert_bitwise(a.detach(), b.detach(), "training after del opt")
    sd = models[0].state_dict()
    assert all(torch.isfinite(v).all() for v in sd.values())
    models[1].load_state_dict(sd)


def test_flatten_with_master_weights():
    """flatten=True and master_weights=True together: same bits as master_weights alone."""
    p_a = make_params(0, torch.bfloat16)
    p_b = clone_params(p_a)
    a = FUSED["AdamW"](groups_of(p_a, "AdamW"), flatten=True, master_weights=True, lr=1e-2)
    b = FUSED["AdamW"](groups_of(p_b, "AdamW"), master_weights=True, lr=1e-2)
    run(a, p_a, 10)
    run(b, p_b, 10)
    for x, y in zip(p_a, p_b):
        assert_bitwise(x.detach(), y.detach(), "param")
        for k in b.state[y]:
            assert_bitwise(a.state[x][k], b.state[y][k], f"state {k}")
            assert a.state[x][k].dtype == b.state[y][k].dtype


def test_replaced_param_with_another_shape_does_not_overrun_its_neighbours():
    """`p.data = t` with t of another size (torch.optim.SGD without momentum keeps no state, so
    torch just continues): the flat store must re-lay out, not copy t into p's old slot, which
    would overwrite the next param's slot."""
    p_flat = make_params(0)
    p_ref = clone_params(p_flat)
    flat = FUSED["SGD"](p_flat, lr=0.1, flatten=True)
    ref = TORCH["SGD"](p_ref, lr=0.1, foreach=False)
    run(flat, p_flat, 2, skip=lambda t, i: True)
    run(ref, p_ref, 2, skip=lambda t, i: True)
    new = torch.randn(20, generator=torch.Generator().manual_seed(3))  # was 7 elements
    p_flat[1].data = new.clone()
    p_ref[1].data = new.clone()
    run(flat, p_flat, 2, start=2, skip=lambda t, i: True)
    run(ref, p_ref, 2, start=2, skip=lambda t, i: True)
    for j, (a, r) in enumerate(zip(p_flat, p_ref)):
        assert_bitwise(a.detach(), r.detach(), f"param {j}")
    _check_layout(p_flat)


def test_flat_grads_are_the_grads_for_one_collective_per_dtype():
    """flat_grads() hands out one buffer per dtype that holds every current grad (also grads that
    backward just created), so scaling it in place (as an all-reduce average would) is seen by the
    step exactly like scaling each p.grad."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Linear(4, 3).to(torch.bfloat16))
    ref = copy.deepcopy(model)
    x = torch.randn(8, 5)
    fus = fusedopt.FusedSGD(model.parameters(), lr=0.1, flatten=True)
    tor = torch.optim.SGD(ref.parameters(), lr=0.1)
    for m in (model, ref):
        m[1](m[0](x).bfloat16()).float().sum().backward()
    buffers = fus.flat_grads()
    assert sorted(str(b.dtype) for b in buffers) == ["torch.bfloat16", "torch.float32"]
    for b in buffers:
        b.mul_(0.5)
    for p in ref.parameters():
        p.grad.mul_(0.5)
    before = [r.detach().clone() for r in ref.parameters()]
    for p in model.parameters():  # the grads are views of the buffers now
        assert any(p.grad.data_ptr() >= b.data_ptr() and
                   p.grad.data_ptr() < b.data_ptr() + b.numel() * b.element_size() for b in buffers)
    fus.step()
    tor.step()
    for a, r, r0 in zip(model.parameters(), ref.parameters(), before):
        if a.dtype == torch.float32:
            assert torch.equal(a, r)
        else:  # torch's bf16 add_ rounds lr*g to bf16 first; we round p - lr*g once (within 1 ulp)
            expected = (r0.float() - 0.1 * r.grad.float()).bfloat16()
            torch.testing.assert_close(a.detach(), expected, atol=0, rtol=2.0**-7)
    with pytest.raises(RuntimeError, match="flatten=True"):
        fusedopt.FusedSGD(ref.parameters(), lr=0.1).flat_grads()
