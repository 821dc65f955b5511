// A hook inside the fused step for the data-parallel layer (src/distributed/):
// internal, not part of the public API.
#pragma once

#include <cstddef>
#include <functional>
#include <span>

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

// What ZeRO-1 can shard: the element-wise algorithms, and those whose sums a SegmentSumsHook can
// complete across ranks (per-tensor sums). Not those with sums per row or across tensors, nor the
// factored ones.
template <class A>
constexpr bool kZeroOneShards = !(algos::TwoPhase<A> || algos::Factored<A>) || kSegmentSums<A>;

// FusedStep, with the hook (kSegmentSums algorithms only).
template <class Hyper>
void FusedStepWithSums(std::span<const Hyper> groups, std::span<const Segment> segments,
                       Runtime& runtime, const SegmentSumsHook& hook);

}  // namespace fusedopt
