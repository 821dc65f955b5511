// ASGD kernel: Io + AsgdMath for every dtype combination, compiled for every SIMD target. Before
// averaging starts (mu == 1) the average is a copy of the param and is not read.

#include "src/algos/asgd.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/asgd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/asgd_math.h"

void AsgdChunks(const StepPlan<AsgdScalars>& plan, std::size_t chunk_begin, std::size_t chunk_end) {
  RunPlanChunks(plan, chunk_begin, chunk_end,
                [](const auto& b, const AsgdScalars s, std::size_t begin, std::size_t end)
                    HWY_ATTR {
                      WithFlags(
                          [&](auto wd, auto average) HWY_ATTR {
                            constexpr bool kAverage = decltype(average)::value;
                            ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                              auto p = b.param.Load(d, i);
                              auto ax = kAverage ? b.LoadState(d, kAsgdAx, i) : hn::Zero(d);
                              AsgdMath<decltype(wd)::value, kAverage>(HwyOps<decltype(d)>{d}, s, p,
                                                                      b.Grad(d, i), ax);
                              b.param.Store(d, p, i);
                              b.StoreState(d, kAsgdAx, ax, i);
                            });
                          },
                          s.has_weight_decay, s.average);
                    });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(AsgdChunks);
void RunAsgdChunks(const StepPlan<AsgdScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(AsgdChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
