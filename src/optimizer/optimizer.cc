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
  if (options.accumulation_steps < 1) {
    throw Error("FlatStorage: invalid accumulation_steps: " +
                std::to_string(options.accumulation_steps) + " (must be >= 1)");
  }
  // Lay tensors out group by group, keeping their order within a group. State arenas are laid
  // out alike; with 8-bit states a tensor's codes take a byte per element, and each tensor starts
  // on 4 bytes so that the f32 states of small ones stay aligned.
  std::vector<std::size_t> offsets(tensors.size());
  std::vector<DType> state_dtypes(tensors.size(), options.state_dtype);
  state_offsets_.resize(tensors.size());
  const bool q8 = options.state_dtype == DType::kQ8;
  for (std::size_t g = 0; g < num_groups; ++g) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].group != g) continue;
      offsets[i] = total_numel_;
      total_numel_ += tensors[i].numel;
      if (q8 && tensors[i].numel < options.min_8bit_size) state_dtypes[i] = DType::kF32;
      if (q8) state_bytes_ = (state_bytes_ + 3) / 4 * 4;
      state_offsets_[i] = {state_bytes_, absmax_blocks_};
      state_bytes_ += tensors[i].numel * DTypeSize(state_dtypes[i]);
      if (state_dtypes[i] == DType::kQ8) absmax_blocks_ += NumQuantBlocks(tensors[i].numel);
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
    s.state_dtype = state_dtypes[i];
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

unsigned FlatStorage::AllocateStates(unsigned slots) {
  unsigned allocated = 0;
  for (int slot = 0; slot < kMaxStates; ++slot) {
    if ((slots >> slot & 1u) == 0 || states_[slot] || total_numel_ == 0) continue;
    states_[slot] = Allocate(state_bytes_);
    absmax_[slot] = Allocate(absmax_blocks_ * sizeof(float));
    for (std::size_t i = 0; i < segments_.size(); ++i) {
      Segment& s = segments_[i];
      s.state[slot] = states_[slot].get() + state_offsets_[i].bytes;
      if (s.state_dtype == DType::kQ8) {
        s.absmax[slot] = reinterpret_cast<float*>(absmax_[slot].get()) + state_offsets_[i].blocks;
      }
    }
    allocated |= 1u << slot;
  }
  return allocated;
}

std::span<float> FlatStorage::absmax(std::size_t tensor, int slot) {
  const Segment& s = segments_.at(tensor);
  if (slot < 0 || slot >= kMaxStates || s.state[slot] == nullptr) {
    throw Error("FlatStorage: state slot " + std::to_string(slot) + " is not allocated");
  }
  if (s.state_dtype != DType::kQ8) {
    throw Error("FlatStorage: tensor " + std::to_string(tensor) + " keeps " +
                std::string(DTypeName(s.state_dtype)) + " states, which have no absmax");
  }
  return {s.absmax[slot], NumQuantBlocks(s.numel)};
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
  if (total_numel_ == 0) return 0.0;
  double bytes = 0.0;
  for (const Segment& s : segments_) {
    for (int slot = 0; slot < kMaxStates; ++slot) {
      if (s.state[slot] == nullptr) continue;
      bytes += static_cast<double>(s.numel * DTypeSize(s.state_dtype));
      if (s.state_dtype == DType::kQ8) bytes += NumQuantBlocks(s.numel) * sizeof(float);
    }
  }
  bytes /= static_cast<double>(total_numel_);
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
