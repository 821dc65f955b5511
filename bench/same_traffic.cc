// same_traffic: per segment, read the grad and read+write the param, master and every state the
// step touches, in the same chunks and threads as the fused step, with no math beyond one fma per
// written array. Its time is the memory-bandwidth floor of the fused step on this machine.

#include <variant>

#include "bench/standard.h"
#include "src/core/parallel.h"
#include "src/core/plan.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/same_traffic.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using fusedopt::HWY_NAMESPACE::ForEachVector;
using fusedopt::HWY_NAMESPACE::RunPlanChunks;

void TrafficChunks(const StepPlan<std::monostate>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end) {
  RunPlanChunks(plan, chunk_begin, chunk_end,
                [](const auto& b, std::monostate, std::size_t begin, std::size_t end) HWY_ATTR {
                  ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                    // x + 0·g keeps every value (barring NaN/Inf) yet depends on the load of g.
                    const auto g = hn::Mul(b.Grad(d, i), hn::Zero(d));
                    b.param.Store(d, hn::Add(b.param.Load(d, i), g), i);
                    for (int slot = 0; slot < kMaxStates; ++slot) {
                      if (b.state[slot] != nullptr)
                        b.StoreState(d, slot, hn::Add(b.LoadState(d, slot, i), g), i);
                    }
                  });
                });
}

}  // namespace fusedopt::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt::bench {
HWY_EXPORT(TrafficChunks);

void SameTrafficStep(std::span<const Segment> segments, const Runtime& runtime) {
  const StepPlan<std::monostate> plan{ChunkPlan(segments),
                                      std::vector<std::monostate>(segments.size())};
  ParallelForChunks(plan.chunks.num_chunks(), runtime.num_threads(),
                    [&](std::size_t c0, std::size_t c1) {
                      HWY_DYNAMIC_DISPATCH(TrafficChunks)(plan, c0, c1);
                    });
}

}  // namespace fusedopt::bench
#endif
