// Rprop kernel: Io + RpropMath for every dtype combination, compiled for every SIMD target.

#include "src/algos/rprop.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/rprop.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/rprop_math.h"

void RpropChunks(const StepPlan<RpropScalars>& plan, std::size_t chunk_begin,
                 std::size_t chunk_end) {
  RunPlanChunks(plan, chunk_begin, chunk_end,
                [](const auto& b, const RpropScalars s, std::size_t begin, std::size_t end)
                    HWY_ATTR {
                      ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                        auto p = b.param.Load(d, i);
                        auto prev = b.LoadState(d, kRpropPrev, i);
                        auto step_size = b.LoadState(d, kRpropStepSize, i);
                        RpropMath(HwyOps<decltype(d)>{d}, s, p, b.Grad(d, i), prev, step_size);
                        b.param.Store(d, p, i);
                        b.StoreState(d, kRpropPrev, prev, i);
                        b.StoreState(d, kRpropStepSize, step_size, i);
                      });
                    });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(RpropChunks);
void RunRpropChunks(const StepPlan<RpropScalars>& plan, std::size_t chunk_begin,
                    std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(RpropChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
