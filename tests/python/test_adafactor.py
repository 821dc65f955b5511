"""FusedAdafactor against torch.optim.Adafactor (torch 2.13, single-tensor path; shared/docs/algorithms-more.md
§2.5). The factored second moments (row_var [..., R, 1], col_var [..., 1, C] of a param of more than one
dimension, variance of a vector) are torch's state tensors, so state_dict loads both ways. torch.norm and mean sum
in an order of their own and the engine in double in a fixed order, so the results agree within a relative bound
(1e-5 after 100 steps here), not bit for bit."""

from __future__ import annotations

import copy
import warnings

import fusedopt
import pytest

import torch

SHAPES = [(33,), (6, 11), (3, 4, 5), (1,), (70, 40), (2, 5000), (), (16, 8, 3, 3), (32, 16, 1, 1)]


def make_params(seed=0, shapes=SHAPES, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.rand(s, generator=gen, dtype=torch.float32).mul_(2).sub_(1).to(dtype))
            for s in shapes]


def grads_for(params, step, scale=1.0):
    gen = torch.Generator().manual_seed(1000 + step)
    return [torch.rand(p.shape, generator=gen).mul_(2 * scale).sub_(scale).to(p.dtype) for p in params]


def groups(params, group_kw):
    if not group_kw:
        return params
    return [dict(params=params[i::len(group_kw)], **kw) for i, kw in enumerate(group_kw)]


def run_both(kw, steps, group_kw=None, shapes=SHAPES, scale=1.0, every=None):
    p_t, p_f = make_params(shapes=shapes), make_params(shapes=shapes)
    ref = torch.optim.Adafactor(groups(p_t, group_kw), foreach=False, **kw)
    fus = fusedopt.FusedAdafactor(groups(p_f, group_kw), **kw)
    for step in range(1, steps + 1):
        for ps in (p_t, p_f):
            for p, g in zip(ps, grads_for(ps, step, scale)):
                p.grad = g
        ref.step()
        fus.step()
        if every is not None:
            every(step, ref, fus, p_t, p_f)
    return ref, fus, p_t, p_f


def assert_close(a, b, rtol, what=""):
    scale = b.abs().max().item() if b.numel() else 0.0
    err = (a.double() - b.double()).abs()
    bound = rtol * b.double().abs() + rtol * 1e-2 * scale
    assert bool((err <= bound).all()), f"{what}: max abs err {err.max().item():.3g} (rtol {rtol})"


def assert_same_state(fus, ref, p_f, p_t, rtol):
    for p, q in zip(p_f, p_t):
        assert_close(p.detach(), q.detach(), rtol, "param")
        sf, st = fus.state[p], ref.state[q]
        assert sorted(sf) == sorted(st)
        for key, value in st.items():
            assert sf[key].shape == value.shape and sf[key].dtype == value.dtype, key
            if key == "step":
                assert sf[key].item() == value.item()
            else:
                assert_close(sf[key], value, rtol, key)


OPTION_SETS = {
    "default": dict(),
    "lr": dict(lr=1e-2),
    "weight_decay": dict(lr=1e-2, weight_decay=0.1),
    "large_lr": dict(lr=0.5, weight_decay=0.05, d=2.0),  # rho = 1/sqrt(t)
    "eps": dict(lr=1e-2, eps=(1e-3, 1e-2), beta2_decay=-0.5),
    "maximize": dict(lr=1e-2, maximize=True),
    "clipping": dict(lr=1e-2, d=1.0, eps=(1e-30, 1e-3)),
}


@pytest.mark.parametrize("case", list(OPTION_SETS))
def test_matches_torch_100_steps(case):
    ref, fus, p_t, p_f = run_both(OPTION_SETS[case], 100)
    assert_same_state(fus, ref, p_f, p_t, 1e-5)


def test_two_groups_and_tiny_gradients_match_torch():
    """Gradients of 1e-3: V meets the eps1 clamps of the second group; the first group's eps1 is None."""
    group_kw = [dict(lr=1e-2), dict(lr=3e-3, weight_decay=0.02, beta2_decay=-0.6, eps=(1e-4, 1e-3))]
    ref, fus, p_t, p_f = run_both({}, 30, group_kw=group_kw, scale=1e-3)
    assert_same_state(fus, ref, p_f, p_t, 1e-5)


def test_one_step_by_hand():
    """A (2, 2) param after one step (t = 1: the factors are the row and column means of g^2), in double."""
    p = torch.nn.Parameter(torch.tensor([[1.0, -2.0], [3.0, 0.5]]))
    g = torch.tensor([[0.5, -1.0], [2.0, 0.25]])
    p.grad = g.clone()
    fusedopt.FusedAdafactor([p], lr=0.1, weight_decay=0.5).step()
    p0, gd = torch.tensor([[1.0, -2.0], [3.0, 0.5]], dtype=torch.float64), g.double()
    alpha = max(1e-3, (p0.square().sum() / 4).sqrt().item()) * min(0.1, 1.0)
    r, c = gd.square().mean(1, keepdim=True), gd.square().mean(0, keepdim=True)
    v = (r @ c) / r.mean()
    u = gd / v.clamp(min=torch.finfo(torch.float32).eps ** 2).sqrt()
    den = max(1.0, (u.square().sum() / 4).sqrt().item())
    expected = p0 * (1 - 0.1 * 0.5) - alpha / den * u
    assert torch.allclose(p.detach().double(), expected, rtol=2e-6, atol=0)


def test_state_shapes_are_torchs():
    ref, fus, p_t, p_f = run_both({}, 1)
    for p, q in zip(p_f, p_t):
        assert {k: tuple(v.shape) for k, v in fus.state[p].items()} == {
            k: tuple(v.shape) for k, v in ref.state[q].items()}
        if p.dim() > 1:
            assert fus.state[p]["row_var"].shape == p.shape[:-1] + (1,)
            assert fus.state[p]["col_var"].shape == p.shape[:-2] + (1, p.shape[-1])


@pytest.mark.parametrize("direction", ["torch_to_fused", "fused_to_torch"])
def test_state_dict_both_ways(direction):
    """After 5 steps one optimizer's state_dict goes into a fresh instance of the other, and both go on."""
    kw = dict(lr=1e-2, weight_decay=0.1)
    ref, fus, p_t, p_f = run_both(kw, 5)
    src_params, src = (p_t, ref) if direction == "torch_to_fused" else (p_f, fus)
    p_a = [torch.nn.Parameter(p.detach().clone()) for p in src_params]
    p_b = [torch.nn.Parameter(p.detach().clone()) for p in src_params]
    cls = fusedopt.FusedAdafactor if direction == "torch_to_fused" else torch.optim.Adafactor
    loaded = cls(p_a, **kw)
    loaded.load_state_dict(copy.deepcopy(src.state_dict()))
    cont = type(src)(p_b, **kw)
    cont.load_state_dict(copy.deepcopy(src.state_dict()))
    for step in range(6, 16):
        for ps in (p_a, p_b):
            for p, g in zip(ps, grads_for(ps, step)):
                p.grad = g
        loaded.step()
        cont.step()
    for a, b in zip(p_a, p_b):
        assert_close(a.detach(), b.detach(), 1e-5, "param")
        assert loaded.state[a]["step"].item() == cont.state[b]["step"].item() == 15


def test_fresh_state_dicts_load_both_ways():
    p_t, p_f = make_params(), make_params()
    ref, fus = torch.optim.Adafactor(p_t), fusedopt.FusedAdafactor(p_f)
    fus.load_state_dict(ref.state_dict())
    ref.load_state_dict(fus.state_dict())
    assert fus.state_dict() == ref.state_dict()


def test_torch_checks_and_messages():
    p = make_params()
    with pytest.raises(ValueError, match="beta2_decay should be <= 0 but is: 0.5"):
        fusedopt.FusedAdafactor(p, beta2_decay=0.5)
    with pytest.raises(ValueError, match="Clipping threshold d should be >= 1 but is: 0.5"):
        fusedopt.FusedAdafactor(p, d=0.5)
    fusedopt.FusedAdafactor(p, foreach=True)  # accepted (and ignored): the engine has one path


def run_fused(steps, params, **kw):
    """FusedAdafactor over `steps` steps of grads_for; returns the optimizer."""
    opt = fusedopt.FusedAdafactor(params, **kw)
    for step in range(1, steps + 1):
        for p, g in zip(params, grads_for(params, step)):
            p.grad = g
        opt.step()
    return opt


def states_of(opt, params):
    return [{k: v.clone() for k, v in opt.state[p].items()} for p in params]


def test_stochastic_rounding_of_bf16_states_is_keyed_on_the_seed():
    """bf16 states rounded stochastically (row_var and col_var by the host, variance and the 1x1 kernels'
    element-wise factors by the kernels): the same bits for a seed on 1 or 2 threads, other bits for another seed
    and for round to nearest."""
    def run(seed, stochastic=True, threads=1):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            ps = make_params()
            opt = run_fused(3, ps, lr=1e-2, state_dtype=torch.bfloat16, stochastic_rounding=stochastic, seed=seed)
            return [p.detach().clone() for p in ps], states_of(opt, ps)
        finally:
            torch.set_num_threads(old)

    params, states = run(7)
    for st in states:
        assert all(v.dtype == torch.bfloat16 for k, v in st.items() if k != "step")
    for other_params, other_states in (run(7, threads=2),):
        assert all(torch.equal(a, b) for a, b in zip(params, other_params))
        assert all(st.keys() == ot.keys() and all(torch.equal(st[k], ot[k]) for k in st)
                   for st, ot in zip(states, other_states))
    for other in (run(8), run(7, stochastic=False)):
        for key in ("row_var", "col_var", "variance"):
            assert any(key in st and not torch.equal(st[key], ot[key]) for st, ot in zip(states, other[1])), key


def test_stochastic_rounding_of_bf16_states_follows_the_f32_states():
    """200 steps with bf16 states rounded stochastically stay close to the f32-state run: the params within 5e-3
    (3e-4 on average), every state within 8% (some bf16 ulps accumulated), the states' mean signed relative
    error below 0.3% (the rounding is unbiased)."""
    shapes = [(33,), (6, 11), (3, 4, 5), (70, 40), (16, 8, 3, 3), (32, 16, 1, 1)]
    kw = dict(lr=1e-2, weight_decay=0.01)
    p32, psr = make_params(shapes=shapes), make_params(shapes=shapes)
    f32 = run_fused(200, p32, **kw)
    sr = run_fused(200, psr, state_dtype=torch.bfloat16, stochastic_rounding=True, seed=3, **kw)
    signed, count = 0.0, 0
    for a, b in zip(p32, psr):
        err = (b.detach().double() - a.detach().double()).abs()
        assert err.max().item() < 5e-3 and err.mean().item() < 1e-3, (a.shape, err.max().item())
        for key, value in f32.state[a].items():
            if key == "step":
                assert sr.state[b][key].item() == value.item() == 200
                continue
            assert sr.state[b][key].dtype == torch.bfloat16
            rel = (sr.state[b][key].double() - value.double()) / value.double()
            assert rel.abs().max().item() < 0.08, (a.shape, key, rel.abs().max().item())
            signed += rel.sum().item()
            count += rel.numel()
    assert abs(signed / count) < 3e-3, signed / count


def test_stochastic_rounding_of_bf16_params_without_master():
    """Pure bf16 (params and states, no master copy), rounded stochastically: reproducible for a seed, and
    unbiased, so closer to the f32 run than round to nearest even after many small updates."""
    shapes = [(64, 32), (4, 16, 8), (300,)]
    kw = dict(lr=1e-3, eps=(1e-6, 1e-3))  # eps1 given: torch's default would be finfo(bf16).eps there
    p32 = make_params(shapes=shapes)
    psr = [torch.nn.Parameter(p.detach().bfloat16()) for p in p32]
    prne = [torch.nn.Parameter(p.detach().clone()) for p in psr]
    again = [torch.nn.Parameter(p.detach().clone()) for p in psr]
    for p, q in zip(p32, psr):
        p.data.copy_(q.detach().float())
    f32 = fusedopt.FusedAdafactor(p32, **kw)
    opts = [fusedopt.FusedAdafactor(ps, stochastic_rounding=s, seed=11, **kw)
            for ps, s in ((psr, True), (prne, False), (again, True))]
    for step in range(1, 101):
        gs = grads_for(p32, step)
        for p, g in zip(p32, gs):
            p.grad = g.abs().add_(0.1).bfloat16().float()  # one sign: the f32 run drifts steadily, by under half an ulp a step
        for ps in (psr, prne, again):
            for p, q in zip(ps, p32):
                p.grad = q.grad.bfloat16()
        f32.step()
        for opt in opts:
            opt.step()
    assert all(torch.equal(a, b) for a, b in zip(psr, again))
    for a, b, c in zip(p32, psr, prne):
        err_sr = (b.detach().double() - a.detach().double()).abs().mean().item()
        err_rne = (c.detach().double() - a.detach().double()).abs().mean().item()
        assert err_sr < err_rne, (a.shape, err_sr, err_rne)


def test_flatten_is_bit_identical_to_flatten_false():
    """flatten=True (params, grads and variance in flat buffers; row_var and col_var tensors of their own):
    matrices, a batch of matrices, 1x1 kernels, vectors and a 0-d param, f32 and bf16 params in two groups,
    bf16 states rounded stochastically too, over several steps."""
    shapes = SHAPES
    for kw in (dict(lr=1e-2, weight_decay=0.1), dict(lr=1e-2, state_dtype=torch.bfloat16, stochastic_rounding=True,
                                                     seed=5)):
        runs = []
        for flatten in (False, True):
            ps = make_params(shapes=shapes) + make_params(1, shapes=[(6, 7), (9,)], dtype=torch.bfloat16)
            opt = fusedopt.FusedAdafactor([dict(params=ps[:5]), dict(params=ps[5:], lr=3e-3)], flatten=flatten, **kw)
            for step in range(1, 6):
                for p, g in zip(ps, grads_for(ps, step)):
                    p.grad = g
                opt.step()
            runs.append((ps, opt))
        (pa, a), (pb, b) = runs
        for p, q in zip(pa, pb):
            assert torch.equal(p.detach(), q.detach())
            assert a.state[p].keys() == b.state[q].keys()
            for key, value in a.state[p].items():
                other = b.state[q][key]
                assert other.shape == value.shape and other.dtype == value.dtype and torch.equal(other, value), key
        sa, sb = a.state_dict(), b.state_dict()
        assert sa["param_groups"] == sb["param_groups"]


@pytest.mark.parametrize("direction", ["torch_to_fused", "fused_to_torch"])
def test_flatten_state_dict_both_ways(direction):
    """A flat FusedAdafactor's state_dict has torch's keys, shapes and dtypes, fresh and after 3 steps. Then one
    side's state_dict goes into a fresh instance of the other (flat for FusedAdafactor) and into a fresh instance
    of its own kind, and both go on alike (torch's state into flat and non-flat FusedAdafactor: bit for bit)."""
    kw = dict(lr=1e-2, weight_decay=0.1, foreach=False)  # (FusedAdafactor ignores foreach)
    p_t, p_f = make_params(), make_params()
    ref = torch.optim.Adafactor(p_t, **kw)
    fus = fusedopt.FusedAdafactor(p_f, flatten=True, **kw)
    assert fus.state_dict() == ref.state_dict()  # fresh: no state yet
    ref.load_state_dict(fus.state_dict())
    fus.load_state_dict(ref.state_dict())
    for step in range(1, 4):
        for ps in (p_t, p_f):
            for p, g in zip(ps, grads_for(ps, step)):
                p.grad = g
        ref.step()
        fus.step()
    sf, st = fus.state_dict(), ref.state_dict()
    assert sf["param_groups"] == st["param_groups"]
    assert sf["state"].keys() == st["state"].keys()
    for i, entry in st["state"].items():
        assert sf["state"][i].keys() == entry.keys()
        for key, value in entry.items():
            assert sf["state"][i][key].shape == value.shape and sf["state"][i][key].dtype == value.dtype, key
    src_params, src = (p_t, ref) if direction == "torch_to_fused" else (p_f, fus)
    p_a, p_b, p_c = ([torch.nn.Parameter(p.detach().clone()) for p in src_params] for _ in range(3))
    if direction == "torch_to_fused":
        opts = [fusedopt.FusedAdafactor(p_a, flatten=True, **kw), torch.optim.Adafactor(p_b, **kw),
                fusedopt.FusedAdafactor(p_c, **kw)]
    else:
        opts = [torch.optim.Adafactor(p_a, **kw), fusedopt.FusedAdafactor(p_b, flatten=True, **kw)]
    for opt in opts:
        opt.load_state_dict(copy.deepcopy(src.state_dict()))
    for step in range(4, 10):
        for ps in (p_a, p_b, p_c)[:len(opts)]:
            for p, g in zip(ps, grads_for(ps, step)):
                p.grad = g
        for opt in opts:
            opt.step()
    for a, b in zip(p_a, p_b):
        assert_close(a.detach(), b.detach(), 1e-5, "param")
        assert opts[0].state[a]["step"].item() == opts[1].state[b]["step"].item() == 9
    if direction == "torch_to_fused":
        for a, c in zip(p_a, p_c):
            assert torch.equal(a.detach(), c.detach())
            assert all(torch.equal(opts[0].state[a][k], opts[2].state[c][k]) for k in opts[0].state[a])


def test_a_rejected_step_changes_nothing():
    """A bad lr set after construction: the engine's check runs before any write; params, states and step
    counters stay bit-identical."""
    ref, fus, p_t, p_f = run_both({}, 3)
    before = [p.detach().clone() for p in p_f]
    states = copy.deepcopy(fus.state_dict()["state"])
    fus.param_groups[0]["lr"] = -1.0
    for p, g in zip(p_f, grads_for(p_f, 4)):
        p.grad = g
    with pytest.raises(ValueError, match="lr"):
        fus.step()
    for p, b in zip(p_f, before):
        assert torch.equal(p.detach(), b)
    after = fus.state_dict()["state"]
    for i, st in states.items():
        for key, value in st.items():
            assert torch.equal(after[i][key], value), key


def test_zero_size_and_complex_params_raise_as_in_torch():
    empty = torch.nn.Parameter(torch.zeros(0, 3))
    empty.grad = torch.zeros(0, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ZeroDivisionError):
            fusedopt.FusedAdafactor([empty]).step()
    z = torch.nn.Parameter(torch.zeros(3, dtype=torch.complex64))
    z.grad = torch.ones(3, dtype=torch.complex64)
    with pytest.raises(RuntimeError, match="Adafactor does not support complex parameters"):
        fusedopt.FusedAdafactor([z]).step()


def test_transposed_params_take_torchs_step():
    base = torch.rand(11, 6) * 2 - 1
    p_t, p_f = torch.nn.Parameter(base.clone().t()), torch.nn.Parameter(base.clone().t())
    assert not p_f.is_contiguous()
    ref, fus = torch.optim.Adafactor([p_t], foreach=False), fusedopt.FusedAdafactor([p_f])
    for step in range(1, 4):
        g = grads_for([p_t], step)[0]
        p_t.grad, p_f.grad = g.clone(), g.clone()
        ref.step()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            fus.step()
    assert torch.equal(p_f.detach(), p_t.detach())  # the same code ran
    q = torch.nn.Parameter(base.clone().t())
    strict = fusedopt.FusedAdafactor([q], strict=True)
    q.grad = torch.empty_like(q).copy_(g)
    with pytest.raises(ValueError, match="row-major"):
        strict.step()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_master_weights_follow_the_f32_run(dtype):
    """bf16/fp16 params with f32 master copies (and f32 states): close to torch's f32 run."""
    shapes = [(33,), (6, 11), (3, 4, 5)]
    p_t = make_params(shapes=shapes)
    p_f = [torch.nn.Parameter(p.detach().to(dtype)) for p in p_t]
    for p, q in zip(p_f, p_t):
        q.data.copy_(p.detach().float())
    ref = torch.optim.Adafactor(p_t, lr=1e-2, foreach=False)
    fus = fusedopt.FusedAdafactor(p_f, lr=1e-2, master_weights=True)
    for step in range(1, 21):
        gs = grads_for(p_t, step)
        for p, q, g in zip(p_f, p_t, gs):
            g16 = g.to(dtype)
            p.grad, q.grad = g16, g16.float()
        ref.step()
        fus.step()
    for p, q in zip(p_f, p_t):
        assert_close(fus.state[p]["master_param"], q.detach(), 1e-5, "master")
        assert fus.state[p]["row_var" if p.dim() > 1 else "variance"].dtype == torch.float32


def test_bf16_params_without_master_stay_near_torchs_bf16_run():
    shapes = [(33,), (6, 11), (3, 4, 5)]
    p_t = [torch.nn.Parameter(p.detach().bfloat16()) for p in make_params(shapes=shapes)]
    p_f = [torch.nn.Parameter(p.detach().clone()) for p in p_t]
    ref, fus = torch.optim.Adafactor(p_t, lr=1e-2, foreach=False), fusedopt.FusedAdafactor(p_f, lr=1e-2)
    for step in range(1, 11):
        for ps in (p_t, p_f):
            for p, g in zip(ps, grads_for(ps, step)):
                p.grad = g
        ref.step()
        fus.step()
    for p, q in zip(p_f, p_t):
        assert fus.state[p].keys() == ref.state[q].keys()
        # torch rounds to bf16 after every op; the engine once per buffer: a few bf16 ulps apart
        assert_close(p.detach().float(), q.detach().float(), 3e-2, "param")
