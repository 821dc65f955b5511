"""Convergence: a small CNN on scikit-learn's 8x8 digits, trained with torch.optim and with the fused
twin from the same initial weights and batches; both must reach > 95 % test accuracy and agree
within 0.5 points. Marked `convergence` (deselect with -m "not convergence"); 5-15 s."""

from __future__ import annotations

import fusedopt
import pytest

import torch

sklearn_datasets = pytest.importorskip("sklearn.datasets")
sklearn_split = pytest.importorskip("sklearn.model_selection")

pytestmark = pytest.mark.convergence


@pytest.fixture(scope="module")
def digits():
    x, y = sklearn_datasets.load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = sklearn_split.train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    f = lambda a: torch.tensor(a, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0  # noqa: E731
    return f(x_tr), torch.tensor(y_tr), f(x_te), torch.tensor(y_te)


def _cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 10))


def _train(make_opt, data, epochs, seed=0):
    x_tr, y_tr, x_te, y_te = data
    torch.manual_seed(seed)
    model = _cnn()
    opt = make_opt(model.parameters())
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(x_tr), generator=gen)
        for i in range(0, len(x_tr), 64):
            idx = perm[i:i + 64]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
            opt.step()
    with torch.no_grad():
        acc = (model(x_te).argmax(1) == y_te).float().mean().item() * 100
    return acc, model


CASES = {
    "AdamW": (lambda ps: torch.optim.AdamW(ps, lr=3e-3, weight_decay=1e-2, foreach=False),
              lambda ps: fusedopt.FusedAdamW(ps, lr=3e-3, weight_decay=1e-2), 6),
    "SGD": (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, foreach=False),
            lambda ps: fusedopt.FusedSGD(ps, lr=0.05, momentum=0.9), 8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_digits_cnn_converges_like_torch(name, digits):
    make_torch, make_fused, epochs = CASES[name]
    acc_t, m_t = _train(make_torch, digits, epochs)
    acc_f, m_f = _train(make_fused, digits, epochs)
    assert acc_t > 95.0, f"torch reference only reached {acc_t:.2f} %"
    assert acc_f > 95.0, f"fused reached {acc_f:.2f} % (torch {acc_t:.2f} %)"
    assert abs(acc_f - acc_t) <= 0.5, f"fused {acc_f:.2f} % vs torch {acc_t:.2f} %"
    if name == "SGD":
        # SGD's update is reproduced bit for bit, so the whole training is (same batches, same
        # deterministic CPU kernels); AdamW drifts apart in the last bits through torch's sqrt
        for a, b in zip(m_f.parameters(), m_t.parameters()):
            assert torch.equal(a, b)


def _train_dtype(make_opt, data, epochs, dtype, seed=0):
    """_train with the model (params, activations, grads) in `dtype`; evaluated in f32."""
    x_tr, y_tr, x_te, y_te = data
    torch.manual_seed(seed)
    model = _cnn().to(dtype)
    opt = make_opt(model.parameters())
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(x_tr), generator=gen)
        for i in range(0, len(x_tr), 64):
            idx = perm[i:i + 64]
            opt.zero_grad()
            logits = model(x_tr[idx].to(dtype)).float()
            torch.nn.functional.cross_entropy(logits, y_tr[idx]).backward()
            opt.step()
    with torch.no_grad():
        acc = (model.float()(x_te).argmax(1) == y_te).float().mean().item() * 100
    return acc


def test_low_memory_adamw_converges_within_a_point_of_f32(digits):
    """Issue #4: bf16 moments, and pure-bf16 training (bf16 params and moments, no master copy), both
    with stochastic rounding, reach within 1 point of f32 AdamW."""
    kw = dict(lr=3e-3, weight_decay=1e-2)
    acc_f32, _ = _train(lambda ps: fusedopt.FusedAdamW(ps, **kw), digits, 6)
    acc_bf16_states, _ = _train(lambda ps: fusedopt.FusedAdamW(
        ps, state_dtype=torch.bfloat16, stochastic_rounding=True, **kw), digits, 6)
    acc_pure_bf16 = _train_dtype(lambda ps: fusedopt.FusedAdamW(ps, stochastic_rounding=True, **kw),
                                 digits, 6, torch.bfloat16)
    assert acc_f32 > 95.0
    assert abs(acc_bf16_states - acc_f32) <= 1.0, f"bf16 states {acc_bf16_states:.2f} % vs f32 {acc_f32:.2f} %"
    assert abs(acc_pure_bf16 - acc_f32) <= 1.0, f"pure bf16 {acc_pure_bf16:.2f} % vs f32 {acc_f32:.2f} %"
