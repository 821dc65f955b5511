// Optimizer<Hyper> (include/fusedopt/optimizer.h): the flat storage of params, gradients and
// states, and the Optimizer's members (optimizer_impl.h) instantiated for every algorithm of the
// registry.

#include "fusedopt/optimizer.h"

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "src/algos/registry.h"
#include "src/optimizer/optimizer_impl.h"
#include "src/optimizer/tensor_specs.h"

namespace fusedopt {

void CheckTensorSpecs(const char* who, std::span<const TensorSpec> tensors,
                      std::size_t num_groups) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].group >= num_groups) {
      throw Error(std::string(who) + ": tensor " + std::to_string(i) + ": group " +
                  std::to_string(tensors[i].group) + " out of range (" +
                  std::to_string(num_groups) + " groups)");
    }
    if (tensors[i].rows > 0 && tensors[i].numel % tensors[i].rows != 0) {
      throw Error(std::string(who) + ": tensor " + std::to_string(i) + ": rows " +
                  std::to_string(tensors[i].rows) + " does not divide numel " +
                  std::to_string(tensors[i].numel));
    }
    if (tensors[i].cols > 0 &&
        (tensors[i].rows == 0 || tensors[i].numel % (tensors[i].rows * tensors[i].cols) != 0)) {
      throw Error(std::string(who) + ": tensor " + std::to_string(i) + ": rows " +
                  std::to_string(tensors[i].rows) + " × cols " + std::to_string(tensors[i].cols) +
                  " does not divide numel " + std::to_string(tensors[i].numel));
    }
  }
}

FlatStorage::Arena FlatStorage::Allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  // Round up to whole cache lines; zero-filled so fresh states and grads start at 0.
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  Arena arena(new (std::align_val_t{64}) std::byte[rounded]);
  std::memset(arena.get(), 0, rounded);
  return arena;
}

FlatStorage::FlatStorage(std::span<const TensorSpec> tensors, std::size_t num_groups,
                         const StorageOptions& options, unsigned state_slots)
    : options_(options) {
  if (options.master_weights && options.param_dtype == DType::kF32) {
    throw Error("FlatStorage: master_weights needs f16 or bf16 params (param_dtype is f32)");
  }
  // 8-bit states need their absmax and quantized initial values, which the stateful Optimizer and
  // its checkpoints do not keep yet: the step functions (Segment::absmax) and the Python classes
  // take them (docs/8bit-states.md).
  if (options.state_dtype == DType::kQ8) {
    throw Error(
        "FlatStorage: 8-bit states (state_dtype q8) are taken by the step functions and the "
        "Python classes, not yet by Optimizer<> (docs/8bit-states.md)");
  }
  if (options.accumulation_steps < 1) {
    throw Error("FlatStorage: invalid accumulation_steps: " +
                std::to_string(options.accumulation_steps) + " (must be >= 1)");
  }
  // Lay tensors out group by group, keeping their order within a group.
  std::vector<std::size_t> offsets(tensors.size());
  for (std::size_t g = 0; g < num_groups; ++g) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].group != g) continue;
      offsets[i] = total_numel_;
      total_numel_ += tensors[i].numel;
    }
  }
  CheckTensorSpecs("FlatStorage", tensors, num_groups);
  const std::size_t param_size = DTypeSize(options.param_dtype);
  const std::size_t grad_size = DTypeSize(options.grad_dtype);
  params_ = Allocate(total_numel_ * param_size);
  grads_ = Allocate(total_numel_ * grad_size);
  if (options.master_weights) master_ = Allocate(total_numel_ * sizeof(float));
  if (options.accumulation_steps > 1) accumulators_ = Allocate(total_numel_ * sizeof(float));
  segments_.resize(tensors.size());
  scalars_.assign(tensors.size() * kMaxScalars, 0.0f);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    Segment& s = segments_[i];
    const std::size_t o = offsets[i];
    s.numel = tensors[i].numel;
    s.rows = tensors[i].rows;
    s.cols = tensors[i].cols;
    s.group = tensors[i].group;
    s.param_dtype = options.param_dtype;
    s.grad_dtype = options.grad_dtype;
    s.state_dtype = options.state_dtype;
    s.param = params_.get() + o * param_size;
    s.grad = grads_.get() + o * grad_size;
    s.stochastic_rounding = options.stochastic_rounding;
    s.rounding_seed = options.rounding_seed;
    s.global_offset = o;
    if (master_) s.master = reinterpret_cast<float*>(master_.get()) + o;
    for (int k = 0; k < kMaxScalars; ++k) s.scalars[k] = &scalars_[i * kMaxScalars + k];
  }
  AllocateStates(state_slots);
}

void FlatStorage::AllocateStates(unsigned slots) {
  const std::size_t state_size = DTypeSize(options_.state_dtype);
  for (int slot = 0; slot < kMaxStates; ++slot) {
    if ((slots >> slot & 1u) == 0 || states_[slot] || total_numel_ == 0) continue;
    states_[slot] = Allocate(total_numel_ * state_size);
    // Offsets in the state arena are those in the param arena.
    for (Segment& s : segments_) {
      const auto offset =
          static_cast<std::size_t>(static_cast<std::byte*>(s.param) - params_.get()) /
          DTypeSize(options_.param_dtype);
      s.state[slot] = states_[slot].get() + offset * state_size;
    }
  }
}

std::span<float> FlatStorage::master(std::size_t tensor) {
  const Segment& s = segments_.at(tensor);
  if (s.master == nullptr) throw Error("FlatStorage: no master copy (master_weights is off)");
  return {s.master, s.numel};
}

std::span<float, kMaxScalars> FlatStorage::scalars(std::size_t tensor) {
  return std::span<float, kMaxScalars>(segments_.at(tensor).scalars[0], kMaxScalars);
}

std::span<float> FlatStorage::accumulator(std::size_t tensor) {
  const Segment& s = segments_.at(tensor);
  if (!accumulators_) throw Error("FlatStorage: no accumulator (accumulation_steps is 1)");
  const auto offset = static_cast<std::size_t>(static_cast<std::byte*>(s.param) - params_.get()) /
                      DTypeSize(options_.param_dtype);
  return {reinterpret_cast<float*>(accumulators_.get()) + offset, s.numel};
}

double FlatStorage::state_bytes_per_param() const {
  double bytes = 0.0;
  for (const Arena& state : states_) bytes += state ? DTypeSize(options_.state_dtype) : 0;
  if (master_) bytes += sizeof(float);
  if (accumulators_) bytes += sizeof(float);
  return bytes;
}

void FlatStorage::ZeroGrad() {
  if (grads_) std::memset(grads_.get(), 0, total_numel_ * DTypeSize(options_.grad_dtype));
}

void FlatStorage::SyncMaster(std::size_t tensor) {
  const Segment& s = segments_.at(tensor);
  if (s.master == nullptr) return;
  for (std::size_t i = 0; i < s.numel; ++i) s.master[i] = LoadAsF32(s.param, s.param_dtype, i);
}

// Every algorithm of the registry (the test-only ones: tests/algos/instances.cc).
#define FOPT_INSTANTIATE(Stem, Alias) template class Optimizer<Stem##Hyper>;
FUSEDOPT_FOR_EACH_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

}  // namespace fusedopt
