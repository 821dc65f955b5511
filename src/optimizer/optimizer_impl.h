// The members of Optimizer<Hyper> (include/fusedopt/optimizer.h): the step over the flat storage
// through TrainingStep. For the files that instantiate them: optimizer.cc for every algorithm of
// the registry, tests/algos/instances.cc for the test-only ones (whose descriptors
// algos::DescriptorOf finds through algos::DescriptorFor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "fusedopt/optimizer.h"
#include "fusedopt/quantize.h"
#include "src/algos/registry.h"
#include "src/core/training_step_impl.h"

namespace fusedopt {

namespace optimizer_detail {

template <class Hyper>
unsigned AllRequiredStates(const std::vector<Hyper>& groups) {
  unsigned slots = 0;
  for (const Hyper& h : groups) slots |= RequiredStates(h);
  return slots;
}

}  // namespace optimizer_detail

template <class Hyper>
Optimizer<Hyper>::Optimizer(std::vector<Hyper> groups, std::vector<TensorSpec> tensors,
                            StorageOptions options, Runtime& runtime)
    : groups_(std::move(groups)),
      storage_(tensors, groups_.size(), options, optimizer_detail::AllRequiredStates(groups_)),
      steps_(tensors.size(), 0),
      buffer_steps_(tensors.size(), 0),
      runtime_(&runtime),
      window_{.steps = storage_.options().accumulation_steps} {
  // Validate the hyper-parameters now rather than at the first step.
  FusedStep(std::span<const Hyper>(groups_), {}, *runtime_);
  using Descriptor = algos::DescriptorOf<Hyper>;
  if (storage_.options().state_dtype == DType::kQ8 && !algos::QuantizableStates<Descriptor>) {
    throw Error(std::string("Optimizer: 8-bit states (state_dtype q8) are not for ") +
                Descriptor::kName + ": " + algos::WhyStatesStayUnquantized<Descriptor>());
  }
  ResetStates(optimizer_detail::AllRequiredStates(groups_));
  // Scalar states start from the algorithm's initial values.
  if constexpr (algos::HasScalarStates<Descriptor>) {
    for (std::size_t i = 0; i < storage_.num_tensors(); ++i) {
      const std::uint32_t group = storage_.segments()[i].group;
      for (std::size_t k = 0; k < algos::NumScalarStates<Descriptor>(); ++k) {
        storage_.scalars(i)[k] = Descriptor::InitialScalar(groups_[group], static_cast<int>(k));
      }
    }
  }
}

template <class Hyper>
void Optimizer<Hyper>::ResetStates(unsigned slots) {
  using Descriptor = algos::DescriptorOf<Hyper>;
  for (const Segment& s : storage_.segments()) {
    for (int slot = 0; slot < kMaxStates; ++slot) {
      if ((slots >> slot & 1u) == 0 || s.state[slot] == nullptr) continue;
      // States start at 0 except where the algorithm says otherwise (InitialState: a sum torch
      // creates eagerly, filled with a hyper-parameter).
      const float init = Descriptor::InitialState(groups_[s.group], slot);
      if (s.state_dtype == DType::kQ8) {
        QuantizeFill(init, s.numel, SlotMap(algos::UnsignedMapStates<Descriptor>(), slot),
                     static_cast<std::uint8_t*>(s.state[slot]), s.absmax[slot]);
      } else if (init == 0.0f) {  // +0 is all zero bits in every float dtype
        std::memset(s.state[slot], 0, s.numel * DTypeSize(s.state_dtype));
      } else {
        for (std::size_t k = 0; k < s.numel; ++k)
          StoreFromF32(s.state[slot], s.state_dtype, k, init);
      }
    }
  }
}

template <class Hyper>
StepResult Optimizer<Hyper>::Step(const StepOptions& options) {
  std::vector<std::size_t> all(storage_.num_tensors());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  return StepTensors(all, options);
}

template <class Hyper>
StepResult Optimizer<Hyper>::StepTensors(std::span<const std::size_t> tensors,
                                         const StepOptions& options) {
  using Descriptor = algos::DescriptorOf<Hyper>;
  const std::int64_t accumulation = storage_.options().accumulation_steps;
  std::vector<bool> seen(storage_.num_tensors(), false);
  for (std::size_t t : tensors) {
    if (t >= storage_.num_tensors()) {
      throw Error("Optimizer::StepTensors: tensor index " + std::to_string(t) + " out of range (" +
                  std::to_string(storage_.num_tensors()) + " tensors)");
    }
    if (seen[t])
      throw Error("Optimizer::StepTensors: tensor index " + std::to_string(t) + " listed twice");
    seen[t] = true;
  }
  if (accumulation > 1 && tensors.size() != storage_.num_tensors()) {
    throw Error("Optimizer::StepTensors: a tensor list needs accumulation_steps 1 (it is " +
                std::to_string(accumulation) + ")");
  }
  if (!(options.max_grad_norm >= 0.0)) {
    throw Error("Optimizer::Step: invalid max_grad_norm: " + std::to_string(options.max_grad_norm) +
                " (must be >= 0; Inf: no clipping)");
  }
  // Validate the (live) hyper-parameters before anything is written.
  FusedStep(std::span<const Hyper>(groups_), {}, *runtime_);
  ResetStates(storage_.AllocateStates(optimizer_detail::AllRequiredStates(groups_)));
  const float inv_scale = options.scaler != nullptr ? options.scaler->inv_scale() : 1.0f;

  std::vector<Segment> segments;
  segments.reserve(tensors.size());
  for (std::size_t t : tensors) segments.push_back(storage_.segments()[t]);

  // With accumulation, the step reads the sums; TrainingStep adds this micro-batch into them first
  // (and steps only on the window's last one).
  std::vector<GradBuffer> grads;
  std::vector<float*> sums;
  if (accumulation > 1) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      Segment& s = segments[i];
      grads.push_back({const_cast<void*>(s.grad), s.numel, s.grad_dtype});
      sums.push_back(storage_.accumulator(tensors[i]).data());
      s.grad = sums.back();
      s.grad_dtype = DType::kF32;
    }
  } else {
    for (Segment& s : segments) s.grad_scale = inv_scale;
  }
  const MicroBatch batch{.window = &window_, .grads = grads, .sums = sums, .grad_scale = inv_scale};

  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::size_t t = tensors[i];
    segments[i].step = steps_[t] + 1;
    if (algos::CountsBufferSteps<Descriptor>(groups_[segments[i].group])) {
      segments[i].step = buffer_steps_[t] + 1;
    }
  }
  const bool updates = accumulation == 1 || window_.pending + 1 == accumulation;
  // Masters are seeded from the params the user wrote before the tensor's first step.
  if (updates) {
    for (std::size_t t : tensors) {
      if (steps_[t] == 0) storage_.SyncMaster(t);
    }
  }
  const StepResult result =
      TrainingStep(std::span<const Hyper>(groups_), std::span<Segment>(segments),
                   {.scaler = options.scaler,
                    .max_grad_norm = options.max_grad_norm,
                    .norm_type = options.norm_type,
                    .clip_rule = options.clip_rule,
                    .micro_batch = accumulation > 1 ? &batch : nullptr},
                   *runtime_);
  if (!result.stepped) return result;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    ++steps_[tensors[i]];
    if (algos::CountsBufferSteps<Descriptor>(groups_[segments[i].group])) {
      ++buffer_steps_[tensors[i]];
    }
  }
  return result;
}

}  // namespace fusedopt
