// Gradient passes (grad.h): the non-finite check, optionally fused with multiplying the gradient
// by a scale. Per target, every dtype.

#include <cstddef>

#include "src/core/grad_kernels.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/grad_pass.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// x − x is 0 for finite x and NaN for ±Inf and NaN, so one running sum of it turns NaN exactly
// when some element is not finite: no compares or mask logic in the loop.
template <bool kScale, class G>
HWY_INLINE bool NonFinitePiece(G* grad, float scale, std::size_t begin, std::size_t end) {
  const hn::ScalableTag<float> d;
  auto poison = hn::Zero(d);
  auto poison1 = hn::Zero(hn::CappedTag<float, 1>());
  ForEachVector(begin, end, [&](auto dv, std::size_t i) HWY_ATTR {
    const auto g = Io<G>::Load(dv, grad + i);
    if constexpr (hn::MaxLanes(dv) == 1) {
      poison1 = hn::Add(poison1, hn::Sub(g, g));
    } else {
      poison = hn::Add(poison, hn::Sub(g, g));
    }
    if constexpr (kScale) Io<G>::Store(dv, hn::Mul(g, hn::Set(dv, scale)), grad + i);
  });
  const float total = hn::GetLane(hn::SumOfLanes(d, poison)) + hn::GetLane(poison1);
  return total != total;
}

bool GradChunksNonFinite(const ChunkPlan& plan, std::size_t chunk_begin, std::size_t chunk_end,
                         const float* scale) {
  bool found = false;
  plan.ForEachPiece(chunk_begin, chunk_end, [&](std::size_t s, std::size_t begin, std::size_t end) {
    const Segment& seg = plan.segments()[s];
    WithStorageType(seg.grad_dtype, [&](auto tag) HWY_ATTR {
      using G = typename decltype(tag)::type;
      auto* grad = static_cast<G*>(seg.param);  // the pass reads (and may write) through `param`
      found |= scale != nullptr ? NonFinitePiece<true>(grad, *scale, begin, end)
                                : NonFinitePiece<false>(grad, 0.0f, begin, end);
    });
  });
  return found;
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(GradChunksNonFinite);
bool RunGradChunksNonFinite(const ChunkPlan& plan, std::size_t chunk_begin, std::size_t chunk_end,
                            const float* scale) {
  return HWY_DYNAMIC_DISPATCH(GradChunksNonFinite)(plan, chunk_begin, chunk_end, scale);
}
}  // namespace fusedopt
#endif
