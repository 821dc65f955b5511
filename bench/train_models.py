"""The end-to-end training benchmark's models and data (issue #5), in torch.nn.

The C++ `fusedopt train` builds the same architectures over libtorch, so the parameter tensors,
their shapes and their order (model.parameters()) must stay exactly as written here:

  mobilenet_v1       83 tensors, 4,231,976 params (1000 classes)
  resnet18           62 tensors, 11,689,512 params (1000 classes; torchvision's layout)
  transformer_small  101 tensors (GPT-style, pre-LN, untied lm_head)

Data is a fixed pool of seeded batches, cycled, so every optimizer implementation trains on the
same batches in the same order.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

# ------------------------------------------------------------------------------- MobileNet v1

# (in, out, stride) of the 13 depthwise-separable blocks
MOBILENET_BLOCKS = ((32, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2),
                    *((512, 512, 1),) * 5, (512, 1024, 2), (1024, 1024, 1))


def _conv_bn_relu(cin: int, cout: int, kernel: int, stride: int, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


def mobilenet_v1(num_classes: int = 1000) -> nn.Module:
    layers = _conv_bn_relu(3, 32, 3, 2)
    for cin, cout, stride in MOBILENET_BLOCKS:
        layers += _conv_bn_relu(cin, cin, 3, stride, groups=cin)  # depthwise
        layers += _conv_bn_relu(cin, cout, 1, 1)  # pointwise
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1024, num_classes)]
    return nn.Sequential(*layers)


# ---------------------------------------------------------------------------------- ResNet-18


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity, inplace=True)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        widths, cin = (64, 128, 256, 512), 64
        for i, width in enumerate(widths):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(cin, width, stride), BasicBlock(width, width, 1)))
            cin = width
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x)), inplace=True))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet18(num_classes: int = 1000) -> nn.Module:
    return ResNet18(num_classes)


# --------------------------------------------------------------------------- transformer_small


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        hd = d // self.n_head
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, hd).transpose(1, 2) for z in (q, k, v))
        # Spelled out (no scaled_dot_product_attention) so the C++ twin computes the same thing.
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.c_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))  # exact (erf) GELU


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TransformerSmall(nn.Module):
    """Input (B, T) token ids, T <= seq_len; output (B, T, vocab) logits."""

    def __init__(self, vocab: int = 1024, seq_len: int = 64, d_model: int = 128, n_layer: int = 8, n_head: int = 4):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model={d_model} is not a multiple of n_head={n_head}")
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def transformer_small(vocab: int = 1024, seq_len: int = 64, d_model: int = 128, n_layer: int = 8,
                      n_head: int = 4) -> nn.Module:
    return TransformerSmall(vocab, seq_len, d_model, n_layer, n_head)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over all B*T positions."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


MODELS = {"mobilenet_v1": mobilenet_v1, "resnet18": resnet18, "transformer_small": transformer_small}


# ------------------------------------------------------------------------------------- data


def image_batches(n: int, batch_size: int, image_size: int, num_classes: int, seed: int = 0) -> list:
    """n batches of (randn(B, 3, S, S), randint(num_classes, (B,)))."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch_size, 3, image_size, image_size, generator=gen),
             torch.randint(num_classes, (batch_size,), generator=gen)) for _ in range(n)]


def token_batches(n: int, batch_size: int, seq_len: int, vocab: int, seed: int = 0) -> list:
    """n batches of (tokens, next tokens): targets are the inputs shifted left by one with a random
    last token."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        tokens = torch.randint(vocab, (batch_size, seq_len + 1), generator=gen)
        out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return out


def digits_batches(n: int, batch_size: int, image_size: int, seed: int = 0) -> list:
    """n batches of scikit-learn's 8x8 digits (10 classes), scaled to [0, 1], repeated to 3 channels
    and resized (bilinear) to image_size, drawn in a seeded order."""
    from sklearn.datasets import load_digits  # only this option needs scikit-learn

    x, y = load_digits(return_X_y=True)
    images = torch.tensor(x, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
    images, labels = images.repeat(1, 3, 1, 1), torch.tensor(y)
    gen = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(len(labels), generator=gen) for _ in range(-(-n * batch_size // len(labels)))])
    return [(images[idx].contiguous(), labels[idx]) for idx in order[: n * batch_size].split(batch_size)]


def cycle(pool: list) -> Iterator:
    """The pool's batches over and over, in order."""
    return itertools.cycle(pool)
