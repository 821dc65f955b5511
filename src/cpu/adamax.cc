// Adamax kernel: Io + AdamaxMath for every dtype combination, compiled for every SIMD target.

#include "src/algos/adamax.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/adamax.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/adamax_math.h"
#include "src/math/lerp_math.h"

void AdamaxChunks(const StepPlan<AdamaxScalars>& plan, std::size_t chunk_begin,
                  std::size_t chunk_end) {
  RunPlanChunks(
      plan, chunk_begin, chunk_end,
      [](const auto& b, const AdamaxScalars s, std::size_t begin, std::size_t end) HWY_ATTR {
        WithFlags(
            [&](auto wd) HWY_ATTR {
              ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                auto p = b.param.Load(d, i);
                auto m = b.LoadState(d, kAdamaxExpAvg, i);
                auto u = b.LoadState(d, kExpInf, i);
                AdamaxMath<decltype(wd)::value>(HwyOps<decltype(d)>{d}, s, p, b.Grad(d, i), m, u);
                b.param.Store(d, p, i);
                b.StoreState(d, kAdamaxExpAvg, m, i);
                b.StoreState(d, kExpInf, u, i);
              });
            },
            s.has_weight_decay);
      });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(AdamaxChunks);
void RunAdamaxChunks(const StepPlan<AdamaxScalars>& plan, std::size_t chunk_begin,
                     std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(AdamaxChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
