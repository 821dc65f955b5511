// Data-parallel training with the fused step: every rank holds the whole model, computes the
// gradients of its slice of the batch, and DistributedOptimizer::Step() reduces them across ranks
// (a Communicator: MPI, or one process) and updates, the optimizer folded into the reduction.
//
//   fusedopt::mpi::MpiCommunicator comm;                       // src/mpi (or LocalCommunicator)
//   fusedopt::DistributedOptimizer<fusedopt::AdamWHyper> opt(
//       {{.lr = 1e-3}}, tensors, {}, comm, {.zero = 1});
//   ... fill opt.params<float>(i) (rank 0's values win: the first Step() broadcasts them) ...
//   ... per iteration: write this rank's gradients into opt.grads(i), then
//   opt.Step({.max_grad_norm = 1.0});
//
// Layout. Tensors lie group by group in one flat range, as FlatStorage lays them out (the same
// element indices, so stochastic-rounding noise matches a one-process Optimizer at any world
// size), padded at the end and cut into buckets of about bucket_bytes of gradient. Each bucket is
// P shards of equal size: rank r owns shard r of every bucket. With shards of whole chunks
// (kGrainElements, the default unless the model is small for its world size) shard edges fall on
// the step's chunk grid, and the gradient norm, whose per-chunk partials are gathered and added in
// chunk order, is the same bits as a one-process Optimizer's at any world size.
//
// zero = 0 (data parallel): each bucket's gradients are all-reduced in place (started together,
// in bucket order); with `pipeline`, bucket k is updated as soon as its sums land, while later
// buckets are still in flight (between pieces of the update the next request is polled: OpenMPI
// progresses a non-blocking collective only inside MPI calls). A loss scaler or clipping (a global
// flag and norm) and the algorithms that reduce over whole tensors wait for every bucket first.
// Every rank updates every param.
//
// zero = 1 (ZeRO-1): each bucket's gradients are reduce-scattered, each rank updates its shard
// only, with optimizer states and f32 masters allocated at shard size, and the updated params are
// all-gathered (in the param dtype) bucket by bucket. A shard's update is bit-identical to the same
// slice of the unsharded update for the element-wise algorithms; LAMB's and LARS's per-tensor
// norms are summed over every rank's slices of the tensor (in the order of the flat range: the
// one-process sums). AdamP (sums per row), BertAdam (across tensors) and Adafactor (factored) run
// with zero = 0.
//
// 8-bit states (StorageOptions::state_dtype kQ8, as Optimizer<> keeps them): every tensor starts on
// a block edge of the flat range (ShardLayout's tensor_align kQuantBlock), so no block straddles a
// shard edge and each rank's blocks are the one-process Optimizer's; a shard's update is then the
// same bits as the slice of the unsharded one, as for float states. shard_align must be a
// multiple of kQuantBlock. The clipping norm's chunks then follow that flat range, gaps included:
// the same bits at any world size, the one-process norm to within the rounding of its sum.
//
// Global agreement. Gradients are averaged (summed, then scaled by 1/P inside the step, as DDP's
// mean; exact for P a power of two). With a LossScaler or clipping, the pre-pass's per-chunk
// partials of every shard are gathered, so every rank sees the same overflow flag and the same
// norm: one rank's Inf makes every rank skip (params, states, step counts bit-identical), and the
// norm is the one a single process computes over the averaged gradients, whatever P is.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "fusedopt/communicator.h"
#include "fusedopt/optimizer.h"

namespace fusedopt {

struct DistributedOptions {
  int zero = 0;  // 0: data parallel; 1: ZeRO-1 (state sharded)
  // Gradient bytes per bucket (DDP's bucket_cap_mb = 25), rounded up to whole shards; > 0.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  // zero = 0: update bucket k while bucket k+1 is in flight. false: all-reduce every bucket, then
  // one update (the baseline `fusedopt bench-dist` compares against).
  bool pipeline = true;
  // Divide the summed gradients by the world size (DDP); false: keep the sums.
  bool average = true;
  // Elements each rank's shard of a bucket is rounded up to (a multiple of 64). kGrainElements
  // puts shard edges on the step's chunk grid, which keeps the gradient norm the same bits at any
  // world size; 0 (auto) takes it unless that padding could exceed 1/8 of the model (P·32768
  // elements per bucket against a small model on many ranks), and 256 then.
  std::size_t shard_align = 0;
};

// Where the tensors and buckets lie, for P ranks (a pure function of the specs, the world size and
// the bucket size: every rank computes the same).
struct ShardLayout {
  struct Bucket {
    std::size_t begin = 0;  // first element
    std::size_t shard = 0;  // elements per rank (a multiple of align); the bucket is P shards
    std::size_t local = 0;  // where this bucket's shard starts in a rank's shard arrays
  };
  // One tensor's elements [first, first + numel) inside [begin, end) of the flat range.
  struct Slice {
    std::size_t tensor = 0;
    std::size_t first = 0;  // element of the tensor
    std::size_t numel = 0;
  };

  // align: DistributedOptions::shard_align (0: auto). tensor_align: what each tensor's first
  // element is rounded up to, a divisor of the shard alignment (8-bit states: kQuantBlock, so that
  // every shard edge inside a tensor falls on one of its blocks' edges).
  ShardLayout(std::span<const TensorSpec> tensors, std::size_t num_groups, int ranks,
              std::size_t bucket_elements, std::size_t align = 0, std::size_t tensor_align = 1);

  int ranks = 1;
  std::size_t align = kGrainElements;  // what shards are rounded up to
  std::size_t tensor_align = 1;        // what tensor offsets are rounded up to
  std::vector<std::size_t> offsets;    // each tensor's first element in the flat range
  std::size_t numel = 0;               // elements of all tensors and the gaps between them
  std::size_t padded = 0;              // the flat range with its padding: Σ P·shard
  std::size_t shard_total = 0;         // Σ shard: a rank's share of every bucket
  std::vector<Bucket> buckets;

  // The tensor pieces in [begin, end) of the flat range, in order (padding has none).
  std::vector<Slice> SlicesIn(std::size_t begin, std::size_t end) const;
  // A 64-bit FNV-1a hash of what every rank must agree on (specs, groups, ranks, buckets).
  std::uint64_t Hash() const;

 private:
  std::vector<TensorSpec> specs_;
};

template <class Hyper>
class DistributedOptimizer {
 public:
  // Collective: every rank constructs it with the same specs and options. Throws fusedopt::Error
  // (on every rank) for invalid hyper-parameters, specs or options, and when the ranks' layouts
  // differ (a hash of each rank's layout is all-gathered), naming the ranks. grad_dtype must be
  // f32 (gradients are reduced in f32); accumulation_steps must be 1.
  DistributedOptimizer(std::vector<Hyper> groups, std::vector<TensorSpec> tensors,
                       StorageOptions storage, Communicator& comm, DistributedOptions options = {},
                       Runtime& runtime = DefaultRuntime());
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  Hyper& group(std::size_t g) { return groups_.at(g); }
  std::size_t num_groups() const { return groups_.size(); }
  std::size_t num_tensors() const { return specs_.size(); }
  const ShardLayout& layout() const { return layout_; }
  const DistributedOptions& options() const { return options_; }
  std::int64_t step_count(std::size_t tensor) const { return steps_.at(tensor); }

  // The whole model's params and this rank's gradients (T: float for f32, std::uint16_t for
  // f16/bf16 params). After Step() every rank holds the same params.
  template <class T>
  std::span<T> params(std::size_t tensor) {
    CheckSize(sizeof(T), storage_.param_dtype);
    return {reinterpret_cast<T*>(params_.data()) + layout_.offsets.at(tensor),
            specs_.at(tensor).numel};
  }
  std::span<float> grads(std::size_t tensor) {
    return {grads_.data() + layout_.offsets.at(tensor), specs_.at(tensor).numel};
  }
  // This rank's parts of a tensor's state slot, as f32, in order (zero = 0: the whole tensor;
  // zero = 1: what its shards hold of it, possibly nothing). Throws fusedopt::Error for a slot that
  // is not allocated.
  struct StateSlice {
    std::size_t first = 0;  // the tensor's element where `values` start
    std::vector<float> values;
  };
  std::vector<StateSlice> state(std::size_t tensor, int slot) const;

  // What a checkpoint of a sharded run needs (the file format is the checkpoint's concern): a state
  // slot (kMasterSlot: the f32 masters) of the whole model in the flat layout (layout().offsets
  // says where each tensor starts; the same layout as a one-process Optimizer's FlatStorage),
  // gathered from every rank's shards (collective; zero = 0: this rank's copy); and the part of
  // such a whole state that this rank keeps, set from it: a checkpoint of any world size, sharded
  // or not, loads into any other. LoadState allocates the slot if needed; both throw
  // fusedopt::Error for a slot out of range, one not allocated (GatherState) or a size that is not
  // layout().numel (LoadState).
  static constexpr int kMasterSlot = -1;
  std::vector<float> GatherState(int slot);
  void LoadState(int slot, std::span<const float> flat);
  // The per-tensor step counts and scalar states (e.g. NAdam's mu_product), the same on every
  // rank; set them when loading a checkpoint.
  void set_step_count(std::size_t tensor, std::int64_t step);
  std::span<float, kMaxScalars> scalars(std::size_t tensor) {
    return std::span<float, kMaxScalars>(&scalars_.at(tensor * kMaxScalars), kMaxScalars);
  }

  void ZeroGrad();
  // Reduces the gradients and updates (see the top of this file). Collective. Throws
  // fusedopt::Error, having changed nothing, on invalid options or hyper-parameters. The first
  // call starts by broadcasting rank 0's params.
  StepResult Step(const StepOptions& options = {});

  // Bytes of optimizer state this rank holds: state slots and f32 masters.
  std::size_t state_bytes() const;

  // The collectives of the last Step(), for traces: one span per bucket and kind, from its start
  // to the return of the wait that saw it complete.
  struct CommSpan {
    const char* kind = "";  // "all_reduce", "reduce_scatter" or "all_gather"
    std::size_t bucket = 0;
    std::chrono::steady_clock::time_point begin, end;
  };
  const std::vector<CommSpan>& last_comm_spans() const { return spans_; }
  // The time the last Step() spent blocked starting and waiting for collectives: the communication
  // not hidden behind updates.
  double last_exposed_comm_ms() const { return exposed_ms_; }
  Communicator& communicator() { return *comm_; }

 private:
  friend struct OptimizerCheckpoint<Hyper>;  // fusedopt/checkpoint.h

  static void CheckSize(std::size_t size, DType dtype);
  static ShardLayout LayoutFor(std::span<const TensorSpec> tensors, std::size_t num_groups,
                               int ranks, const StorageOptions& storage,
                               const DistributedOptions& options);
  // Where a flat element's master and (zero = 1) reduced gradient lie in this rank's arrays.
  std::size_t LocalIndex(std::size_t flat) const;
  // The flat ranges [begin, end) whose states rank `rank` keeps: its shard of every bucket (zero =
  // 1), or everything (zero = 0; one range).
  std::vector<std::pair<std::size_t, std::size_t>> LocalRanges(int rank) const;
  // Rank `rank`'s shard of every bucket, as flat ranges (the zero = 1 LocalRanges; a sharded
  // checkpoint's file of a rank holds these, at any zero level).
  std::vector<std::pair<std::size_t, std::size_t>> ShardRanges(int rank) const;

  // Where a rank's states lie: one piece per slice of a tensor it keeps, in flat order, each at
  // its byte in a slot's arena and (8-bit states) its first block in the slot's absmax arena.
  // Every rank can compute every rank's: a checkpoint gathers them.
  struct StatePiece {
    std::size_t tensor = 0;
    std::size_t flat = 0;  // its first element in the flat range
    std::size_t numel = 0;
    std::size_t byte = 0;   // in a slot's arena (pieces lie back to back: no gaps, no padding)
    std::size_t block = 0;  // in an 8-bit slot's absmax arena
  };
  struct StatePieces {
    std::vector<StatePiece> pieces;
    std::size_t bytes = 0, blocks = 0;  // of one slot's arena and absmax arena
  };
  StatePieces PiecesOf(int rank) const;
  // This rank's piece holding flat element `flat` (one it keeps).
  const StatePiece& PieceAt(std::size_t flat) const;
  // A state slot of every rank (zero = 0: this rank's only): each rank's arena and absmax arena
  // in a stride of the largest rank's (collective).
  struct GatheredSlot {
    std::vector<StatePieces> ranks;
    std::vector<std::byte> bytes;
    std::vector<float> absmax;
    std::size_t bytes_stride = 0, blocks_stride = 0;
  };
  GatheredSlot GatherSlot(int slot);
  // Allocates a state slot's arenas, filled with the algorithm's initial state (quantized for
  // 8-bit pieces).
  void AllocateSlot(int slot);
  bool Allocated(int slot) const { return (allocated_ >> slot & 1u) != 0; }
  // A state slot (or kMasterSlot) of this rank, or throws.
  std::span<std::byte> LocalBuffer(int slot, const char* fn);
  // The segments of the tensor pieces in [begin, end) of the flat range; each gets its own copy
  // of its tensor's scalar states (in scalar_scratch_), as a tensor may be cut into several.
  std::vector<Segment> SegmentsIn(std::size_t begin, std::size_t end, float grad_scale,
                                  bool whole_tensors);
  void AllocateStates();
  // Starts a bucket's collective (start() returns its request; recorded in spans_), and waits for
  // one; both timed into exposed_ms_.
  using Request = std::pair<std::unique_ptr<CommRequest>, std::size_t>;  // and its span
  template <class Start>
  Request Started(const Start& start, const char* kind, std::size_t bucket);
  void Wait(Request& request);
  StepResult StepDataParallel(float grad_scale, const StepOptions& options);
  StepResult StepSharded(float grad_scale, const StepOptions& options);
  // ZeRO-1 with LAMB or LARS: each of this rank's slice sums (segment order, k each) replaced by
  // its tensor's total over every rank (collective; src/distributed/shard_sums.h).
  void WholeTensorSums(std::span<double> sums, std::size_t k);

  std::vector<Hyper> groups_;
  std::vector<TensorSpec> specs_;
  StorageOptions storage_;
  Communicator* comm_;
  DistributedOptions options_;
  Runtime* runtime_;
  ShardLayout layout_;
  std::size_t local_numel_ = 0;      // elements of state this rank keeps: numel or shard_total
  std::vector<std::byte> params_;    // padded, in the param dtype
  std::vector<float> grads_;         // padded
  std::vector<float> shard_grads_;   // zero = 1: the reduced gradients of this rank's shards
  std::vector<float> masters_;       // local_numel_ when master_weights
  std::vector<DType> state_dtypes_;  // each tensor's (8-bit: f32 under min_8bit_size elements)
  std::vector<std::size_t> dense_offsets_;  // each tensor's first element in FlatStorage's layout
  StatePieces pieces_;                      // this rank's
  std::vector<std::byte> states_[kMaxStates];  // pieces_.bytes each, once required
  std::vector<float> absmax_[kMaxStates];      // pieces_.blocks each (8-bit states)
  unsigned allocated_ = 0;                     // bit k: slot k is allocated
  std::vector<float> scalars_;                 // kMaxScalars per tensor
  std::deque<std::array<float, kMaxScalars>> scalar_scratch_;
  std::vector<std::int64_t> steps_, buffer_steps_;
  bool broadcast_done_ = false;
  std::vector<CommSpan> spans_;
  double exposed_ms_ = 0.0;
};

}  // namespace fusedopt
