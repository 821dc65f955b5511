// A hook inside the fused step for the data-parallel layer (src/distributed/):
// internal, not part of the public API.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "src/core/step_traits.h"

namespace fusedopt {

// Called between a two-phase step's reduction pass and its coefficients with the sums of every
// segment (k values each, in segment order), which it may change: a ZeRO-1 step replaces a
// tensor slice's sums (per-tensor norms) with the whole tensor's, added up over every rank's
// slices.
using SegmentSumsHook = std::function<void(std::span<double> sums, std::size_t k)>;

// Algorithms whose coefficients come from each segment's own sums (not per row, not across
// segments, not factored): those FusedStepWithSums calls the hook for.
template <class A>
constexpr bool kSegmentSums =
    algos::TwoPhase<A> && !algos::FinishesAll<A> && !algos::RowReductions<A> && !algos::Factored<A>;

// Algorithms whose per-segment sums a SegmentSumsHook may complete: those of kSegmentSums, and
// those that finish across segments (per param group, say). Completing each segment's sums
// before that finish serves DTensor shards, where every rank holds a piece of every tensor, not
// ZeRO-1, where a rank holds pieces of some of them.
template <class A>
constexpr bool kSumsHook = kSegmentSums<A> || (algos::TwoPhase<A> && algos::FinishesAll<A> &&
                                               !algos::RowReductions<A> && !algos::Factored<A>);

// What ZeRO-1 can shard: the element-wise algorithms, and those whose sums a SegmentSumsHook can
// complete across ranks (per-tensor sums). Not those with sums per row or across tensors, nor the
// factored ones.
template <class A>
constexpr bool kZeroOneShards = !(algos::TwoPhase<A> || algos::Factored<A>) || kSegmentSums<A>;

// FusedStep, with the hook (kSumsHook algorithms only).
template <class Hyper>
void FusedStepWithSums(std::span<const Hyper> groups, std::span<const Segment> segments,
                       Runtime& runtime, const SegmentSumsHook& hook);

// A segment of a per-row algorithm's step that is one rank's shard of a tensor cut between its rows
// (FSDP2's Shard(0)), each of its rows whole; a default one (whole_rows 0) is a whole tensor.
struct RowShard {
  std::size_t whole_numel = 0;
  std::size_t whole_rows = 0;  // the whole tensor's size(0)
  std::size_t first_row = 0;   // the whole tensor's row where this shard's rows start
};

// Given the sharded segments' row sums (k per row of the segment, sums[offsets[i], offsets[i + 1])
// segment i's), returns those of every row of their whole tensors (k per whole row, in segment and
// row order). Every rank calls it with the same segments.
using RowSumsHook = std::function<std::vector<double>(std::span<const double> sums,
                                                      std::span<const std::size_t> offsets)>;
struct RowShardsHook {
  std::span<const RowShard> shards;  // one per segment
  RowSumsHook hook;
};

// The fused step of a per-row algorithm over shards cut between rows, as the whole tensors' step:
// each sharded segment's coefficients come from its whole tensor's row sums (`rows.hook`).
template <class Hyper>
void RowStepOverShards(std::span<const Hyper> groups, std::span<const Segment> segments,
                       Runtime& runtime, const RowShardsHook& rows);

// A segment of a factored step that is one rank's shard of a tensor cut along its first dimension
// (FSDP2's Shard(0)); a default one (whole_numel 0) is a whole tensor. A matrix (a param of two
// dimensions) cut between its rows keeps its own rows' factors and the whole column factors (the
// same on every rank); a batch of matrices cut between matrices keeps its own matrices' factors.
struct FactoredShard {
  std::size_t whole_numel = 0;  // the whole tensor's numel; 0: the segment is the whole tensor
  std::size_t whole_rows = 0;   // a matrix cut between its rows: its size(-2); 0 otherwise
  std::size_t cols = 0;         // and its size(-1) (the segment may hold none of its rows)
};

// Adds each value up over the ranks that hold the other shards of its segment's tensor, in place:
// sums[offsets[i], offsets[i + 1]) are segment i's. Every rank calls it with the same layout.
using ShardSumsHook =
    std::function<void(std::span<double> sums, std::span<const std::size_t> offsets)>;

// The fused step of a factored algorithm over shards, as the whole tensors' step:
// `hook` completes each sharded segment's Σp², a row-cut matrix's column sums of g², the sum of
// its new row factors (for their mean) and ΣU², in three calls (the second only when some matrix
// is cut between its rows).
template <class Hyper>
void FactoredStepOverShards(std::span<const Hyper> groups, std::span<const Segment> segments,
                            std::span<const FactoredShard> shards, Runtime& runtime,
                            const ShardSumsHook& hook);

}  // namespace fusedopt
