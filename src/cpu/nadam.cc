// NAdam kernel: Io + NadamMath for every dtype combination, compiled for every SIMD target.

#include "src/algos/nadam.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/nadam.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/bias_correction_math.h"
#include "src/math/lerp_math.h"
#include "src/math/nadam_math.h"

void NadamChunks(const StepPlan<NadamScalars>& plan, std::size_t chunk_begin,
                 std::size_t chunk_end) {
  RunPlanChunks(plan, chunk_begin, chunk_end,
                [](const auto& b, const NadamScalars s, std::size_t begin, std::size_t end)
                    HWY_ATTR {
                      WithFlags(
                          [&](auto coupled_wd) HWY_ATTR {
                            ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                              auto p = b.param.Load(d, i);
                              auto m = b.LoadState(d, kNadamExpAvg, i);
                              auto v = b.LoadState(d, kNadamExpAvgSq, i);
                              NadamMath<decltype(coupled_wd)::value>(HwyOps<decltype(d)>{d}, s, p,
                                                                     b.Grad(d, i), m, v);
                              b.param.Store(d, p, i);
                              b.StoreState(d, kNadamExpAvg, m, i);
                              b.StoreState(d, kNadamExpAvgSq, v, i);
                            });
                          },
                          s.coupled_weight_decay);
                    });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(NadamChunks);
void RunNadamChunks(const StepPlan<NadamScalars>& plan, std::size_t chunk_begin,
                    std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(NadamChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
