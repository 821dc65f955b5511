// DistributedOptimizer::Step: the data-parallel step (zero = 0: gradients all-reduced bucket by
// bucket, each bucket updated as its reduction lands) and the ZeRO-1 step (zero = 1:
// reduce-scatter, each rank updating its shards, all-gather), with the whole-tensor sums a sharded
// two-phase algorithm completes across ranks.
#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedopt/convert.h"
#include "fusedopt/distributed.h"
#include "src/algos/registry.h"
#include "src/core/step_hooks.h"
#include "src/core/validate.h"
#include "src/distributed/distributed_common.h"
#include "src/distributed/shard_sums.h"

namespace fusedopt {
namespace {

using distributed::kFn;

// zero = 0 with `pipeline`: a bucket is updated in pieces of this many elements, the next bucket's
// request polled between them (a few hundred microseconds of work each).
constexpr std::size_t kPieceElements = 8 * kGrainElements;

// An algorithm whose update reads sums over whole tensors (which bucket edges cut).
template <class A>
constexpr bool kReducesTensors = algos::TwoPhase<A> || algos::Factored<A>;

}  // namespace

template <class Hyper>
StepResult DistributedOptimizer<Hyper>::Step(const StepOptions& options) {
  using A = algos::DescriptorOf<Hyper>;
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
    for (const auto& [begin, end] : LocalRanges(comm_->rank())) {
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
      s.state_dtype = state_dtypes_[t];
      s.group = specs_[t].group;
      s.step = steps_[t] + 1;
      for (int k = 0; k < kMaxScalars; ++k) s.scalars[k] = &scalars_[t * kMaxScalars + k];
    }
    FusedStep(std::span<const Hyper>(groups_), std::span<const Segment>(all), *runtime_);
  }
  for (std::size_t t = 0; t < specs_.size(); ++t) {
    ++steps_[t];
    if (algos::CountsBufferSteps<A>(groups_[specs_[t].group])) ++buffer_steps_[t];
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
  // This rank's slice sums packed by (bucket, tensor), every rank's pack gathered, and each
  // tensor's added in the order of the flat range (src/distributed/shard_sums.h).
  const std::size_t p = static_cast<std::size_t>(comm_->size());
  const std::size_t rank = static_cast<std::size_t>(comm_->rank());
  const distributed::ShardSums plan(distributed::ShardPieces(layout_, comm_->rank()),
                                    layout_.buckets.size(), specs_.size(), k);
  const std::size_t per_rank = plan.per_rank();
  std::vector<double> gathered(p * per_rank);
  plan.Pack(sums, std::span<double>(gathered).subspan(rank * per_rank, per_rank));
  comm_->AllGather(gathered.data(), per_rank, CommType::kF64);
  plan.Add(p, gathered, sums);
}

// Every algorithm's Step (and with it the private members it calls, defined above).
#define FOPT_INSTANTIATE(Stem, Alias) \
  template StepResult DistributedOptimizer<Stem##Hyper>::Step(const StepOptions&);
FUSEDOPT_FOR_EACH_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

}  // namespace fusedopt
