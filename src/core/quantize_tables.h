// The tables the quantized-state code searches (include/fusedopt/quantize.h): the map, the
// thresholds between its neighbours and an interval table that gives each value's code in two
// lookups and one compare instead of a binary search of eight dependent steps.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "fusedopt/quantize.h"

namespace fusedopt {

// The interval table covers magnitudes [2^-24, 1] in intervals of 2^15 f32 bit patterns (the
// exponent and the top 8 mantissa bits): interval k holds the bit patterns [kQuantIntervalBase + k
// · 2^15, kQuantIntervalBase + (k + 1) · 2^15). An interval is at most 1/256 of its values wide,
// narrower than the gap between any two thresholds of either map (0.9/128 of a decade's top at
// least), so it holds at most one threshold and its values take one of two neighbouring codes.
// Magnitudes under 2^-24 are far below the smallest map entry (3.3e-7) and join interval 0.
inline constexpr std::uint32_t kQuantIntervalBase = 0x33800000u;  // 2^-24
inline constexpr std::uint32_t kQuantIntervalTop = 0x3F800000u;   // 1.0
inline constexpr int kQuantIntervalShift = 15;
inline constexpr std::size_t kQuantIntervals =
    ((kQuantIntervalTop - kQuantIntervalBase) >> kQuantIntervalShift) + 1;  // 1.0 has its own

// An interval's entry: its first magnitude's code (bits 0-7) and where in the interval the
// threshold to the next code lies (bits 8-23: the offset of the threshold's bit pattern from the
// interval's first one, kNoThreshold where none lies inside). Positive floats order as their bit
// patterns, so |x| passes the threshold when its offset in the interval is greater: one lookup
// and one integer compare per value.
inline constexpr std::uint32_t kNoThreshold = 1u << kQuantIntervalShift;

// The search without a lookup per value (src/cpu/quantize-inl.h). The non-negative half of a map
// is eight runs of codes: the zero code with decade 0, then decades 1 to 6 (2^d codes each on the
// signed map, 2^(d+1) on the unsigned one), then 1.0's code 255 alone (past threshold[254]).
// Inside a run the thresholds lie evenly, so one line u = fma(m, slope, −offset) puts each of them
// within kQuantRunBand of the code it starts, and floor(u) is m's code; u is capped at the run's
// last code + 0.5 (past the run's top threshold u keeps rising up to the next run's). The last
// run's line is flat at 255.5. Seven compares with the thresholds between runs find m's run (on
// AVX-512 and AVX2 its octave's table entries: octave_run).
// A value whose u lies within the band of an integer may be on either side of its threshold: its
// vector takes the interval search instead, so every code stays exact.
// tests/quantized_state_test.cc checks every threshold, and the value above it, against the band.
// On both maps the farthest of them lies 2^-16 from its integer (one rounding of u near 255): the
// band is 4 times that. (It was 2^-10: 3 vectors in 100 of continuous states took the interval
// search, whose gather and mispredicted branch cost 12% of the encoding; now 2 in 1000.)
inline constexpr float kQuantRunBand = 1.0f / 16384;
inline constexpr int kQuantRuns = 8;

// The vector code evaluates each line in fixed point: t = 256 + u + band lies in [256, 512), where
// a float's mantissa holds the integer part floor(u + band) in bits 15-22 and the fraction in bits
// 0-14. So t's bits >> 15 are kQuantLineCodeBias + the code (the low byte: the code), and u + band
// lies in [k, k + 2·band) of an integer k, too near a threshold to tell, exactly when the
// fraction's bits kQuantLineNearBits are all zero: integer instructions instead of a rounding
// (AVX-512's vreduceps), a compare and a conversion on the floating-point adders (vreduceps takes
// two of their cycles on AMD Zen 4). t's own rounding (2^-15) keeps every threshold in the band.
inline constexpr float kQuantLineOrigin = 256.0f;
inline constexpr int kQuantLineShift = 15;  // 23 mantissa bits, the top 8 t's integer part
inline constexpr std::uint32_t kQuantLineCodeBias =
    std::bit_cast<std::uint32_t>(kQuantLineOrigin) >> kQuantLineShift;
inline constexpr std::uint32_t kQuantLineNearBits =
    ((1u << kQuantLineShift) - 1) &
    ~(static_cast<std::uint32_t>(2 * kQuantRunBand * (1u << kQuantLineShift)) - 1);
static_assert(kQuantLineNearBits == 0x7FFCu, "2·band is 4 units of t's last mantissa bit");

struct QuantRuns {
  // per run (lanes 8-15 unused, for a 16-lane table lookup): its line u = fma(m, slope, −offset) in
  // fixed point, t = fma(m, slope, base) capped at cap
  alignas(64) std::array<float, 16> slope;
  alignas(64) std::array<float, 16> base;        // kQuantLineOrigin + band − offset
  alignas(64) std::array<float, 16> cap;         // kQuantLineOrigin + its last code + 0.5 + band
  std::array<float, kQuantRuns - 1> transition;  // threshold[last code of run r]
  std::array<std::uint8_t, kQuantRuns> first, last;  // each run's codes
  // The run found by the magnitude's binary exponent instead of seven compares (AVX-512: two
  // 32-entry table lookups; AVX2: two 16-entry byte shuffles). Runs span decades, so an octave
  // holds at most one transition: a magnitude m >= 2^-24 in octave [2^e, 2^(e+1)) is in run
  // octave_run[e & 31], one more if m > octave_transition[e & 31] (+Inf where none lies in the
  // octave; AVX2 tests m > transition[octave_run[e & 31]] instead, the first transition at or
  // above 2^e: the same test, from an 8-entry table). Octaves 2^-24..2^0 take entries 7..31
  // (entries 0..6 hold run 0); smaller magnitudes count as 2^-24's octave, which holds no
  // transition.
  alignas(64) std::array<std::int32_t, 32> octave_run;
  alignas(64) std::array<float, 32> octave_transition;
  // AVX2's: octave_run[0..16) as bytes, once per 128-bit lane, then [16..32) likewise; transition
  // with +Inf for the last run.
  alignas(32) std::array<std::uint8_t, 64> octave_run_bytes;
  alignas(32) std::array<float, kQuantRuns> run_transition;
  // octave_run by the whole exponent field e (0..127 for m <= 1; 0 below 2^-24), for AVX-512 VBMI's
  // 128-entry byte permute: no clamp to 2^-24 first. The transition's lookup then takes e & 31 of
  // a smaller e too: that entry holds a transition or +Inf (the entries of no octave), and such an
  // m lies below every transition. (Clamping cost one more instruction per vector: 3% of the
  // encoding.)
  alignas(64) std::array<std::uint8_t, 128> exponent_run;
};

struct QuantTables {
  alignas(64) std::array<float, 256> map;
  // map_bytes[k][c]: byte k (little-endian) of map[c]'s bits, for a decode by byte permutes
  // (AVX-512 VBMI: src/cpu/quantize-inl.h).
  alignas(64) std::array<std::array<std::uint8_t, 256>, 4> map_bytes;
  // threshold[c]: where the nearest code of a magnitude turns from c to c + 1, f32((map[c] +
  // map[c + 1]) · 0.5) as bitsandbytes' CUDA search computes it; a magnitude goes up only when
  // greater (ties go to the smaller magnitude). +Inf for the last code.
  alignas(64) std::array<float, 256> threshold;
  // Per interval: code | offset << 8 (the search over magnitudes runs on the non-negative half of a
  // signed map: codes 127..255).
  alignas(64) std::array<std::uint32_t, kQuantIntervals> interval;
  std::uint8_t zero_code;  // the code of 0: 127 signed, 0 unsigned
  QuantRuns runs;
};

const QuantTables& QuantTablesOf(QuantMap map);

}  // namespace fusedopt
