// Optimizer classes for C++ users who let fusedopt own the memory: every tensor's param, grad,
// state and optional f32 master live in 64-byte-aligned flat arenas, laid out group by group, so a
// group's params (and grads) are one contiguous range and ZeroGrad is one memset. Step counts are
// kept per tensor, as torch.optim keeps state['step'].
//
//   fusedopt::AdamW opt({fusedopt::AdamWHyper{.lr = 1e-3}}, {{.numel = 4096}, {.numel = 64}});
//   std::span<float> w = opt.storage().params<float>(0);   // fill params, then per iteration:
//   ... write gradients into opt.storage().grads<float>(i) ...
//   opt.Step();
//   opt.ZeroGrad();
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/error.h"
#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"

namespace fusedopt {

struct TensorSpec {
  std::size_t numel = 0;
  std::uint32_t group = 0;
};

struct StorageOptions {
  DType param_dtype = DType::kF32;
  DType grad_dtype = DType::kF32;
  DType state_dtype = DType::kF32;
  bool master_weights = false;  // keep an f32 master copy of f16/bf16 params
};

// The arenas and the segment table over them.
class FlatStorage {
 public:
  // state_slots: bit i set allocates Segment::state[i] for every tensor (see RequiredStates).
  FlatStorage(std::span<const TensorSpec> tensors, std::size_t num_groups,
              const StorageOptions& options, unsigned state_slots);

  std::size_t num_tensors() const { return segments_.size(); }
  std::size_t total_numel() const { return total_numel_; }
  const StorageOptions& options() const { return options_; }
  // Segment i describes tensor i (the order given to the constructor); its step field is not used
  // here.
  std::span<const Segment> segments() const { return segments_; }

  // Typed views; T must have the size of the dtype (float for f32, std::uint16_t for f16/bf16).
  template <class T>
  std::span<T> params(std::size_t tensor) {
    return View<T>(segments_.at(tensor).param, options_.param_dtype, tensor);
  }
  template <class T>
  std::span<T> grads(std::size_t tensor) {
    return View<T>(const_cast<void*>(segments_.at(tensor).grad), options_.grad_dtype, tensor);
  }
  // Throws fusedopt::Error for a slot outside [0, kMaxStates) or one that is not allocated.
  template <class T>
  std::span<T> state(std::size_t tensor, int slot) {
    if (slot < 0 || slot >= kMaxStates || segments_.at(tensor).state[slot] == nullptr) {
      throw Error("FlatStorage: state slot " + std::to_string(slot) + " is not allocated");
    }
    return View<T>(segments_.at(tensor).state[slot], options_.state_dtype, tensor);
  }
  std::span<float> master(std::size_t tensor);

  // All grads (params) of all tensors as one flat range, group by group.
  void* flat_grads() { return grads_.get(); }
  void* flat_params() { return params_.get(); }

  void ZeroGrad();
  // Allocates (zero-filled) the state slots in `slots` (bit i: Segment::state[i]) that are not
  // allocated yet.
  void AllocateStates(unsigned slots);
  // Copies params into the master copy (done for each tensor before its first step).
  void SyncMaster(std::size_t tensor);

 private:
  struct AlignedFree {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  using Arena = std::unique_ptr<std::byte[], AlignedFree>;
  static Arena Allocate(std::size_t bytes);

  template <class T>
  std::span<T> View(void* data, DType dtype, std::size_t tensor) {
    if (sizeof(T) != DTypeSize(dtype)) {
      throw Error("FlatStorage: element size " + std::to_string(sizeof(T)) +
                  " does not match dtype " + std::string(DTypeName(dtype)));
    }
    return {static_cast<T*>(data), segments_.at(tensor).numel};
  }

  StorageOptions options_;
  std::size_t total_numel_ = 0;
  Arena params_, grads_, master_;
  Arena states_[kMaxStates];
  std::vector<Segment> segments_;
};

// Hyper is one of SgdHyper, AdamHyper, AdamWHyper, RmspropHyper, AdagradHyper.
template <class Hyper>
class Optimizer {
 public:
  // Every tensor's group must index `groups`. Throws fusedopt::Error on invalid hyper-parameters or
  // specs.
  Optimizer(std::vector<Hyper> groups, std::vector<TensorSpec> tensors, StorageOptions options = {},
            Runtime& runtime = DefaultRuntime());

  // Live hyper-parameters: edit them between steps (schedules); the next step validates them, and
  // allocates (zero-filled) any state a new setting needs, e.g. amsgrad switched on.
  Hyper& group(std::size_t g) { return groups_.at(g); }
  std::size_t num_groups() const { return groups_.size(); }
  FlatStorage& storage() { return storage_; }
  std::int64_t step_count(std::size_t tensor) const { return steps_.at(tensor); }

  void ZeroGrad() { storage_.ZeroGrad(); }
  // Updates every tensor.
  void Step();
  // Updates only the listed tensors (the others have no gradient this step: no update, no step
  // count).
  void Step(std::span<const std::size_t> tensors);

 private:
  std::vector<Hyper> groups_;
  FlatStorage storage_;
  std::vector<std::int64_t> steps_;
  // SGD only: steps taken with a momentum buffer, so a buffer starts as a copy of the gradient on
  // its own first step, also when momentum is switched on later (torch's `momentum_buffer is
  // None`).
  std::vector<std::int64_t> buffer_steps_;
  Runtime* runtime_;
};

using SGD = Optimizer<SgdHyper>;
using Adam = Optimizer<AdamHyper>;
using AdamW = Optimizer<AdamWHyper>;
using RMSprop = Optimizer<RmspropHyper>;
using Adagrad = Optimizer<AdagradHyper>;

extern template class Optimizer<SgdHyper>;
extern template class Optimizer<AdamHyper>;
extern template class Optimizer<AdamWHyper>;
extern template class Optimizer<RmspropHyper>;
extern template class Optimizer<AdagradHyper>;

}  // namespace fusedopt
