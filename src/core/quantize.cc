#include "fusedopt/quantize.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "src/core/quantize_tables.h"

namespace fusedopt {
namespace {

// torch.linspace(0.1, 1, steps, dtype=float32) as torch 2.x's CPU kernel computes it: from the
// start for the first half, from the end for the second, each value one fused multiply-add (the
// compiler contracts `start + step * i` on FMA targets; the map's golden hash depends on it).
std::vector<float> Linspace(int steps) {
  const float start = 0.1f;
  const float end = 1.0f;
  const float step = (end - start) / static_cast<float>(steps - 1);
  std::vector<float> out(static_cast<std::size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    out[static_cast<std::size_t>(i)] =
        i < steps / 2 ? std::fma(step, static_cast<float>(i), start)
                      : std::fma(-step, static_cast<float>(steps - i - 1), end);
  }
  return out;
}

// bitsandbytes' create_dynamic_map(signed): for decade i = 0..6, the midpoints of linspace(0.1, 1,
// k + 1) (k = 2^i signed, 2^(i+1) unsigned) times f32(10^(i-6)), and their negatives when signed;
// then 0 and 1.0, sorted.
std::array<float, 256> MakeDynamicMap(bool is_signed) {
  std::vector<float> values;
  for (int i = 0; i < 7; ++i) {
    const int k = is_signed ? 1 << i : 1 << (i + 1);
    const std::vector<float> bounds = Linspace(k + 1);
    const auto scale = static_cast<float>(std::pow(10.0, i - 6));  // the Python float, in f32
    for (int j = 0; j < k; ++j) {
      const auto u = static_cast<std::size_t>(j);
      const float mean = (bounds[u] + bounds[u + 1]) / 2.0f;
      values.push_back(scale * mean);
      if (is_signed) values.push_back(-(scale * mean));
    }
  }
  values.push_back(0.0f);
  values.push_back(1.0f);
  std::sort(values.begin(), values.end());
  std::array<float, 256> map{};
  std::copy(values.begin(), values.end(), map.begin());
  return map;
}

// Runs and their affine maps (QuantRuns): each run's line through its first and last inner
// threshold at the codes they start. A run with one inner threshold (2 codes: decade 0 with the
// zero code and decade 1 on the signed map) takes the run's lower edge (0, or the threshold from
// the run below) at its first code + 0.5 as its other point. The last run, code 255 alone, has
// none: its line is flat at 255.5.
QuantRuns MakeRuns(const QuantTables& t, bool is_signed) {
  QuantRuns runs{};
  const int zero = t.zero_code;
  const int codes_per_decade_0 = is_signed ? 1 : 2;
  for (int r = 0; r + 1 < kQuantRuns; ++r) {
    const int first = r == 0 ? zero : zero + ((1 << r) - 1) * codes_per_decade_0 + 1;
    const int last = zero + ((2 << r) - 1) * codes_per_decade_0;
    // inner thresholds: threshold[c] starts code c + 1, for c in [first, last)
    const bool one_inner = first + 1 == last;
    const double lower_edge = r == 0 ? 0.0 : t.threshold[static_cast<std::size_t>(first - 1)];
    const double x0 = one_inner ? lower_edge : t.threshold[static_cast<std::size_t>(first)];
    const double u0 = one_inner ? first + 0.5 : first + 1;
    const double x1 = t.threshold[static_cast<std::size_t>(last - 1)];
    const double slope = (last - u0) / (x1 - x0);
    const auto i = static_cast<std::size_t>(r);
    runs.slope[i] = static_cast<float>(slope);
    runs.base[i] = static_cast<float>(kQuantLineOrigin + kQuantRunBand - (slope * x0 - u0));
    runs.cap[i] = kQuantLineOrigin + static_cast<float>(last) + 0.5f + kQuantRunBand;
    runs.transition[i] = t.threshold[static_cast<std::size_t>(last)];
    runs.first[i] = static_cast<std::uint8_t>(first);
    runs.last[i] = static_cast<std::uint8_t>(last);
  }
  constexpr std::size_t kTop = kQuantRuns - 1;
  runs.slope[kTop] = 0.0f;
  runs.base[kTop] = runs.cap[kTop] = kQuantLineOrigin + 255.5f + kQuantRunBand;
  runs.first[kTop] = runs.last[kTop] = 255;
  // (+Inf also in the entries of no octave, which exponent_run's lookups of e & 31 may read)
  runs.octave_transition.fill(std::numeric_limits<float>::infinity());
  for (std::uint32_t e = kQuantIntervalBase >> 23; e <= kQuantIntervalTop >> 23; ++e) {
    const float low = std::bit_cast<float>(e << 23);
    const float high = std::bit_cast<float>((e + 1) << 23);
    const std::size_t k = e & 31;
    runs.octave_run[k] = 0;
    runs.octave_transition[k] = std::numeric_limits<float>::infinity();
    for (float transition : runs.transition) {
      if (transition < low) ++runs.octave_run[k];
      if (transition >= low && transition < high) runs.octave_transition[k] = transition;
    }
  }
  for (std::size_t k = 0; k < 32; ++k) {
    const std::size_t at = 32 * (k / 16) + k % 16;
    runs.octave_run_bytes[at] = runs.octave_run_bytes[at + 16] =
        static_cast<std::uint8_t>(runs.octave_run[k]);
  }
  std::copy(runs.transition.begin(), runs.transition.end(), runs.run_transition.begin());
  runs.run_transition[kTop] = std::numeric_limits<float>::infinity();
  for (std::uint32_t e = 0; e < runs.exponent_run.size(); ++e) {
    runs.exponent_run[e] =
        e < kQuantIntervalBase >> 23 ? 0 : static_cast<std::uint8_t>(runs.octave_run[e & 31]);
  }
  return runs;
}

QuantTables MakeTables(QuantMap which) {
  QuantTables t{};
  t.map = MakeDynamicMap(which == QuantMap::kSigned);
  for (std::size_t c = 0; c < 256; ++c) {
    const auto bits = std::bit_cast<std::uint32_t>(t.map[c]);
    for (std::size_t k = 0; k < 4; ++k)
      t.map_bytes[k][c] = static_cast<std::uint8_t>(bits >> (8 * k));
  }
  for (std::size_t c = 0; c + 1 < 256; ++c) t.threshold[c] = (t.map[c] + t.map[c + 1]) * 0.5f;
  t.threshold[255] = std::numeric_limits<float>::infinity();
  t.zero_code = which == QuantMap::kSigned ? 127 : 0;
  // Each interval's first magnitude, searched the slow way (its code is the number of thresholds it
  // exceeds, counted from the zero code), and the next threshold's offset if it lies inside.
  for (std::size_t k = 0; k < kQuantIntervals; ++k) {
    const std::uint32_t first =
        kQuantIntervalBase + static_cast<std::uint32_t>(k << kQuantIntervalShift);
    std::size_t code = t.zero_code;
    while (std::bit_cast<float>(first) > t.threshold[code]) ++code;
    const std::uint32_t next = std::bit_cast<std::uint32_t>(t.threshold[code]);
    const std::uint32_t offset = next - first < kNoThreshold ? next - first : kNoThreshold;
    t.interval[k] = static_cast<std::uint32_t>(code) | offset << 8;
  }
  t.runs = MakeRuns(t, which == QuantMap::kSigned);
  return t;
}

}  // namespace

const QuantTables& QuantTablesOf(QuantMap map) {
  static const QuantTables kSigned = MakeTables(QuantMap::kSigned);
  static const QuantTables kUnsigned = MakeTables(QuantMap::kUnsigned);
  return map == QuantMap::kSigned ? kSigned : kUnsigned;
}

const std::array<float, 256>& DynamicMap(QuantMap map) { return QuantTablesOf(map).map; }

std::uint8_t QuantizeValue(float x, QuantMap map) {
  const QuantTables& t = QuantTablesOf(map);
  const bool negative = x < 0.0f;
  if (negative && map == QuantMap::kUnsigned) return 0;
  // The code of |x| on the non-negative half: the interval's code, one more past its threshold.
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(std::fabs(x));
  const std::uint32_t clamped = std::clamp(bits, kQuantIntervalBase, kQuantIntervalTop);
  const std::uint32_t entry = t.interval[(clamped - kQuantIntervalBase) >> kQuantIntervalShift];
  auto code = static_cast<std::uint8_t>(entry & 0xFFu);
  if ((clamped & (kNoThreshold - 1)) > entry >> 8) ++code;
  if (!negative) return code;
  // The signed map's negatives mirror its positives (code c ↔ 254 − c, the entries negated) but
  // for 1.0, which has no negative: past the last threshold the nearest is code 0 (−0.99297). And
  // a negative value never takes the zero code: code 126, the smallest negative.
  if (code == 255) return 0;
  if (code == t.zero_code) return t.zero_code - 1;
  return static_cast<std::uint8_t>(254 - code);
}

void Quantize(const float* x, std::size_t n, QuantMap map, std::uint8_t* codes, float* absmax) {
  const QuantTables& t = QuantTablesOf(map);
  for (std::size_t b = 0; b * kQuantBlock < n; ++b) {
    const std::size_t begin = b * kQuantBlock;
    const std::size_t end = std::min(n, begin + kQuantBlock);
    float max = 0.0f;
    bool nan = false;
    for (std::size_t i = begin; i < end; ++i) {
      max = std::max(max, std::fabs(x[i]));
      nan = nan || std::isnan(x[i]);
    }
    absmax[b] = nan ? std::numeric_limits<float>::quiet_NaN() : max;
    const float inverse = 1.0f / max;
    for (std::size_t i = begin; i < end; ++i) {
      if (max == 0.0f || !std::isfinite(absmax[b])) {
        codes[i] = t.zero_code;
      } else {
        codes[i] = QuantizeValue(std::isinf(inverse) ? x[i] / max : x[i] * inverse, map);
      }
    }
  }
}

void QuantizeFill(float value, std::size_t n, QuantMap map, std::uint8_t* codes, float* absmax) {
  const std::vector<float> block(std::min(n, kQuantBlock), value);
  for (std::size_t b = 0; b * kQuantBlock < n; ++b) {
    Quantize(block.data(), std::min(kQuantBlock, n - b * kQuantBlock), map, codes + b * kQuantBlock,
             absmax + b);
  }
}

void Dequantize(const std::uint8_t* codes, const float* absmax, std::size_t n, QuantMap map,
                float* out) {
  const std::array<float, 256>& m = DynamicMap(map);
  for (std::size_t i = 0; i < n; ++i) out[i] = m[codes[i]] * absmax[i / kQuantBlock];
}

}  // namespace fusedopt
