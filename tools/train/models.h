// The models `fusedopt train` trains, built with libtorch's C++ modules; bench/train_models.py
// builds the same ones in Python (same parameter shapes, in the same order).
//   mobilenet_v1       MobileNetV1 (width 1.0): 83 tensors, 4.23 M params with 1000 classes
//   resnet18           torchvision's ResNet-18: 62 tensors, 11.7 M params with 1000 classes
//   transformer_small  a GPT-style decoder (8 pre-LN blocks, d_model 128, 4 heads, vocab 1024,
//                      64 tokens): 101 mostly small tensors, 1.86 M params — where per-tensor
//                      overhead hurts most
// and their synthetic data (a fixed, seeded pool of batches, cycled) or scikit-learn's digits.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fusedopt/pt/trainer.h"

namespace fusedopt::train {

struct ModelConfig {
  std::string name = "mobilenet_v1";
  int num_classes = 1000;  // image models
  int image_size = 32;     // image models: inputs are 3 x image_size x image_size
  // transformer_small
  int vocab = 1024, seq_len = 64, d_model = 128, n_layer = 8, n_head = 4;
};

// A model with its forward and loss, ready for pt::Trainer.
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  pt::Trainer::Forward forward;
  pt::Trainer::Loss loss;
};

// Known names, in a stable order.
const std::vector<std::string>& ModelNames();

// Builds the model with torch's default initialization under torch::manual_seed(seed): two calls
// with the same config and seed give identical parameters. Throws std::invalid_argument naming
// the model and the known names if unknown.
Model MakeModel(const ModelConfig& config, std::uint64_t seed);

// A fixed pool of `pool` batches of `batch_size` samples, generated from `seed`, handed out in a
// cycle: images ~ N(0,1) with uniform labels (image models) or uniform tokens whose targets are the
// next tokens (transformer). With data "digits", scikit-learn's 8x8 digits (10 classes) from the
// CSV file `digits_csv` (rows: 64 pixel values 0..16, then the label), scaled to [0,1], repeated
// over 3 channels and zero-padded to image_size.
struct DataConfig {
  std::string data = "synthetic";  // or "digits"
  std::string digits_csv;
  int batch_size = 32;
  int pool = 8;
  std::uint64_t seed = 1;
};
class Batches {
 public:
  Batches(const ModelConfig& model, const DataConfig& data);
  // The i-th batch of the cycle.
  const pt::Batch& Get(std::int64_t i) const {
    return batches_[static_cast<std::size_t>(i) % batches_.size()];
  }
  std::int64_t samples_per_batch() const { return samples_per_batch_; }

 private:
  std::vector<pt::Batch> batches_;
  std::int64_t samples_per_batch_ = 0;
};

}  // namespace fusedopt::train
