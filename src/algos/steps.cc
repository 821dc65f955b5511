// The public step functions of every algorithm of the registry: the engine's generic step
// (src/core/run_step.h) instantiated with each descriptor, and the named entry points of step.h
// (SgdStep, ..., one per line of FUSEDOPT_FOR_EACH_ALGORITHM) forwarding to it.

#include <span>
#include <string>

#include "fusedopt/error.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "src/algos/registry.h"
#include "src/core/run_step.h"
#include "src/core/step_hooks.h"

namespace fusedopt {

template <class Hyper>
void FusedStep(std::span<const Hyper> groups, std::span<const Segment> segments, Runtime& runtime) {
  RunStep<algos::DescriptorOf<Hyper>>(groups, segments, runtime);
}

template <class Hyper>
void FusedStepWithSums(std::span<const Hyper> groups, std::span<const Segment> segments,
                       Runtime& runtime, const SegmentSumsHook& hook) {
  RunStep<algos::DescriptorOf<Hyper>>(groups, segments, runtime, &hook);
}

template <class Hyper>
void FactoredStepOverShards(std::span<const Hyper> groups, std::span<const Segment> segments,
                            std::span<const FactoredShard> shards, Runtime& runtime,
                            const ShardSumsHook& hook) {
  RunFactoredStep<algos::DescriptorOf<Hyper>>(groups, segments, runtime, shards, &hook);
}
template void FactoredStepOverShards(std::span<const AdafactorHyper>, std::span<const Segment>,
                                     std::span<const FactoredShard>, Runtime&,
                                     const ShardSumsHook&);

template <class Hyper>
void RowStepOverShards(std::span<const Hyper> groups, std::span<const Segment> segments,
                       Runtime& runtime, const RowShardsHook& rows) {
  if (rows.shards.size() != segments.size()) {
    throw Error("RowStepOverShards: " + std::to_string(rows.shards.size()) + " shards for " +
                std::to_string(segments.size()) + " segments");
  }
  RunStepChunks<algos::DescriptorOf<Hyper>>(groups, segments, runtime, nullptr, &rows);
}
template void RowStepOverShards(std::span<const AdampHyper>, std::span<const Segment>, Runtime&,
                                const RowShardsHook&);

template <class Hyper>
unsigned RequiredStates(const Hyper& h) {
  return algos::DescriptorOf<Hyper>::RequiredStates(h);
}

#define FOPT_INSTANTIATE(Stem, Alias)                                                        \
  template void FusedStep(std::span<const Stem##Hyper>, std::span<const Segment>, Runtime&); \
  template void FusedStepWithSums(std::span<const Stem##Hyper>, std::span<const Segment>,    \
                                  Runtime&, const SegmentSumsHook&);                         \
  template unsigned RequiredStates(const Stem##Hyper&);                                      \
  void Stem##Step(std::span<const Stem##Hyper> groups, std::span<const Segment> segments,    \
                  Runtime& runtime) {                                                        \
    FusedStep(groups, segments, runtime);                                                    \
  }
FUSEDOPT_FOR_EACH_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

}  // namespace fusedopt
