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
#include "fusedopt/quantize.h"
#include "src/algos/registry.h"
#include "src/core/step_hooks.h"
#include "src/core/validate.h"
#include "src/distributed/distributed_common.h"
#include "src/optimizer/tensor_specs.h"

namespace fusedopt {

using distributed::kFn;
using distributed::Mix;

namespace {

// A piece of a state slot as f32: float states widened, 8-bit codes decoded with their absmax.
void DecodePiece(const std::byte* data, const float* absmax, std::size_t numel, DType dtype,
                 QuantMap map, float* out) {
  if (dtype == DType::kQ8) {
    Dequantize(reinterpret_cast<const std::uint8_t*>(data), absmax, numel, map, out);
  } else {
    for (std::size_t i = 0; i < numel; ++i) out[i] = LoadAsF32(data, dtype, i);
  }
}

}  // namespace

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
      layout_(LayoutFor(specs_, groups_.size(), comm.size(), storage, options)) {
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
  if (storage_.state_dtype == DType::kQ8 && !algos::QuantizableStates<A>) {
    Fail(kFn, "8-bit states (state_dtype q8) are not for ", A::kName, ": ",
         algos::WhyStatesStayUnquantized<A>());
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
  if (storage_.state_dtype == DType::kQ8) Mix(mine, storage_.min_8bit_size);
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
  // FlatStorage's per-tensor state dtypes and element indices (those of stochastic rounding).
  state_dtypes_.assign(specs_.size(), storage_.state_dtype);
  dense_offsets_.assign(specs_.size(), 0);
  std::size_t dense = 0;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (std::size_t t = 0; t < specs_.size(); ++t) {
      if (specs_[t].group != g) continue;
      dense_offsets_[t] = dense;
      dense += specs_[t].numel;
      if (storage_.state_dtype == DType::kQ8 && specs_[t].numel < storage_.min_8bit_size) {
        state_dtypes_[t] = DType::kF32;
      }
    }
  }
  pieces_ = PiecesOf(comm.rank());
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
ShardLayout DistributedOptimizer<Hyper>::LayoutFor(std::span<const TensorSpec> tensors,
                                                   std::size_t num_groups, int ranks,
                                                   const StorageOptions& storage,
                                                   const DistributedOptions& options) {
  CheckTensorSpecs(kFn, tensors, num_groups);
  const bool q8 = storage.state_dtype == DType::kQ8;
  if (q8 && options.shard_align % kQuantBlock != 0) {
    Fail(kFn, "invalid shard_align: ", options.shard_align, " (8-bit states need a multiple of ",
         kQuantBlock, ", their block size; 0: auto)");
  }
  return ShardLayout(tensors, num_groups, ranks,
                     (options.bucket_bytes + sizeof(float) - 1) / sizeof(float),
                     options.shard_align, q8 ? kQuantBlock : 1);
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
std::vector<std::pair<std::size_t, std::size_t>> DistributedOptimizer<Hyper>::LocalRanges(
    int rank) const {
  if (options_.zero == 0) return {{0, layout_.numel}};
  return ShardRanges(rank);
}

template <class Hyper>
std::vector<std::pair<std::size_t, std::size_t>> DistributedOptimizer<Hyper>::ShardRanges(
    int rank) const {
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (const ShardLayout::Bucket& b : layout_.buckets) {
    const std::size_t begin = b.begin + static_cast<std::size_t>(rank) * b.shard;
    const std::size_t end = std::min(begin + b.shard, layout_.numel);
    if (begin < end) ranges.emplace_back(begin, end);  // not a shard of padding only
  }
  return ranges;
}

template <class Hyper>
typename DistributedOptimizer<Hyper>::StatePieces DistributedOptimizer<Hyper>::PiecesOf(
    int rank) const {
  // As FlatStorage lays a slot out: with 8-bit states each piece starts on 4 bytes, so that the
  // f32 states of small tensors stay aligned.
  const bool q8 = storage_.state_dtype == DType::kQ8;
  StatePieces out;
  for (const auto& [begin, end] : LocalRanges(rank)) {
    for (const ShardLayout::Slice& s : layout_.SlicesIn(begin, end)) {
      if (q8) out.bytes = (out.bytes + 3) / 4 * 4;
      out.pieces.push_back({.tensor = s.tensor,
                            .flat = layout_.offsets[s.tensor] + s.first,
                            .numel = s.numel,
                            .byte = out.bytes,
                            .block = out.blocks});
      const DType dtype = state_dtypes_[s.tensor];
      out.bytes += s.numel * DTypeSize(dtype);
      if (dtype == DType::kQ8) out.blocks += NumQuantBlocks(s.numel);
    }
  }
  return out;
}

template <class Hyper>
const typename DistributedOptimizer<Hyper>::StatePiece& DistributedOptimizer<Hyper>::PieceAt(
    std::size_t flat) const {
  const auto it = std::upper_bound(pieces_.pieces.begin(), pieces_.pieces.end(), flat,
                                   [](std::size_t f, const StatePiece& p) { return f < p.flat; });
  return *(it - 1);
}

template <class Hyper>
std::span<std::byte> DistributedOptimizer<Hyper>::LocalBuffer(int slot, const char* fn) {
  if (slot == kMasterSlot) {
    if (masters_.empty()) Fail(kFn, fn, ": no f32 masters (master_weights is off)");
    return std::as_writable_bytes(std::span<float>(masters_));
  }
  if (slot < 0 || slot >= kMaxStates) Fail(kFn, fn, ": invalid state slot ", slot);
  if (!Allocated(slot)) Fail(kFn, fn, ": state slot ", slot, " is not allocated");
  return states_[slot];
}

template <class Hyper>
typename DistributedOptimizer<Hyper>::GatheredSlot DistributedOptimizer<Hyper>::GatherSlot(
    int slot) {
  GatheredSlot g;
  const int ranks = options_.zero == 1 ? comm_->size() : 1;
  for (int r = 0; r < ranks; ++r) {
    g.ranks.push_back(options_.zero == 1 ? PiecesOf(r) : pieces_);
    g.bytes_stride = std::max(g.bytes_stride, g.ranks.back().bytes);
    g.blocks_stride = std::max(g.blocks_stride, g.ranks.back().blocks);
  }
  const auto mine = static_cast<std::size_t>(options_.zero == 1 ? comm_->rank() : 0);
  g.bytes.resize(g.bytes_stride * g.ranks.size());
  g.absmax.resize(g.blocks_stride * g.ranks.size());
  std::copy(states_[slot].begin(), states_[slot].end(),
            g.bytes.begin() + static_cast<std::ptrdiff_t>(mine * g.bytes_stride));
  std::copy(absmax_[slot].begin(), absmax_[slot].end(),
            g.absmax.begin() + static_cast<std::ptrdiff_t>(mine * g.blocks_stride));
  if (options_.zero == 1) {
    comm_->AllGather(g.bytes.data(), g.bytes_stride, CommType::kByte);
    if (g.blocks_stride > 0) comm_->AllGather(g.absmax.data(), g.blocks_stride, CommType::kF32);
  }
  return g;
}

template <class Hyper>
std::vector<float> DistributedOptimizer<Hyper>::GatherState(int slot) {
  const std::span<const std::byte> local = LocalBuffer(slot, "GatherState");
  std::vector<float> flat(layout_.numel);
  if (slot != kMasterSlot) {
    const QuantMap map = SlotMap(algos::UnsignedMapStates<algos::DescriptorOf<Hyper>>(), slot);
    const GatheredSlot g = GatherSlot(slot);
    for (std::size_t r = 0; r < g.ranks.size(); ++r) {
      for (const StatePiece& p : g.ranks[r].pieces) {
        DecodePiece(g.bytes.data() + r * g.bytes_stride + p.byte,
                    g.absmax.data() + r * g.blocks_stride + p.block, p.numel,
                    state_dtypes_[p.tensor], map, flat.data() + p.flat);
      }
    }
    return flat;
  }
  // The masters: one f32 per element of this rank's ranges, at its LocalIndex.
  const std::size_t count = local_numel_;
  const std::span<const float> mine(reinterpret_cast<const float*>(local.data()), count);
  if (options_.zero == 0) {
    std::copy(mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(layout_.numel),
              flat.begin());
    return flat;
  }
  // Every rank's arrays side by side, then each rank's shards put in their flat places.
  const auto p = static_cast<std::size_t>(comm_->size());
  std::vector<float> all(count * p);
  std::copy(
      mine.begin(), mine.end(),
      all.begin() + static_cast<std::ptrdiff_t>(count * static_cast<std::size_t>(comm_->rank())));
  comm_->AllGather(all.data(), count, CommType::kF32);
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
  if (slot >= 0 && slot < kMaxStates && !Allocated(slot)) AllocateSlot(slot);
  const std::span<std::byte> local = LocalBuffer(slot, "LoadState");
  if (slot == kMasterSlot) {
    for (const auto& [begin, end] : LocalRanges(comm_->rank())) {
      std::copy(flat.begin() + static_cast<std::ptrdiff_t>(begin),
                flat.begin() + static_cast<std::ptrdiff_t>(end),
                masters_.begin() + static_cast<std::ptrdiff_t>(LocalIndex(begin)));
    }
    return;
  }
  const QuantMap map = SlotMap(algos::UnsignedMapStates<algos::DescriptorOf<Hyper>>(), slot);
  for (const StatePiece& p : pieces_.pieces) {
    std::byte* data = local.data() + p.byte;
    const DType dtype = state_dtypes_[p.tensor];
    if (dtype == DType::kQ8) {
      Quantize(flat.data() + p.flat, p.numel, map, reinterpret_cast<std::uint8_t*>(data),
               absmax_[slot].data() + p.block);
    } else {
      for (std::size_t i = 0; i < p.numel; ++i) StoreFromF32(data, dtype, i, flat[p.flat + i]);
    }
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
  unsigned slots = 0;
  for (const Hyper& h : groups_) slots |= RequiredStates(h);
  for (int slot = 0; slot < kMaxStates; ++slot) {
    if ((slots >> slot & 1u) != 0 && !Allocated(slot)) AllocateSlot(slot);
  }
}

template <class Hyper>
void DistributedOptimizer<Hyper>::AllocateSlot(int slot) {
  using A = algos::DescriptorOf<Hyper>;
  allocated_ |= 1u << slot;  // also on a rank whose shards hold only padding
  states_[slot].assign(pieces_.bytes, std::byte{0});
  absmax_[slot].assign(pieces_.blocks, 0.0f);
  // States start at 0 but where the algorithm says otherwise (InitialState); 8-bit pieces start
  // as that value quantized, as Optimizer<>'s.
  for (const StatePiece& p : pieces_.pieces) {
    const float init = A::InitialState(groups_[specs_[p.tensor].group], slot);
    std::byte* data = states_[slot].data() + p.byte;
    const DType dtype = state_dtypes_[p.tensor];
    if (dtype == DType::kQ8) {
      QuantizeFill(init, p.numel, SlotMap(algos::UnsignedMapStates<A>(), slot),
                   reinterpret_cast<std::uint8_t*>(data), absmax_[slot].data() + p.block);
    } else if (init != 0.0f) {
      for (std::size_t i = 0; i < p.numel; ++i) StoreFromF32(data, dtype, i, init);
    }
  }
}

template <class Hyper>
std::vector<Segment> DistributedOptimizer<Hyper>::SegmentsIn(std::size_t begin, std::size_t end,
                                                             float grad_scale, bool whole_tensors) {
  using A = algos::DescriptorOf<Hyper>;
  const std::size_t param_size = DTypeSize(storage_.param_dtype);
  std::vector<Segment> segments;
  for (const ShardLayout::Slice& slice : layout_.SlicesIn(begin, end)) {
    const TensorSpec& spec = specs_[slice.tensor];
    const std::size_t flat = layout_.offsets[slice.tensor] + slice.first;
    const std::size_t local = LocalIndex(flat);
    const StatePiece& piece = PieceAt(flat);
    const DType state_dtype = state_dtypes_[slice.tensor];
    Segment s;
    s.param = params_.data() + flat * param_size;
    s.grad = options_.zero == 1 ? shard_grads_.data() + local : grads_.data() + flat;
    for (int k = 0; k < kMaxStates; ++k) {
      if (!Allocated(k)) continue;
      // A slice starts on a block edge of its tensor (tensor_align): inside its piece, too.
      s.state[k] = states_[k].data() + piece.byte + (flat - piece.flat) * DTypeSize(state_dtype);
      if (state_dtype == DType::kQ8) {
        s.absmax[k] = absmax_[k].data() + piece.block + (flat - piece.flat) / kQuantBlock;
      }
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
    s.state_dtype = state_dtype;
    s.group = spec.group;
    s.step = steps_[slice.tensor] + 1;
    if (algos::CountsBufferSteps<A>(groups_[spec.group])) s.step = buffer_steps_[slice.tensor] + 1;
    s.grad_scale = grad_scale;
    s.stochastic_rounding = storage_.stochastic_rounding;
    s.rounding_seed = storage_.rounding_seed;
    s.global_offset = dense_offsets_[slice.tensor] + slice.first;
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
  if (slot < 0 || slot >= kMaxStates || !Allocated(slot)) {
    Fail(kFn, "state slot ", slot, " is not allocated");
  }
  const std::size_t offset = layout_.offsets.at(tensor);
  const QuantMap map = SlotMap(algos::UnsignedMapStates<algos::DescriptorOf<Hyper>>(), slot);
  std::vector<StateSlice> slices;
  for (const StatePiece& p : pieces_.pieces) {
    if (p.tensor != tensor) continue;
    StateSlice slice{.first = p.flat - offset, .values = std::vector<float>(p.numel)};
    DecodePiece(states_[slot].data() + p.byte, absmax_[slot].data() + p.block, p.numel,
                state_dtypes_[tensor], map, slice.values.data());
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
  for (int slot = 0; slot < kMaxStates; ++slot) {
    bytes += states_[slot].size() + absmax_[slot].size() * sizeof(float);
  }
  return bytes;
}

// Every algorithm: the members above (the step's are instantiated in distributed_step.cc).
#define FOPT_INSTANTIATE(Stem, Alias) template class DistributedOptimizer<Stem##Hyper>;
FUSEDOPT_FOR_EACH_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

}  // namespace fusedopt
