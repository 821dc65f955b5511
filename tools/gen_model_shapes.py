#!/usr/bin/env python3
"""Generates src/tool_util/model_shapes*.cc: per-tensor parameter shapes of real models.

The benchmarks need the exact list of tensors an optimizer receives from
`model.parameters()` (BN running stats are buffers and are excluded), because
fused optimizers behave very differently on 83 small tensors than on one big
one. The models are built on the meta device, so no memory is allocated and no
weights are needed; only the layouts matter, and they follow the standard
torchvision / Hugging Face parameter naming and ordering.

One file per model (model_shapes_<model>.cc: its tensors, one a line) and the index
(model_shapes.cc: the names and the lookup), so that no file grows with every model added.

Run from the repo root:  .venv/bin/python tools/gen_model_shapes.py
"""

import argparse
import math
import pathlib

import torch
from torch import nn

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
OUTPUT_DIR = REPO_ROOT / "src" / "tool_util"
MAX_COLUMNS = 100


# ---------------------------------------------------------------- MobileNetV1


def _conv_bn(in_ch, out_ch, kernel, stride, groups=1):
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(inplace=True),
    )


class DepthwiseSeparable(nn.Module):
    def __init__(self, in_ch, out_ch, stride):
        super().__init__()
        self.depthwise = _conv_bn(in_ch, in_ch, 3, stride, groups=in_ch)
        self.pointwise = _conv_bn(in_ch, out_ch, 1, 1)

    def forward(self, x):
        return self.pointwise(self.depthwise(x))


class MobileNetV1(nn.Module):
    # (out_channels, stride) of the 13 depthwise-separable blocks, width 1.0.
    BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [
        (1024, 2),
        (1024, 1),
    ]

    def __init__(self, num_classes=1000):
        super().__init__()
        layers = [_conv_bn(3, 32, 3, 2)]
        in_ch = 32
        for out_ch, stride in self.BLOCKS:
            layers.append(DepthwiseSeparable(in_ch, out_ch, stride))
            in_ch = out_ch
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(in_ch, num_classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# ------------------------------------------------------------------ ResNet-50


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch, width, stride):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        in_ch = 64
        for index, (width, blocks, stride) in enumerate(
            [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)], start=1
        ):
            layer = []
            for block in range(blocks):
                layer.append(Bottleneck(in_ch, width, stride if block == 0 else 1))
                in_ch = width * Bottleneck.expansion
            setattr(self, f"layer{index}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ------------------------------------------------------------------ BERT-base
# Attribute names mirror Hugging Face BertModel so the generated names match
# what users see in real checkpoints.


class BertEmbeddings(nn.Module):
    def __init__(self, vocab, hidden, max_positions, type_vocab):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)


class BertSelfAttention(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)


class BertDenseLayerNorm(nn.Module):
    """Dense projection followed by residual LayerNorm (BertSelfOutput / BertOutput)."""

    def __init__(self, in_features, hidden):
        super().__init__()
        self.dense = nn.Linear(in_features, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)


class BertAttention(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.self = BertSelfAttention(hidden)
        self.output = BertDenseLayerNorm(hidden, hidden)


class BertIntermediate(nn.Module):
    def __init__(self, hidden, intermediate):
        super().__init__()
        self.dense = nn.Linear(hidden, intermediate)


class BertLayer(nn.Module):
    def __init__(self, hidden, intermediate):
        super().__init__()
        self.attention = BertAttention(hidden)
        self.intermediate = BertIntermediate(hidden, intermediate)
        self.output = BertDenseLayerNorm(intermediate, hidden)


class BertEncoder(nn.Module):
    def __init__(self, hidden, intermediate, layers):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(hidden, intermediate) for _ in range(layers))


class BertPooler(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)


class BertBase(nn.Module):
    def __init__(
        self,
        vocab=30522,
        hidden=768,
        layers=12,
        intermediate=3072,
        max_positions=512,
        type_vocab=2,
    ):
        super().__init__()
        # The 12 attention heads split `hidden` and add no parameters of their own.
        self.embeddings = BertEmbeddings(vocab, hidden, max_positions, type_vocab)
        self.encoder = BertEncoder(hidden, intermediate, layers)
        self.pooler = BertPooler(hidden)


# ---------------------------------------------------------------- GPT-2 small
# Mirrors Hugging Face GPT2Model. The LM head is tied to wte, so it adds no
# parameter tensor of its own and is not modelled.


class Conv1D(nn.Module):
    """HF GPT-2's linear layer: weight is stored (in, out), transposed vs nn.Linear."""

    def __init__(self, out_features, in_features):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features))


class GPT2Attention(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.c_attn = Conv1D(3 * hidden, hidden)
        self.c_proj = Conv1D(hidden, hidden)


class GPT2MLP(nn.Module):
    def __init__(self, hidden, inner):
        super().__init__()
        self.c_fc = Conv1D(inner, hidden)
        self.c_proj = Conv1D(hidden, inner)


class GPT2Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = GPT2Attention(hidden)
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = GPT2MLP(hidden, 4 * hidden)


class GPT2Small(nn.Module):
    def __init__(self, vocab=50257, positions=1024, hidden=768, layers=12):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(positions, hidden)
        self.h = nn.ModuleList(GPT2Block(hidden) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)


# ------------------------------------------------------------------ Generator

# (C++ name, constructor, expected tensor count, expected total numel). The
# expected values are the published counts for each architecture; asserting
# them guards against a layout slip silently skewing the benchmarks.
MODELS = [
    ("mobilenet_v1", MobileNetV1, 83, 4_231_976),
    ("resnet50", ResNet50, 161, 25_557_032),
    ("bert_base", BertBase, 199, 109_482_240),
    ("gpt2_small", GPT2Small, 148, 124_439_808),
]


def collect(constructor):
    # Meta tensors carry shapes only, so even GPT-2 costs no memory to build.
    with torch.device("meta"):
        model = constructor()
    return [(name, tuple(p.shape), p.numel()) for name, p in model.named_parameters()]


HEADER = [
    "// Generated by tools/gen_model_shapes.py — do not edit.",
    "// Regenerate with: .venv/bin/python tools/gen_model_shapes.py",
    "",
    '#include "src/tool_util/model_shapes.h"',
    "",
]


def function_name(model):
    """mobilenet_v1 -> MobilenetV1Shapes: the function of model_shapes_<model>.cc."""
    return "".join(part.capitalize() for part in model.split("_")) + "Shapes"


def render_model(name, tensors, total):
    out = HEADER + [
        "namespace fusedopt::tools {",
        "",
        f"// {name}: {len(tensors)} tensors, {total} parameters.",
        f"ModelShapes {function_name(name)}() {{",
        f'  return {{"{name}",',
        "          {",
    ]
    for tname, dims, numel in tensors:
        dims_text = ", ".join(str(d) for d in dims)
        out.append(f'              {{"{tname}", {{{dims_text}}}, {numel}}},')
    out += [
        "          },",
        f"          {total}}};",
        "}",
        "",
        "}  // namespace fusedopt::tools",
        "",
    ]
    return out


def render_index(models):
    out = HEADER + [
        "#include <array>",
        "#include <stdexcept>",
        "#include <string>",
        "",
        "namespace fusedopt::tools {",
        "",
        "// One per model, in model_shapes_<model>.cc.",
    ]
    out += [f"ModelShapes {function_name(name)}();" for name, _, _ in models]
    out += [
        "",
        "namespace {",
        "",
        f"constexpr std::array<std::string_view, {len(models)}> kModelNames = {{",
    ]
    out += [f'    "{name}",' for name, _, _ in models]
    out += [
        "};",
        "",
        "// Heap-allocated and never freed so that no destructor runs at exit while",
        "// other static destructors might still be using the table.",
        "const std::vector<ModelShapes>& AllModels() {",
        "  static const auto* const kModels = new std::vector<ModelShapes>{",
    ]
    out += [f"      {function_name(name)}()," for name, _, _ in models]
    out += [
        "  };",
        "  return *kModels;",
        "}",
        "",
        "}  // namespace",
        "",
        "std::span<const std::string_view> ModelNames() { return kModelNames; }",
        "",
        "const ModelShapes& GetModelShapes(std::string_view model) {",
        "  for (const ModelShapes& shapes : AllModels()) {",
        "    if (shapes.model == model) return shapes;",
        "  }",
        '  std::string message = "unknown model \'" + std::string(model) + "\'; known models:";',
        "  for (std::string_view name : kModelNames) {",
        '    message += " ";',
        "    message += name;",
        "  }",
        "  throw std::invalid_argument(message);",
        "}",
        "",
        "}  // namespace fusedopt::tools",
        "",
    ]
    return out


def render(models):
    """{file name: text}: the index and one file per model."""
    files = {"model_shapes.cc": render_index(models)}
    for name, tensors, total in models:
        files[f"model_shapes_{name}.cc"] = render_model(name, tensors, total)
    for lines in files.values():
        for line in lines:
            assert len(line) <= MAX_COLUMNS, f"line exceeds {MAX_COLUMNS} columns: {line}"
    return {file: "\n".join(lines) for file, lines in files.items()}


def main():
    parser = argparse.ArgumentParser(description="Writes src/tool_util/model_shapes*.cc from torch model definitions.")
    parser.add_argument("--out-dir", type=pathlib.Path, default=OUTPUT_DIR, help="output folder")
    out_dir = parser.parse_args().out_dir
    models = []
    for name, constructor, want_tensors, want_numel in MODELS:
        tensors = collect(constructor)
        total = sum(numel for _, _, numel in tensors)
        assert all(math.prod(dims) == numel for _, dims, numel in tensors)
        assert len(tensors) == want_tensors, f"{name}: {len(tensors)} tensors, want {want_tensors}"
        assert total == want_numel, f"{name}: {total} parameters, want {want_numel}"
        models.append((name, tensors, total))
        print(f"{name}: {len(tensors)} tensors, {total} parameters")
    for file, text in render(models).items():
        (out_dir / file).write_text(text, encoding="utf-8", newline="\n")
        print(f"wrote {out_dir / file}")


if __name__ == "__main__":
    main()
