// Io<T>: loads any storage type as f32 vectors and stores f32 vectors back with our own
// round-to-nearest-even (Highway 1.0.3's bf16 demotion truncates, and its f16 demotion truncates
// off F16C). The bit-level rules are those of include/fusedopt/dtype.h; tests compare the two on
// every target. Per-target header: toggling include guard.

#if defined(FOPT_CPU_IO_INL_H_) == defined(HWY_TARGET_TOGGLE)
#  ifdef FOPT_CPU_IO_INL_H_
#    undef FOPT_CPU_IO_INL_H_
#  else
#    define FOPT_CPU_IO_INL_H_
#  endif

#  include <cstdint>

#  include "fusedopt/step.h"
#  include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class T>
struct Io;

template <>
struct Io<float> {
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const float* p) {
    return hn::LoadU(df, p);
  }
  template <class DF>
  static HWY_INLINE void Store(DF df, hn::Vec<DF> v, float* p) {
    hn::StoreU(v, df, p);
  }
};

// The saturating i32 -> u16 demotion is exact here: every value already fits in 16 bits.
template <class DF>
HWY_INLINE void StoreLow16(DF /*df*/, hn::Vec<hn::RebindToUnsigned<DF>> bits, std::uint16_t* p) {
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<std::uint16_t, DF> du16;
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, bits)), du16, p);
}

template <>
struct Io<hwy::bfloat16_t> {
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const hwy::bfloat16_t* p) {
    const hn::RebindToUnsigned<DF> du;
    const hn::Rebind<std::uint16_t, DF> du16;
    const auto bits = hn::PromoteTo(du, hn::LoadU(du16, reinterpret_cast<const std::uint16_t*>(p)));
    return hn::BitCast(df, hn::ShiftLeft<16>(bits));  // bf16 is the top half of an f32
  }
  template <class DF>
  static HWY_INLINE void Store(DF df, hn::Vec<DF> v, hwy::bfloat16_t* p) {
    const hn::RebindToUnsigned<DF> du;
    const auto u = hn::BitCast(du, v);
    // Round to nearest even: add 0x7FFF plus the lsb of the kept half, then drop the low half.
    const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1));
    const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7FFF), lsb)));
    const auto quiet_nan = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x0040));
    const auto bits = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet_nan, rounded);
    StoreLow16(df, bits, reinterpret_cast<std::uint16_t*>(p));
  }
};

template <>
struct Io<hwy::float16_t> {
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const hwy::float16_t* p) {
#  if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(df, hn::LoadU(df16, p));  // F16C: exact, Inf/NaN/subnormals included
#  else
    // Highway 1.0.3 emulates the promotion without Inf/NaN (65536 comes out), so widen by hand.
    const hn::RebindToUnsigned<DF> du;
    const hn::RebindToSigned<DF> di;
    const hn::Rebind<std::uint16_t, DF> du16;
    const auto h = hn::PromoteTo(du, hn::LoadU(du16, reinterpret_cast<const std::uint16_t*>(p)));
    const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000)));
    const auto magnitude = hn::And(h, hn::Set(du, 0x7FFF));
    const auto mag_signed = hn::BitCast(di, magnitude);
    // Normal: rebias the exponent by 127 - 15. Inf/NaN: all-ones exponent, payload kept.
    const auto normal = hn::Add(hn::ShiftLeft<13>(magnitude), hn::Set(du, 0x38000000));
    const auto inf_nan = hn::Or(hn::ShiftLeft<13>(magnitude), hn::Set(du, 0x7F800000));
    // Subnormal or zero: mantissa · 2^-24, exact in f32.
    const auto subnormal = hn::BitCast(
        du, hn::Mul(hn::ConvertTo(df, mag_signed), hn::Set(df, 5.9604644775390625e-8f)));
    auto bits = hn::IfThenElse(hn::RebindMask(du, hn::Lt(mag_signed, hn::Set(di, 0x0400))),
                               subnormal, normal);
    bits =
        hn::IfThenElse(hn::RebindMask(du, hn::Gt(mag_signed, hn::Set(di, 0x7BFF))), inf_nan, bits);
    return hn::BitCast(df, hn::Or(sign, bits));
#  endif
  }
  template <class DF>
  static HWY_INLINE void Store(DF df, hn::Vec<DF> v, hwy::float16_t* p) {
    const hn::RebindToUnsigned<DF> du;
    const hn::RebindToSigned<DF> di;
    const auto u = hn::BitCast(du, v);
    const auto sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000));
    const auto abs_bits = hn::And(u, hn::Set(du, 0x7FFFFFFF));
    const auto abs_signed = hn::BitCast(di, abs_bits);  // < 2^31: signed compares are safe
    // Normal range: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
    const auto lsb = hn::And(hn::ShiftRight<13>(abs_bits), hn::Set(du, 1));
    const auto normal = hn::ShiftRight<13>(
        hn::Add(hn::Sub(abs_bits, hn::Set(du, 0x38000000)), hn::Add(hn::Set(du, 0x0FFF), lsb)));
    // Subnormal or zero: |v| + 0.5 makes the FPU round to a multiple of 2^-24 (nearest even).
    const auto sum = hn::Add(hn::BitCast(df, abs_bits), hn::Set(df, 0.5f));
    const auto subnormal = hn::Sub(hn::BitCast(du, sum), hn::Set(du, 0x3F000000));
    auto h = hn::IfThenElse(hn::RebindMask(du, hn::Lt(abs_signed, hn::Set(di, 0x38800000))),
                            subnormal, normal);
    h = hn::IfThenElse(hn::RebindMask(du, hn::Gt(abs_signed, hn::Set(di, 0x477FFFFF))),
                       hn::Set(du, 0x7C00), h);  // >= 65536: Inf
    h = hn::IfThenElse(hn::RebindMask(du, hn::Gt(abs_signed, hn::Set(di, 0x7F800000))),
                       hn::Set(du, 0x7E00), h);  // NaN
    StoreLow16(df, hn::Or(sign, h), reinterpret_cast<std::uint16_t*>(p));
  }
};

// A parameter as the update sees it: the f32 master copy when there is one (the 16-bit param then
// receives its rounding), else the param itself.
template <class P>
struct ParamIo {
  P* param;
  float* master;

  template <class DF>
  HWY_INLINE hn::Vec<DF> Load(DF df, std::size_t i) const {
    return master != nullptr ? Io<float>::Load(df, master + i) : Io<P>::Load(df, param + i);
  }
  template <class DF>
  HWY_INLINE void Store(DF df, hn::Vec<DF> v, std::size_t i) const {
    if (master != nullptr) Io<float>::Store(df, v, master + i);
    Io<P>::Store(df, v, param + i);
  }
};

// A segment's buffers with their storage types: everything a kernel loads and stores, as f32
// vectors.
template <class P, class G, class S>
struct SegmentBuffers {
  ParamIo<P> param;
  const G* grad;
  S* state[kMaxStates];

  explicit SegmentBuffers(const Segment& s)
      : param{static_cast<P*>(s.param), s.master},
        grad(static_cast<const G*>(s.grad)),
        state{static_cast<S*>(s.state[0]), static_cast<S*>(s.state[1]),
              static_cast<S*>(s.state[2])} {}

  template <class DF>
  HWY_INLINE hn::Vec<DF> Grad(DF df, std::size_t i) const {
    return Io<G>::Load(df, grad + i);
  }
  template <class DF>
  HWY_INLINE hn::Vec<DF> LoadState(DF df, int slot, std::size_t i) const {
    return Io<S>::Load(df, state[slot] + i);
  }
  template <class DF>
  HWY_INLINE void StoreState(DF df, int slot, hn::Vec<DF> v, std::size_t i) const {
    Io<S>::Store(df, v, state[slot] + i);
  }
};

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FOPT_CPU_IO_INL_H_
