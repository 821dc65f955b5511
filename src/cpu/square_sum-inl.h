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
#  include <utility>

#  include "hwy/highway.h"
#  include "src/core/grad_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The accumulators of each position of a full vector (see Accumulators) in registers, as f64
// vectors: none where vectors are scalable (sizeless types cannot be members) or of one lane,
// where the same calls do nothing.
template <bool kUse, std::size_t kPositions>
struct AccumulatorRegisters {
  template <class F>
  void At(std::size_t /*position*/, const F& /*f*/) {}
  void Load(const double* /*acc*/) {}
  void Store(double* /*acc*/) const {}
};
template <std::size_t kPositions>
struct AccumulatorRegisters<true, kPositions> {
  using D64 = hn::Repartition<double, hn::ScalableTag<float>>;

  // f(d64, lo, hi) on position p's registers, p known at compile time: they stay registers.
  template <class F>
  HWY_INLINE void At(std::size_t position, const F& f) {
    ForEachPosition([&](auto p) HWY_ATTR {
      if (position == p) f(D64(), lo[p], hi[p]);
    });
  }
  // Position p's accumulators are acc[p·2n, p·2n + 2n), n the lanes of an f64 vector.
  HWY_INLINE void Load(const double* acc) {
    ForEachPosition([&](auto p) HWY_ATTR {
      lo[p] = hn::Load(D64(), acc + 2 * hn::Lanes(D64()) * p);
      hi[p] = hn::Load(D64(), acc + 2 * hn::Lanes(D64()) * p + hn::Lanes(D64()));
    });
  }
  HWY_INLINE void Store(double* acc) const {
    ForEachPosition([&](auto p) HWY_ATTR {
      hn::Store(lo[p], D64(), acc + 2 * hn::Lanes(D64()) * p);
      hn::Store(hi[p], D64(), acc + 2 * hn::Lanes(D64()) * p + hn::Lanes(D64()));
    });
  }

  hn::Vec<D64> lo[kPositions];  // position p's lower half of lanes
  hn::Vec<D64> hi[kPositions];  // and its upper half

 private:
  // g(std::integral_constant<std::size_t, p>) for every position p.
  template <class G>
  HWY_INLINE static void ForEachPosition(const G& g) {
    [&]<std::size_t... kP>(std::index_sequence<kP...>) HWY_ATTR {
      (g(std::integral_constant<std::size_t, kP>()), ...);
    }
    (std::make_index_sequence<kPositions>());
  }
};

// The 16 accumulators of one sum. A full vector of N f32 lanes (ForEachVector's) at element k, a
// multiple of N, covers accumulators k mod 16 ... + N − 1, a "position" of the 16, held in
// registers as two f64 vectors. In memory, every add waited for the previous one's store to come
// back (a loop-carried store-to-load dependency), which held BertAdam's gradient-norm pass to a
// third of the memory bandwidth. A 1-lane vector (a tail) adds into the array instead: the
// registers are spilled to it first and reloaded at the next full vector, so every accumulator
// gets its additions in the same order as in memory.
class Accumulators {
  static constexpr std::size_t kLanes = hn::MaxLanes(hn::ScalableTag<float>());
  static constexpr bool kInRegisters = !HWY_HAVE_SCALABLE && kLanes >= 2;
  static constexpr std::size_t kPositions = kNormAccumulators / kLanes;
  static_assert(kNormAccumulators % kLanes == 0, "vectors must tile the accumulators");

 public:
  // f(d64, lo, hi) updates the accumulators of the vector of elements k, ... (lo: its lower half
  // of lanes, hi: its upper half, as f64 vectors; a 1-lane vector's hi is a copy, ignored).
  template <class DV, class F>
  HWY_INLINE void Update(DV dv, std::size_t k, const F& f) {
    constexpr std::size_t kVectorLanes = hn::MaxLanes(dv);
    if constexpr (kInRegisters && kVectorLanes == kLanes) {
      if (HWY_UNLIKELY(!in_registers_)) Load();
      regs_.At(k % kNormAccumulators / kLanes, f);
    } else if constexpr (kVectorLanes == 1) {
      if (in_registers_) Spill();
      const hn::CappedTag<double, 1> d1;
      double* acc = acc_ + k % kNormAccumulators;
      auto lo = hn::LoadU(d1, acc);
      auto hi = lo;
      f(d1, lo, hi);
      hn::StoreU(lo, d1, acc);
    } else {  // a full vector where registers are not used
      const hn::Repartition<double, DV> d64;
      double* acc = acc_ + k % kNormAccumulators;
      auto lo = hn::LoadU(d64, acc);
      auto hi = hn::LoadU(d64, acc + hn::Lanes(d64));
      f(d64, lo, hi);
      hn::StoreU(lo, d64, acc);
      hn::StoreU(hi, d64, acc + hn::Lanes(d64));
    }
  }

  // Fixed pairwise tree: 16 -> 8 -> 4 -> 2 -> 1.
  double Total() {
    if (in_registers_) Spill();
    for (std::size_t width = kNormAccumulators / 2; width >= 1; width /= 2) {
      for (std::size_t k = 0; k < width; ++k) acc_[k] += acc_[k + width];
    }
    return acc_[0];
  }

 private:
  HWY_INLINE void Load() {
    regs_.Load(acc_);
    in_registers_ = true;
  }
  HWY_INLINE void Spill() {
    regs_.Store(acc_);
    in_registers_ = false;
  }

  HWY_ALIGN double acc_[kNormAccumulators] = {};
  AccumulatorRegisters<kInRegisters, kPositions> regs_;
  bool in_registers_ = false;
};

// Half `half` (0: lower, 1: upper) of the f32 lanes `lanes` of a full vector, as f64 lanes.
template <class D64>
HWY_INLINE hn::Vec<D64> PromoteHalf(D64 d64, const float* lanes, std::size_t half) {
  const hn::Rebind<float, D64> d32;
  return hn::PromoteTo(d64, hn::LoadU(d32, lanes + half * hn::Lanes(d64)));
}

class SquareSum {
 public:
  // Adds the squares of x's lanes, the piece's elements k, k + 1, ...; k is a multiple of the
  // vector's lane count (ForEachVector's full vectors), or any index for a 1-lane vector (the
  // tail).
  template <class DF>
  HWY_INLINE void Add(DF df, hn::Vec<DF> x, std::size_t k) {
    if constexpr (hn::MaxLanes(df) == 1) {
      acc_.Update(df, k, [&](auto d1, auto& lo, auto& /*hi*/) HWY_ATTR {
        const auto v = hn::PromoteTo(d1, x);
        lo = hn::MulAdd(v, v, lo);
      });
    } else {
      HWY_ALIGN float xs[hn::MaxLanes(df)];
      hn::Store(x, df, xs);
      acc_.Update(df, k, [&](auto d64, auto& lo, auto& hi) HWY_ATTR {
        const auto a = PromoteHalf(d64, xs, 0);
        const auto b = PromoteHalf(d64, xs, 1);
        lo = hn::MulAdd(a, a, lo);
        hi = hn::MulAdd(b, b, hi);
      });
    }
  }
  double Total() { return acc_.Total(); }

 private:
  Accumulators acc_;
};

// ProductSum: Σx·y of two f32 vectors of one piece, in double, in SquareSum's order (element k of
// the piece into accumulator k mod 16, the same fixed tree). x·y of two f32 is exact in double too,
// so only the order of additions matters. AdamP's per-row Σg·p and Σp·u are built from these.
class ProductSum {
 public:
  template <class DF>
  HWY_INLINE void Add(DF df, hn::Vec<DF> x, hn::Vec<DF> y, std::size_t k) {
    if constexpr (hn::MaxLanes(df) == 1) {
      acc_.Update(df, k, [&](auto d1, auto& lo, auto& /*hi*/) HWY_ATTR {
        lo = hn::MulAdd(hn::PromoteTo(d1, x), hn::PromoteTo(d1, y), lo);
      });
    } else {
      HWY_ALIGN float xs[hn::MaxLanes(df)];
      HWY_ALIGN float ys[hn::MaxLanes(df)];
      hn::Store(x, df, xs);
      hn::Store(y, df, ys);
      acc_.Update(df, k, [&](auto d64, auto& lo, auto& hi) HWY_ATTR {
        lo = hn::MulAdd(PromoteHalf(d64, xs, 0), PromoteHalf(d64, ys, 0), lo);
        hi = hn::MulAdd(PromoteHalf(d64, xs, 1), PromoteHalf(d64, ys, 1), hi);
      });
    }
  }
  double Total() { return acc_.Total(); }

 private:
  Accumulators acc_;
};

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FOPT_CPU_SQUARE_SUM_INL_H_
