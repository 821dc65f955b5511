// Adam / AdamW kernel: Io + AdamMath for every dtype combination, compiled for every SIMD target.

#include "src/algos/adam.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/adam.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/adam_math.h"
#include "src/math/bias_correction_math.h"
#include "src/math/lerp_math.h"

void AdamChunks(const StepPlan<AdamScalars>& plan, std::size_t chunk_begin, std::size_t chunk_end) {
  RunPlanChunks(plan, chunk_begin, chunk_end,
                [](const auto& b, const AdamScalars s, std::size_t begin, std::size_t end)
                    HWY_ATTR {
                      WithFlags(
                          [&](auto coupled_wd, auto amsgrad) HWY_ATTR {
                            constexpr bool kAmsgrad = decltype(amsgrad)::value;
                            ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                              auto p = b.param.Load(d, i);
                              auto m = b.LoadState(d, kExpAvg, i);
                              auto v = b.LoadState(d, kExpAvgSq, i);
                              auto v_max = kAmsgrad ? b.LoadState(d, kMaxExpAvgSq, i) : v;
                              AdamMath<decltype(coupled_wd)::value, kAmsgrad>(
                                  HwyOps<decltype(d)>{d}, s, p, b.Grad(d, i), m, v, v_max);
                              b.param.Store(d, p, i);
                              b.StoreState(d, kExpAvg, m, i);
                              b.StoreState(d, kExpAvgSq, v, i);
                              if constexpr (kAmsgrad) b.StoreState(d, kMaxExpAvgSq, v_max, i);
                            });
                          },
                          s.coupled_weight_decay, s.amsgrad);
                    });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(AdamChunks);
void RunAdamChunks(const StepPlan<AdamScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(AdamChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
