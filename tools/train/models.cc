// tools/train/models.h: MobileNetV1, ResNet-18 and a small GPT in libtorch, and their data.

#include "tools/train/models.h"

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/pooling.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fusedopt::train {
namespace {

namespace nn = torch::nn;

nn::Conv2d Conv(int in, int out, int kernel, int stride, int padding, int groups = 1) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel)
                        .stride(stride)
                        .padding(padding)
                        .groups(groups)
                        .bias(false));
}

// ---- MobileNetV1 --------------------------------------------------------------------------------

struct MobileNetV1Impl : nn::Module {
  explicit MobileNetV1Impl(int num_classes) {
    nn::Sequential layers;
    const auto conv_bn_relu = [&](int in, int out, int kernel, int stride, int groups) {
      layers->push_back(Conv(in, out, kernel, stride, kernel / 2, groups));
      layers->push_back(nn::BatchNorm2d(out));
      layers->push_back(nn::ReLU(nn::ReLUOptions(true)));
    };
    conv_bn_relu(3, 32, 3, 2, 1);
    // (in, out, stride) of the 13 depthwise-separable blocks.
    const int blocks[13][3] = {{32, 64, 1},    {64, 128, 2},  {128, 128, 1}, {128, 256, 2},
                               {256, 256, 1},  {256, 512, 2}, {512, 512, 1}, {512, 512, 1},
                               {512, 512, 1},  {512, 512, 1}, {512, 512, 1}, {512, 1024, 2},
                               {1024, 1024, 1}};
    for (const auto& [in, out, stride] : blocks) {
      conv_bn_relu(in, in, 3, stride, in);  // depthwise 3x3
      conv_bn_relu(in, out, 1, 1, 1);       // pointwise 1x1
    }
    features = register_module("features", layers);
    fc = register_module("fc", nn::Linear(1024, num_classes));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc(torch::adaptive_avg_pool2d(features->forward(x), {1, 1}).flatten(1));
  }
  nn::Sequential features{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(MobileNetV1);

// ---- ResNet-18 ----------------------------------------------------------------------------------

struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(int in, int out, int stride)
      : conv1(register_module("conv1", Conv(in, out, 3, stride, 1))),
        bn1(register_module("bn1", nn::BatchNorm2d(out))),
        conv2(register_module("conv2", Conv(out, out, 3, 1, 1))),
        bn2(register_module("bn2", nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      downsample = register_module(
          "downsample", nn::Sequential(Conv(in, out, 1, stride, 0), nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (downsample ? downsample->forward(x) : x));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

struct ResNet18Impl : nn::Module {
  explicit ResNet18Impl(int num_classes)
      : conv1(register_module("conv1", Conv(3, 64, 7, 2, 3))),
        bn1(register_module("bn1", nn::BatchNorm2d(64))) {
    int in = 64;
    const int widths[4] = {64, 128, 256, 512};
    for (int stage = 0; stage < 4; ++stage) {
      nn::Sequential layer;
      for (int block = 0; block < 2; ++block) {
        const int stride = stage > 0 && block == 0 ? 2 : 1;
        layer->push_back(BasicBlock(in, widths[stage], stride));
        in = widths[stage];
      }
      layers.push_back(register_module("layer" + std::to_string(stage + 1), layer));
    }
    fc = register_module("fc", nn::Linear(512, num_classes));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = torch::max_pool2d(torch::relu(bn1(conv1(x))), 3, 2, 1);
    for (nn::Sequential& layer : layers) y = layer->forward(y);
    return fc(torch::adaptive_avg_pool2d(y, {1, 1}).flatten(1));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  std::vector<nn::Sequential> layers;
  nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet18);

// ---- transformer_small (GPT-style) --------------------------------------------------------------

struct BlockImpl : nn::Module {
  BlockImpl(int d, int heads)
      : n_head(heads),
        ln_1(register_module("ln_1", nn::LayerNorm(nn::LayerNormOptions({d})))),
        c_attn(register_module("c_attn", nn::Linear(d, 3 * d))),
        attn_proj(register_module("attn_c_proj", nn::Linear(d, d))),
        ln_2(register_module("ln_2", nn::LayerNorm(nn::LayerNormOptions({d})))),
        c_fc(register_module("c_fc", nn::Linear(d, 4 * d))),
        mlp_proj(register_module("mlp_c_proj", nn::Linear(4 * d, d))) {}

  // Causal self-attention written out (q k^T / sqrt(head_dim), mask, softmax, times v).
  torch::Tensor Attention(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / n_head;
    const std::vector<torch::Tensor> qkv = c_attn->forward(x).split(d, 2);
    const auto heads = [&](const torch::Tensor& z) {
      return z.view({b, t, n_head, hd}).transpose(1, 2);
    };
    const torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    torch::Tensor att = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    const torch::Tensor mask = torch::ones({t, t}, torch::kBool).tril();
    att = att.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity()).softmax(-1);
    return attn_proj->forward(att.matmul(v).transpose(1, 2).contiguous().view({b, t, d}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor h = x + Attention(ln_1(x));
    return h + mlp_proj(torch::gelu(c_fc(ln_2(h))));
  }
  int64_t n_head;
  nn::LayerNorm ln_1;
  nn::Linear c_attn, attn_proj;
  nn::LayerNorm ln_2;
  nn::Linear c_fc, mlp_proj;
};
TORCH_MODULE(Block);

std::string BlockName(int i) {
  std::string name = std::to_string(i);
  name.insert(name.begin(), 'h');
  return name;
}

struct TransformerSmallImpl : nn::Module {
  explicit TransformerSmallImpl(const ModelConfig& c)
      : wte(register_module("wte", nn::Embedding(c.vocab, c.d_model))),
        wpe(register_module("wpe", nn::Embedding(c.seq_len, c.d_model))) {
    for (int i = 0; i < c.n_layer; ++i) {
      // (std::format would do; "h" + std::to_string(i) trips a g++ 12 -O3 false warning.)
      blocks.push_back(register_module(BlockName(i), Block(c.d_model, c.n_head)));
    }
    ln_f = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({c.d_model})));
    lm_head =
        register_module("lm_head", nn::Linear(nn::LinearOptions(c.d_model, c.vocab).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    const torch::Tensor positions = torch::arange(tokens.size(1), torch::kLong);
    torch::Tensor x = wte(tokens) + wpe(positions);
    for (Block& block : blocks) x = block(x);
    return lm_head(ln_f(x));
  }
  nn::Embedding wte, wpe;
  std::vector<Block> blocks;
  nn::LayerNorm ln_f{nullptr};
  nn::Linear lm_head{nullptr};
};
TORCH_MODULE(TransformerSmall);

torch::Tensor CrossEntropy(const torch::Tensor& output, const torch::Tensor& target) {
  // Logits of every token (transformer) or sample: one class dimension last.
  return torch::nn::functional::cross_entropy(
      output.reshape({-1, output.size(-1)}).to(torch::kFloat), target.reshape({-1}));
}

template <class Holder>
Model Wrap(Holder holder) {
  return {holder.ptr(), [m = holder.ptr()](const torch::Tensor& x) { return m->forward(x); },
          CrossEntropy};
}

}  // namespace

const std::vector<std::string>& ModelNames() {
  static const std::vector<std::string> kNames = {"mobilenet_v1", "resnet18", "transformer_small"};
  return kNames;
}

Model MakeModel(const ModelConfig& config, std::uint64_t seed) {
  torch::manual_seed(seed);
  if (config.name == "mobilenet_v1") return Wrap(MobileNetV1(config.num_classes));
  if (config.name == "resnet18") return Wrap(ResNet18(config.num_classes));
  if (config.name == "transformer_small") return Wrap(TransformerSmall(config));
  std::string known;
  for (const std::string& name : ModelNames()) known += " " + name;
  throw std::invalid_argument("unknown model '" + config.name + "' (known:" + known + ")");
}

namespace {

// scikit-learn's digits as exported by scripts/build: 64 pixels (0..16) and a label (0..9) per
// line. Every error names the file, and the line for a bad row.
std::pair<torch::Tensor, torch::Tensor> LoadDigits(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    throw std::invalid_argument("cannot read the digits file '" + path +
                                "' (scripts/build writes it; or pass --digits-csv)");
  }
  std::vector<float> pixels;
  std::vector<int64_t> labels;
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    const auto bad = [&](const std::string& why) {
      throw std::invalid_argument("the digits file '" + path + "' is malformed: line " +
                                  std::to_string(number) + " " + why + ": " + line.substr(0, 80));
    };
    std::istringstream fields(line);
    std::string field;
    std::vector<float> row;
    while (std::getline(fields, field, ',')) {
      char* end = nullptr;
      const float value = std::strtof(field.c_str(), &end);
      if (field.empty() || end != field.c_str() + field.size() || !std::isfinite(value))
        bad("has a field that is not a number, '" + field + "'");
      row.push_back(value);
    }
    if (row.size() != 65)
      bad("has " + std::to_string(row.size()) + " fields, not 64 pixels and a label");
    if (row[64] != std::floor(row[64]) || row[64] < 0 || row[64] > 9)
      bad("has a label that is not 0..9");
    pixels.insert(pixels.end(), row.begin(), row.begin() + 64);
    labels.push_back(static_cast<int64_t>(row[64]));
  }
  if (file.bad()) throw std::invalid_argument("cannot read the digits file '" + path + "'");
  if (labels.empty()) throw std::invalid_argument("the digits file '" + path + "' is empty");
  const auto n = static_cast<int64_t>(labels.size());
  return {torch::tensor(pixels).view({n, 1, 8, 8}) / 16.0, torch::tensor(labels)};
}

}  // namespace

Batches::Batches(const ModelConfig& model, const DataConfig& data) {
  if (data.batch_size < 1)
    throw std::invalid_argument("invalid batch size " + std::to_string(data.batch_size));
  if (data.pool < 1) throw std::invalid_argument("invalid batch pool " + std::to_string(data.pool));
  torch::manual_seed(data.seed);
  const int64_t b = data.batch_size;
  const bool transformer = model.name == "transformer_small";
  samples_per_batch_ = b;
  if (data.data == "digits") {
    if (transformer) throw std::invalid_argument("the digits data set is for the image models");
    if (model.image_size < 8) {
      throw std::invalid_argument("digits need --image-size >= 8, got " +
                                  std::to_string(model.image_size));
    }
    const auto [images, labels] = LoadDigits(data.digits_csv);
    const torch::Tensor order = torch::randperm(images.size(0));
    const int64_t pad = model.image_size - 8;
    for (int64_t i = 0; i + b <= images.size(0) && static_cast<int>(batches_.size()) < data.pool;
         i += b) {
      const torch::Tensor index = order.slice(0, i, i + b);
      torch::Tensor x = images.index_select(0, index).expand({b, 3, 8, 8});
      x = torch::constant_pad_nd(x, {pad / 2, pad - pad / 2, pad / 2, pad - pad / 2});
      batches_.push_back({x.contiguous(), labels.index_select(0, index)});
    }
    if (batches_.empty()) {
      const int64_t n = images.size(0);
      throw std::invalid_argument(
          "batch size " + std::to_string(b) + " larger than the digits set (" + std::to_string(n) +
          (n == 1 ? " sample" : " samples") + " in '" + data.digits_csv + "')");
    }
    return;
  }
  if (data.data != "synthetic") {
    throw std::invalid_argument("unknown --dataset '" + data.data + "' (known: synthetic digits)");
  }
  for (int i = 0; i < data.pool; ++i) {
    if (transformer) {
      // Next-token targets: the sequence shifted left by one, plus one more random token.
      const torch::Tensor tokens =
          torch::randint(model.vocab, {b, model.seq_len + 1}, torch::kLong);
      batches_.push_back({tokens.slice(1, 0, model.seq_len).contiguous(),
                          tokens.slice(1, 1, model.seq_len + 1).contiguous()});
    } else {
      batches_.push_back({torch::randn({b, 3, model.image_size, model.image_size}),
                          torch::randint(model.num_classes, {b}, torch::kLong)});
    }
  }
}

}  // namespace fusedopt::train
