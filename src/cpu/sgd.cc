// SGD kernel (momentum, dampening, Nesterov): Io + SgdMath for every dtype combination and SIMD
// target.

#include "src/core/kernels.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/sgd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/sgd_math.h"

void SgdChunks(const StepPlan<SgdScalars>& plan, std::size_t chunk_begin, std::size_t chunk_end) {
  RunPlanChunks(
      plan, chunk_begin, chunk_end,
      [](auto p_tag, auto g_tag, auto s_tag, const SgdScalars s, const Segment& seg,
         std::size_t begin, std::size_t end) HWY_ATTR {
        using P = typename decltype(p_tag)::type;
        using G = typename decltype(g_tag)::type;
        using S = typename decltype(s_tag)::type;
        const ParamIo<P> param{static_cast<P*>(seg.param), seg.master};
        const G* grad = static_cast<const G*>(seg.grad);
        S* momentum_buffer = static_cast<S*>(seg.state[kMomentumBuffer]);
        WithFlags(
            [&](auto wd, auto momentum, auto nesterov, auto first) HWY_ATTR {
              constexpr bool kMomentum = decltype(momentum)::value;
              constexpr bool kFirst = decltype(first)::value;
              // Without momentum, nesterov and the first step do not matter: compile it once.
              if constexpr (kMomentum || !(decltype(nesterov)::value || kFirst)) {
                ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                  const HwyOps<decltype(d)> o{d};
                  auto p = param.Load(d, i);
                  const auto g = Io<G>::Load(d, grad + i);
                  // A fresh buffer is written before it is read, so it is not loaded.
                  auto buf = kMomentum && !kFirst ? Io<S>::Load(d, momentum_buffer + i) : g;
                  SgdMath<decltype(wd)::value, kMomentum, decltype(nesterov)::value, kFirst>(
                      o, s, p, g, buf);
                  param.Store(d, p, i);
                  if constexpr (kMomentum) Io<S>::Store(d, buf, momentum_buffer + i);
                });
              }
            },
            s.has_weight_decay, s.has_momentum, s.has_momentum && s.nesterov,
            s.has_momentum && s.first_step);
      });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(SgdChunks);
void RunSgdChunks(const StepPlan<SgdScalars>& plan, std::size_t chunk_begin,
                  std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(SgdChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
