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

QuantTables MakeTables(QuantMap which) {
  QuantTables t{};
  t.map = MakeDynamicMap(which == QuantMap::kSigned);
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
    for (std::size_t i = begin; i < end; ++i) {
      codes[i] =
          max > 0.0f && std::isfinite(absmax[b]) ? QuantizeValue(x[i] / max, map) : t.zero_code;
    }
  }
}

void Dequantize(const std::uint8_t* codes, const float* absmax, std::size_t n, QuantMap map,
                float* out) {
  const std::array<float, 256>& m = DynamicMap(map);
  for (std::size_t i = 0; i < n; ++i) out[i] = m[codes[i]] * absmax[i / kQuantBlock];
}

}  // namespace fusedopt
