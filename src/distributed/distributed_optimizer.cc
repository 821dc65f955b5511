// DistributedOptimizer (include/fusedopt/distributed.h): construction (every rank checks the others
// built the same layout), the states each rank keeps, and what checkpoints of sharded runs need.
// The step is distributed_step.cc's.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>

#include "fusedopt/convert.h"
#include "fusedopt/distributed.h"
#include "src/algos/registry.h"
#include "src/core/step_hooks.h"
#include "src/core/validate.h"
#include "src/distributed/distributed_common.h"
#include "src/optimizer/tensor_specs.h"

namespace fusedopt {

using distributed::kFn;
using distributed::Mix;

template <class Hyper>
DistributedOptimizer<Hyper>::DistributedOptimizer(std::vector<Hyper> groups,
                                                  std::vector<TensorSpec> tensors,
                                                  StorageOptions storage, Communicator& comm,
                                                  DistributedOptions options, Runtime& runtime)
    : groups_(std::move(groups)),
      specs_(std::move(tensors)),
      storage_(storage),
      comm_(&comm),
      options_(options),
      runtime_(&runtime),
      layout_((CheckTensorSpecs(kFn, specs_, groups_.size()), specs_), groups_.size(), comm.size(),
              (options.bucket_bytes + sizeof(float) - 1) / sizeof(float), options.shard_align) {
  using A = algos::DescriptorOf<Hyper>;
  if (options_.zero != 0 && options_.zero != 1) {
    Fail(kFn, "invalid zero: ", options_.zero, " (0: data parallel, 1: ZeRO-1)");
  }
  if (options_.zero == 1 && !kZeroOneShards<A>) {
    Fail(kFn, A::kName,
         " reduces over whole tensors per row, across tensors or factored, which ZeRO-1 shards "
         "would cut: use zero = 0 with it");
  }
  if (storage_.grad_dtype != DType::kF32) {
    Fail(kFn, "invalid grad_dtype: ", DTypeName(storage_.grad_dtype),
         " (gradients are reduced in f32)");
  }
  if (storage_.accumulation_steps != 1) {
    Fail(kFn, "invalid accumulation_steps: ", storage_.accumulation_steps, " (must be 1)");
  }
  if (storage_.state_dtype == DType::kQ8) {
    Fail(kFn,
         "8-bit states (state_dtype q8) are taken by Optimizer<> and by the Python "
         "DistributedOptimizer, not yet by the C++ one");
  }
  if (storage_.master_weights && storage_.param_dtype == DType::kF32) {
    Fail(kFn, "master_weights needs f16 or bf16 params (param_dtype is f32)");
  }
  FusedStep(std::span<const Hyper>(groups_), {}, *runtime_);  // the hyper-parameters' rules

  // Every rank must have built the same layout: otherwise the collectives would mismatch (wrong
  // sums, or a hang). Every rank sees every hash, so every rank throws the same error.
  std::uint64_t mine = layout_.Hash();
  Mix(mine, static_cast<std::uint64_t>(options_.zero));
  Mix(mine, static_cast<std::uint64_t>(storage_.param_dtype));
  Mix(mine, static_cast<std::uint64_t>(storage_.state_dtype));
  Mix(mine, storage_.master_weights ? 1 : 0);
  Mix(mine, groups_.size());
  for (const char* c = A::kName; *c != 0; ++c) Mix(mine, static_cast<unsigned char>(*c));
  std::vector<std::uint64_t> hashes(static_cast<std::size_t>(comm.size()));
  hashes[static_cast<std::size_t>(comm.rank())] = mine;
  comm.AllGather(hashes.data(), 1, CommType::kU64);
  for (std::size_t r = 1; r < hashes.size(); ++r) {
    if (hashes[r] != hashes[0]) {
      Fail(kFn, "rank ", r, "'s layout differs from rank 0's (hash ", hashes[r], " vs ", hashes[0],
           "): every rank must construct it with the same algorithm, tensors, groups, dtypes, "
           "options and world size");
    }
  }

  local_numel_ = options_.zero == 1 ? layout_.shard_total : layout_.numel;
  params_.assign(layout_.padded * DTypeSize(storage_.param_dtype), std::byte{0});
  grads_.assign(layout_.padded, 0.0f);
  if (options_.zero == 1) shard_grads_.assign(layout_.shard_total, 0.0f);
  if (storage_.master_weights) masters_.assign(local_numel_, 0.0f);
  steps_.assign(specs_.size(), 0);
  buffer_steps_.assign(specs_.size(), 0);
  scalars_.assign(specs_.size() * kMaxScalars, 0.0f);
  if constexpr (algos::HasScalarStates<A>) {
    for (std::size_t t = 0; t < specs_.size(); ++t) {
      for (std::size_t k = 0; k < algos::NumScalarStates<A>(); ++k) {
        scalars_[t * kMaxScalars + k] =
            A::InitialScalar(groups_[specs_[t].group], static_cast<int>(k));
      }
    }
  }
  AllocateStates();
}

template <class Hyper>
void DistributedOptimizer<Hyper>::CheckSize(std::size_t size, DType dtype) {
  if (size != DTypeSize(dtype)) {
    Fail(kFn, "element size ", size, " does not match dtype ", DTypeName(dtype));
  }
}

template <class Hyper>
std::size_t DistributedOptimizer<Hyper>::LocalIndex(std::size_t flat) const {
  if (options_.zero == 0) return flat;
  // The bucket holding `flat`, and its place in this rank's shard (only asked for elements of
  // this rank's shards).
  const auto it =
      std::upper_bound(layout_.buckets.begin(), layout_.buckets.end(), flat,
                       [](std::size_t f, const ShardLayout::Bucket& b) { return f < b.begin; });
  const ShardLayout::Bucket& b = *(it - 1);
  return b.local + flat - b.begin - static_cast<std::size_t>(comm_->rank()) * b.shard;
}

template <class Hyper>
std::vector<std::pair<std::size_t, std::size_t>> DistributedOptimizer<Hyper>::LocalRanges() const {
  if (options_.zero == 0) return {{0, layout_.numel}};
  return ShardRanges();
}

template <class Hyper>
std::vector<std::pair<std::size_t, std::size_t>> DistributedOptimizer<Hyper>::ShardRanges() const {
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (const ShardLayout::Bucket& b : layout_.buckets) {
    const std::size_t begin = b.begin + static_cast<std::size_t>(comm_->rank()) * b.shard;
    const std::size_t end = std::min(begin + b.shard, layout_.numel);
    if (begin < end) ranges.emplace_back(begin, end);  // not a shard of padding only
  }
  return ranges;
}

template <class Hyper>
std::span<std::byte> DistributedOptimizer<Hyper>::LocalBuffer(int slot, const char* fn) {
  if (slot == kMasterSlot) {
    if (masters_.empty()) Fail(kFn, fn, ": no f32 masters (master_weights is off)");
    return std::as_writable_bytes(std::span<float>(masters_));
  }
  if (slot < 0 || slot >= kMaxStates) Fail(kFn, fn, ": invalid state slot ", slot);
  if (states_[slot].empty()) Fail(kFn, fn, ": state slot ", slot, " is not allocated");
  return states_[slot];
}

template <class Hyper>
std::vector<float> DistributedOptimizer<Hyper>::GatherState(int slot) {
  const std::span<const std::byte> local = LocalBuffer(slot, "GatherState");
  const DType dtype = slot == kMasterSlot ? DType::kF32 : storage_.state_dtype;
  const std::size_t count = local_numel_;
  std::vector<float> mine(count);
  for (std::size_t i = 0; i < count; ++i) mine[i] = LoadAsF32(local.data(), dtype, i);
  if (options_.zero == 0) return mine;  // the whole model, in the flat layout
  // Every rank's arrays side by side, then each rank's shards put in their flat places.
  const auto p = static_cast<std::size_t>(comm_->size());
  std::vector<float> all(count * p);
  std::copy(
      mine.begin(), mine.end(),
      all.begin() + static_cast<std::ptrdiff_t>(count * static_cast<std::size_t>(comm_->rank())));
  comm_->AllGather(all.data(), count, CommType::kF32);
  std::vector<float> flat(layout_.numel);
  for (const ShardLayout::Bucket& b : layout_.buckets) {
    for (std::size_t r = 0; r < p; ++r) {
      const std::size_t begin = b.begin + r * b.shard;
      const std::size_t end = std::min(begin + b.shard, layout_.numel);
      if (begin < end) {
        std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(r * count + b.local), end - begin,
                    flat.begin() + static_cast<std::ptrdiff_t>(begin));
      }
    }
  }
  return flat;
}

template <class Hyper>
void DistributedOptimizer<Hyper>::LoadState(int slot, std::span<const float> flat) {
  if (flat.size() != layout_.numel) {
    Fail(kFn, "LoadState: ", flat.size(), " values for a model of ", layout_.numel, " elements");
  }
  if (slot >= 0 && slot < kMaxStates && states_[slot].empty() && local_numel_ > 0) {
    states_[slot].assign(local_numel_ * DTypeSize(storage_.state_dtype), std::byte{0});
  }
  const std::span<std::byte> local = LocalBuffer(slot, "LoadState");
  const DType dtype = slot == kMasterSlot ? DType::kF32 : storage_.state_dtype;
  for (const auto& [begin, end] : LocalRanges()) {
    const std::size_t at = LocalIndex(begin);
    for (std::size_t i = begin; i < end; ++i)
      StoreFromF32(local.data(), dtype, at + i - begin, flat[i]);
  }
}

template <class Hyper>
void DistributedOptimizer<Hyper>::set_step_count(std::size_t tensor, std::int64_t step) {
  if (step < 0) Fail(kFn, "set_step_count: invalid step ", step, " (must be >= 0)");
  steps_.at(tensor) = step;
  buffer_steps_.at(tensor) = step;
}

template <class Hyper>
void DistributedOptimizer<Hyper>::AllocateStates() {
  using A = algos::DescriptorOf<Hyper>;
  unsigned slots = 0;
  for (const Hyper& h : groups_) slots |= RequiredStates(h);
  const std::size_t size = DTypeSize(storage_.state_dtype);
  for (int slot = 0; slot < kMaxStates; ++slot) {
    std::vector<std::byte>& state = states_[slot];
    if ((slots >> slot & 1u) == 0 || !state.empty() || local_numel_ == 0) continue;
    state.assign(local_numel_ * size, std::byte{0});
    // States start at 0 but where the algorithm says otherwise (InitialState);
    // a rank initializes the elements it keeps.
    for (const auto& [begin, end] : LocalRanges()) {
      for (const ShardLayout::Slice& s : layout_.SlicesIn(begin, end)) {
        const float init = A::InitialState(groups_[specs_[s.tensor].group], slot);
        if (init == 0.0f) continue;
        const std::size_t local = LocalIndex(layout_.offsets[s.tensor] + s.first);
        for (std::size_t i = 0; i < s.numel; ++i) {
          StoreFromF32(state.data(), storage_.state_dtype, local + i, init);
        }
      }
    }
  }
}

template <class Hyper>
std::vector<Segment> DistributedOptimizer<Hyper>::SegmentsIn(std::size_t begin, std::size_t end,
                                                             float grad_scale, bool whole_tensors) {
  using A = algos::DescriptorOf<Hyper>;
  const std::size_t param_size = DTypeSize(storage_.param_dtype);
  const std::size_t state_size = DTypeSize(storage_.state_dtype);
  std::vector<Segment> segments;
  for (const ShardLayout::Slice& slice : layout_.SlicesIn(begin, end)) {
    const TensorSpec& spec = specs_[slice.tensor];
    const std::size_t flat = layout_.offsets[slice.tensor] + slice.first;
    const std::size_t local = LocalIndex(flat);
    Segment s;
    s.param = params_.data() + flat * param_size;
    s.grad = options_.zero == 1 ? shard_grads_.data() + local : grads_.data() + flat;
    for (int k = 0; k < kMaxStates; ++k) {
      if (!states_[k].empty()) s.state[k] = states_[k].data() + local * state_size;
    }
    if (!masters_.empty()) s.master = masters_.data() + local;
    s.numel = slice.numel;
    // Row and column shapes matter to the algorithms that reduce over whole tensors, which only
    // ever see whole tensors; to the others a slice is a flat run of elements.
    if (whole_tensors) {
      s.rows = spec.rows;
      s.cols = spec.cols;
    }
    s.param_dtype = storage_.param_dtype;
    s.grad_dtype = DType::kF32;
    s.state_dtype = storage_.state_dtype;
    s.group = spec.group;
    s.step = steps_[slice.tensor] + 1;
    if (algos::CountsBufferSteps<A>(groups_[spec.group])) s.step = buffer_steps_[slice.tensor] + 1;
    s.grad_scale = grad_scale;
    s.stochastic_rounding = storage_.stochastic_rounding;
    s.rounding_seed = storage_.rounding_seed;
    s.global_offset = flat;
    std::array<float, kMaxScalars>& scratch = scalar_scratch_.emplace_back();
    for (int k = 0; k < kMaxScalars; ++k) {
      scratch[k] = scalars_[slice.tensor * kMaxScalars + k];
      s.scalars[k] = &scratch[k];
    }
    segments.push_back(s);
  }
  return segments;
}

template <class Hyper>
void DistributedOptimizer<Hyper>::ZeroGrad() {
  std::fill(grads_.begin(), grads_.end(), 0.0f);
}

template <class Hyper>
std::vector<typename DistributedOptimizer<Hyper>::StateSlice> DistributedOptimizer<Hyper>::state(
    std::size_t tensor, int slot) const {
  if (slot < 0 || slot >= kMaxStates || states_[slot].empty()) {
    Fail(kFn, "state slot ", slot, " is not allocated");
  }
  const std::size_t offset = layout_.offsets.at(tensor);
  const std::size_t numel = specs_.at(tensor).numel;
  std::vector<StateSlice> slices;
  for (const auto& [begin, end] : LocalRanges()) {
    const std::size_t lo = std::max(begin, offset);
    const std::size_t hi = std::min(end, offset + numel);
    if (lo >= hi) continue;
    StateSlice slice{.first = lo - offset, .values = std::vector<float>(hi - lo)};
    const std::size_t local = LocalIndex(lo);
    for (std::size_t i = 0; i < hi - lo; ++i) {
      slice.values[i] = LoadAsF32(states_[slot].data(), storage_.state_dtype, local + i);
    }
    if (!slices.empty() && slices.back().first + slices.back().values.size() == slice.first) {
      slices.back().values.insert(slices.back().values.end(), slice.values.begin(),
                                  slice.values.end());
    } else {
      slices.push_back(std::move(slice));
    }
  }
  return slices;
}

template <class Hyper>
std::size_t DistributedOptimizer<Hyper>::state_bytes() const {
  std::size_t bytes = masters_.size() * sizeof(float);
  for (const std::vector<std::byte>& state : states_) bytes += state.size();
  return bytes;
}

// Every algorithm: the members above (the step's are instantiated in distributed_step.cc).
#define FOPT_INSTANTIATE(Stem, Alias) template class DistributedOptimizer<Stem##Hyper>;
FUSEDOPT_FOR_EACH_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

}  // namespace fusedopt
