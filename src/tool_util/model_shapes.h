// Per-tensor parameter shapes of real models, used by the benchmarks and the doctor so that "83
// small tensors" is measured as such.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

namespace fusedopt::tools {

struct TensorShape {
  std::string_view name;
  std::vector<std::size_t> dims;
  std::size_t numel;
};

struct ModelShapes {
  std::string_view model;
  std::vector<TensorShape> tensors;
  std::size_t total_numel;
};

// Known model names, in a stable order: mobilenet_v1, resnet50, bert_base, gpt2_small.
std::span<const std::string_view> ModelNames();

// Throws std::invalid_argument naming the model and the known names if unknown.
const ModelShapes& GetModelShapes(std::string_view model);

}  // namespace fusedopt::tools
