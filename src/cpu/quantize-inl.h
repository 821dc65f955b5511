// One block of an 8-bit state (include/fusedopt/quantize.h), vectorized: codes to f32 before the
// update, f32 to codes after it. Bit for bit what src/core/quantize.cc's Quantize and Dequantize
// compute on every target (tests compare them).
// Per-target header: toggling include guard.

#if defined(FOPT_CPU_QUANTIZE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#  ifdef FOPT_CPU_QUANTIZE_INL_H_
#    undef FOPT_CPU_QUANTIZE_INL_H_
#  else
#    define FOPT_CPU_QUANTIZE_INL_H_
#  endif

#  include <algorithm>
#  include <array>
#  include <bit>
#  include <cmath>
#  include <cstddef>
#  include <cstdint>
#  include <limits>
#  include <type_traits>

#  include "fusedopt/quantize.h"
#  include "hwy/highway.h"
#  include "src/core/quantize_tables.h"
#  include "src/cpu/quantize_blocks.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Calls body(d, i) for full f32 vectors over [0, n), then with a 1-lane tag for the rest.
template <class Body>
HWY_INLINE void ForEachBlockVector(std::size_t n, const Body& body) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) body(d, i);
  const hn::CappedTag<float, 1> d1;
  for (; i < n; ++i) body(d1, i);
}

#  if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// AVX-512 keeps the whole map in 16 registers and reads it with two-table permutes (32 entries
// each, the right one picked by bits 5-7 of the code): 2.7x faster than a 16-lane gather
// (measured: 0.29 vs 0.77 ns per value on AMD Zen 4), for the same values.
struct MapLookup {
  __m512 table[16];
  explicit MapLookup(const QuantTables& t) {
    for (int k = 0; k < 16; ++k) table[k] = _mm512_load_ps(t.map.data() + 16 * k);
  }
  HWY_INLINE __m512 operator()(__m512i code) const {
    __m512 part[8];
    for (int k = 0; k < 8; ++k) {
      part[k] = _mm512_permutex2var_ps(table[2 * k], code, table[2 * k + 1]);
    }
    const __mmask16 bit5 = _mm512_test_epi32_mask(code, _mm512_set1_epi32(32));
    const __mmask16 bit6 = _mm512_test_epi32_mask(code, _mm512_set1_epi32(64));
    const __mmask16 bit7 = _mm512_test_epi32_mask(code, _mm512_set1_epi32(128));
    for (int k = 0; k < 4; ++k) part[k] = _mm512_mask_blend_ps(bit5, part[2 * k], part[2 * k + 1]);
    for (int k = 0; k < 2; ++k) part[k] = _mm512_mask_blend_ps(bit6, part[2 * k], part[2 * k + 1]);
    return _mm512_mask_blend_ps(bit7, part[0], part[1]);
  }
};
#  endif

#  if HWY_TARGET == HWY_AVX3_DL
// AVX-512 VBMI looks up 64 codes at once, a byte of each value at a time: each byte of the map is
// a 256-byte table in four registers, read with two 128-entry byte permutes and a blend on the
// code's top bit; two rounds of unpacks then put the four bytes of each value together. 3.4x
// faster than MapLookup per value (measured: 0.088 vs 0.30 ns on AMD Zen 5), for the same bits.
struct ByteMapLookup {
  // The codes' order that the unpacks' lane-local interleave puts back: they interleave within
  // 128-bit lanes, so output register r = 2·hi8 + hi16 holds, in lane c at position p, the byte at
  // 16c + 8·hi8 + 4·hi16 + p; it must be code 16r + 4c + p.
  alignas(64) static constexpr std::array<std::uint8_t, 64> kOrder = [] {
    std::array<std::uint8_t, 64> index{};
    for (int c = 0; c < 4; ++c) {
      for (int r = 0; r < 4; ++r) {
        for (int p = 0; p < 4; ++p) {
          index[16 * c + 8 * (r >> 1) + 4 * (r & 1) + p] =
              static_cast<std::uint8_t>(16 * r + 4 * c + p);
        }
      }
    }
    return index;
  }();

  __m512i plane[4][4];  // plane[k]: byte k of map[0..256)
  __m512i order;

  explicit ByteMapLookup(const QuantTables& t) : order(_mm512_load_si512(kOrder.data())) {
    for (int k = 0; k < 4; ++k) {
      for (int q = 0; q < 4; ++q) plane[k][q] = _mm512_load_si512(t.map_bytes[k].data() + 64 * q);
    }
  }

  // out[0..64) = map[codes[0..64)] · scale.
  HWY_INLINE void Decode64(const std::uint8_t* codes, __m512 scale, float* out) const {
    const __m512i code = _mm512_permutexvar_epi8(order, _mm512_loadu_si512(codes));
    const __mmask64 upper = _mm512_movepi8_mask(code);  // codes 128..255
    __m512i byte[4];
    for (int k = 0; k < 4; ++k) {
      byte[k] =
          _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(plane[k][0], code, plane[k][1]),
                                 _mm512_permutex2var_epi8(plane[k][2], code, plane[k][3]));
    }
    const __m512i low01 = _mm512_unpacklo_epi8(byte[0], byte[1]);
    const __m512i high01 = _mm512_unpackhi_epi8(byte[0], byte[1]);
    const __m512i low23 = _mm512_unpacklo_epi8(byte[2], byte[3]);
    const __m512i high23 = _mm512_unpackhi_epi8(byte[2], byte[3]);
    const __m512i value[4] = {
        _mm512_unpacklo_epi16(low01, low23), _mm512_unpackhi_epi16(low01, low23),
        _mm512_unpacklo_epi16(high01, high23), _mm512_unpackhi_epi16(high01, high23)};
    for (int r = 0; r < 4; ++r) {
      _mm512_storeu_ps(out + 16 * r, _mm512_mul_ps(_mm512_castsi512_ps(value[r]), scale));
    }
  }
};
#  endif

// out[i] = map[codes[i]] · absmax for the n <= kQuantBlock elements of one block.
HWY_INLINE void DequantizeBlock(const QuantTables& t, const std::uint8_t* codes, float absmax,
                                std::size_t n, float* out) {
#  if HWY_TARGET == HWY_AVX3_DL
  const ByteMapLookup bytes(t);
  const std::size_t whole = n / 64 * 64;
  for (std::size_t i = 0; i < whole; i += 64)
    bytes.Decode64(codes + i, _mm512_set1_ps(absmax), out + i);
  codes += whole, out += whole, n -= whole;  // a partial block's rest: the lookup below
  if (n == 0) return;
#  endif
#  if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const MapLookup lookup(t);
#  endif
  ForEachBlockVector(n, [&](auto d, std::size_t i) HWY_ATTR {
    const hn::RebindToSigned<decltype(d)> di;
    const hn::Rebind<std::uint8_t, decltype(d)> du8;
    const auto index = hn::PromoteTo(di, hn::LoadU(du8, codes + i));
    hn::Vec<decltype(d)> value;
#  if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if constexpr (hn::MaxLanes(d) == 16) {
      value = hn::Vec<decltype(d)>{lookup(index.raw)};
    } else {
      value = hn::GatherIndex(d, t.map.data(), index);
    }
#  else
    value = hn::GatherIndex(d, t.map.data(), index);
#  endif
    hn::StoreU(hn::Mul(value, hn::Set(d, absmax)), d, out + i);
  });
}

// The code of each magnitude m in [0, 1] on the non-negative half (codes zero_code..255), by its
// interval: a gather and one compare (QuantizeValue's search, src/core/quantize.cc).
template <class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> IntervalCode(D /*d*/, const QuantTables& t,
                                                       hn::Vec<D> m) {
  const hn::RebindToSigned<D> di;
  const hn::RebindToUnsigned<D> du;
  // The interval of m (clamped to the table), its entry, and one code more where m lies past the
  // threshold inside it.
  const auto bits = hn::Min(hn::Max(hn::BitCast(du, m), hn::Set(du, kQuantIntervalBase)),
                            hn::Set(du, kQuantIntervalTop));
  const auto interval =
      hn::ShiftRight<kQuantIntervalShift>(hn::Sub(bits, hn::Set(du, kQuantIntervalBase)));
  const auto* entries = reinterpret_cast<const std::int32_t*>(t.interval.data());
  const auto entry = hn::GatherIndex(di, entries, hn::BitCast(di, interval));
  const auto offset = hn::BitCast(di, hn::And(bits, hn::Set(du, kNoThreshold - 1)));
  const auto code = hn::And(entry, hn::Set(di, 0xFF));
  // (offsets and thresholds are below 2^16: signed compares are safe)
  return hn::IfThenElse(hn::Gt(offset, hn::ShiftRight<8>(entry)), hn::Add(code, hn::Set(di, 1)),
                        code);
}

// The run search (QuantRuns) where a vector has a fixed 8 or 16 lanes (its run table holds 8
// entries in 16 floats; a scalable vector cannot be a struct member) and a fused
// multiply-subtract, so that u is the one rounding the band was checked for.
template <class D>
inline constexpr bool kRunSearch = (HWY_NATIVE_FMA != 0) && !HWY_HAVE_SCALABLE
                                   && hn::MaxLanes(D()) >= 8 && hn::MaxLanes(D()) <= 16;

// A map's runs in registers, loaded once per block: their lines in fixed point (QuantRuns), lifted
// by the band: u + band lies within the band of an integer k exactly when it lies in [k, k +
// 2·band), one test of its fraction, and floors to u's code everywhere else.
template <class D>
struct RunSearch {
  hn::Vec<D> slope, base, cap;
  hn::Vec<D> transition[kQuantRuns - 1];
#  if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  __m512i octave_run[2];  // AVX3_DL: QuantRuns::exponent_run, else QuantRuns::octave_run
  __m512 octave_transition[2];
#  elif HWY_TARGET == HWY_AVX2
  __m256i octave_run_bytes[2];
  __m256 run_transition;
#  endif

  RunSearch(D d, const QuantTables& t)
      : slope(hn::Load(d, t.runs.slope.data())),
        base(hn::Load(d, t.runs.base.data())),
        cap(hn::Load(d, t.runs.cap.data())) {
    for (int r = 0; r + 1 < kQuantRuns; ++r) transition[r] = hn::Set(d, t.runs.transition[r]);
#  if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    for (int k = 0; k < 2; ++k) {
#    if HWY_TARGET == HWY_AVX3_DL
      octave_run[k] = _mm512_load_si512(t.runs.exponent_run.data() + 64 * k);
#    else
      octave_run[k] = _mm512_load_si512(t.runs.octave_run.data() + 16 * k);
#    endif
      octave_transition[k] = _mm512_load_ps(t.runs.octave_transition.data() + 16 * k);
    }
#  elif HWY_TARGET == HWY_AVX2
    for (int k = 0; k < 2; ++k) {
      octave_run_bytes[k] =
          _mm256_load_si256(reinterpret_cast<const __m256i*>(t.runs.octave_run_bytes.data()) + k);
    }
    run_transition = _mm256_load_ps(t.runs.run_transition.data());
#  endif
  }

  // The run of each magnitude m: the number of transitions m is past.
  HWY_INLINE hn::Vec<hn::RebindToSigned<D>> Run(D /*d*/, hn::Vec<D> m) const {
    const hn::RebindToSigned<D> di;
#  if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if constexpr (hn::MaxLanes(di) == 16) {  // by the octave (QuantRuns::octave_run)
#    if HWY_TARGET == HWY_AVX3_DL
      // The whole exponent field indexes a byte permute of 128 entries, without a clamp (each
      // lane's upper three index bytes are 0 and read entry 0, which is 0).
      const __m512i octave = _mm512_srli_epi32(_mm512_castps_si512(m.raw), 23);
      const __m512i run = _mm512_permutex2var_epi8(octave_run[0], octave, octave_run[1]);
#    else
      const __m512i bits =
          _mm512_max_epu32(_mm512_castps_si512(m.raw), _mm512_set1_epi32(kQuantIntervalBase));
      const __m512i octave = _mm512_srli_epi32(bits, 23);  // the lookups read its low 5 bits
      const __m512i run = _mm512_permutex2var_epi32(octave_run[0], octave, octave_run[1]);
#    endif
      const __m512 past =
          _mm512_permutex2var_ps(octave_transition[0], octave, octave_transition[1]);
      return hn::Vec<decltype(di)>{_mm512_mask_add_epi32(
          run, _mm512_cmp_ps_mask(m.raw, past, _CMP_GT_OQ), run, _mm512_set1_epi32(1))};
    }
#  elif HWY_TARGET == HWY_AVX2
    if constexpr (hn::MaxLanes(di) == 8) {  // by the octave, with byte shuffles of 16 entries
      // e = 103..127 (2^-24..1.0): each shuffle reads e's low 4 bits, and its bit 4, shifted to the
      // byte's top, picks the table; the lanes' upper bytes (0) read entry 0, which is 0.
      const __m256i bits =
          _mm256_max_epu32(_mm256_castps_si256(m.raw), _mm256_set1_epi32(kQuantIntervalBase));
      const __m256i octave = _mm256_srli_epi32(bits, 23);
      const __m256i run = _mm256_blendv_epi8(_mm256_shuffle_epi8(octave_run_bytes[0], octave),
                                             _mm256_shuffle_epi8(octave_run_bytes[1], octave),
                                             _mm256_slli_epi32(octave, 3));
      // The first transition at or above the octave's start: inside the octave, or past m. A
      // compare's true (-1) counts one more run.
      const __m256 past = _mm256_permutevar8x32_ps(run_transition, run);
      return hn::Vec<decltype(di)>{
          _mm256_sub_epi32(run, _mm256_castps_si256(_mm256_cmp_ps(m.raw, past, _CMP_GT_OQ)))};
    }
#  endif
    auto run = hn::Zero(di);
    for (const auto& between : transition) {
      run =
          hn::IfThenElse(hn::RebindMask(di, hn::Gt(m, between)), hn::Add(run, hn::Set(di, 1)), run);
    }
    return run;
  }

  // The codes of magnitudes m on the non-negative half, in the low byte above kQuantLineCodeBias
  // (t's bits >> kQuantLineShift), and in *near the lanes too close to a threshold to tell.
  HWY_INLINE hn::Vec<hn::RebindToSigned<D>> Codes(D d, hn::Vec<D> m, hn::Mask<D>* near) const {
    const hn::RebindToUnsigned<D> du;
    const auto index = hn::IndicesFromVec(d, Run(d, m));
    const auto t = hn::Min(
        hn::MulAdd(m, hn::TableLookupLanes(slope, index), hn::TableLookupLanes(base, index)),
        hn::TableLookupLanes(cap, index));
    const auto bits = hn::BitCast(du, t);
    const auto codes = hn::BitCast(hn::RebindToSigned<D>(), hn::ShiftRight<kQuantLineShift>(bits));
#  if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    // AVX-512: the intrinsic. Highway's And and Eq below also compile to a vptestnmd there, yet
    // the encoding then took 0.322-0.324 ns per value against 0.302-0.306 (AMD Zen 4, alternated).
    if constexpr (hn::MaxLanes(d) == 16) {
      *near = hn::Mask<D>{_mm512_testn_epi32_mask(bits.raw, _mm512_set1_epi32(kQuantLineNearBits))};
      return codes;
    }
#  endif
    *near = hn::RebindMask(d, hn::Eq(hn::And(bits, hn::Set(du, kQuantLineNearBits)), hn::Zero(du)));
    return codes;
  }
};

// A stand-in where the run search is not used.
struct NoRunSearch {
  template <class D>
  NoRunSearch(D /*d*/, const QuantTables& /*t*/) {}
};
template <class D>
using RunSearchFor = std::conditional_t<kRunSearch<D>, RunSearch<D>, NoRunSearch>;

// A vector of values already scaled by their absmax, searched: magnitudes and signs, and where the
// run search applies (kRunSearch), its codes of the magnitudes (RunSearch::Codes) and the lanes it
// cannot tell.
template <class D>
struct Searched {
  hn::Vec<D> magnitude;
  hn::Mask<D> negative;
  hn::Vec<hn::RebindToSigned<D>> codes;
  hn::Mask<D> near;
};

template <class D, class Search>
HWY_INLINE Searched<D> SearchVector(D d, const Search& search, hn::Vec<D> x) {
  Searched<D> s{hn::Abs(x), hn::Lt(x, hn::Zero(d)), hn::Zero(hn::RebindToSigned<D>()),
                hn::FirstN(d, 0)};
  if constexpr (kRunSearch<D>) s.codes = search.Codes(d, s.magnitude, &s.near);
  return s;
}

// The codes of a searched vector (in the low byte) on a signed map or an unsigned one:
// QuantizeValue (src/core/quantize.cc) lane by lane. The run search's where it told every lane,
// else the interval search's.
template <bool kSigned, class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> FinishVector(D d, const QuantTables& t,
                                                       const Searched<D>& s, int negative_top) {
  const hn::RebindToSigned<D> di;
  const auto negative = hn::RebindMask(di, s.negative);
  const auto with_signs = [&](auto codes, std::int32_t bias) HWY_ATTR {
    if constexpr (!kSigned) {
      return hn::IfThenZeroElse(negative, codes);
    } else {
      // Negatives mirror the positives (c ↔ 254 − c) onto codes 0..126: 1.0's 255 becomes 0 and
      // the zero code 127 becomes 126.
      const auto mirrored = hn::Min(hn::Max(hn::Sub(hn::Set(di, bias + 254), codes), hn::Zero(di)),
                                    hn::Set(di, negative_top));
      return hn::IfThenElse(negative, mirrored, codes);
    }
  };
  if (kRunSearch<D> && HWY_LIKELY(hn::AllFalse(d, s.near))) {
    return with_signs(s.codes, static_cast<std::int32_t>(kQuantLineCodeBias));
  }
  return with_signs(IntervalCode(d, t, s.magnitude), 0);
}

// The codes of a block's values on its map, vector by vector: its run search, loaded once, and the
// reciprocal of the block's absmax (Quantize's scaling: a multiply per vector, where a division
// took 2.4 cycles of the divider that the update's divisions share, measured on AMD Zen 5).
// kSigned: the map's (FinishVector).
template <bool kSigned>
struct BlockCoder {
  const QuantTables& t;
  RunSearchFor<hn::ScalableTag<float>> search;
  // (locals: codes' byte stores may alias the tables and the block, whose fields would be read
  // again for every vector)
  int negative_top;
  const float* x;
  std::uint8_t* codes;
  float inverse;

  BlockCoder(const StateBlock& block, float absmax_inverse)
      : t(*block.t),
        search(hn::ScalableTag<float>(), *block.t),
        negative_top(block.t->zero_code - 1),
        x(block.x),
        codes(block.codes),
        inverse(absmax_inverse) {}

  // The search of x[i, i + Lanes(d)) · inverse, and the store of its codes.
  template <class D>
  HWY_INLINE Searched<D> Search(D d, std::size_t i) const {
    return SearchVector(d, search, hn::Mul(hn::LoadU(d, x + i), hn::Set(d, inverse)));
  }
  template <class D>
  HWY_INLINE void Store(D d, std::size_t i, const Searched<D>& s) const {
    const auto code = FinishVector<kSigned>(d, t, s, negative_top);
#  if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    // One vpmovdb (Highway 1.0.3's TruncateTo takes two instructions on AVX3 and, on AVX3_DL,
    // picks the wrong bytes: it permutes dwords by byte indices).
    if constexpr (hn::MaxLanes(d) == 16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(code.raw));
      return;
    }
#  endif
    const hn::Rebind<std::uint8_t, D> du8;
    hn::StoreU(hn::TruncateTo(du8, hn::BitCast(hn::RebindToUnsigned<D>(), code)), du8, codes + i);
  }
};

// Encodes a block of n values of each coder's state. A vector's search is a long chain of
// dependent steps (three lookups, a fused multiply-add, the band test) and a block holds only 16
// vectors, so the states of a block go together, two vectors of each per turn, all searched before
// any is finished: four independent chains for Adam's m and v, two for a state alone (measured,
// docs/8bit-states.md: the states together made the 8-bit AdamW step 4-12% faster on AMD Zen 5;
// two vectors per turn made the encoding 1.035x faster on Zen 4).
template <class... Coders>
HWY_INLINE void EncodeBlock(std::size_t n, const Coders&... coders) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    Searched<hn::ScalableTag<float>> first[sizeof...(Coders)], second[sizeof...(Coders)];
    std::size_t k = 0;
    ((first[k] = coders.Search(d, i), second[k] = coders.Search(d, i + lanes), ++k), ...);
    k = 0;
    ((coders.Store(d, i, first[k]), coders.Store(d, i + lanes, second[k]), ++k), ...);
  }
  ForEachBlockVector(n - i, [&](auto d1, std::size_t j) HWY_ATTR {
    (coders.Store(d1, i + j, coders.Search(d1, i + j)), ...);
  });
}

// Calls f(std::bool_constant<the block's map is signed>).
template <class F>
HWY_INLINE void WithSignedness(const StateBlock& block, const F& f) {
  if (block.t->zero_code != 0) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// Stores the absmax of a block of n values (max |x|, NaN if any x is) and returns whether its codes
// are left to search, with *inverse = 1 / absmax to scale them by. Where the absmax is 0 or not
// finite, every code is the zero code; where its reciprocal overflows (a block of subnormals, which
// Quantize divides instead), the codes are Quantize's, value by value. Finds the
// maximum as integers: non-negative floats order as their bit patterns, NaN's above Inf's, so one
// integer max per vector finds the absmax and any NaN alike, the same on every target (a float
// Max's NaN rule differs between them).
HWY_INLINE bool StoreAbsmax(const StateBlock& block, std::size_t n, float* inverse) {
  const hn::ScalableTag<float> dmax;
  const hn::RebindToUnsigned<decltype(dmax)> dbits;
  auto max_vec = hn::Zero(dbits);
  std::uint32_t max_tail = 0;
  ForEachBlockVector(n, [&](auto d, std::size_t i) HWY_ATTR {
    const hn::RebindToUnsigned<decltype(d)> du;
    const auto bits = hn::And(hn::BitCast(du, hn::LoadU(d, block.x + i)), hn::Set(du, 0x7FFFFFFFu));
    if constexpr (hn::MaxLanes(d) == 1) {
      max_tail = std::max(max_tail, hn::GetLane(bits));
    } else {
      max_vec = hn::Max(max_vec, bits);
    }
  });
  const std::uint32_t max_bits = std::max(hn::GetLane(hn::MaxOfLanes(dbits, max_vec)), max_tail);
  constexpr std::uint32_t kInfBits = 0x7F800000u;
  const float max = std::bit_cast<float>(max_bits);
  *block.absmax = max_bits > kInfBits ? std::numeric_limits<float>::quiet_NaN() : max;
  if (max_bits == 0 || max_bits >= kInfBits) {
    std::fill_n(block.codes, n, block.t->zero_code);
    return false;
  }
  *inverse = 1.0f / max;
  if (std::isinf(*inverse)) {
    const QuantMap map = block.t->zero_code != 0 ? QuantMap::kSigned : QuantMap::kUnsigned;
    for (std::size_t i = 0; i < n; ++i) block.codes[i] = QuantizeValue(block.x[i] / max, map);
    return false;
  }
  return true;
}

// Quantizes a block of n <= kQuantBlock values of one state, or of two (b != nullptr) together
// (EncodeBlock).
HWY_INLINE void QuantizeOneOrTwo(std::size_t n, const StateBlock& a, const StateBlock* b) {
  float inverse_a = 0.0f;
  float inverse_b = 0.0f;
  const bool search_a = StoreAbsmax(a, n, &inverse_a);
  const bool search_b = b != nullptr && StoreAbsmax(*b, n, &inverse_b);
  // (Each coder is built where its loop runs: one passed in by reference would be read from memory
  // again after every store of codes.)
  if (search_a && search_b) {
    WithSignedness(a, [&](auto signed_a) HWY_ATTR {
      WithSignedness(*b, [&](auto signed_b) HWY_ATTR {
        const BlockCoder<decltype(signed_a)::value> coder_a(a, inverse_a);
        const BlockCoder<decltype(signed_b)::value> coder_b(*b, inverse_b);
        EncodeBlock(n, coder_a, coder_b);
      });
    });
  } else if (search_a || search_b) {
    const StateBlock& block = search_a ? a : *b;
    const float inverse = search_a ? inverse_a : inverse_b;
    WithSignedness(block, [&](auto is_signed) HWY_ATTR {
      const BlockCoder<decltype(is_signed)::value> coder(block, inverse);
      EncodeBlock(n, coder);
    });
  }
}

// Quantizes one block (n <= kQuantBlock values) of each of `count` states: their absmax and codes
// (StoreAbsmax, BlockCoder), two states at a time (QuantizeOneOrTwo).
HWY_INLINE void QuantizeBlocks(const StateBlock* blocks, std::size_t count, std::size_t n) {
  for (std::size_t k = 0; k < count; k += 2) {
    QuantizeOneOrTwo(n, blocks[k], k + 1 < count ? &blocks[k + 1] : nullptr);
  }
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FOPT_CPU_QUANTIZE_INL_H_
