// Stochastic rounding of f32 to bf16/f16, and the counter-based noise that drives it.
//
// A stochastically rounded value goes to the next representable value away from zero with
// probability (dropped bits) / (one ulp), else towards zero, so its expected value is the f32
// input: many small updates to a 16-bit param or moment add up instead of being rounded away.
//
// The noise is a pure function of (seed, step, global element index, stream): no state, no
// thread, chunk, SIMD target or ZeRO shard enters it, so every run with the same inputs gives the
// same bits. The SIMD stores (src/cpu/io-inl.h) implement these very functions; tests compare them
// bit for bit on every target. docs/numerics.md ("Stochastic rounding") has the full story.
#pragma once

#include <bit>
#include <cstdint>

#include "fusedopt/dtype.h"

namespace fusedopt {

// Noise streams: one per buffer role, so that the param and the moments of one element never see
// the same noise.
inline constexpr std::uint32_t kRoundingStreamParam = 0;
// Segment::state[slot] uses stream 1 + slot.
inline constexpr std::uint32_t RoundingStreamState(int slot) {
  return 1u + static_cast<std::uint32_t>(slot);
}

// splitmix64's finalizer: a bijection of 64-bit words with full avalanche.
inline constexpr std::uint64_t RoundingMix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

// A murmur3-fmix32-style finalizer (xor-shift, multiply, xor-shift, multiply, xor-shift) with the
// lower-bias constants of C. Wellons' "lowbias32": a bijection of 32-bit words. Only 32-bit
// multiplies, shifts and xors, so every SIMD target computes it lane by lane.
inline constexpr std::uint32_t RoundingMix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// The 32-bit key of one (seed, step, stream) and one high word of the element index. Kernels
// compute it once per piece of a segment, outside the element loop.
inline constexpr std::uint32_t RoundingKey(std::uint64_t seed, std::int64_t step,
                                           std::uint32_t stream, std::uint32_t index_hi) {
  std::uint64_t k = RoundingMix64(seed + 0x9E3779B97F4A7C15ull);
  k = RoundingMix64(k ^ static_cast<std::uint64_t>(step));
  k = RoundingMix64(k ^ (std::uint64_t{stream} << 32 | index_hi));
  return static_cast<std::uint32_t>(k >> 32);
}

// The per-element part: what the SIMD code computes in each 32-bit lane.
inline constexpr std::uint32_t RoundingNoiseFromKey(std::uint32_t key, std::uint32_t index_lo) {
  return RoundingMix32(index_lo ^ key);
}

// The noise of element `index` (its index in the whole, unsharded parameter vector:
// Segment::global_offset + the index inside the tensor) at this tensor's `step`, for one buffer
// role (`stream`). Uniform over 32 bits; the roundings use its low 16 (bf16) or 13 (f16) bits.
inline constexpr std::uint32_t RoundingNoise(std::uint64_t seed, std::int64_t step,
                                             std::uint64_t index, std::uint32_t stream) {
  return RoundingNoiseFromKey(
      RoundingKey(seed, step, stream, static_cast<std::uint32_t>(index >> 32)),
      static_cast<std::uint32_t>(index));
}

// f32 -> bf16, rounded stochastically with `noise`: the low 16 bits are added to the f32 bits
// before they are dropped, so the magnitude rounds up with probability (low 16 bits of f) / 2^16.
// - A value exactly representable in bf16 (zeros, Inf included) is returned unchanged for any
//   noise.
// - NaN becomes a quiet NaN with its sign, as in F32ToBF16.
// - Above the largest finite bf16 (0x1.FEp127) a value rounds up to Inf with that same
//   probability: the rounding's natural overflow, as for any other binade.
inline std::uint16_t F32ToBF16Stochastic(float f, std::uint32_t noise) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((u + (noise & 0xFFFFu)) >> 16);
}

// f32 -> f16, rounded stochastically with `noise` in the f16 normal range: the low 13 bits of the
// noise replace the round-to-nearest-even bias before the 13 dropped mantissa bits go, so the
// magnitude rounds up with probability (dropped bits) / 2^13.
// - |f| in [65504, 65536) rounds up to Inf with that probability; |f| >= 65536, Inf and NaN go as
//   in F32ToF16 (Inf, Inf, canonical quiet NaN).
// - Results below the smallest normal f16 (|f| < 2^-14) fall back to round-to-nearest-even
//   (F32ToF16): the subnormal range is not rounded stochastically.
// - A value exactly representable in f16 is returned unchanged for any noise.
inline std::uint16_t F32ToF16Stochastic(float f, std::uint32_t noise) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a < 0x38800000u || a >= 0x47800000u) return F32ToF16(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  return static_cast<std::uint16_t>(sign | ((a - 0x38000000u + (noise & 0x1FFFu)) >> 13));
}

}  // namespace fusedopt
