// Gradient passes (grad.h) per target, every dtype: the norm with its fixed reduction order, and
// the element-wise passes (check, scale, accumulate, clamp), each reporting non-finite input.

#include <cstddef>
#include <cstdint>

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

// Adds x² (kSquare) or |x| of x = f32(grad · scale), in double, element k of [begin, end) into
// acc[k mod 16]. Squares of f32 values are exact in double, so fma and mul+add agree and the order
// of additions alone fixes the result; it is the same on every target: vectors of N doubles cover
// accumulators k..k+N-1 of a 16-element block, and the tail uses 1-lane vectors.
template <bool kSquare, class G>
HWY_INLINE void SumPowers(const G* HWY_RESTRICT grad, float scale, std::size_t begin,
                          std::size_t end, double* HWY_RESTRICT acc) {
  const auto add = [&](auto d64, std::size_t i, double* a) HWY_ATTR {
    const hn::Rebind<float, decltype(d64)> d32;
    const auto x = hn::PromoteTo(d64, hn::Mul(Io<G>::Load(d32, grad + i), hn::Set(d32, scale)));
    const auto sum = hn::LoadU(d64, a);
    hn::StoreU(kSquare ? hn::MulAdd(x, x, sum) : hn::Add(hn::Abs(x), sum), d64, a);
  };
  const hn::ScalableTag<double> d64;
  constexpr std::size_t kLanes = hn::MaxLanes(d64);
  static_assert(kNormAccumulators % kLanes == 0, "vectors must tile the accumulators");
  std::size_t i = begin;
  for (; i + kNormAccumulators <= end; i += kNormAccumulators) {
    for (std::size_t k = 0; k < kNormAccumulators; k += kLanes) add(d64, i + k, acc + k);
  }
  for (std::size_t k = 0; i < end; ++i, ++k) add(hn::CappedTag<double, 1>(), i, acc + k);
}

// Largest |f32(grad · scale)| as bits: for non-negative floats the integer order is the float
// order, with Inf above every finite value and NaN above Inf. Max is exact, so any order works.
template <class G>
HWY_INLINE std::uint32_t MaxAbsBits(const G* HWY_RESTRICT grad, float scale, std::size_t begin,
                                    std::size_t end) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  auto max_bits = hn::Zero(di);
  auto max_bits1 = hn::Zero(hn::CappedTag<std::int32_t, 1>());
  ForEachVector(begin, end, [&](auto dv, std::size_t i) HWY_ATTR {
    const hn::RebindToSigned<decltype(dv)> dvi;
    const auto x = hn::Mul(Io<G>::Load(dv, grad + i), hn::Set(dv, scale));
    const auto bits = hn::And(hn::BitCast(dvi, x), hn::Set(dvi, 0x7FFFFFFF));
    if constexpr (hn::MaxLanes(dv) == 1) {
      max_bits1 = hn::Max(max_bits1, bits);
    } else {
      max_bits = hn::Max(max_bits, bits);
    }
  });
  const std::int32_t best =
      HWY_MAX(hn::GetLane(hn::MaxOfLanes(di, max_bits)), hn::GetLane(max_bits1));
  return static_cast<std::uint32_t>(best);
}

ChunkNorm GradChunkNorm(const ChunkPlan& plan, std::size_t chunk, NormType type) {
  ChunkNorm out;
  HWY_ALIGN double acc[kNormAccumulators] = {};
  plan.ForEachPiece(chunk, chunk + 1, [&](std::size_t s, std::size_t begin, std::size_t end) {
    const Segment& seg = plan.segments()[s];
    WithStorageType(seg.grad_dtype, [&](auto tag) HWY_ATTR {
      using G = typename decltype(tag)::type;
      const auto* grad = static_cast<const G*>(seg.grad);
      switch (type) {
        case NormType::kL2:
          return SumPowers<true>(grad, seg.grad_scale, begin, end, acc);
        case NormType::kL1:
          return SumPowers<false>(grad, seg.grad_scale, begin, end, acc);
        case NormType::kInf:
          out.max_abs_bits =
              HWY_MAX(out.max_abs_bits, MaxAbsBits(grad, seg.grad_scale, begin, end));
          return;
      }
    });
  });
  // Fixed pairwise tree: 16 -> 8 -> 4 -> 2 -> 1.
  for (std::size_t width = kNormAccumulators / 2; width >= 1; width /= 2) {
    for (std::size_t k = 0; k < width; ++k) acc[k] += acc[k + width];
  }
  out.sum = acc[0];
  return out;
}

// x − x is 0 for finite x and NaN for ±Inf and NaN, so one running sum of it turns NaN exactly
// when some element is not finite: no compares or mask logic in the loop.
template <GradOp kOp, class G, class P>
HWY_INLINE bool GradPiece(const G* grad, P* out, float scale, float value, std::size_t begin,
                          std::size_t end) {
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
    if constexpr (kOp == GradOp::kScale) {
      Io<P>::Store(dv, hn::Mul(g, hn::Set(dv, scale)), out + i);
    } else if constexpr (kOp == GradOp::kAccumulate) {
      // Product and sum rounded separately: the same bits on FMA and non-FMA targets.
      const auto sum = hn::Add(Io<P>::Load(dv, out + i), hn::Mul(g, hn::Set(dv, scale)));
      Io<P>::Store(dv, sum, out + i);
    } else if constexpr (kOp == GradOp::kClamp) {
      const auto clamped = hn::Min(hn::Max(g, hn::Set(dv, -value)), hn::Set(dv, value));
      Io<P>::Store(dv, hn::IfThenElse(hn::IsNaN(g), g, clamped), out + i);  // NaN stays NaN
    }
  });
  const float total = hn::GetLane(hn::SumOfLanes(d, poison)) + hn::GetLane(poison1);
  return total != total;
}

bool GradChunks(const ChunkPlan& plan, std::size_t chunk_begin, std::size_t chunk_end, GradOp op,
                float value) {
  bool found = false;
  plan.ForEachPiece(chunk_begin, chunk_end, [&](std::size_t s, std::size_t begin, std::size_t end) {
    const Segment& seg = plan.segments()[s];
    WithStorageType(seg.grad_dtype, [&](auto grad_tag) HWY_ATTR {
      using G = typename decltype(grad_tag)::type;
      const auto* grad = static_cast<const G*>(seg.grad);
      if (op == GradOp::kCheck) {
        found |= GradPiece<GradOp::kCheck, G, G>(grad, nullptr, 0.0f, 0.0f, begin, end);
        return;
      }
      if (op == GradOp::kAccumulate) {
        found |= GradPiece<GradOp::kAccumulate>(grad, static_cast<float*>(seg.param),
                                                seg.grad_scale, value, begin, end);
        return;
      }
      WithStorageType(seg.param_dtype, [&](auto out_tag) HWY_ATTR {
        using P = typename decltype(out_tag)::type;
        auto* out = static_cast<P*>(seg.param);
        found |= op == GradOp::kScale
                     ? GradPiece<GradOp::kScale>(grad, out, seg.grad_scale, value, begin, end)
                     : GradPiece<GradOp::kClamp>(grad, out, seg.grad_scale, value, begin, end);
      });
    });
  });
  return found;
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(GradChunkNorm);
HWY_EXPORT(GradChunks);

ChunkNorm RunGradChunkNorm(const ChunkPlan& plan, std::size_t chunk, NormType type) {
  return HWY_DYNAMIC_DISPATCH(GradChunkNorm)(plan, chunk, type);
}
bool RunGradChunks(const ChunkPlan& plan, std::size_t chunk_begin, std::size_t chunk_end, GradOp op,
                   float value) {
  return HWY_DYNAMIC_DISPATCH(GradChunks)(plan, chunk_begin, chunk_end, op, value);
}
}  // namespace fusedopt
#endif
