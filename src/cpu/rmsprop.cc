// RMSprop kernel (centered, momentum): Io + RmspropMath for every dtype combination and SIMD
// target.

#include "src/algos/rmsprop.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/rmsprop.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/lerp_math.h"
#include "src/math/rmsprop_math.h"

void RmspropChunks(const StepPlan<RmspropScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end) {
  RunPlanChunks(plan, chunk_begin, chunk_end,
                [](const auto& b, const RmspropScalars s, std::size_t begin, std::size_t end)
                    HWY_ATTR {
                      WithFlags(
                          [&](auto wd, auto centered, auto momentum) HWY_ATTR {
                            constexpr bool kCentered = decltype(centered)::value;
                            constexpr bool kMomentum = decltype(momentum)::value;
                            ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                              auto p = b.param.Load(d, i);
                              auto sq = b.LoadState(d, kSquareAvg, i);
                              // Unused states alias sq and are not stored.
                              auto buf = kMomentum ? b.LoadState(d, kRmspropMomentumBuffer, i) : sq;
                              auto ga = kCentered ? b.LoadState(d, kGradAvg, i) : sq;
                              RmspropMath<decltype(wd)::value, kCentered, kMomentum>(
                                  HwyOps<decltype(d)>{d}, s, p, b.Grad(d, i), sq, buf, ga);
                              b.param.Store(d, p, i);
                              b.StoreState(d, kSquareAvg, sq, i);
                              if constexpr (kMomentum)
                                b.StoreState(d, kRmspropMomentumBuffer, buf, i);
                              if constexpr (kCentered) b.StoreState(d, kGradAvg, ga, i);
                            });
                          },
                          s.has_weight_decay, s.centered, s.has_momentum);
                    });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(RmspropChunks);
void RunRmspropChunks(const StepPlan<RmspropScalars>& plan, std::size_t chunk_begin,
                      std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(RmspropChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
