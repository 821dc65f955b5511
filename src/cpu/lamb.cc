// LAMB kernels, both passes: Io + LambUpdate for every dtype combination, compiled for every SIMD
// target. The reduction pass writes nothing; the update pass recomputes the same u (same inputs,
// same ops) and applies it.

#include "src/algos/lamb.h"

#include <cstddef>

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/lamb.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"
#include "src/cpu/square_sum-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/bias_correction_math.h"
#include "src/math/lamb_math.h"

// Writes Σp² and Σu² of each piece of the chunk, in piece order.
void LambReduceChunk(const StepPlan<LambScalars>& plan, std::size_t chunk, double* sums) {
  std::size_t piece = 0;
  ReducePlanChunk(
      plan, chunk, /*reads_states=*/true,
      [&](const auto& b, const LambScalars s, std::size_t begin, std::size_t end) HWY_ATTR {
        SquareSum param_sum, update_sum;
        WithFlags(
            [&](auto l2, auto decoupled) HWY_ATTR {
              ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                const auto p = b.param.Load(d, i);
                auto m = b.LoadState(d, kLambExpAvg, i);
                auto v = b.LoadState(d, kLambExpAvgSq, i);
                const auto u = LambUpdate<decltype(l2)::value, decltype(decoupled)::value>(
                    HwyOps<decltype(d)>{d}, s, p, b.Grad(d, i), m, v);
                param_sum.Add(d, p, i - begin);
                update_sum.Add(d, u, i - begin);
              });
            },
            s.l2_weight_decay, s.decoupled_weight_decay);
        sums[2 * piece] = param_sum.Total();
        sums[2 * piece + 1] = update_sum.Total();
        ++piece;
      });
}

void LambChunks(const StepPlan<LambScalars>& plan, std::size_t chunk_begin, std::size_t chunk_end) {
  RunPlanChunks(
      plan, chunk_begin, chunk_end,
      [](const auto& b, const LambScalars s, std::size_t begin, std::size_t end) HWY_ATTR {
        WithFlags(
            [&](auto l2, auto decoupled) HWY_ATTR {
              ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                const HwyOps<decltype(d)> o{d};
                auto p = b.param.Load(d, i);
                auto m = b.LoadState(d, kLambExpAvg, i);
                auto v = b.LoadState(d, kLambExpAvgSq, i);
                const auto u = LambUpdate<decltype(l2)::value, decltype(decoupled)::value>(
                    o, s, p, b.Grad(d, i), m, v);
                LambApply(o, s, p, u);
                b.param.Store(d, p, i);
                b.StoreState(d, kLambExpAvg, m, i);
                b.StoreState(d, kLambExpAvgSq, v, i);
              });
            },
            s.l2_weight_decay, s.decoupled_weight_decay);
      });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(LambReduceChunk);
HWY_EXPORT(LambChunks);
void RunLambReduceChunk(const StepPlan<LambScalars>& plan, std::size_t chunk, double* sums) {
  HWY_DYNAMIC_DISPATCH(LambReduceChunk)(plan, chunk, sums);
}
void RunLambChunks(const StepPlan<LambScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(LambChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
