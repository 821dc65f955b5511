// Adagrad kernel: Io + AdagradMath for every dtype combination and SIMD target.

#include "src/algos/adagrad.h"

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
  RunPlanChunks(
      plan, chunk_begin, chunk_end,
      [](const auto& b, const AdagradScalars s, std::size_t begin, std::size_t end) HWY_ATTR {
        WithFlags(
            [&](auto wd) HWY_ATTR {
              ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                auto p = b.param.Load(d, i);
                auto sum = b.LoadState(d, kSum, i);
                AdagradMath<decltype(wd)::value>(HwyOps<decltype(d)>{d}, s, p, b.Grad(d, i), sum);
                b.param.Store(d, p, i);
                b.StoreState(d, kSum, sum, i);
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
