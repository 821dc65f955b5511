// BertAdam kernels, both passes: Io + BertAdamGrad/BertAdamMath for every dtype combination,
// compiled for every SIMD target. The reduction pass reads the gradient and writes nothing; the
// update pass reads it through the same BertAdamGrad, then clips and steps.

#include "src/algos/bert_adam.h"

#include <cstddef>

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/bert_adam.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"
#include "src/cpu/square_sum-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/bert_adam_math.h"

// Writes Σg² of each piece of the chunk, in piece order.
void BertAdamReduceChunk(const StepPlan<BertAdamScalars>& plan, std::size_t chunk, double* sums) {
  std::size_t piece = 0;
  ReducePlanChunk(
      plan, chunk, /*reads_states=*/false,
      [&](const auto& b, const BertAdamScalars s, std::size_t begin, std::size_t end) HWY_ATTR {
        SquareSum grad_sum;
        ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
          grad_sum.Add(d, BertAdamGrad(HwyOps<decltype(d)>{d}, s, b.Grad(d, i)), i - begin);
        });
        sums[piece++] = grad_sum.Total();
      });
}

void BertAdamChunks(const StepPlan<BertAdamScalars>& plan, std::size_t chunk_begin,
                    std::size_t chunk_end) {
  RunPlanChunks(plan, chunk_begin, chunk_end,
                [](const auto& b, const BertAdamScalars s, std::size_t begin, std::size_t end)
                    HWY_ATTR {
                      WithFlags(
                          [&](auto weight_decay) HWY_ATTR {
                            ForEachVector(begin, end, [&](auto d, std::size_t i) HWY_ATTR {
                              auto p = b.param.Load(d, i);
                              auto m = b.LoadState(d, kBertAdamExpAvg, i);
                              auto v = b.LoadState(d, kBertAdamExpAvgSq, i);
                              BertAdamMath<decltype(weight_decay)::value>(HwyOps<decltype(d)>{d}, s,
                                                                          p, b.Grad(d, i), m, v);
                              b.param.Store(d, p, i);
                              b.StoreState(d, kBertAdamExpAvg, m, i);
                              b.StoreState(d, kBertAdamExpAvgSq, v, i);
                            });
                          },
                          s.has_weight_decay);
                    });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(BertAdamReduceChunk);
HWY_EXPORT(BertAdamChunks);
void RunBertAdamReduceChunk(const StepPlan<BertAdamScalars>& plan, std::size_t chunk,
                            double* sums) {
  HWY_DYNAMIC_DISPATCH(BertAdamReduceChunk)(plan, chunk, sums);
}
void RunBertAdamChunks(const StepPlan<BertAdamScalars>& plan, std::size_t chunk_begin,
                       std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(BertAdamChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
