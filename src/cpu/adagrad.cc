// Adagrad kernel: Io + AdagradMath for every dtype combination and SIMD target.

#include "src/core/kernels.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/adagrad.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/adagrad_math.h"

void AdagradChunks(const StepPlan<AdagradScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end) {
  RunPlanChunks(plan, chunk_begin, chunk_end,
                [](auto p_tag, auto g_tag, auto s_tag, const AdagradScalars s, const Segment& seg,
                   std::size_t begin, std::size_t end) HWY_ATTR {
                  using P = typename decltype(p_tag)::type;
                  using G = typename decltype(g_tag)::type;
                  using S = typename decltype(s_tag)::type;
                  const ParamIo<P> param{static_cast<P*>(seg.param), seg.master};
                  const G* grad = static_cast<const G*>(seg.grad);
                  S* sum = static_cast<S*>(seg.state[kSum]);
                  WithFlags(
                      [&](auto wd) HWY_ATTR {
                        ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                          const HwyOps<decltype(d)> o{d};
                          auto p = param.Load(d, i);
                          auto acc = Io<S>::Load(d, sum + i);
                          AdagradMath<decltype(wd)::value>(o, s, p, Io<G>::Load(d, grad + i), acc);
                          param.Store(d, p, i);
                          Io<S>::Store(d, acc, sum + i);
                        });
                      },
                      s.has_weight_decay);
                });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(AdagradChunks);
void RunAdagradChunks(const StepPlan<AdagradScalars>& plan, std::size_t chunk_begin,
                      std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(AdagradChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
