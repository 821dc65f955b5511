// same_traffic: per segment, read the grad and read+write the param, master and every state the
// step touches, in the same chunks and threads as the fused step, with no math beyond one fma per
// written array. Its time is the memory-bandwidth floor of the fused step on this machine.
// SameTrafficGradRead is the floor of the fused pre-pass (GradPrePass): one read of every gradient
// in the step's chunks, one add per vector.

#include <variant>
#include <vector>

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
using fusedopt::HWY_NAMESPACE::Io;
using fusedopt::HWY_NAMESPACE::RunPlanChunks;
using fusedopt::HWY_NAMESPACE::WithStorageType;

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

// Sum of every gradient element of chunks [chunk_begin, chunk_end): four vector accumulators, so
// the adds never bound the loop, then 1-lane vectors for the tail of each piece.
float GradReadChunks(const ChunkPlan& plan, std::size_t chunk_begin, std::size_t chunk_end) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  const hn::CappedTag<float, 1> d1;
  auto acc0 = hn::Zero(d);
  auto acc1 = hn::Zero(d);
  auto acc2 = hn::Zero(d);
  auto acc3 = hn::Zero(d);
  auto acc_tail = hn::Zero(d1);
  plan.ForEachPiece(chunk_begin, chunk_end,
                    [&](std::size_t s, std::size_t begin, std::size_t end) HWY_ATTR {
                      const Segment& seg = plan.segments()[s];
                      WithStorageType(seg.grad_dtype, [&](auto tag) HWY_ATTR {
                        using G = typename decltype(tag)::type;
                        const G* g = static_cast<const G*>(seg.grad);
                        std::size_t i = begin;
                        for (; i + 4 * lanes <= end; i += 4 * lanes) {
                          acc0 = hn::Add(acc0, Io<G>::Load(d, g + i));
                          acc1 = hn::Add(acc1, Io<G>::Load(d, g + i + lanes));
                          acc2 = hn::Add(acc2, Io<G>::Load(d, g + i + 2 * lanes));
                          acc3 = hn::Add(acc3, Io<G>::Load(d, g + i + 3 * lanes));
                        }
                        for (; i < end; ++i) acc_tail = hn::Add(acc_tail, Io<G>::Load(d1, g + i));
                      });
                    });
  const auto sum = hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3));
  return hn::GetLane(hn::SumOfLanes(d, sum)) + hn::GetLane(acc_tail);
}

}  // namespace fusedopt::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt::bench {
HWY_EXPORT(TrafficChunks);
HWY_EXPORT(GradReadChunks);

void SameTrafficStep(std::span<const Segment> segments, const Runtime& runtime) {
  const StepPlan<std::monostate> plan{ChunkPlan(segments),
                                      std::vector<std::monostate>(segments.size())};
  ParallelForChunks(plan.chunks.num_chunks(), runtime.num_threads(),
                    [&](std::size_t c0, std::size_t c1) {
                      HWY_DYNAMIC_DISPATCH(TrafficChunks)(plan, c0, c1);
                    });
}

float SameTrafficGradRead(std::span<const Segment> segments, const Runtime& runtime) {
  const ChunkPlan plan(segments);
  std::vector<float> partial(plan.num_chunks(), 0.0f);  // one per chunk, written by its thread
  ParallelForChunks(partial.size(), runtime.num_threads(), [&](std::size_t c0, std::size_t c1) {
    for (std::size_t c = c0; c < c1; ++c) {
      partial[c] = HWY_DYNAMIC_DISPATCH(GradReadChunks)(plan, c, c + 1);
    }
  });
  float total = 0.0f;
  for (const float p : partial) total += p;
  return total;
}

}  // namespace fusedopt::bench
#endif
