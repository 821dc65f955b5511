// DistributedOptimizer and its ShardLayout (include/fusedopt/distributed.h): the layout, the
// data-parallel and ZeRO-1 steps over a Communicator, and what checkpoints of sharded runs need.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>

#include "fusedopt/convert.h"
#include "fusedopt/distributed.h"
#include "src/algos/registry.h"
#include "src/core/step_hooks.h"
#include "src/core/tensor_specs.h"
#include "src/core/validate.h"

namespace fusedopt {
namespace {

constexpr const char* kFn = "DistributedOptimizer";
// zero = 0 with `pipeline`: a bucket is updated in pieces of this many elements, the next bucket's
// request polled between them (a few hundred microseconds of work each).
constexpr std::size_t kPieceElements = 8 * kGrainElements;

std::size_t RoundUp(std::size_t n, std::size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

void Mix(std::uint64_t& hash, std::uint64_t value) {
  for (int byte = 0; byte < 8; ++byte) {
    hash ^= (value >> (8 * byte)) & 0xff;
    hash *= 0x100000001b3ull;  // FNV-1a's 64-bit prime
  }
}

// An algorithm whose update reads sums over whole tensors (which bucket edges cut).
template <class A>
constexpr bool kReducesTensors = algos::TwoPhase<A> || algos::Factored<A>;

}  // namespace

ShardLayout::ShardLayout(std::span<const TensorSpec> tensors, std::size_t num_groups, int ranks_,
                         std::size_t bucket_elements, std::size_t align_)
    : ranks(ranks_), specs_(tensors.begin(), tensors.end()) {
  if (ranks < 1) Fail(kFn, "invalid world size: ", ranks, " (must be >= 1)");
  if (bucket_elements == 0) Fail(kFn, "invalid bucket size: 0 (must be > 0)");
  if (align_ % 64 != 0) Fail(kFn, "invalid shard_align: ", align_, " (a multiple of 64; 0: auto)");
  // Group by group, as FlatStorage: the same element indices as a one-process Optimizer.
  offsets.resize(tensors.size());
  for (std::size_t g = 0; g < num_groups; ++g) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].group != g) continue;
      offsets[i] = numel;
      numel += tensors[i].numel;
    }
  }
  const auto p = static_cast<std::size_t>(ranks);
  align = align_ != 0 ? align_ : 8 * p * kGrainElements <= numel ? kGrainElements : 256;
  const std::size_t full_shard = RoundUp((bucket_elements + p - 1) / p, align);
  while (padded < numel) {
    // The last bucket is only as large as what is left, rounded up per rank.
    const std::size_t left = RoundUp((numel - padded + p - 1) / p, align);
    const Bucket b{.begin = padded, .shard = std::min(full_shard, left), .local = shard_total};
    buckets.push_back(b);
    padded += p * b.shard;
    shard_total += b.shard;
  }
}

std::vector<ShardLayout::Slice> ShardLayout::SlicesIn(std::size_t begin, std::size_t end) const {
  std::vector<Slice> slices;
  for (std::size_t t = 0; t < specs_.size(); ++t) {
    const std::size_t lo = std::max(begin, offsets[t]);
    const std::size_t hi = std::min(end, offsets[t] + specs_[t].numel);
    if (lo < hi) slices.push_back({.tensor = t, .first = lo - offsets[t], .numel = hi - lo});
  }
  std::sort(slices.begin(), slices.end(), [&](const Slice& a, const Slice& b) {
    return offsets[a.tensor] + a.first < offsets[b.tensor] + b.first;
  });
  return slices;
}

std::uint64_t ShardLayout::Hash() const {
  std::uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a's offset basis
  Mix(hash, static_cast<std::uint64_t>(ranks));
  Mix(hash, align);
  Mix(hash, specs_.size());
  for (const TensorSpec& s : specs_) {
    Mix(hash, s.numel);
    Mix(hash, s.group);
    Mix(hash, s.rows);
    Mix(hash, s.cols);
  }
  for (const Bucket& b : buckets) Mix(hash, b.shard);
  return hash;
}

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
    // States start at 0 but where the algorithm says otherwise (Adagrad's initial accumulator);
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
    if constexpr (std::is_same_v<Hyper, SgdHyper> || std::is_same_v<Hyper, LarsHyper>) {
      if (groups_[spec.group].momentum != 0.0) s.step = buffer_steps_[slice.tensor] + 1;
    }
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

template <class Hyper>
StepResult DistributedOptimizer<Hyper>::Step(const StepOptions& options) {
  if (!(options.max_grad_norm >= 0.0)) {
    Fail(kFn, "invalid max_grad_norm: ", options.max_grad_norm,
         " (must be >= 0; Inf: no clipping)");
  }
  FusedStep(std::span<const Hyper>(groups_), {}, *runtime_);  // the live hyper-parameters
  AllocateStates();
  if (!std::exchange(broadcast_done_, true)) {
    comm_->Broadcast(params_.data(), params_.size(), CommType::kByte, 0);
  }
  // Masters start from the params (now rank 0's) before their tensor's first update.
  if (!masters_.empty()) {
    for (const auto& [begin, end] : LocalRanges()) {
      for (const ShardLayout::Slice& s : layout_.SlicesIn(begin, end)) {
        if (steps_[s.tensor] != 0) continue;
        const std::size_t flat = layout_.offsets[s.tensor] + s.first;
        const std::size_t local = LocalIndex(flat);
        for (std::size_t i = 0; i < s.numel; ++i) {
          masters_[local + i] = LoadAsF32(params_.data(), storage_.param_dtype, flat + i);
        }
      }
    }
  }
  const float inv_scale = options.scaler != nullptr ? options.scaler->inv_scale() : 1.0f;
  // The mean over ranks folded into the step's gradient multiplier, rounded once.
  const float grad_scale =
      options_.average ? static_cast<float>(double{inv_scale} / comm_->size()) : inv_scale;
  scalar_scratch_.clear();
  spans_.clear();
  exposed_ms_ = 0.0;
  const StepResult result =
      options_.zero == 1 ? StepSharded(grad_scale, options) : StepDataParallel(grad_scale, options);
  if (options.scaler != nullptr) options.scaler->Update(!result.stepped);
  if (!result.stepped) return result;

  // Each tensor's scalar states advance once per step, whichever pieces of it this rank updated:
  // one more call, with no elements, over every tensor.
  if constexpr (algos::HasScalarStates<algos::DescriptorOf<Hyper>>) {
    std::vector<Segment> all(specs_.size());
    for (std::size_t t = 0; t < specs_.size(); ++t) {
      Segment& s = all[t];
      s.param_dtype = storage_.param_dtype;
      s.state_dtype = storage_.state_dtype;
      s.group = specs_[t].group;
      s.step = steps_[t] + 1;
      for (int k = 0; k < kMaxScalars; ++k) s.scalars[k] = &scalars_[t * kMaxScalars + k];
    }
    FusedStep(std::span<const Hyper>(groups_), std::span<const Segment>(all), *runtime_);
  }
  for (std::size_t t = 0; t < specs_.size(); ++t) {
    ++steps_[t];
    if constexpr (std::is_same_v<Hyper, SgdHyper> || std::is_same_v<Hyper, LarsHyper>) {
      if (groups_[specs_[t].group].momentum != 0.0) ++buffer_steps_[t];
    }
  }
  return result;
}

template <class Hyper>
template <class Start>
typename DistributedOptimizer<Hyper>::Request DistributedOptimizer<Hyper>::Started(
    const Start& start, const char* kind, std::size_t bucket) {
  // A transport may run a collective to completion inside its start (MpiCommunicator's
  // reduce-scatter): that time is exposed too.
  const auto begin = std::chrono::steady_clock::now();
  std::unique_ptr<CommRequest> request = start();
  const auto end = std::chrono::steady_clock::now();
  exposed_ms_ += std::chrono::duration<double, std::milli>(end - begin).count();
  spans_.push_back({.kind = kind, .bucket = bucket, .begin = begin, .end = end});
  return {std::move(request), spans_.size() - 1};
}

template <class Hyper>
void DistributedOptimizer<Hyper>::Wait(Request& request) {
  const auto begin = std::chrono::steady_clock::now();
  request.first->Wait();
  const auto end = std::chrono::steady_clock::now();
  exposed_ms_ += std::chrono::duration<double, std::milli>(end - begin).count();
  spans_[request.second].end = end;
}

template <class Hyper>
StepResult DistributedOptimizer<Hyper>::StepDataParallel(float grad_scale,
                                                         const StepOptions& options) {
  using A = algos::DescriptorOf<Hyper>;
  const std::size_t p = static_cast<std::size_t>(comm_->size());
  std::vector<Request> requests;
  for (std::size_t k = 0; k < layout_.buckets.size(); ++k) {
    const ShardLayout::Bucket& b = layout_.buckets[k];
    requests.push_back(Started(
        [&] {
          return comm_->StartAllReduce(grads_.data() + b.begin, p * b.shard, CommType::kF32,
                                       ReduceOp::kSum);
        },
        "all_reduce", k));
  }
  const bool pre_pass = options.scaler != nullptr || std::isfinite(options.max_grad_norm);
  const std::span<const Hyper> groups(groups_);
  StepResult result;
  if (pre_pass || !options_.pipeline || kReducesTensors<A>) {
    // Everything lands before anything is updated: the norm and the overflow flag are global, and
    // whole-tensor reductions need whole tensors. Each bucket's norm partials are taken as it
    // lands (with whole-chunk shards, buckets start on the chunk grid: the one-process chunks).
    const PrePassOptions pre{.max_norm = options.max_grad_norm,
                             .norm_type = options.norm_type,
                             .clip_rule = options.clip_rule};
    std::vector<NormPartial> partials;
    for (std::size_t k = 0; k < requests.size(); ++k) {
      Wait(requests[k]);
      if (!pre_pass) continue;
      const ShardLayout::Bucket& b = layout_.buckets[k];
      const std::vector<Segment> bucket =
          SegmentsIn(b.begin, b.begin + p * b.shard, grad_scale, false);
      const std::vector<NormPartial> part = GradPrePassPartials(bucket, pre, *runtime_);
      partials.insert(partials.end(), part.begin(), part.end());
    }
    std::vector<Segment> segments = SegmentsIn(0, layout_.numel, grad_scale, true);
    if (pre_pass) {
      const PrePassResult r = FinishGradPrePass(partials, segments, pre);
      result.grad_norm = r.norm;
      result.clip_coef = r.clip_coef;
      result.found_inf = r.non_finite;
      if (r.non_finite) return result;
    }
    FusedStep(groups, std::span<const Segment>(segments), *runtime_);
  } else {
    // Pipelined: bucket k is updated while bucket k+1 is reduced.
    for (std::size_t k = 0; k < requests.size(); ++k) {
      Wait(requests[k]);
      const ShardLayout::Bucket& b = layout_.buckets[k];
      const std::size_t end = std::min(b.begin + p * b.shard, layout_.numel);
      for (std::size_t lo = b.begin; lo < end; lo += kPieceElements) {
        const std::vector<Segment> piece =
            SegmentsIn(lo, std::min(lo + kPieceElements, end), grad_scale, false);
        FusedStep(groups, std::span<const Segment>(piece), *runtime_);
        if (k + 1 < requests.size()) requests[k + 1].first->Test();
      }
    }
  }
  result.stepped = true;
  return result;
}

template <class Hyper>
StepResult DistributedOptimizer<Hyper>::StepSharded(float grad_scale, const StepOptions& options) {
  const std::size_t p = static_cast<std::size_t>(comm_->size());
  const std::size_t rank = static_cast<std::size_t>(comm_->rank());
  std::vector<Request> reductions;
  for (std::size_t k = 0; k < layout_.buckets.size(); ++k) {
    const ShardLayout::Bucket& b = layout_.buckets[k];
    reductions.push_back(Started(
        [&] {
          return comm_->StartReduceScatter(grads_.data() + b.begin, shard_grads_.data() + b.local,
                                           b.shard, CommType::kF32);
        },
        "reduce_scatter", k));
  }
  // This rank's shard of bucket k: the segments of its pieces.
  const auto shard_segments = [&](const ShardLayout::Bucket& b) {
    const std::size_t begin = b.begin + rank * b.shard;
    return SegmentsIn(begin, begin + b.shard, grad_scale, false);
  };
  const std::span<const Hyper> groups(groups_);
  StepResult result;
  const bool pre_pass = options.scaler != nullptr || std::isfinite(options.max_grad_norm);
  std::vector<std::vector<Segment>> shards;
  if (pre_pass) {
    // Every rank's per-chunk partials, gathered and added in the order of the whole flat range
    // (bucket, rank, chunk): the same norm and overflow flag on every rank (and, with shards of
    // whole chunks, the same bits as one process).
    const PrePassOptions pre{.max_norm = options.max_grad_norm,
                             .norm_type = options.norm_type,
                             .clip_rule = options.clip_rule};
    std::vector<std::size_t> first_chunk;  // of each bucket's shard, in a rank's partials
    std::size_t chunks = 0;                // per rank
    for (const ShardLayout::Bucket& b : layout_.buckets) {
      first_chunk.push_back(chunks);
      chunks += (b.shard + kGrainElements - 1) / kGrainElements;
    }
    std::vector<NormPartial> gathered(p * chunks);
    for (std::size_t k = 0; k < reductions.size(); ++k) {
      Wait(reductions[k]);
      shards.push_back(shard_segments(layout_.buckets[k]));
      const std::vector<NormPartial> part = GradPrePassPartials(shards.back(), pre, *runtime_);
      // A shard's chunks past the end of the model (padding) add zeros.
      std::copy(part.begin(), part.end(), gathered.begin() + rank * chunks + first_chunk[k]);
    }
    comm_->AllGather(gathered.data(), chunks * sizeof(NormPartial), CommType::kByte);
    std::vector<NormPartial> ordered;
    ordered.reserve(gathered.size());
    for (std::size_t k = 0; k < layout_.buckets.size(); ++k) {
      const std::size_t end = k + 1 < first_chunk.size() ? first_chunk[k + 1] : chunks;
      for (std::size_t r = 0; r < p; ++r) {
        const auto first = gathered.begin() + r * chunks;
        ordered.insert(ordered.end(), first + first_chunk[k], first + end);
      }
    }
    std::vector<Segment> all;
    for (const std::vector<Segment>& s : shards) all.insert(all.end(), s.begin(), s.end());
    const PrePassResult r = FinishGradPrePass(ordered, all, pre);
    result.grad_norm = r.norm;
    result.clip_coef = r.clip_coef;
    result.found_inf = r.non_finite;
    if (r.non_finite) return result;
    for (std::size_t k = 0, i = 0; k < shards.size(); ++k) {
      for (Segment& s : shards[k]) s.grad_scale = all[i++].grad_scale;
    }
  }
  if (!pre_pass) shards.resize(layout_.buckets.size());
  const auto land = [&](std::size_t k) {  // bucket k's reduced gradients, and its segments
    if (pre_pass) return;
    Wait(reductions[k]);
    shards[k] = shard_segments(layout_.buckets[k]);
  };
  if constexpr (kSegmentSums<algos::DescriptorOf<Hyper>>) {
    // LAMB's and LARS's norms are over whole tensors: every shard of this rank in one call, in
    // which each slice's sums become its tensor's (WholeTensorSums).
    std::vector<Segment> mine;
    for (std::size_t k = 0; k < layout_.buckets.size(); ++k) {
      land(k);
      mine.insert(mine.end(), shards[k].begin(), shards[k].end());
    }
    FusedStepWithSums(groups, std::span<const Segment>(mine), *runtime_,
                      [&](std::span<double> sums, std::size_t k) { WholeTensorSums(sums, k); });
  }
  // Update each shard as its gradients land, then gather it into every rank's params.
  const std::size_t param_size = DTypeSize(storage_.param_dtype);
  std::vector<Request> gathers;
  for (std::size_t k = 0; k < layout_.buckets.size(); ++k) {
    const ShardLayout::Bucket& b = layout_.buckets[k];
    if constexpr (!kSegmentSums<algos::DescriptorOf<Hyper>>) {
      land(k);
      FusedStep(groups, std::span<const Segment>(shards[k]), *runtime_);
    }
    gathers.push_back(Started(
        [&] {
          return comm_->StartAllGather(params_.data() + b.begin * param_size, b.shard * param_size,
                                       CommType::kByte);
        },
        "all_gather", k));
    // Drive the gathers already started while the next shard is updated.
    for (Request& g : gathers) g.first->Test();
  }
  for (Request& g : gathers) Wait(g);
  result.stepped = true;
  return result;
}

template <class Hyper>
void DistributedOptimizer<Hyper>::WholeTensorSums(std::span<double> sums, std::size_t k) {
  // This rank's slice sums by (bucket, tensor), every rank's gathered, and each tensor's added in
  // the order of the flat range (bucket, then rank): the one-process sums, bit for bit with
  // shards of whole chunks (0 + x is x, and a slice's sum is the fold of its chunks).
  const std::size_t p = static_cast<std::size_t>(comm_->size());
  const std::size_t rank = static_cast<std::size_t>(comm_->rank());
  const std::size_t tensors = specs_.size();
  const std::size_t per_rank = layout_.buckets.size() * tensors * k;
  std::vector<double> partial(p * per_rank, 0.0);
  std::vector<std::size_t> tensor_of;  // of each segment: the shards' slices, bucket by bucket
  for (std::size_t b = 0; b < layout_.buckets.size(); ++b) {
    const std::size_t begin = layout_.buckets[b].begin + rank * layout_.buckets[b].shard;
    for (const ShardLayout::Slice& slice :
         layout_.SlicesIn(begin, begin + layout_.buckets[b].shard)) {
      const std::size_t at = rank * per_rank + (b * tensors + slice.tensor) * k;
      std::copy_n(sums.begin() + static_cast<std::ptrdiff_t>(tensor_of.size() * k), k,
                  partial.begin() + static_cast<std::ptrdiff_t>(at));
      tensor_of.push_back(slice.tensor);
    }
  }
  comm_->AllGather(partial.data(), per_rank, CommType::kF64);
  std::vector<double> totals(tensors * k, 0.0);
  for (std::size_t b = 0; b < layout_.buckets.size(); ++b) {
    for (std::size_t r = 0; r < p; ++r) {
      for (std::size_t i = 0; i < tensors * k; ++i) {
        totals[i] += partial[r * per_rank + b * tensors * k + i];
      }
    }
  }
  for (std::size_t i = 0; i < tensor_of.size(); ++i) {
    std::copy_n(totals.begin() + static_cast<std::ptrdiff_t>(tensor_of[i] * k), k,
                sums.begin() + static_cast<std::ptrdiff_t>(i * k));
  }
}

#define FOPT_INSTANTIATE(A) template class DistributedOptimizer<algos::A::Hyper>;
FOPT_FOR_EACH_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

}  // namespace fusedopt
