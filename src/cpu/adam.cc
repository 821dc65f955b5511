// Adam / AdamW kernel: Io + AdamMath for every dtype combination, compiled for every SIMD target.

#include "src/core/kernels.h"

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
#include "src/math/lerp_math.h"

void AdamChunks(const StepPlan<AdamScalars>& plan, std::size_t chunk_begin, std::size_t chunk_end) {
  RunPlanChunks(plan, chunk_begin, chunk_end,
                [](auto p_tag, auto g_tag, auto s_tag, const AdamScalars s, const Segment& seg,
                   std::size_t begin, std::size_t end) HWY_ATTR {
                  using P = typename decltype(p_tag)::type;
                  using G = typename decltype(g_tag)::type;
                  using S = typename decltype(s_tag)::type;
                  const ParamIo<P> param{static_cast<P*>(seg.param), seg.master};
                  const G* grad = static_cast<const G*>(seg.grad);
                  S* exp_avg = static_cast<S*>(seg.state[kExpAvg]);
                  S* exp_avg_sq = static_cast<S*>(seg.state[kExpAvgSq]);
                  S* max_exp_avg_sq = static_cast<S*>(seg.state[kMaxExpAvgSq]);
                  WithFlags(
                      [&](auto coupled_wd, auto amsgrad) HWY_ATTR {
                        constexpr bool kAmsgrad = decltype(amsgrad)::value;
                        ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                          const HwyOps<decltype(d)> o{d};
                          auto p = param.Load(d, i);
                          auto m = Io<S>::Load(d, exp_avg + i);
                          auto v = Io<S>::Load(d, exp_avg_sq + i);
                          auto v_max = kAmsgrad ? Io<S>::Load(d, max_exp_avg_sq + i) : v;
                          AdamMath<decltype(coupled_wd)::value, kAmsgrad>(
                              o, s, p, Io<G>::Load(d, grad + i), m, v, v_max);
                          param.Store(d, p, i);
                          Io<S>::Store(d, m, exp_avg + i);
                          Io<S>::Store(d, v, exp_avg_sq + i);
                          if constexpr (kAmsgrad) Io<S>::Store(d, v_max, max_exp_avg_sq + i);
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
