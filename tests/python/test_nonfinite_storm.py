"""Non-finite storms (issue #16): 1000 steps of dynamic loss scaling with random Inf/NaN bursts in the
gradients. fusedopt.GradScaler + a fused optimizer against torch.amp.GradScaler + torch.optim's twin on the same
model and bursts: the same skip decisions (so the same scale after every step), every skipped step leaves params
and states bit-identical, and no NaN or Inf ever reaches a param or a state."""

from __future__ import annotations

import math
import random

import fusedopt
import pytest

import torch

STEPS = 1000


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))


def _tensors(model, opt) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()] + [
        v.clone() for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("name, kw", [("AdamW", dict(lr=1e-3, weight_decay=0.01)),
                                      ("SGD", dict(lr=1e-2, momentum=0.9))])
def test_storms_skip_as_torch_does_and_never_poison_the_state(name, kw):
    fused_model, torch_model = _model(), _model()
    fused = getattr(fusedopt, f"Fused{name}")(fused_model.parameters(), **kw)
    reference = getattr(torch.optim, name)(torch_model.parameters(), foreach=False, **kw)
    scalers = (fusedopt.GradScaler(init_scale=2.0**12, growth_interval=10),
               torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=10))
    rng, skipped = random.Random(7), 0
    data = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        x, y = torch.randn(16, 10, generator=data), torch.randn(16, 2, generator=data)
        burst = rng.random() < 0.08
        # A burst: a few elements of one gradient become +Inf, -Inf or NaN, the same in both runs.
        where = [(rng.randrange(4), rng.random(), rng.choice((math.inf, -math.inf, math.nan)))
                 for _ in range(rng.randint(1, 3))] if burst else []
        before = _tensors(fused_model, fused) if burst else None
        for model, opt, scaler in ((fused_model, fused, scalers[0]), (torch_model, reference, scalers[1])):
            loss = torch.nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            params = list(model.parameters())
            for k, fraction, value in where:
                g = params[k].grad.view(-1)
                g[int(fraction * g.numel())] = value
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        assert scalers[0].get_scale() == scalers[1].get_scale(), f"step {step}: another skip decision"
        if burst:
            skipped += 1
            after = _tensors(fused_model, fused)
            assert all(torch.equal(a, b) for a, b in zip(after, before)), f"step {step}: a skipped step changed state"
        assert all(bool(torch.isfinite(t).all()) for t in _tensors(fused_model, fused)), f"step {step}: non-finite"
    assert skipped > 50  # the storms happened
