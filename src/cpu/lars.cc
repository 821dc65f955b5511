// LARS kernels, both passes: Io + LarsGrad/LarsMath for every dtype combination, compiled for every
// SIMD target. The reduction pass reads the param and the gradient and writes nothing; the update
// pass reads the gradient through the same LarsGrad and applies LARC's scaling and SGD's step.

#include "src/algos/lars.h"

#include <cstddef>

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/lars.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"
#include "src/cpu/square_sum-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/lars_math.h"

// Writes Σp² and Σg² of each piece of the chunk, in piece order.
void LarsReduceChunk(const StepPlan<LarsScalars>& plan, std::size_t chunk, double* sums) {
  std::size_t piece = 0;
  ReducePlanChunk(
      plan, chunk, /*reads_states=*/false,
      [&](const auto& b, const LarsScalars s, std::size_t begin, std::size_t end) HWY_ATTR {
        SquareSum param_sum, grad_sum;
        ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
          param_sum.Add(d, b.param.Load(d, i), i - begin);
          grad_sum.Add(d, LarsGrad(HwyOps<decltype(d)>{d}, s, b.Grad(d, i)), i - begin);
        });
        sums[2 * piece] = param_sum.Total();
        sums[2 * piece + 1] = grad_sum.Total();
        ++piece;
      });
}

void LarsChunks(const StepPlan<LarsScalars>& plan, std::size_t chunk_begin, std::size_t chunk_end) {
  RunPlanChunks(
      plan, chunk_begin, chunk_end,
      [](const auto& b, const LarsScalars s, std::size_t begin, std::size_t end) HWY_ATTR {
        WithFlags(
            [&](auto trust, auto momentum, auto nesterov) HWY_ATTR {
              constexpr bool kMomentum = decltype(momentum)::value;
              // Nesterov needs momentum (validated): do not compile the impossible loop.
              if constexpr (kMomentum || !decltype(nesterov)::value) {
                ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                  const HwyOps<decltype(d)> o{d};
                  auto p = b.param.Load(d, i);
                  const auto g = LarsGrad(o, s, b.Grad(d, i));
                  auto buf = kMomentum ? b.LoadState(d, kLarsMomentumBuffer, i) : g;
                  LarsMath<decltype(trust)::value, kMomentum, decltype(nesterov)::value>(o, s, p, g,
                                                                                         buf);
                  b.param.Store(d, p, i);
                  if constexpr (kMomentum) b.StoreState(d, kLarsMomentumBuffer, buf, i);
                });
              }
            },
            s.trust, s.has_momentum, s.has_momentum && s.nesterov);
      });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(LarsReduceChunk);
HWY_EXPORT(LarsChunks);
void RunLarsReduceChunk(const StepPlan<LarsScalars>& plan, std::size_t chunk, double* sums) {
  HWY_DYNAMIC_DISPATCH(LarsReduceChunk)(plan, chunk, sums);
}
void RunLarsChunks(const StepPlan<LarsScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(LarsChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
