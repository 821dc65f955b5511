// fusedopt/checkpoint.h for DistributedOptimizer: one file gathered from the ranks' shards, or
// one file per rank written without gathering (SaveShardedCheckpoint), and loading them. Every
// collective runs on every rank, also one whose own part failed (AnyRankFailed).

#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fusedopt/checkpoint.h"
#include "fusedopt/quantize.h"
#include "src/checkpoint/optimizer_checkpoint.h"

namespace fusedopt {
namespace {

// Copies `numel` elements of a state slot, from element `first` of a tensor's one-process segment
// `s`, to a rank's arena and absmax arena (`to_segment`: the other way), as they are: float states
// as bytes, 8-bit codes with their absmax (`first` is then on a block edge).
void CopyPiece(const Segment& s, int slot, std::size_t first, std::size_t numel, std::byte* arena,
               float* absmax, bool to_segment) {
  const std::size_t size = DTypeSize(s.state_dtype);
  std::byte* segment = static_cast<std::byte*>(s.state[slot]) + first * size;
  std::memcpy(to_segment ? segment : arena, to_segment ? arena : segment, numel * size);
  if (s.state_dtype != DType::kQ8) return;
  float* blocks = s.absmax[slot] + first / kQuantBlock;
  std::copy_n(to_segment ? absmax : blocks, NumQuantBlocks(numel), to_segment ? blocks : absmax);
}

}  // namespace

template <class Hyper>
unsigned OptimizerCheckpoint<Hyper>::AllocatedSlots(DistributedOptimizer<Hyper>& d) {
  double slots = 0;
  for (int slot = 0; slot < kMaxStates; ++slot) {
    if (d.Allocated(slot)) slots += static_cast<double>(1u << slot);
  }
  d.comm_->AllReduce(&slots, 1, CommType::kF64, ReduceOp::kMax);
  return static_cast<unsigned>(slots);
}

template <class Hyper>
void OptimizerCheckpoint<Hyper>::Consolidate(DistributedOptimizer<Hyper>& d,
                                             Optimizer<Hyper>& one) {
  const unsigned allocated = AllocatedSlots(d);
  one.storage_.AllocateStates(allocated);
  const std::size_t param_size = DTypeSize(d.storage_.param_dtype);
  const std::span<const Segment> segments = one.storage_.segments();
  for (std::size_t t = 0; t < segments.size(); ++t) {
    const Segment& s = segments[t];
    std::memcpy(s.param, d.params_.data() + d.layout_.offsets[t] * param_size,
                s.numel * param_size);
    for (int k = 0; k < kMaxScalars; ++k) *s.scalars[k] = d.scalars_[t * kMaxScalars + k];
  }
  // Every rank's pieces of each slot, copied as they are (8-bit codes and absmax included).
  for (int slot = 0; slot < kMaxStates; ++slot) {
    if ((allocated >> slot & 1u) == 0) continue;
    auto g = d.GatherSlot(slot);
    for (std::size_t r = 0; r < g.ranks.size(); ++r) {
      for (const auto& p : g.ranks[r].pieces) {
        CopyPiece(segments[p.tensor], slot, p.flat - d.layout_.offsets[p.tensor], p.numel,
                  g.bytes.data() + r * g.bytes_stride + p.byte,
                  g.absmax.data() + r * g.blocks_stride + p.block, true);
      }
    }
  }
  if (d.storage_.master_weights) {
    const std::vector<float> flat = d.GatherState(DistributedOptimizer<Hyper>::kMasterSlot);
    for (std::size_t t = 0; t < segments.size(); ++t) {
      std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(d.layout_.offsets[t]),
                  segments[t].numel, segments[t].master);
    }
  }
  one.steps_ = d.steps_;
  one.buffer_steps_ = d.buffer_steps_;
}

template <class Hyper>
std::string OptimizerCheckpoint<Hyper>::DistributedClass(const DistributedOptimizer<Hyper>& d) {
  return std::string("fusedopt::DistributedOptimizer<") + Descriptor::kName +
         "> zero=" + std::to_string(d.options_.zero);
}

template <class Hyper>
bool OptimizerCheckpoint<Hyper>::AnyRankFailed(DistributedOptimizer<Hyper>& d, bool failed) {
  double flag = failed ? 1.0 : 0.0;
  d.comm_->AllReduce(&flag, 1, CommType::kF64, ReduceOp::kMax);
  return flag != 0.0;
}

template <class Hyper>
void OptimizerCheckpoint<Hyper>::SaveDistributed(DistributedOptimizer<Hyper>& d,
                                                 const std::string& path, const LossScaler* scaler,
                                                 const CheckpointCounters& counters) {
  Optimizer<Hyper> one(d.groups_, d.specs_, d.storage_, *d.runtime_);
  Consolidate(d, one);
  std::exception_ptr error;
  if (d.comm_->rank() == 0) {
    try {
      Source src = SourceOf(one);
      src.world_size = d.comm_->size();
      src.optimizer_class = DistributedClass(d);
      Save(src, path, scaler, counters);
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (AnyRankFailed(d, error != nullptr)) {
    if (error) std::rethrow_exception(error);
    throw std::runtime_error("SaveCheckpoint: rank 0 could not write " + path);
  }
}

template <class Hyper>
void OptimizerCheckpoint<Hyper>::SaveSharded(DistributedOptimizer<Hyper>& d,
                                             const std::string& path, const LossScaler* scaler,
                                             const CheckpointCounters& counters) {
  const unsigned slots = AllocatedSlots(d);
  // The save's id, rank 0's draw (53 bits: exact in the f64 every rank receives).
  double id = 0;
  if (d.comm_->rank() == 0) {
    std::random_device random;
    id = static_cast<double>((std::uint64_t{random()} << 32 | random()) >> 11);
  }
  d.comm_->AllReduce(&id, 1, CommType::kF64, ReduceOp::kMax);
  const int rank = d.comm_->rank(), ranks = d.comm_->size();
  const Json record = {
      {"set", std::to_string(static_cast<std::uint64_t>(id))}, {"rank", rank}, {"ranks", ranks}};
  std::exception_ptr error;
  try {
    // The whole model's segments: params and scalar states as every rank holds them; the state
    // slots and masters are marked present (never read through them: this rank's shards are
    // written below).
    static const std::byte kSharded{};
    void* const marker = const_cast<std::byte*>(&kSharded);
    std::vector<Segment> segments(d.specs_.size());
    const std::size_t param_size = DTypeSize(d.storage_.param_dtype);
    for (std::size_t t = 0; t < segments.size(); ++t) {
      Segment& s = segments[t];
      const TensorSpec& spec = d.specs_[t];
      s.param = d.params_.data() + d.layout_.offsets[t] * param_size;
      s.numel = spec.numel, s.rows = spec.rows, s.cols = spec.cols, s.group = spec.group;
      s.param_dtype = d.storage_.param_dtype, s.state_dtype = d.state_dtypes_[t];
      for (int slot = 0; slot < kMaxStates; ++slot) {
        if ((slots >> slot & 1u) == 0) continue;
        s.state[slot] = marker;
        if (s.state_dtype == DType::kQ8) s.absmax[slot] = static_cast<float*>(marker);
      }
      if (d.storage_.master_weights) s.master = static_cast<float*>(marker);
      for (int k = 0; k < kMaxScalars; ++k) s.scalars[k] = &d.scalars_[t * kMaxScalars + k];
    }
    Source src{segments, d.groups_, d.steps_, d.buffer_steps_, {}, {}, d.storage_};
    src.world_size = ranks;
    src.optimizer_class = DistributedClass(d);
    const Manifest m = ManifestOf(src, scaler, counters);

    // This rank's shard of every bucket, at zero = 0 too (where it keeps everything).
    std::vector<ShardLayout::Slice> slices;
    for (const auto& [begin, end] : d.ShardRanges(rank)) {
      const std::vector<ShardLayout::Slice> in = d.layout_.SlicesIn(begin, end);
      slices.insert(slices.end(), in.begin(), in.end());
    }
    Json listed = Json::array();
    std::vector<CheckpointTensor> mine;
    for (std::size_t k = 0; k < m.tensors.size(); ++k) {
      const CheckpointTensor& t = m.tensors[k];
      listed.push_back({t.name, t.dtype, t.shape});
      if (!m.sharded[k].has_value()) {
        if (rank == 0) mine.push_back(t);
        continue;
      }
      const auto [tensor, what] = *m.sharded[k];
      for (const ShardLayout::Slice& slice : slices) {
        if (slice.tensor != tensor) continue;
        const std::size_t flat = d.layout_.offsets[tensor] + slice.first;
        const auto& piece = d.PieceAt(flat);
        // The slice's first element (or block) in the tensor, its count and its bytes. A slice
        // starts on a block edge of its tensor (tensor_align): its absmax are whole blocks.
        std::size_t at = slice.first, count = slice.numel, size = sizeof(float);
        const std::byte* data = nullptr;
        if (what == kMasters) {
          data = reinterpret_cast<const std::byte*>(d.masters_.data() + d.LocalIndex(flat));
        } else if (what >= kMaxStates) {
          at = slice.first / kQuantBlock;
          count = NumQuantBlocks(slice.numel);
          data =
              reinterpret_cast<const std::byte*>(d.absmax_[what - kMaxStates].data() + piece.block +
                                                 (flat - piece.flat) / kQuantBlock);
        } else {
          size = DTypeSize(d.state_dtypes_[tensor]);
          data = d.states_[what].data() + piece.byte + (flat - piece.flat) * size;
        }
        mine.push_back({t.name + "@" + std::to_string(at),
                        t.dtype,
                        {static_cast<std::int64_t>(count)},
                        {data, count * size}});
      }
    }
    Json meta = rank == 0 ? m.meta
                          : Json{{"fusedopt_checkpoint", checkpoint_meta::kFormat},
                                 {"algorithm", Descriptor::kName},
                                 {"optimizer_class", src.optimizer_class},
                                 {"world_size", ranks}};
    meta["shard"] = record;
    if (rank == 0) meta["shard"]["tensors"] = listed;
    WriteCheckpointFile(CheckpointShardPath(path, rank, ranks), meta.dump(), mine);
  } catch (...) {
    error = std::current_exception();
  }
  if (AnyRankFailed(d, error != nullptr)) {
    // No torn set: the files written are removed (a failed write left none).
    std::error_code ignored;
    std::filesystem::remove(CheckpointShardPath(path, rank, ranks), ignored);
    if (error) std::rethrow_exception(error);
    throw std::runtime_error("SaveShardedCheckpoint: another rank could not write its file of " +
                             path);
  }
  // The set is whole: what else lies at `path` (a file, another world size's set) is older.
  if (rank == 0) RemoveCheckpointsAt(path, ranks);
}

template <class Hyper>
CheckpointCounters OptimizerCheckpoint<Hyper>::LoadDistributed(DistributedOptimizer<Hyper>& d,
                                                               const std::string& path,
                                                               LossScaler* scaler) {
  // Every rank loads the file into the one-process Optimizer of its layout (which checks it
  // all), the ranks agree that all of them could, then each keeps its shards.
  Optimizer<Hyper> one(d.groups_, d.specs_, d.storage_, *d.runtime_);
  std::optional<LossScaler> restored;
  if (scaler != nullptr) restored = *scaler;
  CheckpointCounters counters;
  std::exception_ptr error;
  try {
    counters = LoadCheckpoint(one, path, restored ? &*restored : nullptr);
  } catch (...) {
    error = std::current_exception();
  }
  if (AnyRankFailed(d, error != nullptr)) {
    if (error) std::rethrow_exception(error);
    Refuse(path, "another rank could not load it");
  }
  d.groups_ = one.groups_;
  const std::size_t param_size = DTypeSize(d.storage_.param_dtype);
  const std::span<const Segment> segments = one.storage_.segments();
  for (std::size_t t = 0; t < segments.size(); ++t) {
    const Segment& s = segments[t];
    std::memcpy(d.params_.data() + d.layout_.offsets[t] * param_size, s.param,
                s.numel * param_size);
    for (int k = 0; k < kMaxScalars; ++k) d.scalars_[t * kMaxScalars + k] = *s.scalars[k];
  }
  // Each state slot's pieces this rank keeps, copied as they are (8-bit codes and absmax too).
  for (int slot = 0; slot < kMaxStates; ++slot) {
    if (segments.empty() || segments[0].state[slot] == nullptr) continue;
    if (!d.Allocated(slot)) d.AllocateSlot(slot);
    for (const auto& p : d.pieces_.pieces) {
      CopyPiece(segments[p.tensor], slot, p.flat - d.layout_.offsets[p.tensor], p.numel,
                d.states_[slot].data() + p.byte, d.absmax_[slot].data() + p.block, false);
    }
  }
  if (d.storage_.master_weights) {  // a tensor not stepped yet is seeded at its first step
    std::vector<float> masters(d.layout_.numel);
    for (std::size_t t = 0; t < segments.size(); ++t) {
      std::copy_n(segments[t].master, segments[t].numel,
                  masters.begin() + static_cast<std::ptrdiff_t>(d.layout_.offsets[t]));
    }
    d.LoadState(DistributedOptimizer<Hyper>::kMasterSlot, masters);
  }
  d.steps_ = one.steps_;
  d.buffer_steps_ = one.buffer_steps_;
  if (scaler != nullptr) *scaler = *restored;
  return counters;
}

template <class Hyper>
void SaveCheckpoint(DistributedOptimizer<Hyper>& optimizer, const std::string& path,
                    const LossScaler* scaler, const CheckpointCounters& counters) {
  OptimizerCheckpoint<Hyper>::SaveDistributed(optimizer, path, scaler, counters);
}

template <class Hyper>
void SaveShardedCheckpoint(DistributedOptimizer<Hyper>& optimizer, const std::string& path,
                           const LossScaler* scaler, const CheckpointCounters& counters) {
  OptimizerCheckpoint<Hyper>::SaveSharded(optimizer, path, scaler, counters);
}

template <class Hyper>
CheckpointCounters LoadCheckpoint(DistributedOptimizer<Hyper>& optimizer, const std::string& path,
                                  LossScaler* scaler) {
  return OptimizerCheckpoint<Hyper>::LoadDistributed(optimizer, path, scaler);
}

// Every algorithm (the members they call on the one-process side are instantiated in
// checkpoint.cc).
#define FOPT_INSTANTIATE(Stem, Alias)                                                         \
  template void SaveCheckpoint(DistributedOptimizer<Stem##Hyper>&, const std::string&,        \
                               const LossScaler*, const CheckpointCounters&);                 \
  template void SaveShardedCheckpoint(DistributedOptimizer<Stem##Hyper>&, const std::string&, \
                                      const LossScaler*, const CheckpointCounters&);          \
  template CheckpointCounters LoadCheckpoint(DistributedOptimizer<Stem##Hyper>&,              \
                                             const std::string&, LossScaler*);
FUSEDOPT_FOR_EACH_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

}  // namespace fusedopt
