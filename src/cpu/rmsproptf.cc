// RMSpropTF kernel (weight decay coupled or decoupled, centered, momentum): Io + RmsproptfMath for
// every dtype combination and SIMD target.

#include "src/algos/rmsproptf.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/rmsproptf.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/rmsproptf_math.h"

// f(std::integral_constant<RmsproptfDecay, d>{}) for the run-time decay d: three modes, not the
// four of two flags.
template <class F>
HWY_INLINE void WithDecay(RmsproptfDecay decay, const F& f) {
  switch (decay) {
    case RmsproptfDecay::kNone:
      f(std::integral_constant<RmsproptfDecay, RmsproptfDecay::kNone>{});
      break;
    case RmsproptfDecay::kCoupled:
      f(std::integral_constant<RmsproptfDecay, RmsproptfDecay::kCoupled>{});
      break;
    case RmsproptfDecay::kDecoupled:
      f(std::integral_constant<RmsproptfDecay, RmsproptfDecay::kDecoupled>{});
      break;
  }
}

void RmsproptfChunks(const StepPlan<RmsproptfScalars>& plan, std::size_t chunk_begin,
                     std::size_t chunk_end) {
  RunPlanChunks(
      plan, chunk_begin, chunk_end,
      [](const auto& b, const RmsproptfScalars s, std::size_t begin, std::size_t end) HWY_ATTR {
        WithDecay(s.decay, [&](auto decay) HWY_ATTR {
          WithFlags(
              [&](auto centered, auto momentum) HWY_ATTR {
                constexpr bool kCentered = decltype(centered)::value;
                constexpr bool kMomentum = decltype(momentum)::value;
                ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                  auto p = b.param.Load(d, i);
                  auto sq = b.LoadState(d, kRmsproptfSquareAvg, i);
                  // Unused states alias sq and are not stored.
                  auto buf = kMomentum ? b.LoadState(d, kRmsproptfMomentumBuffer, i) : sq;
                  auto ga = kCentered ? b.LoadState(d, kRmsproptfGradAvg, i) : sq;
                  RmsproptfMath<decltype(decay)::value, kCentered, kMomentum>(
                      HwyOps<decltype(d)>{d}, s, p, b.Grad(d, i), sq, buf, ga);
                  b.param.Store(d, p, i);
                  b.StoreState(d, kRmsproptfSquareAvg, sq, i);
                  if constexpr (kMomentum) b.StoreState(d, kRmsproptfMomentumBuffer, buf, i);
                  if constexpr (kCentered) b.StoreState(d, kRmsproptfGradAvg, ga, i);
                });
              },
              s.centered, s.has_momentum);
        });
      });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(RmsproptfChunks);
void RunRmsproptfChunks(const StepPlan<RmsproptfScalars>& plan, std::size_t chunk_begin,
                        std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(RmsproptfChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
