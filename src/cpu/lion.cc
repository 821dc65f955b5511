// Lion kernel: Io + LionMath for every dtype combination, compiled for every SIMD target.

#include "src/algos/lion.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/lion.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/lion_math.h"

void LionChunks(const StepPlan<LionScalars>& plan, std::size_t chunk_begin, std::size_t chunk_end) {
  RunPlanChunks(plan, chunk_begin, chunk_end,
                [](const auto& b, const LionScalars s, std::size_t begin, std::size_t end)
                    HWY_ATTR {
                      ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                        auto p = b.param.Load(d, i);
                        auto m = b.LoadState(d, kLionExpAvg, i);
                        LionMath(HwyOps<decltype(d)>{d}, s, p, b.Grad(d, i), m);
                        b.param.Store(d, p, i);
                        b.StoreState(d, kLionExpAvg, m, i);
                      });
                    });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(LionChunks);
void RunLionChunks(const StepPlan<LionScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(LionChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
