// AdamP kernels, both passes: Io + AdampUpdate/AdampProject/AdampApply for every dtype combination,
// compiled for every SIMD target. The reduction pass reads everything, writes nothing, and gives
// per channel row Σg·p, Σg², Σp² and Σp·u (u: the perturbation before the projection); the update
// pass recomputes the same u and applies the projection Adamp::Finish chose.

#include "src/algos/adamp.h"

#include <algorithm>
#include <cstddef>

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/adamp.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"
#include "src/cpu/square_sum-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/adamp_math.h"
#include "src/math/bias_correction_math.h"

// Calls f(row, begin, end) for the parts of channel rows of `row_length` elements in the piece
// [begin, end) of a segment, in order.
template <class F>
HWY_INLINE void ForEachRowPart(std::size_t row_length, std::size_t begin, std::size_t end,
                               const F& f) {
  for (std::size_t lo = begin; lo < end;) {
    const std::size_t row = lo / row_length;
    const std::size_t hi = std::min(end, (row + 1) * row_length);
    f(row, lo, hi);
    lo = hi;
  }
}

// Writes Σg·p, Σg², Σp², Σp·u of each row part of each piece of the chunk, in order (one part of
// zeros for a piece of a param with at most one dimension, which is never projected).
void AdampReduceChunk(const StepPlan<AdampScalars>& plan, std::size_t chunk, double* sums) {
  std::size_t part = 0;
  RunPlanChunks(
      plan, chunk, chunk + 1,
      [&](const auto& b, const AdampScalars s, std::size_t begin, std::size_t end) HWY_ATTR {
        if (s.reduce_row_length == 0) {
          std::fill_n(sums + 4 * part++, 4, 0.0);
          return;
        }
        WithFlags(
            [&](auto nesterov) HWY_ATTR {
              ForEachRowPart(s.reduce_row_length, begin, end,
                             [&](std::size_t, std::size_t lo, std::size_t hi) HWY_ATTR {
                               ProductSum grad_param, param_update;
                               SquareSum grad_sq, param_sq;
                               ForEachVector(lo, hi, [&](auto d, std::size_t i) HWY_ATTR {
                                 const HwyOps<decltype(d)> o{d};
                                 const auto p = b.param.Load(d, i);
                                 const auto g = o.Mul(b.Grad(d, i), o.Set(s.grad_mul));
                                 auto m = b.LoadState(d, kAdampExpAvg, i);
                                 auto v = b.LoadState(d, kAdampExpAvgSq, i);
                                 const auto u =
                                     AdampUpdate<decltype(nesterov)::value>(o, s, g, m, v);
                                 grad_param.Add(d, g, p, i - lo);
                                 grad_sq.Add(d, g, i - lo);
                                 param_sq.Add(d, p, i - lo);
                                 param_update.Add(d, p, u, i - lo);
                               });
                               double* out = sums + 4 * part++;
                               out[0] = grad_param.Total();
                               out[1] = grad_sq.Total();
                               out[2] = param_sq.Total();
                               out[3] = param_update.Total();
                             });
            },
            s.nesterov);
      });
}

void AdampChunks(const StepPlan<AdampScalars>& plan, std::size_t chunk_begin,
                 std::size_t chunk_end) {
  RunPlanChunks(
      plan, chunk_begin, chunk_end,
      [](const auto& b, const AdampScalars s, std::size_t begin, std::size_t end) HWY_ATTR {
        WithFlags(
            [&](auto nesterov, auto project, auto decay) HWY_ATTR {
              // One range of one projected row (its ‖p_r‖ + ε and Σ p̂·u), or of an unprojected
              // piece (both ignored).
              const auto range = [&](std::size_t lo, std::size_t hi, float norm_eps,
                                     float radial) HWY_ATTR {
                ForEachVector(lo, hi, [&](auto d, std::size_t i) HWY_ATTR {
                  const HwyOps<decltype(d)> o{d};
                  auto p = b.param.Load(d, i);
                  const auto g = o.Mul(b.Grad(d, i), o.Set(s.grad_mul));
                  auto m = b.LoadState(d, kAdampExpAvg, i);
                  auto v = b.LoadState(d, kAdampExpAvgSq, i);
                  auto u = AdampUpdate<decltype(nesterov)::value>(o, s, g, m, v);
                  if constexpr (decltype(project)::value)
                    u = AdampProject(o, p, u, norm_eps, radial);
                  AdampApply<decltype(decay)::value>(o, s, p, u);
                  b.param.Store(d, p, i);
                  b.StoreState(d, kAdampExpAvg, m, i);
                  b.StoreState(d, kAdampExpAvgSq, v, i);
                });
              };
              if constexpr (decltype(project)::value) {
                ForEachRowPart(s.project_row_length, begin, end,
                               [&](std::size_t row, std::size_t lo, std::size_t hi) HWY_ATTR {
                                 range(lo, hi, s.row_values[2 * row], s.row_values[2 * row + 1]);
                               });
              } else {
                range(begin, end, 1.0f, 0.0f);
              }
            },
            s.nesterov, s.project_row_length != 0, s.decay);
      });
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(AdampReduceChunk);
HWY_EXPORT(AdampChunks);
void RunAdampReduceChunk(const StepPlan<AdampScalars>& plan, std::size_t chunk, double* sums) {
  HWY_DYNAMIC_DISPATCH(AdampReduceChunk)(plan, chunk, sums);
}
void RunAdampChunks(const StepPlan<AdampScalars>& plan, std::size_t chunk_begin,
                    std::size_t chunk_end) {
  HWY_DYNAMIC_DISPATCH(AdampChunks)(plan, chunk_begin, chunk_end);
}
}  // namespace fusedopt
#endif
