// SquareSum (and ProductSum, below): Σx² of the f32 values of one piece, in double, with the same
// additions on every SIMD target: element k of the piece goes into accumulator k mod 16
// (kNormAccumulators, as the gradient norm), and the 16 are combined by a fixed tree. x² of an f32
// is exact in double, so fma and mul + add agree and only the order of additions matters, which
// this fixes. The per-tensor norms of two-phase algorithms (LAMB's ‖p‖ and ‖u‖) are built from
// these. Per-target header: toggling include guard.

#if defined(FOPT_CPU_SQUARE_SUM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#  ifdef FOPT_CPU_SQUARE_SUM_INL_H_
#    undef FOPT_CPU_SQUARE_SUM_INL_H_
#  else
#    define FOPT_CPU_SQUARE_SUM_INL_H_
#  endif

#  include <cstddef>

#  include "hwy/highway.h"
#  include "src/core/grad_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

class SquareSum {
 public:
  // Adds the lanes of x, the piece's elements k, k + 1, ...; k is a multiple of the vector's
  // lane count (ForEachVector's full vectors), or any index for a 1-lane vector (the tail).
  template <class DF>
  HWY_INLINE void Add(DF df, hn::Vec<DF> x, std::size_t k) {
    constexpr std::size_t kLanes = hn::MaxLanes(df);
    if constexpr (kLanes == 1) {
      const double v = hn::GetLane(x);
      acc_[k % kNormAccumulators] += v * v;
    } else {
      static_assert(kNormAccumulators % kLanes == 0, "vectors must tile the accumulators");
      HWY_ALIGN float lanes[kLanes];
      hn::Store(x, df, lanes);
      const hn::Repartition<double, DF> d64;  // half as many lanes, twice as wide
      const hn::Rebind<float, decltype(d64)> d32;
      double* acc = acc_ + k % kNormAccumulators;
      for (std::size_t j = 0; j < kLanes; j += hn::Lanes(d64)) {
        const auto v = hn::PromoteTo(d64, hn::LoadU(d32, lanes + j));
        hn::StoreU(hn::MulAdd(v, v, hn::LoadU(d64, acc + j)), d64, acc + j);
      }
    }
  }

  // Fixed pairwise tree: 16 -> 8 -> 4 -> 2 -> 1.
  double Total() {
    for (std::size_t width = kNormAccumulators / 2; width >= 1; width /= 2) {
      for (std::size_t k = 0; k < width; ++k) acc_[k] += acc_[k + width];
    }
    return acc_[0];
  }

 private:
  HWY_ALIGN double acc_[kNormAccumulators] = {};
};

// ProductSum: Σx·y of two f32 vectors of one piece, in double, in SquareSum's order (element k of
// the piece into accumulator k mod 16, the same fixed tree). x·y of two f32 is exact in double too,
// so only the order of additions matters. AdamP's per-row Σg·p and Σp·u are built from these.
class ProductSum {
 public:
  template <class DF>
  HWY_INLINE void Add(DF df, hn::Vec<DF> x, hn::Vec<DF> y, std::size_t k) {
    constexpr std::size_t kLanes = hn::MaxLanes(df);
    if constexpr (kLanes == 1) {
      acc_[k % kNormAccumulators] +=
          static_cast<double>(hn::GetLane(x)) * static_cast<double>(hn::GetLane(y));
    } else {
      static_assert(kNormAccumulators % kLanes == 0, "vectors must tile the accumulators");
      HWY_ALIGN float xs[kLanes];
      HWY_ALIGN float ys[kLanes];
      hn::Store(x, df, xs);
      hn::Store(y, df, ys);
      const hn::Repartition<double, DF> d64;
      const hn::Rebind<float, decltype(d64)> d32;
      double* acc = acc_ + k % kNormAccumulators;
      for (std::size_t j = 0; j < kLanes; j += hn::Lanes(d64)) {
        const auto a = hn::PromoteTo(d64, hn::LoadU(d32, xs + j));
        const auto b = hn::PromoteTo(d64, hn::LoadU(d32, ys + j));
        hn::StoreU(hn::MulAdd(a, b, hn::LoadU(d64, acc + j)), d64, acc + j);
      }
    }
  }

  // Fixed pairwise tree: 16 -> 8 -> 4 -> 2 -> 1.
  double Total() {
    for (std::size_t width = kNormAccumulators / 2; width >= 1; width /= 2) {
      for (std::size_t k = 0; k < width; ++k) acc_[k] += acc_[k + width];
    }
    return acc_[0];
  }

 private:
  HWY_ALIGN double acc_[kNormAccumulators] = {};
};

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FOPT_CPU_SQUARE_SUM_INL_H_
