// OptimizerCheckpoint<Hyper>, the friend of Optimizer and DistributedOptimizer that saves and
// restores their private state: declared here, its one-process members defined in
// checkpoint_impl.h (instantiated in checkpoint.cc for every algorithm, and for the test-only ones
// in tests/algos/instances.cc), those of sharded runs in checkpoint_distributed.cc (instantiated
// there for every algorithm).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fusedopt/checkpoint.h"
#include "fusedopt/distributed.h"
#include "fusedopt/optimizer.h"
#include "src/algos/registry.h"
#include "src/checkpoint/checkpoint_meta.h"

namespace fusedopt {

using checkpoint_meta::CopyConverting;
using checkpoint_meta::Json;
using checkpoint_meta::Refuse;

namespace checkpoint_detail {

inline std::vector<std::int64_t> ShapeOf(const Segment& s) {
  const auto numel = static_cast<std::int64_t>(s.numel);
  const auto rows = static_cast<std::int64_t>(s.rows);
  const auto cols = static_cast<std::int64_t>(s.cols);
  if (cols > 0) {  // a factored algorithm's matrices: a batch of rows × cols
    const std::int64_t batch = numel / (rows * cols);
    if (batch > 1) return {batch, rows, cols};
    return {rows, cols};
  }
  if (rows > 0) return {rows, numel / rows};  // channel rows (per-row sums)
  return {numel};
}

// The elements and shape of state slot `slot` of a segment: the param's, or for a factored
// algorithm's reduced slots one value per row ([..., rows, 1]) or per column ([..., 1, cols]).
template <class Descriptor>
std::pair<std::size_t, std::vector<std::int64_t>> StateShape(const Segment& s, int slot) {
  std::vector<std::int64_t> shape = ShapeOf(s);
  if constexpr (algos::Factored<Descriptor>) {
    const algos::Shape kind = Descriptor::kStateShapes[static_cast<std::size_t>(slot)];
    if (kind == algos::Shape::kRows) shape.back() = 1;
    if (kind == algos::Shape::kCols) shape[shape.size() - 2] = 1;
  }
  std::size_t numel = 1;
  for (std::int64_t d : shape) numel *= static_cast<std::size_t>(d);
  return {numel, shape};
}

// Whether segment s keeps state slot `slot` (allocated, named, and for a factored algorithm one of
// the slots its shape uses).
template <class Descriptor>
bool KeepsSlot(const Segment& s, int slot) {
  if (s.state[slot] == nullptr || *Descriptor::kStates[static_cast<std::size_t>(slot)] == '\0') {
    return false;
  }
  if constexpr (algos::Factored<Descriptor>) {
    return (Descriptor::SegmentStates(s) >> slot & 1u) != 0;
  }
  return true;
}

// An algorithm that keeps each tensor's momentum-buffer steps beside its steps (HasBufferSteps).
template <class Hyper>
constexpr bool kMomentumBufferOnFirstStep = algos::HasBufferSteps<algos::DescriptorOf<Hyper>>;

template <class Hyper>
unsigned AllRequiredStates(const std::vector<Hyper>& groups) {
  unsigned slots = 0;
  for (const Hyper& h : groups) slots |= RequiredStates(h);
  return slots;
}

inline std::string OptimizerClass(const char* name) {
  return std::string("fusedopt::Optimizer<") + name + ">";
}

}  // namespace checkpoint_detail

template <class Hyper>
struct OptimizerCheckpoint {
  using Descriptor = algos::DescriptorOf<Hyper>;
  static constexpr int kMasters = DistributedOptimizer<Hyper>::kMasterSlot;
  // What a sharded tensor of a manifest holds, beside a slot's states and kMasters: an 8-bit
  // slot's absmax.
  static constexpr int AbsmaxOf(int slot) { return kMaxStates + slot; }

  static Json Layout(std::span<const Segment> segments, std::size_t num_groups);

  // The core knows each tensor's element count, and the rows and cols of the matrices of per-row
  // and factored algorithms, not its shape: a saved param matches with those and the dtype (a
  // checkpoint that fusedopt.save_checkpoint wrote, with torch's shapes, then loads too).
  static void CheckLayout(const Optimizer<Hyper>& opt, const std::string& path, const Json& saved);

  // What a save reads: an Optimizer's storage, or a DistributedOptimizer's whole model (whose
  // state slots and masters a sharded save writes from each rank's shards).
  struct Source {
    std::span<const Segment> segments;
    std::span<const Hyper> groups;
    std::span<const std::int64_t> steps, buffer_steps;
    AccumulationWindow window;
    std::function<const float*(std::size_t)> accumulator;  // of tensor i, inside a window
    StorageOptions options;
    int world_size = 1;
    std::string optimizer_class = checkpoint_detail::OptimizerClass(Descriptor::kName);
  };

  static Source SourceOf(const Optimizer<Hyper>& opt);

  // What a save writes: the metadata and the tensors in file order. Each tensor of a state slot,
  // of its absmax or of the masters says which (tensor, slot) it is (slot: a state slot,
  // AbsmaxOf(slot) or kMasters): a sharded save writes those in pieces.
  struct Manifest {
    Json meta;
    std::vector<CheckpointTensor> tensors;
    std::vector<std::optional<std::pair<std::size_t, int>>> sharded;  // one per tensor
    std::deque<float> numbers;  // the 0-d tensors' values (a deque: their addresses stay put)
  };

  static Manifest ManifestOf(const Source& src, const LossScaler* scaler,
                             const CheckpointCounters& counters);

  static void Save(const Source& src, const std::string& path, const LossScaler* scaler,
                   const CheckpointCounters& counters);

  static CheckpointCounters Load(Optimizer<Hyper>& opt, const std::string& path,
                                 LossScaler* scaler);

  // The state slots allocated (collective): every rank allocates its slots together (at
  // construction and in Step), but a rank whose shards hold no element keeps none.
  static unsigned AllocatedSlots(DistributedOptimizer<Hyper>& d);

  // The one-process Optimizer `one` (built with d's groups, specs and storage options) made the
  // run d equals: its params, every state slot and master gathered from the ranks' shards
  // (collective), its step counts and scalar states.
  static void Consolidate(DistributedOptimizer<Hyper>& d, Optimizer<Hyper>& one);

  static std::string DistributedClass(const DistributedOptimizer<Hyper>& d);

  // Whether any rank failed (collective).
  static bool AnyRankFailed(DistributedOptimizer<Hyper>& d, bool failed);

  static void SaveDistributed(DistributedOptimizer<Hyper>& d, const std::string& path,
                              const LossScaler* scaler, const CheckpointCounters& counters);

  // Every rank writes its file of the shard set at `path` (fusedopt/checkpoint_file.h): rank 0
  // the metadata and the tensors that are not sharded, each rank the pieces of the state slots and
  // masters that its shard of every bucket holds. Nothing is gathered.
  static void SaveSharded(DistributedOptimizer<Hyper>& d, const std::string& path,
                          const LossScaler* scaler, const CheckpointCounters& counters);

  static CheckpointCounters LoadDistributed(DistributedOptimizer<Hyper>& d, const std::string& path,
                                            LossScaler* scaler);

  // The copy of saved state slot `key` of tensor i (numel elements) into the optimizer, planned
  // once its tensors are checked: float states, or 8-bit codes with their "<key>_absmax", each
  // converted to this tensor's state dtype (quantized or dequantized where one side is 8-bit).
  static std::function<void()> PlanStateCopy(Optimizer<Hyper>& opt,
                                             const checkpoint_meta::TensorTable& table,
                                             const Json& entry, const std::string& where,
                                             const std::string& key, std::size_t i, int slot,
                                             std::size_t numel);

  static int SlotOf(const std::string& key);
  static int ScalarOf(const std::string& key);
};

}  // namespace fusedopt
