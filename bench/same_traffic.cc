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
using fusedopt::HWY_NAMESPACE::Io;
using fusedopt::HWY_NAMESPACE::ParamIo;
using fusedopt::HWY_NAMESPACE::RunPlanChunks;

void TrafficChunks(const StepPlan<std::monostate>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end) {
  RunPlanChunks(plan, chunk_begin, chunk_end,
                [](auto p_tag, auto g_tag, auto s_tag, const std::monostate&, const Segment& seg,
                   std::size_t begin, std::size_t end) HWY_ATTR {
                  using P = typename decltype(p_tag)::type;
                  using G = typename decltype(g_tag)::type;
                  using S = typename decltype(s_tag)::type;
                  const ParamIo<P> param{static_cast<P*>(seg.param), seg.master};
                  const G* grad = static_cast<const G*>(seg.grad);
                  S* s0 = static_cast<S*>(seg.state[0]);
                  S* s1 = static_cast<S*>(seg.state[1]);
                  S* s2 = static_cast<S*>(seg.state[2]);
                  ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                    // x + 0·g keeps every value (barring NaN/Inf) yet depends on the load of g.
                    const auto g = hn::Mul(Io<G>::Load(d, grad + i), hn::Zero(d));
                    param.Store(d, hn::Add(param.Load(d, i), g), i);
                    if (s0 != nullptr) Io<S>::Store(d, hn::Add(Io<S>::Load(d, s0 + i), g), s0 + i);
                    if (s1 != nullptr) Io<S>::Store(d, hn::Add(Io<S>::Load(d, s1 + i), g), s1 + i);
                    if (s2 != nullptr) Io<S>::Store(d, hn::Add(Io<S>::Load(d, s2 + i), g), s2 + i);
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
