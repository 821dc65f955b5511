# What the Python examples of README.md and docs/*.md may use without defining it (docs/testing.md):
# tests/python/test_docs.py runs each example in a fresh interpreter after these lines.
import torch

import fusedopt

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
loss_fn = torch.nn.functional.cross_entropy
loader = [(torch.randn(4, 8), torch.randint(0, 4, (4,))) for _ in range(6)]  # 6 batches of 4
opt = fusedopt.FusedAdamW(model.parameters(), lr=1e-3)
