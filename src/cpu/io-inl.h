// Io<T>: loads any storage type as f32 vectors and stores f32 vectors back with our own
// round-to-nearest-even (Highway 1.0.3's bf16 demotion truncates, and its f16 demotion truncates
// off F16C; on F16C targets, f16 stores use the instruction), or with stochastic rounding driven by
// per-lane noise. The bit-level rules are those of
// include/fusedopt/dtype.h and include/fusedopt/rounding.h; tests compare them on every target.
// Per-target header: toggling include guard.

#if defined(FOPT_CPU_IO_INL_H_) == defined(HWY_TARGET_TOGGLE)
#  ifdef FOPT_CPU_IO_INL_H_
#    undef FOPT_CPU_IO_INL_H_
#  else
#    define FOPT_CPU_IO_INL_H_
#  endif

#  include <cstddef>
#  include <cstdint>
#  include <type_traits>

#  include "fusedopt/dtype.h"
#  include "fusedopt/rounding.h"
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

#  if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// AVX-512BW moves 16 bf16 values in or out of the top halves of 16 f32 lanes with one word permute,
// where the portable code needs a widening load and a shift, or a shift, a saturating pack and a
// lane permute: in a pure-bf16 AdamW step those were a third of the ops (docs/numerics.md).
template <class DF>
inline constexpr bool kBf16WordPermutes = hn::MaxLanes(DF()) == 16;
#  endif

template <>
struct Io<hwy::bfloat16_t> {
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const hwy::bfloat16_t* p) {
#  if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if constexpr (kBf16WordPermutes<DF>) {
      // Word k goes to word 2k + 1, the top half of lane k; the bottom halves are zeroed.
      const __m512i top_halves =
          _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0, 5, 0,
                           4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
      const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      return hn::Vec<DF>{_mm512_castsi512_ps(
          _mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, top_halves, _mm512_castsi256_si512(words)))};
    }
#  endif
    const hn::RebindToUnsigned<DF> du;
    const hn::Rebind<std::uint16_t, DF> du16;
    const auto bits = hn::PromoteTo(du, hn::LoadU(du16, reinterpret_cast<const std::uint16_t*>(p)));
    return hn::BitCast(df, hn::ShiftLeft<16>(bits));  // bf16 is the top half of an f32
  }
  template <class DF>
  static HWY_INLINE void Store(DF df, hn::Vec<DF> v, hwy::bfloat16_t* p) {
    StoreRounded<false>(df, v, p, hn::Zero(hn::RebindToUnsigned<DF>()));
  }
  // Stochastic rounding with one 32-bit noise word per lane (rounding.h: F32ToBF16Stochastic).
  template <class DF>
  static HWY_INLINE void StoreStochastic(DF df, hn::Vec<DF> v, hwy::bfloat16_t* p,
                                         hn::Vec<hn::RebindToUnsigned<DF>> noise) {
    StoreRounded<true>(df, v, p, noise);
  }

 private:
  template <bool kStochastic, class DF>
  static HWY_INLINE void StoreRounded(DF df, hn::Vec<DF> v, hwy::bfloat16_t* p,
                                      hn::Vec<hn::RebindToUnsigned<DF>> noise) {
    const hn::RebindToUnsigned<DF> du;
    const auto u = hn::BitCast(du, v);
    hn::Vec<decltype(du)> bias;
    if constexpr (kStochastic) {
      // Stochastic: add 16 bits of noise, so the kept half goes up with probability low half/2^16.
      bias = hn::And(noise, hn::Set(du, 0xFFFF));
    } else {
      // Round to nearest even: add 0x7FFF plus the lsb of the kept half.
      const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1));
      bias = hn::Add(hn::Set(du, 0x7FFF), lsb);
    }
    // Then drop the low half. A NaN would not survive that: keep it quiet, with its sign.
    const auto nan = hn::RebindMask(du, hn::IsNaN(v));
#  if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if constexpr (kBf16WordPermutes<DF>) {
      // The top halves of the rounded lanes (of u with the quiet bit set for a NaN), gathered into
      // the low 256 bits by one word permute: word 2k + 1 to word k.
      const auto rounded =
          hn::IfThenElse(nan, hn::Or(u, hn::Set(du, 0x00400000u)), hn::Add(u, bias));
      const __m512i odd_words =
          _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 31, 29, 27,
                           25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                          _mm512_castsi512_si256(_mm512_permutexvar_epi16(odd_words, rounded.raw)));
      return;
    }
#  endif
    const auto rounded = hn::ShiftRight<16>(hn::Add(u, bias));
    const auto quiet_nan = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x0040));
    StoreLow16(df, hn::IfThenElse(nan, quiet_nan, rounded), reinterpret_cast<std::uint16_t*>(p));
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
#  if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    // F16C rounds to nearest even exactly as StoreRounded does, subnormals and overflow to Inf
    // included, but keeps a NaN's payload where dtype.h's rule is one quiet NaN with its sign. So a
    // NaN becomes f32's quiet NaN with its sign first, which converts to 0x7E00 | sign.
    const hn::RebindToUnsigned<DF> du;
    const hn::Rebind<hwy::float16_t, DF> df16;
    const auto sign = hn::And(hn::BitCast(du, v), hn::Set(du, 0x80000000u));
    const auto quiet_nan = hn::BitCast(df, hn::Or(sign, hn::Set(du, 0x7FC00000u)));
    hn::StoreU(hn::DemoteTo(df16, hn::IfThenElse(hn::IsNaN(v), quiet_nan, v)), df16, p);
#  else
    StoreRounded<false>(df, v, p, hn::Zero(hn::RebindToUnsigned<DF>()));
#  endif
  }
  // Stochastic rounding in the normal range with one 32-bit noise word per lane; subnormal results
  // round to nearest even (rounding.h: F32ToF16Stochastic).
  template <class DF>
  static HWY_INLINE void StoreStochastic(DF df, hn::Vec<DF> v, hwy::float16_t* p,
                                         hn::Vec<hn::RebindToUnsigned<DF>> noise) {
    StoreRounded<true>(df, v, p, noise);
  }

 private:
  template <bool kStochastic, class DF>
  static HWY_INLINE void StoreRounded(DF df, hn::Vec<DF> v, hwy::float16_t* p,
                                      hn::Vec<hn::RebindToUnsigned<DF>> noise) {
    const hn::RebindToUnsigned<DF> du;
    const hn::RebindToSigned<DF> di;
    const auto u = hn::BitCast(du, v);
    const auto sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000));
    const auto abs_bits = hn::And(u, hn::Set(du, 0x7FFFFFFF));
    const auto abs_signed = hn::BitCast(di, abs_bits);  // < 2^31: signed compares are safe
    // Normal range: rebias the exponent and round the 13 dropped mantissa bits, to nearest even
    // (bias 0x0FFF plus the lsb of the kept bits) or stochastically (13 bits of noise).
    hn::Vec<decltype(du)> bias;
    if constexpr (kStochastic) {
      bias = hn::And(noise, hn::Set(du, 0x1FFF));
    } else {
      const auto lsb = hn::And(hn::ShiftRight<13>(abs_bits), hn::Set(du, 1));
      bias = hn::Add(hn::Set(du, 0x0FFF), lsb);
    }
    const auto normal =
        hn::ShiftRight<13>(hn::Add(hn::Sub(abs_bits, hn::Set(du, 0x38000000)), bias));
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

// RoundingMix32 (rounding.h) in every 32-bit lane.
template <class DU>
HWY_INLINE hn::Vec<DU> RoundingMix32Lanes(DU du, hn::Vec<DU> x) {
  x = hn::Xor(x, hn::ShiftRight<16>(x));
  x = hn::Mul(x, hn::Set(du, 0x7FEB352Du));
  x = hn::Xor(x, hn::ShiftRight<15>(x));
  x = hn::Mul(x, hn::Set(du, 0x846CA68Bu));
  return hn::Xor(x, hn::ShiftRight<16>(x));
}

// The rounding noise of one buffer of one piece of a segment: lane j of Noise(du, i) is
// RoundingNoise(seed, step, global_offset + i + j, stream) (rounding.h). The keys of the two high
// index words a piece can touch (it holds at most kGrainElements elements) are computed once, so
// the element loop runs only the 32-bit mixer.
class RoundingNoiseGen {
 public:
  // first_local: the segment-local index of the piece's first element.
  RoundingNoiseGen(const Segment& s, std::uint32_t stream, std::size_t first_local)
      : offset_(s.global_offset),
        hi_(static_cast<std::uint32_t>((s.global_offset + first_local) >> 32)),
        key_(RoundingKey(s.rounding_seed, NoiseStep(s), stream, hi_)),
        key_next_(RoundingKey(s.rounding_seed, NoiseStep(s), stream, hi_ + 1)) {}

  // Noise of the elements at segment-local indices i, i + 1, ... (one per lane of du).
  template <class DU>
  HWY_INLINE hn::Vec<DU> Noise(DU du, std::size_t i) const {
    const std::uint64_t index = offset_ + i;
    const auto lo = static_cast<std::uint32_t>(index);
    const auto lanes_lo = hn::Add(hn::Set(du, lo), hn::Iota(du, 0));  // wraps modulo 2^32
    auto key = hn::Set(du, static_cast<std::uint32_t>(index >> 32) == hi_ ? key_ : key_next_);
    if (HWY_UNLIKELY(std::uint64_t{lo} + hn::Lanes(du) > (std::uint64_t{1} << 32))) {
      // The vector straddles a multiple of 2^32: its wrapped lanes (lo + j < lo as unsigned,
      // compared as signed after flipping the top bit) belong to the next high word.
      const hn::RebindToSigned<DU> di;
      const auto flip = hn::Set(du, 0x80000000u);
      const auto wrapped = hn::Lt(hn::BitCast(di, hn::Xor(lanes_lo, flip)),
                                  hn::BitCast(di, hn::Xor(hn::Set(du, lo), flip)));
      key = hn::IfThenElse(hn::RebindMask(du, wrapped), hn::Set(du, key_next_), key);
    }
    return RoundingMix32Lanes(du, hn::Xor(lanes_lo, key));
  }

 private:
  std::uint64_t offset_;
  std::uint32_t hi_;        // high word of the piece's first global index
  std::uint32_t key_;       // RoundingKey for hi_
  std::uint32_t key_next_;  // and for hi_ + 1
};

// Stands for a RoundingNoiseGen where rounding is to nearest even: no storage, no code.
struct NoRoundingNoise {
  NoRoundingNoise(const Segment& /*s*/, std::uint32_t /*stream*/, std::size_t /*first_local*/) {}
};

template <bool kStochastic>
using NoiseGenFor = std::conditional_t<kStochastic, RoundingNoiseGen, NoRoundingNoise>;

// The storage type of a buffer known only at run time: its loads and stores switch on the dtype, a
// well-predicted branch per vector. The loops of rare dtype combinations read and write through it,
// so that they are one loop per kernel and mode rather than one per combination
// (loop-inl.h: WithSegmentBuffers).
struct AnyStorage {};

// A buffer of storage type T, or AnyStorage. Gradients are buffers too: they are only ever loaded.
template <class T>
struct Buffer {
  T* data;
  Buffer(const void* p, DType /*dtype*/) : data(static_cast<T*>(const_cast<void*>(p))) {}
  template <class DF>
  HWY_INLINE hn::Vec<DF> Load(DF df, std::size_t i) const {
    return Io<T>::Load(df, data + i);
  }
  template <class DF>
  HWY_INLINE void Store(DF df, hn::Vec<DF> v, std::size_t i) const {
    Io<T>::Store(df, v, data + i);
  }
  template <class DF>
  HWY_INLINE void StoreStochastic(DF df, hn::Vec<DF> v, std::size_t i,
                                  hn::Vec<hn::RebindToUnsigned<DF>> noise) const {
    if constexpr (std::is_same_v<T, float>) {
      Io<float>::Store(df, v, data + i);  // an f32 store is exact: it has nothing to round
    } else {
      Io<T>::StoreStochastic(df, v, data + i, noise);
    }
  }
};

template <>
struct Buffer<AnyStorage> {
  void* data;
  DType dtype;
  Buffer(const void* p, DType t) : data(const_cast<void*>(p)), dtype(t) {}
  template <class DF>
  HWY_INLINE hn::Vec<DF> Load(DF df, std::size_t i) const {
    return Typed([&](auto b) HWY_ATTR { return b.Load(df, i); });
  }
  template <class DF>
  HWY_INLINE void Store(DF df, hn::Vec<DF> v, std::size_t i) const {
    Typed([&](auto b) HWY_ATTR { b.Store(df, v, i); });
  }
  template <class DF>
  HWY_INLINE void StoreStochastic(DF df, hn::Vec<DF> v, std::size_t i,
                                  hn::Vec<hn::RebindToUnsigned<DF>> noise) const {
    Typed([&](auto b) HWY_ATTR { b.StoreStochastic(df, v, i, noise); });
  }

 private:
  // Returns f(Buffer<T>) with T the storage type of dtype.
  template <class F>
  HWY_INLINE auto Typed(const F& f) const {
    switch (dtype) {
      case DType::kF16:
        return f(Buffer<hwy::float16_t>(data, dtype));
      case DType::kBF16:
        return f(Buffer<hwy::bfloat16_t>(data, dtype));
      case DType::kF32:
      case DType::kQ8:  // 8-bit states run as f32 parts (loop-inl.h: RunQuantizedPiece)
        break;
    }
    return f(Buffer<float>(data, dtype));
  }
};

// A parameter as the update sees it: the f32 master copy when there is one (the 16-bit param then
// receives its rounding to nearest even), else the param itself. kStochastic: a 16-bit param
// without master is rounded stochastically.
template <class P, bool kStochastic = false>
struct ParamIo {
  static constexpr bool kRoundStochastically = kStochastic && !std::is_same_v<P, float>;

  Buffer<P> param;
  float* master;
  [[no_unique_address]] NoiseGenFor<kRoundStochastically> noise;

  template <class DF>
  HWY_INLINE hn::Vec<DF> Load(DF df, std::size_t i) const {
    return master != nullptr ? Io<float>::Load(df, master + i) : param.Load(df, i);
  }
  template <class DF>
  HWY_INLINE void Store(DF df, hn::Vec<DF> v, std::size_t i) const {
    if constexpr (kRoundStochastically) {
      if (master == nullptr) {
        param.StoreStochastic(df, v, i, noise.Noise(hn::RebindToUnsigned<DF>(), i));
        return;
      }
    }
    if (master != nullptr) Io<float>::Store(df, v, master + i);
    param.Store(df, v, i);
  }
};

// A segment's buffers with their storage types: everything a kernel loads and stores, as f32
// vectors. P, G and S may be AnyStorage. kStochastic: 16-bit stores of the param (without master)
// and of the states round stochastically, with noise keyed on the segment's seed, step and global
// indices from `first_local` (the segment-local index of the piece's first element) on.
template <class P, class G, class S, bool kStochastic = false>
struct SegmentBuffers {
  static constexpr bool kStatesStochastic = kStochastic && !std::is_same_v<S, float>;
  // The same buffers with every store rounded to nearest even.
  using RoundingToNearest = SegmentBuffers<P, G, S>;

  ParamIo<P, kStochastic> param;
  Buffer<G> grad;
  Buffer<S> state[kMaxStates];
  [[no_unique_address]] NoiseGenFor<kStatesStochastic> state_noise[kMaxStates];

  explicit SegmentBuffers(const Segment& s, std::size_t first_local = 0)
      : param{{s.param, s.param_dtype}, s.master, {s, kRoundingStreamParam, first_local}},
        grad(s.grad, s.grad_dtype),
        state{
            {s.state[0], s.state_dtype}, {s.state[1], s.state_dtype}, {s.state[2], s.state_dtype}},
        state_noise{{s, RoundingStreamState(0), first_local},
                    {s, RoundingStreamState(1), first_local},
                    {s, RoundingStreamState(2), first_local}} {}

  template <class DF>
  HWY_INLINE hn::Vec<DF> Grad(DF df, std::size_t i) const {
    return grad.Load(df, i);
  }
  template <class DF>
  HWY_INLINE hn::Vec<DF> LoadState(DF df, int slot, std::size_t i) const {
    return state[slot].Load(df, i);
  }
  template <class DF>
  HWY_INLINE void StoreState(DF df, int slot, hn::Vec<DF> v, std::size_t i) const {
    if constexpr (kStatesStochastic) {
      state[slot].StoreStochastic(df, v, i, state_noise[slot].Noise(hn::RebindToUnsigned<DF>(), i));
    } else {
      state[slot].Store(df, v, i);
    }
  }
};

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FOPT_CPU_IO_INL_H_
