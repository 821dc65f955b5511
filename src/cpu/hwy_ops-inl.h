// HwyOps<D>: the arithmetic the *_math.h bodies use, forwarded to Highway for one vector type. The
// math is written against this interface only, so one body serves every SIMD target and the 1-lane
// tail. Per-target header: toggling include guard, re-included once per target by foreach_target.

#if defined(FOPT_CPU_HWY_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#  ifdef FOPT_CPU_HWY_OPS_INL_H_
#    undef FOPT_CPU_HWY_OPS_INL_H_
#  else
#    define FOPT_CPU_HWY_OPS_INL_H_
#  endif

#  include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D>
struct HwyOps {
  using V = hn::Vec<D>;
  D d;

  HWY_INLINE V Set(float x) const { return hn::Set(d, x); }
  HWY_INLINE V Add(V a, V b) const { return hn::Add(a, b); }
  HWY_INLINE V Sub(V a, V b) const { return hn::Sub(a, b); }
  HWY_INLINE V Mul(V a, V b) const { return hn::Mul(a, b); }
  HWY_INLINE V Div(V a, V b) const { return hn::Div(a, b); }
  // a·b + c, rounded once on FMA targets (AVX2 and up, NEON, SVE); mul then add elsewhere.
  HWY_INLINE V MulAdd(V a, V b, V c) const { return hn::MulAdd(a, b, c); }
  HWY_INLINE V Sqrt(V a) const { return hn::Sqrt(a); }
  // |a|: clears the sign bit (torch.abs; NaN stays NaN).
  HWY_INLINE V Abs(V a) const { return hn::Abs(a); }
  // NaN if either input is NaN, as torch.maximum (hn::Max returns one input or the other depending
  // on the target: maxps keeps the second, Highway's scalar fallback the non-NaN one).
  HWY_INLINE V Max(V a, V b) const {
    return hn::IfThenElse(hn::Or(hn::IsNaN(a), hn::IsNaN(b)), hn::Add(a, b), hn::Max(a, b));
  }
  // NaN if either input is NaN, as torch.minimum (and clamp_'s upper bound).
  HWY_INLINE V Min(V a, V b) const {
    return hn::IfThenElse(hn::Or(hn::IsNaN(a), hn::IsNaN(b)), hn::Add(a, b), hn::Min(a, b));
  }
  // Lane-wise a > b, a < b, a == b (false where either is NaN), for IfThenElse: torch's masked
  // fills `x[c.gt(t)] = v`.
  HWY_INLINE auto Gt(V a, V b) const { return hn::Gt(a, b); }
  HWY_INLINE auto Lt(V a, V b) const { return hn::Lt(a, b); }
  HWY_INLINE auto Eq(V a, V b) const { return hn::Eq(a, b); }
  // m ? a : b per lane.
  template <class M>
  HWY_INLINE V IfThenElse(M m, V a, V b) const {
    return hn::IfThenElse(m, a, b);
  }
  // +1, −1 or 0 as torch.sgn on CPU: 0 for ±0 and for NaN (neither compare holds).
  HWY_INLINE V Sign(V a) const {
    const V zero = hn::Zero(d);
    const V one = hn::Set(d, 1.0f);
    return hn::Sub(hn::IfThenElseZero(hn::Gt(a, zero), one),
                   hn::IfThenElseZero(hn::Lt(a, zero), one));
  }
};

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FOPT_CPU_HWY_OPS_INL_H_
