// RMSprop kernel (centered, momentum): Io + RmspropMath for every dtype combination and SIMD
// target.

#include "src/core/kernels.h"

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
                [](auto p_tag, auto g_tag, auto s_tag, const RmspropScalars s, const Segment& seg,
                   std::size_t begin, std::size_t end) HWY_ATTR {
                  using P = typename decltype(p_tag)::type;
                  using G = typename decltype(g_tag)::type;
                  using S = typename decltype(s_tag)::type;
                  const ParamIo<P> param{static_cast<P*>(seg.param), seg.master};
                  const G* grad = static_cast<const G*>(seg.grad);
                  S* square_avg = static_cast<S*>(seg.state[kSquareAvg]);
                  S* momentum_buffer = static_cast<S*>(seg.state[kRmspropMomentumBuffer]);
                  S* grad_avg = static_cast<S*>(seg.state[kGradAvg]);
                  WithFlags(
                      [&](auto wd, auto centered, auto momentum) HWY_ATTR {
                        constexpr bool kCentered = decltype(centered)::value;
                        constexpr bool kMomentum = decltype(momentum)::value;
                        ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                          const HwyOps<decltype(d)> o{d};
                          auto p = param.Load(d, i);
                          auto sq = Io<S>::Load(d, square_avg + i);
                          // Unused states alias sq and are not stored.
                          auto buf = kMomentum ? Io<S>::Load(d, momentum_buffer + i) : sq;
                          auto ga = kCentered ? Io<S>::Load(d, grad_avg + i) : sq;
                          RmspropMath<decltype(wd)::value, kCentered, kMomentum>(
                              o, s, p, Io<G>::Load(d, grad + i), sq, buf, ga);
                          param.Store(d, p, i);
                          Io<S>::Store(d, sq, square_avg + i);
                          if constexpr (kMomentum) Io<S>::Store(d, buf, momentum_buffer + i);
                          if constexpr (kCentered) Io<S>::Store(d, ga, grad_avg + i);
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
