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
//
// The training-loop features are part of the step: with a LossScaler, max_grad_norm or
// accumulation_steps > 1, Step() runs the fused pre-pass (grad.h: one read of the gradients for
// overflow and global norm; unscale and clip folded into the update), skips a step whose gradients
// overflowed (params, states and step counts bit-identical), updates the scaler, and with
// accumulation sums micro-batch gradients into f32 accumulators and updates every k-th call.
//
//   fusedopt::LossScaler scaler;                  // dynamic, torch.amp.GradScaler's policy
//   ... backward of loss * scaler.scale() into opt.storage().grads ...
//   fusedopt::StepResult r = opt.Step({.scaler = &scaler, .max_grad_norm = 1.0});
//
// With state_dtype kQ8 the element-wise algorithms keep 8-bit block-wise states (quantize.h), as
// the Python classes' state_dtype=torch.uint8 does: each state of a tensor of at least
// min_8bit_size elements is its codes and one f32 absmax per block; smaller tensors keep f32
// states.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/error.h"
#include "fusedopt/grad.h"
#include "fusedopt/hyper.h"
#include "fusedopt/quantize.h"
#include "fusedopt/runtime.h"
#include "fusedopt/scaler.h"
#include "fusedopt/step.h"
#include "fusedopt/training_step.h"

namespace fusedopt {

struct TensorSpec {
  std::size_t numel = 0;
  std::uint32_t group = 0;
  // The tensor's size(0) when it has more than one dimension (Segment::rows: AdamP projects per
  // channel row), else 0; must divide numel.
  std::size_t rows = 0;
  // Adafactor: the tensor's size(-1) when it has more than one dimension (Segment::cols), and rows
  // then its size(-2); rows·cols must divide numel. 0 otherwise. FlatStorage gives every state slot
  // numel elements, more than a factored tensor's row_var and col_var use.
  std::size_t cols = 0;
};

struct StorageOptions {
  DType param_dtype = DType::kF32;
  DType grad_dtype = DType::kF32;
  // kQ8: 8-bit codes with an f32 absmax per block for the tensors of at least min_8bit_size
  // elements, f32 states for the others (bitsandbytes' policy: biases and norms are too small to
  // matter and quantize worst); not for AdamP and Adafactor (QuantizableStates).
  DType state_dtype = DType::kF32;
  std::size_t min_8bit_size = kMin8bitSize;
  bool master_weights = false;  // keep an f32 master copy of f16/bf16 params
  // > 1: Step() adds the gradients into f32 accumulators and updates every k-th call (one large
  // batch: the accumulated mean of the micro-batch gradients).
  std::int64_t accumulation_steps = 1;
  // Round 16-bit state stores, and 16-bit params without a master copy, stochastically (keyed on
  // seed, step and the element's index in the arena; Segment::stochastic_rounding).
  bool stochastic_rounding = false;
  std::uint64_t rounding_seed = 0;
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

  // Typed views; T must have the size of the dtype (float for f32, std::uint16_t for f16/bf16,
  // std::uint8_t for the codes of 8-bit states).
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
    return View<T>(segments_.at(tensor).state[slot], segments_.at(tensor).state_dtype, tensor);
  }
  // The absmax of an 8-bit state slot, one per block of kQuantBlock elements; throws
  // fusedopt::Error for a slot that is not allocated or a tensor whose states are not 8-bit.
  std::span<float> absmax(std::size_t tensor, int slot);
  std::span<float> master(std::size_t tensor);
  // The kMaxScalars per-tensor scalar states (Segment::scalars, e.g. NAdam's mu_product), zero
  // until set (Optimizer<> sets the algorithm's initial values).
  std::span<float, kMaxScalars> scalars(std::size_t tensor);
  // The f32 gradient accumulator of a tensor (accumulation_steps > 1 only).
  std::span<float> accumulator(std::size_t tensor);

  // Bytes the optimizer keeps per parameter beyond the param and its gradient: states (8-bit ones
  // with their absmax), master copy and accumulator.
  double state_bytes_per_param() const;

  // All grads (params) of all tensors as one flat range, group by group.
  void* flat_grads() { return grads_.get(); }
  void* flat_params() { return params_.get(); }

  void ZeroGrad();
  // Allocates (zero-filled: 8-bit codes and absmax too, which the owner then sets to its initial
  // values) the state slots in `slots` (bit i: Segment::state[i]) that are not allocated yet;
  // returns those it allocated.
  unsigned AllocateStates(unsigned slots);
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

  // Where tensor i's states start in a state arena (bytes: 8-bit codes and f32 states share it)
  // and its absmax in an absmax arena (floats).
  struct StateOffsets {
    std::size_t bytes = 0, blocks = 0;
  };

  StorageOptions options_;
  std::size_t total_numel_ = 0;
  std::size_t state_bytes_ = 0, absmax_blocks_ = 0;  // of one slot's arenas
  std::vector<StateOffsets> state_offsets_;
  Arena params_, grads_, master_, accumulators_;
  Arena states_[kMaxStates], absmax_[kMaxStates];
  std::vector<float> scalars_;  // kMaxScalars per tensor
  std::vector<Segment> segments_;
};

// What Step() should do around the update.
struct StepOptions {
  // Gradients hold loss · scaler->scale(): the step unscales them, skips on overflow and calls
  // scaler->Update(). Null: the gradients are used as they are (no overflow check unless clipping).
  LossScaler* scaler = nullptr;
  // Clip the global norm of the (unscaled) gradients to this (torch.nn.utils.clip_grad_norm_);
  // Inf: no clipping.
  double max_grad_norm = std::numeric_limits<double>::infinity();
  NormType norm_type = NormType::kL2;
  // How the norm becomes the clip factor: torch's clip_grad_norm_, or apex FusedLAMB's
  // max_grad_norm (ClipRule::kLamb, the rule fusedopt.FusedLAMB uses).
  ClipRule clip_rule = ClipRule::kTorch;
};

// Saves and restores an Optimizer's private state (src/checkpoint/, for
// fusedopt/checkpoint.h).
template <class Hyper>
struct OptimizerCheckpoint;

// Hyper is one of the Stem##Hyper structs of hyper.h's FUSEDOPT_FOR_EACH_ALGORITHM list.
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
  // Updates every tensor (with accumulation: every accumulation_steps-th call).
  StepResult Step(const StepOptions& options = {});
  // `Step({0})` would bind to the options (`.scaler = 0`) and update every tensor; a tensor list
  // goes to StepTensors, so the braced call does not compile.
  StepResult Step(std::initializer_list<std::size_t>) = delete;
  // Updates only the listed tensors (the others have no gradient this step: no update, no step
  // count). Not with accumulation_steps > 1.
  StepResult StepTensors(std::span<const std::size_t> tensors, const StepOptions& options = {});
  StepResult StepTensors(std::initializer_list<std::size_t> tensors,
                         const StepOptions& options = {}) {
    return StepTensors(std::span<const std::size_t>(tensors.begin(), tensors.size()), options);
  }
  // Micro-batches accumulated since the last update.
  std::int64_t pending_micro_batches() const { return window_.pending; }

 private:
  friend struct OptimizerCheckpoint<Hyper>;

  // Sets the state slots in `slots` of every tensor to the algorithm's initial values (8-bit ones
  // quantized, so that their codes are those the Python classes start from).
  void ResetStates(unsigned slots);

  std::vector<Hyper> groups_;
  FlatStorage storage_;
  std::vector<std::int64_t> steps_;
  // For an algorithm whose momentum buffer starts as a copy of the gradient (SGD, LARS): steps
  // taken with a momentum buffer, so a buffer starts so on its own first step, also when momentum
  // is switched on later (torch's `momentum_buffer is None`).
  std::vector<std::int64_t> buffer_steps_;
  Runtime* runtime_;
  AccumulationWindow window_;  // steps: the storage's accumulation_steps
};

// fusedopt::SGD, fusedopt::Adam, ..., fusedopt::Adafactor: one alias per algorithm of hyper.h's
// list, each instantiated once in the library.
// NOLINTBEGIN(bugprone-macro-parentheses): Alias is the name declared
#define FUSEDOPT_DECLARE_OPTIMIZER_(Stem, Alias) \
  using Alias = Optimizer<Stem##Hyper>;          \
  extern template class Optimizer<Stem##Hyper>;
// NOLINTEND(bugprone-macro-parentheses)
FUSEDOPT_FOR_EACH_ALGORITHM(FUSEDOPT_DECLARE_OPTIMIZER_)
#undef FUSEDOPT_DECLARE_OPTIMIZER_

}  // namespace fusedopt
