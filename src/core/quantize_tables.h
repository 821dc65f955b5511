// The tables the quantized-state code searches (include/fusedopt/quantize.h): the map, the
// thresholds between its neighbours and an interval table that gives each value's code in two
// lookups and one compare instead of a binary search of eight dependent steps.
#pragma once

#include <array>
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

struct QuantTables {
  alignas(64) std::array<float, 256> map;
  // threshold[c]: where the nearest code of a magnitude turns from c to c + 1, f32((map[c] +
  // map[c + 1]) · 0.5) as bitsandbytes' CUDA search computes it; a magnitude goes up only when
  // greater (ties go to the smaller magnitude). +Inf for the last code.
  alignas(64) std::array<float, 256> threshold;
  // Per interval: code | offset << 8 (the search over magnitudes runs on the non-negative half of a
  // signed map: codes 127..255).
  alignas(64) std::array<std::uint32_t, kQuantIntervals> interval;
  std::uint8_t zero_code;  // the code of 0: 127 signed, 0 unsigned
};

const QuantTables& QuantTablesOf(QuantMap map);

}  // namespace fusedopt
