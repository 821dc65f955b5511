// SGD kernel (momentum, dampening, Nesterov): Io + SgdMath for every dtype combination and SIMD
// target.

#include "src/algos/sgd.h"

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
  RunPlanChunks(plan, chunk_begin, chunk_end,
                [](const auto& b, const SgdScalars s, std::size_t begin, std::size_t end) HWY_ATTR {
                  WithFlags(
                      [&](auto wd, auto momentum, auto nesterov) HWY_ATTR {
                        constexpr bool kMomentum = decltype(momentum)::value;
                        // Nesterov needs momentum (validated): do not compile the impossible loop.
                        if constexpr (kMomentum || !decltype(nesterov)::value) {
                          ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                            auto p = b.param.Load(d, i);
                            const auto g = b.Grad(d, i);
                            auto buf = kMomentum ? b.LoadState(d, kMomentumBuffer, i) : g;
                            SgdMath<decltype(wd)::value, kMomentum, decltype(nesterov)::value>(
                                HwyOps<decltype(d)>{d}, s, p, g, buf);
                            b.param.Store(d, p, i);
                            if constexpr (kMomentum) b.StoreState(d, kMomentumBuffer, buf, i);
                          });
                        }
                      },
                      s.has_weight_decay, s.has_momentum, s.has_momentum && s.nesterov);
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
