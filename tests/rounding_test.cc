// Stochastic rounding (include/fusedopt/rounding.h, Segment::stochastic_rounding):
//   Rounding.Noise*        the counter-based hash: pinned values (an independent Python
//                          implementation gave them), dependence on every input, no correlation
//                          between streams, neighbours, steps or seeds;
//   Rounding.*Definition   the scalar converters against a double-precision definition, on bit
//                          patterns around every rounding boundary, with noise at the thresholds;
//   Rounding.Exact*        representable values never change, NaN stays NaN, overflow goes to Inf;
//   Rounding.*Unbiased     10^5 trials of one value: the mean is the value within 3σ (RNE is far
//                          off), through the scalar functions and through the kernels' SIMD stores;
//   Rounding.Simd*         the kernels' stores (through SgdStep with lr = 1, which makes the stored
//                          f32 value known exactly) bit for bit against the scalar functions on
//                          every SIMD target, including vectors that straddle a 2^32 index edge;
//   Rounding.FlagOff*      without the flag every store is round-to-nearest-even (dtype.h), and
//                          with the flag but no 16-bit store nothing changes;
//   Rounding.Same*         1 vs 2 threads, one segment vs two with matching global_offset (any
//                          order, other segments in between, separate calls): the same bits;
//   Rounding.*Reference    Adam with bf16 states and pure-bf16/f16 SGD against the double oracle;
//   Rounding.Adafactor*    the kernel's and the host's (row_var, col_var) stores against the scalar
//                          functions on every target, 1 vs 2 threads and segment order, and pure
//                          bf16 following the f32 run where round to nearest stagnates.
// FOPT_TEST_SMALL (ASan builds) shrinks the sweeps.

#include "fusedopt/rounding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/error.h"
#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "tests/reference/reference.h"
#include "tests/test_support.h"

namespace fusedopt {
namespace {

constexpr DType kF32 = DType::kF32;
constexpr DType kF16 = DType::kF16;
constexpr DType kBF16 = DType::kBF16;
constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();

using test::SmallOnly;

using test::Rng;
using test::TargetGuard;

std::string Hex(std::uint64_t x) {
  std::ostringstream out;
  out << "0x" << std::hex << x;
  return out.str();
}

float FromBits(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t Bits(float f) { return std::bit_cast<std::uint32_t>(f); }

double Widen(DType t, std::uint16_t h) { return t == kBF16 ? BF16ToF32(h) : F16ToF32(h); }
std::uint16_t RoundNearest(DType t, float f) { return t == kBF16 ? F32ToBF16(f) : F32ToF16(f); }
std::uint16_t RoundStochastic(DType t, float f, std::uint32_t noise) {
  return t == kBF16 ? F32ToBF16Stochastic(f, noise) : F32ToF16Stochastic(f, noise);
}

// ------------------------------------------------------------------------------------------------
// The noise

TEST(Rounding, NoiseIsPinned) {
  // From an independent Python transcription of rounding.h. Changing the hash changes every
  // stochastically rounded checkpoint: do it only on purpose, with a note in docs/numerics.md.
  EXPECT_EQ(RoundingNoise(0, 1, 0, 0), 0x2557CE20u);
  EXPECT_EQ(RoundingNoise(0, 1, 1, 0), 0x2251DE17u);
  EXPECT_EQ(RoundingNoise(0, 1, 0, 1), 0xAC69043Cu);
  EXPECT_EQ(RoundingNoise(42, 7, 123456789, 2), 0xB1776A11u);
  EXPECT_EQ(RoundingNoise(0x0123456789ABCDEFull, 1000000, (std::uint64_t{1} << 32) + 5, 3),
            0xAF05647Au);
  EXPECT_EQ(RoundingNoise(kU64Max, std::numeric_limits<std::int64_t>::max(), kU64Max - 1, 0),
            0xA676F213u);
  // The split the kernels use: key per (seed, step, stream, high index word), mixer per element.
  static_assert(RoundingNoise(5, 9, (std::uint64_t{7} << 32) | 11, 2) ==
                RoundingNoiseFromKey(RoundingKey(5, 9, 2, 7), 11));
  static_assert(RoundingStreamState(0) != kRoundingStreamParam);
}

// Pearson correlation of two samples of uniform 32-bit words.
double Correlation(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b) {
  double sa = 0, sb = 0, saa = 0, sbb = 0, sab = 0;
  const auto n = static_cast<double>(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = a[i] * 0x1p-32 - 0.5;
    const double y = b[i] * 0x1p-32 - 0.5;
    sa += x;
    sb += y;
    saa += x * x;
    sbb += y * y;
    sab += x * y;
  }
  const double cov = sab / n - (sa / n) * (sb / n);
  return cov / std::sqrt((saa / n - (sa / n) * (sa / n)) * (sbb / n - (sb / n) * (sb / n)));
}

// Every input changes the noise, and noise that changes with one input is uncorrelated with the
// noise before: the param and state streams of an element, neighbouring elements, consecutive
// steps, seeds, and index words 2^32 apart.
TEST(Rounding, NoiseIsUncorrelatedAcrossStreamsIndicesStepsAndSeeds) {
  const std::size_t n = SmallOnly() ? 1 << 14 : 1 << 18;
  const std::uint64_t seed = 0x5EED;
  const std::int64_t step = 17;
  const std::uint64_t base = 1000;
  std::vector<std::uint32_t> ref(n);
  for (std::size_t i = 0; i < n; ++i) ref[i] = RoundingNoise(seed, step, base + i, 0);

  struct Variant {
    const char* name;
    std::uint64_t seed;
    std::int64_t step;
    std::uint64_t index_shift;  // added to the index
    std::uint32_t stream;
  };
  const Variant variants[] = {
      {"stream 1 (state[0])", seed, step, 0, 1},
      {"stream 2 (state[1])", seed, step, 0, 2},
      {"stream 3 (state[2])", seed, step, 0, 3},
      {"next element", seed, step, 1, 0},
      {"element 2^32 further", seed, step, std::uint64_t{1} << 32, 0},
      {"next step", seed, step + 1, 0, 0},
      {"next seed", seed + 1, step, 0, 0},
  };
  // |r| of independent samples is about N(0, 1/n): 6/sqrt(n) is far out in the tail.
  const double bound = 6.0 / std::sqrt(static_cast<double>(n));
  for (const Variant& v : variants) {
    std::vector<std::uint32_t> other(n);
    std::size_t same = 0;
    for (std::size_t i = 0; i < n; ++i) {
      other[i] = RoundingNoise(v.seed, v.step, base + i + v.index_shift, v.stream);
      same += other[i] == ref[i];
    }
    EXPECT_LT(same, 4u) << v.name;
    EXPECT_LT(std::abs(Correlation(ref, other)), bound) << v.name;
  }
  // The bits the roundings use are uniform: each of the low 16 is set about half the time.
  for (int bit = 0; bit < 16; ++bit) {
    std::size_t ones = 0;
    for (std::uint32_t r : ref) ones += (r >> bit) & 1u;
    const double frac = static_cast<double>(ones) / static_cast<double>(n);
    EXPECT_NEAR(frac, 0.5, 6.0 * 0.5 / std::sqrt(static_cast<double>(n))) << "bit " << bit;
  }
}

// ------------------------------------------------------------------------------------------------
// The scalar converters against their definition

// The two candidates of a stochastic rounding of finite |x| to a format with `mant_bits` stored
// mantissa bits and smallest normal exponent `min_exp`, and how far |x| lies between them in units
// of 2^-`frac_bits` of an ulp (exact: f32 has `frac_bits` more mantissa bits than the format).
struct Bracket {
  double down;            // |x| rounded towards zero
  double up;              // the next value away from zero (may exceed the largest finite)
  std::uint32_t between;  // (|x| − down) / ulp · 2^frac_bits, in [0, 2^frac_bits)
};

Bracket BracketOf(float x, int mant_bits, int min_exp, int frac_bits) {
  const double a = std::fabs(static_cast<double>(x));
  if (!std::isfinite(a)) return {a, a, 0};
  const int e = a == 0.0 ? min_exp : std::max(std::ilogb(a), min_exp);
  const double ulp = std::ldexp(1.0, e - mant_bits);
  const double down = std::floor(a / ulp) * ulp;
  const double between = std::ldexp((a - down) / ulp, frac_bits);
  return {down, down + ulp, static_cast<std::uint32_t>(between)};
}

// The definition: round away from zero iff between + (noise mod 2^frac_bits) ≥ 2^frac_bits; a
// result beyond the largest finite value is Inf.
double StochasticDefinition(float x, std::uint32_t noise, int mant_bits, int min_exp, int frac_bits,
                            double max_finite) {
  const Bracket b = BracketOf(x, mant_bits, min_exp, frac_bits);
  const std::uint32_t mask = (1u << frac_bits) - 1u;
  double r = b.between + (noise & mask) >= (1u << frac_bits) ? b.up : b.down;
  if (r > max_finite) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, x);
}

// Bit patterns around every rounding boundary of both formats (all 2^16 upper halves with low
// halves at the edges and ties), plus a strided sweep over all 2^32 patterns.
std::vector<std::uint32_t> Patterns() {
  std::vector<std::uint32_t> out;
  const std::uint32_t hi_step = SmallOnly() ? 7 : 1;
  for (std::uint32_t hi = 0; hi < 0x10000u; hi += hi_step) {
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x0FFFu, 0x1000u, 0x1001u, 0x1FFFu, 0x2000u, 0x7FFFu,
                             0x8000u, 0x8001u, 0xE000u, 0xFFFFu}) {
      out.push_back(hi << 16 | lo);
    }
  }
  const std::uint64_t stride = SmallOnly() ? 65537 : 4099;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += stride)
    out.push_back(static_cast<std::uint32_t>(u));
  return out;
}

// Noise words for pattern u: the extremes, the exact threshold at which it rounds up and the word
// just below it, and a random word.
std::vector<std::uint32_t> NoisesFor(std::uint32_t threshold, std::uint32_t mask, Rng& rng) {
  return {0u, mask, threshold & mask, (threshold - 1u) & mask, rng.Next32(), 0xFFFFFFFFu & ~mask};
}

TEST(Rounding, BF16StochasticMatchesDefinition) {
  Rng rng(1);
  std::size_t up = 0, down = 0;
  for (std::uint32_t u : Patterns()) {
    const float f = FromBits(u);
    const Bracket b = BracketOf(f, 7, -126, 16);
    for (std::uint32_t noise : NoisesFor(0x10000u - b.between, 0xFFFFu, rng)) {
      const std::uint16_t h = F32ToBF16Stochastic(f, noise);
      if (std::isnan(f)) {
        ASSERT_TRUE(std::isnan(BF16ToF32(h))) << Hex(u);
        ASSERT_EQ(h >> 15, u >> 31) << "NaN sign lost for " << Hex(u);
        ASSERT_EQ(h, F32ToBF16(f)) << "NaN as RNE makes it, " << Hex(u);
        continue;
      }
      const double want =
          std::isinf(f) ? f : StochasticDefinition(f, noise, 7, -126, 16, 0x1.FEp127);
      ASSERT_EQ(static_cast<double>(BF16ToF32(h)), want)
          << "bits " << Hex(u) << " noise " << Hex(noise);
      ASSERT_EQ(std::signbit(BF16ToF32(h)), std::signbit(f)) << Hex(u);
      (std::fabs(BF16ToF32(h)) > std::fabs(f) ? up : down) += 1;
    }
  }
  EXPECT_GT(up, 100000u);  // both directions were exercised
  EXPECT_GT(down, 100000u);
}

TEST(Rounding, F16StochasticMatchesDefinition) {
  Rng rng(2);
  std::size_t stochastic = 0;
  for (std::uint32_t u : Patterns()) {
    const float f = FromBits(u);
    const double a = std::fabs(static_cast<double>(f));
    const Bracket b = BracketOf(f, 10, -14, 13);
    for (std::uint32_t noise : NoisesFor(0x2000u - b.between, 0x1FFFu, rng)) {
      const std::uint16_t h = F32ToF16Stochastic(f, noise);
      if (std::isnan(f)) {
        ASSERT_TRUE(std::isnan(F16ToF32(h))) << Hex(u);
        continue;
      }
      double want;
      if (a >= 65536.0) {
        want = std::copysign(std::numeric_limits<double>::infinity(), f);  // as RNE
      } else if (a < 0x1p-14) {
        want = F16ToF32(F32ToF16(f));  // subnormal results: round to nearest even
      } else {
        want = StochasticDefinition(f, noise, 10, -14, 13, 65504.0);
        ++stochastic;
      }
      ASSERT_EQ(static_cast<double>(F16ToF32(h)), want)
          << "bits " << Hex(u) << " noise " << Hex(noise);
      ASSERT_EQ(std::signbit(F16ToF32(h)), std::signbit(f)) << Hex(u);
    }
  }
  EXPECT_GT(stochastic, 100000u);
}

TEST(Rounding, ExactValuesNeverChangeAndOverflowGoesToInf) {
  Rng rng(3);
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    for (int k = 0; k < (SmallOnly() ? 4 : 32); ++k) {
      const std::uint32_t noise = k == 0 ? 0xFFFFFFFFu : rng.Next32();
      const float b = BF16ToF32(h);
      if (std::isnan(b)) {
        ASSERT_TRUE(std::isnan(BF16ToF32(F32ToBF16Stochastic(b, noise))));
      } else {
        ASSERT_EQ(F32ToBF16Stochastic(b, noise), h) << "bf16 " << Hex(bits);
      }
      const float f = F16ToF32(h);
      if (std::isnan(f)) {
        ASSERT_TRUE(std::isnan(F16ToF32(F32ToF16Stochastic(f, noise))));
      } else {
        ASSERT_EQ(F32ToF16Stochastic(f, noise), h) << "f16 " << Hex(bits);
      }
    }
  }
  // Halfway between the largest finite bf16 (0x7F7F) and 2^128: Inf iff the noise carries.
  const float above_max_bf16 = FromBits(0x7F7F8000u);
  EXPECT_EQ(F32ToBF16Stochastic(above_max_bf16, 0x7FFFu), 0x7F7Fu);
  EXPECT_EQ(F32ToBF16Stochastic(above_max_bf16, 0x8000u), 0x7F80u);
  EXPECT_EQ(F32ToBF16Stochastic(-above_max_bf16, 0x8000u), 0xFF80u);
  EXPECT_EQ(F32ToBF16Stochastic(FromBits(0x7F7FFFFFu), 0x0001u), 0x7F80u);
  // f16: 65504 is the largest finite; 65520 lies halfway to 65536 (Inf).
  EXPECT_EQ(F32ToF16Stochastic(65520.0f, 0x0FFFu), 0x7BFFu);
  EXPECT_EQ(F32ToF16Stochastic(65520.0f, 0x1000u), 0x7C00u);
  EXPECT_EQ(F32ToF16Stochastic(65535.0f, 0x0000u), 0x7BFFu);
  EXPECT_EQ(F32ToF16Stochastic(65536.0f, 0x0000u), 0x7C00u);
  EXPECT_EQ(F32ToF16Stochastic(1e30f, 0x0000u), 0x7C00u);
  EXPECT_EQ(F32ToF16Stochastic(-std::numeric_limits<float>::infinity(), 0x1FFFu), 0xFC00u);
  // Subnormal f16 results round to nearest even whatever the noise.
  const float tiny = 0x1.8p-24f * 1.25f;  // between the first two f16 subnormals
  EXPECT_EQ(F32ToF16Stochastic(tiny, 0x1FFFu), F32ToF16(tiny));
  EXPECT_EQ(F32ToF16Stochastic(tiny, 0x0000u), F32ToF16(tiny));
  // A signalling NaN comes out quiet, as with RNE.
  EXPECT_EQ(F32ToBF16Stochastic(FromBits(0x7F800001u), 0xFFFFu), F32ToBF16(FromBits(0x7F800001u)));
}

// ------------------------------------------------------------------------------------------------
// Unbiasedness of the scalar functions driven by RoundingNoise

struct Trials {
  double mean_error;  // mean of (rounded − x), in ulps of the format at x
  double sigma;       // standard deviation of that mean for a fair stochastic rounding
};

// Rounds x `n` times with the noise of one element over n steps (as a training run would) and
// returns the mean error.
Trials RoundMany(DType t, float x, std::size_t n, bool stochastic) {
  const int mant_bits = t == kBF16 ? 7 : 10;
  const int min_exp = t == kBF16 ? -126 : -14;
  const Bracket b = BracketOf(x, mant_bits, min_exp, 0);
  const double ulp = b.up - b.down;
  double sum = 0.0;
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint32_t noise =
        RoundingNoise(0xC0FFEE, static_cast<std::int64_t>(k + 1), 12345, kRoundingStreamParam);
    const std::uint16_t h = stochastic ? RoundStochastic(t, x, noise) : RoundNearest(t, x);
    sum += (Widen(t, h) - static_cast<double>(x)) / ulp;
  }
  const double p = (std::fabs(static_cast<double>(x)) - b.down) / ulp;
  return {sum / static_cast<double>(n), std::sqrt(p * (1.0 - p) / static_cast<double>(n))};
}

TEST(Rounding, ScalarStochasticRoundingIsUnbiased) {
  const std::size_t n = SmallOnly() ? 20000 : 100000;
  struct Case {
    DType t;
    float x;
  };
  const Case cases[] = {
      {kBF16, 1.0f + 0.3f * 0x1p-7f},
      {kBF16, -(1.0f + 0.7f * 0x1p-7f)},
      {kBF16, 3.14159265f},
      {kBF16, 1e-30f},
      {kBF16, 0x1.0123p-130f},  // bf16 subnormal range: still stochastic
      {kF16, 1.0f + 0.3f * 0x1p-10f},
      {kF16, -1000.3f},
      {kF16, 6.2e-5f},
      {kF16, 65510.0f},  // may round up to Inf: below
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(DTypeName(c.t)) + " x=" + std::to_string(c.x));
    if (c.t == kF16 && c.x > 65504.0f) {
      // Rounding up gives Inf: count how often instead of averaging.
      std::size_t inf = 0;
      for (std::size_t k = 0; k < n; ++k) {
        const std::uint32_t noise = RoundingNoise(7, static_cast<std::int64_t>(k + 1), 0, 0);
        inf += std::isinf(F16ToF32(F32ToF16Stochastic(c.x, noise)));
      }
      const double p = (65510.0 - 65504.0) / 32.0;
      const double frac = static_cast<double>(inf) / static_cast<double>(n);
      EXPECT_NEAR(frac, p, 3.0 * std::sqrt(p * (1 - p) / static_cast<double>(n)));
      continue;
    }
    const Trials sr = RoundMany(c.t, c.x, n, true);
    ASSERT_GT(sr.sigma, 0.0);
    EXPECT_LE(std::abs(sr.mean_error), 3.0 * sr.sigma) << "sigma " << sr.sigma;
    // Round-to-nearest-even is biased by a fixed amount: the test can tell them apart.
    const Trials rne = RoundMany(c.t, c.x, n, false);
    EXPECT_GT(std::abs(rne.mean_error), 10.0 * sr.sigma);
  }
}

// ------------------------------------------------------------------------------------------------
// Kernel stores: buffers and a harness around SgdStep

// A buffer of one dtype with raw 16-bit or f32 access.
class Buffer {
 public:
  Buffer(DType t, std::size_t n) : dtype_(t), n_(n), bytes_(n * DTypeSize(t) + 1) {}
  DType dtype() const { return dtype_; }
  std::size_t size() const { return n_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  float Get(std::size_t i) const { return LoadAsF32(data(), dtype_, i); }
  void Set(std::size_t i, float v) { StoreFromF32(data(), dtype_, i, v); }
  std::uint16_t Bits16(std::size_t i) const {
    std::uint16_t h;
    std::memcpy(&h, bytes_.data() + 2 * i, 2);
    return h;
  }
  std::uint32_t Bits32(std::size_t i) const {
    std::uint32_t u;
    std::memcpy(&u, bytes_.data() + 4 * i, 4);
    return u;
  }
  void Fill(float v) {
    for (std::size_t i = 0; i < n_; ++i) Set(i, v);
  }
  bool operator==(const Buffer& o) const { return dtype_ == o.dtype_ && bytes_ == o.bytes_; }

 private:
  DType dtype_;
  std::size_t n_;
  std::vector<std::uint8_t> bytes_;
};

// Gradient values that reach every branch of both stores: random bit patterns (NaN, Inf, huge,
// subnormal), values in the f16 range with any exponent, and f32 values near bf16 ties.
std::vector<float> InterestingValues(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (rng.Next() % 4) {
      case 0:
        out[i] = FromBits(rng.Next32());
        break;
      case 1: {
        const int e = static_cast<int>(rng.Next() % 46) - 28;  // 2^-28 .. 2^17
        out[i] = static_cast<float>(std::ldexp(rng.Uniform(-2.0, 2.0), e));
        break;
      }
      case 2: {
        const std::uint32_t lows[] = {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu, 0x1000u};
        out[i] = FromBits((rng.Next32() & 0xFFFF0000u) | lows[rng.Next() % 6]);
        break;
      }
      default:
        out[i] = static_cast<float>(rng.Uniform(-70000.0, 70000.0));
    }
  }
  return out;
}

struct StoreCase {
  DType param;
  DType grad;
  DType state;
  bool master;
  std::uint64_t global_offset;
  std::uint64_t seed;
  std::int64_t step;
  std::int64_t rounding_step = 0;  // Segment::rounding_step: 0 keys the noise by step
};

std::int64_t NoiseStepOf(const StoreCase& c) {
  return c.rounding_step != 0 ? c.rounding_step : c.step;
}

std::string Describe(const StoreCase& c) {
  std::ostringstream o;
  o << "param " << DTypeName(c.param) << (c.master ? "+master" : "") << ", grad "
    << DTypeName(c.grad) << ", state " << DTypeName(c.state) << ", global_offset "
    << Hex(c.global_offset) << ", seed " << Hex(c.seed) << ", step " << c.step << ", rounding_step "
    << c.rounding_step;
  return o.str();
}

// One SgdStep with lr = 1 and momentum (no dampening) from param = 0 and momentum_buffer = 0:
// the kernel's f32 results are then known exactly on every target (FMA or not):
//   momentum_buffer = g (first step) or 0.9·0 + g = g + 0 (later steps),
//   param = −momentum_buffer + 0,
// so the stored bits show the stores alone.
struct StoreRun {
  Buffer param, grad, state;
  std::vector<float> master;
  std::vector<float> grad_f32;  // the gradient as the kernel reads it

  StoreRun(const StoreCase& c, const std::vector<float>& values)
      : param(c.param, values.size()),
        grad(c.grad, values.size()),
        state(c.state, values.size()),
        master(c.master ? values.size() : 0, 0.0f),
        grad_f32(values.size()) {
    param.Fill(0.0f);
    state.Fill(0.0f);
    for (std::size_t i = 0; i < values.size(); ++i) {
      grad.Set(i, values[i]);
      grad_f32[i] = grad.Get(i);
    }
  }

  void Step(const StoreCase& c, bool stochastic, Runtime& runtime) {
    Segment s;
    s.param = param.data();
    s.grad = grad.data();
    s.state[kMomentumBuffer] = state.data();
    s.master = c.master ? master.data() : nullptr;
    s.numel = param.size();
    s.param_dtype = c.param;
    s.grad_dtype = c.grad;
    s.state_dtype = c.state;
    s.step = c.step;
    s.rounding_step = c.rounding_step;
    s.stochastic_rounding = stochastic;
    s.rounding_seed = c.seed;
    s.global_offset = c.global_offset;
    const SgdHyper h{.lr = 1.0, .momentum = 0.9};
    SgdStep(std::span<const SgdHyper>(&h, 1), std::span<const Segment>(&s, 1), runtime);
  }

  float ExpectedState(const StoreCase& c, std::size_t i) const {
    return c.step == 1 ? grad_f32[i] : grad_f32[i] + 0.0f;
  }
  float ExpectedParam(const StoreCase& c, std::size_t i) const {
    return -ExpectedState(c, i) + 0.0f;
  }
};

// Checks one stored element: bits equal to `want` (NaN iff NaN for 16-bit NaNs, whose payload is
// not specified). Returns "" or a message.
std::string CheckStored(const Buffer& b, std::size_t i, float value, std::uint16_t want16,
                        const char* what) {
  if (b.dtype() == kF32) {
    if (std::isnan(value) ? std::isnan(b.Get(i)) : b.Bits32(i) == Bits(value)) return "";
    std::ostringstream o;
    o << what << " i=" << i << ": f32 " << Hex(b.Bits32(i)) << ", want " << Hex(Bits(value));
    return o.str();
  }
  const std::uint16_t got = b.Bits16(i);
  if (std::isnan(value) ? std::isnan(Widen(b.dtype(), got)) : got == want16) return "";
  std::ostringstream o;
  o << what << " i=" << i << ": value " << Hex(Bits(value)) << " (" << value << ") stored as "
    << Hex(got) << ", want " << Hex(want16);
  return o.str();
}

// Compares a run's buffers with the scalar functions; returns the first mismatches.
std::string CompareRun(const StoreRun& run, const StoreCase& c, bool stochastic) {
  std::string out;
  int failures = 0;
  auto expect16 = [&](DType t, float v, std::uint32_t stream, std::size_t i) {
    if (t == kF32) return std::uint16_t{0};
    return stochastic
               ? RoundStochastic(t, v,
                                 RoundingNoise(c.seed, NoiseStepOf(c), c.global_offset + i, stream))
               : RoundNearest(t, v);
  };
  for (std::size_t i = 0; i < run.param.size() && failures < 5; ++i) {
    const float s = run.ExpectedState(c, i);
    const float p = run.ExpectedParam(c, i);
    std::string e =
        CheckStored(run.state, i, s, expect16(c.state, s, RoundingStreamState(kMomentumBuffer), i),
                    "momentum_buffer");
    if (c.master) {
      // The master is exact f32 and its 16-bit param copy is rounded to nearest even.
      if (std::isnan(p) ? !std::isnan(run.master[i]) : Bits(run.master[i]) != Bits(p)) {
        e += " master i=" + std::to_string(i) + " is " + Hex(Bits(run.master[i]));
      }
      e += CheckStored(run.param, i, p, RoundNearest(c.param, p), " param(RNE of master)");
    } else {
      e += CheckStored(run.param, i, p, expect16(c.param, p, kRoundingStreamParam, i), " param");
    }
    if (!e.empty()) {
      out += "    " + e + "\n";
      ++failures;
    }
  }
  return out;
}

std::vector<StoreCase> StoreCases() {
  std::vector<StoreCase> out;
  const std::uint64_t offsets[] = {0, (std::uint64_t{1} << 32) - 5, 0x0000123480000003ull};
  std::size_t k = 0;
  for (DType p : {kBF16, kF16, kF32}) {
    for (DType st : {kBF16, kF16, kF32}) {
      for (DType g : {kF32, kBF16, kF16}) {
        for (bool master : {false, true}) {
          if (master && p == kF32) continue;
          if (p == kF32 && st == kF32) continue;  // nothing to round: FlagOff covers it
          const std::int64_t steps[] = {1, 2, 1000003};
          // SGD's step 2 (a momentum buffer that is not fresh) with its own count keying the
          // noise, as the Python classes and the libtorch adapter pass it.
          const std::int64_t rounding_steps[] = {0, 5 + static_cast<std::int64_t>(k), 0};
          out.push_back({p, g, st, master, offsets[k % 3], 0x9E3779B97F4A7C15ull * (k + 1),
                         steps[k % 3], rounding_steps[k % 3]});
          ++k;
        }
      }
    }
  }
  return out;
}

TEST(Rounding, SimdStoresMatchScalarOnEveryTarget) {
  // Two 32768-element chunks (one per thread) and vector tails.
  const std::size_t n = SmallOnly() ? 4 * 1024 + 13 : 32768 + 4099;
  const std::vector<float> values = InterestingValues(n, 4);
  TargetGuard guard;
  Runtime runtime(2);
  for (const std::string& target : test::KernelTargets()) {
    ForceTarget(target);
    ASSERT_EQ(ActiveTargetName(), target);
    for (const StoreCase& c : StoreCases()) {
      StoreRun run(c, values);
      run.Step(c, true, runtime);
      const std::string report = CompareRun(run, c, true);
      EXPECT_TRUE(report.empty()) << "target " << target << ", " << Describe(c) << ":\n" << report;
    }
  }
}

// Global indices that cross a multiple of 2^32 inside one SIMD vector, and the top of the index
// range: small buffers at offsets 2^32 − k for every k up to the widest vector, every target.
TEST(Rounding, SimdNoiseAcrossTheHighIndexWordOnEveryTarget) {
  const std::size_t n = 67;
  const std::vector<float> values = InterestingValues(n, 5);
  TargetGuard guard;
  Runtime runtime(1);
  for (const std::string& target : test::KernelTargets()) {
    ForceTarget(target);
    for (std::uint64_t k = 0; k <= 40; ++k) {
      for (std::uint64_t edge : {std::uint64_t{1} << 32, std::uint64_t{3} << 32, kU64Max - n}) {
        const StoreCase c{kBF16, kF32, kF16, false, edge - k, 77, 3};
        StoreRun run(c, values);
        run.Step(c, true, runtime);
        const std::string report = CompareRun(run, c, true);
        ASSERT_TRUE(report.empty()) << "target " << target << ", " << Describe(c) << ":\n"
                                    << report;
      }
    }
  }
}

// Without the flag every 16-bit store rounds to nearest even (dtype.h), whatever the seed and
// offset say.
TEST(Rounding, FlagOffIsRoundToNearestEvenOnEveryTarget) {
  const std::size_t n = SmallOnly() ? 2000 : 32768 + 77;
  const std::vector<float> values = InterestingValues(n, 6);
  TargetGuard guard;
  Runtime runtime(2);
  for (const std::string& target : test::KernelTargets()) {
    ForceTarget(target);
    for (StoreCase c : StoreCases()) {
      StoreRun run(c, values);
      run.Step(c, false, runtime);
      const std::string report = CompareRun(run, c, false);
      EXPECT_TRUE(report.empty()) << "target " << target << ", " << Describe(c) << ":\n" << report;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Adam on one tensor, as one segment or split into pieces

struct AdamTensor {
  Buffer param, grad, m, v;
  std::vector<float> master;

  AdamTensor(DType p, DType g, DType st, std::size_t n, bool with_master, std::uint64_t seed)
      : param(p, n), grad(g, n), m(st, n), v(st, n), master(with_master ? n : 0) {
    Rng rng(seed);
    for (std::size_t i = 0; i < n; ++i) {
      const auto x = static_cast<float>(rng.Uniform(-1.0, 1.0));
      param.Set(i, x);
      if (with_master) master[i] = x;
      grad.Set(i, static_cast<float>(rng.Uniform(-0.1, 0.1)));
      m.Set(i, static_cast<float>(rng.Uniform(-0.01, 0.01)));
      v.Set(i, static_cast<float>(rng.Uniform(0.0, 1e-3)));
    }
  }

  // The segment of elements [begin, end).
  Segment Part(std::size_t begin, std::size_t end, std::int64_t step, std::uint64_t seed,
               std::uint64_t global_offset, bool stochastic) {
    auto at = [&](Buffer& b) {
      return static_cast<void*>(static_cast<std::uint8_t*>(b.data()) +
                                begin * DTypeSize(b.dtype()));
    };
    Segment s;
    s.param = at(param);
    s.grad = static_cast<const std::uint8_t*>(grad.data()) + begin * DTypeSize(grad.dtype());
    s.state[kExpAvg] = at(m);
    s.state[kExpAvgSq] = at(v);
    s.master = master.empty() ? nullptr : master.data() + begin;
    s.numel = end - begin;
    s.param_dtype = param.dtype();
    s.grad_dtype = grad.dtype();
    s.state_dtype = m.dtype();
    s.step = step;
    s.stochastic_rounding = stochastic;
    s.rounding_seed = seed;
    s.global_offset = global_offset + begin;
    return s;
  }

  bool operator==(const AdamTensor& o) const {
    return param == o.param && m == o.m && v == o.v && master == o.master;
  }
};

const AdamWHyper kAdamW{.lr = 1e-3, .weight_decay = 0.01};

void AdamWSteps(std::span<const Segment> segments, Runtime& runtime) {
  const AdamWHyper groups[] = {kAdamW, kAdamW};
  AdamWStep(groups, segments, runtime);
}

TEST(Rounding, SameBitsForAnyThreadCountAndSegmentSplit) {
  const std::size_t n = SmallOnly() ? 2 * 32768 + 77 : 5 * 32768 + 77;
  const std::size_t cut = 40000 + 3;  // not on a chunk or vector edge
  const std::uint64_t offset = 123456789012ull, seed = 99;
  auto fresh = [&] { return AdamTensor(kBF16, kBF16, kBF16, n, false, 11); };
  Runtime one(1), two(2);

  // Reference: one segment, one thread, steps 5 and 6.
  AdamTensor ref = fresh();
  for (std::int64_t step : {5, 6}) {
    const Segment s = ref.Part(0, n, step, seed, offset, true);
    AdamWSteps({&s, 1}, one);
  }

  {  // two threads
    AdamTensor t = fresh();
    for (std::int64_t step : {5, 6}) {
      const Segment s = t.Part(0, n, step, seed, offset, true);
      AdamWSteps({&s, 1}, two);
    }
    EXPECT_TRUE(t == ref) << "1 vs 2 threads";
  }
  {  // two segments, reversed, in different groups, with an unrelated tensor first
    AdamTensor t = fresh();
    AdamTensor other = AdamTensor(kBF16, kF32, kBF16, 1000, false, 12);
    for (std::int64_t step : {5, 6}) {
      Segment segs[] = {other.Part(0, 1000, 2, 1, 0, true),
                        t.Part(cut, n, step, seed, offset, true),
                        t.Part(0, cut, step, seed, offset, true)};
      segs[1].group = 1;
      AdamWSteps(segs, two);
    }
    EXPECT_TRUE(t == ref) << "split into two segments";
  }
  {  // each half in its own call (as two ZeRO shards would)
    AdamTensor t = fresh();
    for (std::int64_t step : {5, 6}) {
      const Segment lo = t.Part(0, cut, step, seed, offset, true);
      const Segment hi = t.Part(cut, n, step, seed, offset, true);
      AdamWSteps({&hi, 1}, one);
      AdamWSteps({&lo, 1}, two);
    }
    EXPECT_TRUE(t == ref) << "one call per half";
  }
  // The noise does depend on the seed and on the global offset.
  for (auto [seed2, offset2] : {std::pair{seed + 1, offset}, std::pair{seed, offset + 1}}) {
    AdamTensor t = fresh();
    for (std::int64_t step : {5, 6}) {
      const Segment s = t.Part(0, n, step, seed2, offset2, true);
      AdamWSteps({&s, 1}, one);
    }
    EXPECT_FALSE(t.param == ref.param) << "seed " << seed2 << " offset " << offset2;
    EXPECT_FALSE(t.m == ref.m) << "seed " << seed2 << " offset " << offset2;
  }
}

// With the flag on but no store it applies to (f32 param and states, or a master copy with f32
// states), the results are those of the flag off, bit for bit.
TEST(Rounding, FlagWithoutSixteenBitStoresChangesNothing) {
  const std::size_t n = 5000;
  Runtime runtime(2);
  for (bool with_master : {false, true}) {
    const DType p = with_master ? kBF16 : kF32;
    AdamTensor on(p, kBF16, kF32, n, with_master, 13), off(p, kBF16, kF32, n, with_master, 13);
    for (std::int64_t step : {1, 2}) {
      const Segment a = on.Part(0, n, step, 42, 0, true);
      const Segment b = off.Part(0, n, step, 42, 0, false);
      AdamWSteps({&a, 1}, runtime);
      AdamWSteps({&b, 1}, runtime);
    }
    EXPECT_TRUE(on == off) << "master " << with_master;
  }
}

// ------------------------------------------------------------------------------------------------
// Against the double-precision oracle

// Ulp of a 16-bit format at |x| (normal range).
double Ulp16(DType t, double x) {
  const int e = std::max(std::ilogb(std::fabs(x)), t == kBF16 ? -126 : -14);
  return std::ldexp(1.0, e - (t == kBF16 ? 7 : 10));
}

// Adam with f32 params and bf16 moments rounded stochastically, one step at a time from the
// kernel's own buffers: each stored moment is one of the two bf16 neighbours of the oracle's value
// (up to f32 rounding), and the mean signed error is zero within 5σ (RNE of random data is also
// unbiased; truncation is −0.5 ulp). The f32 param follows the oracle to f32 precision.
TEST(Rounding, AdamWithBf16StatesFollowsTheDoubleReference) {
  const std::size_t n = SmallOnly() ? 4096 + 3 : 65536 + 3;
  AdamTensor t(kF32, kF32, kBF16, n, false, 21);
  Runtime runtime(2);
  for (std::int64_t step = 1; step <= 8; ++step) {
    std::vector<double> p(n), g(n), m(n), v(n), unused;
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = t.param.Get(i);
      g[i] = t.grad.Get(i);
      m[i] = t.m.Get(i);
      v[i] = t.v.Get(i);
    }
    AdamHyper h = kAdamW.ToAdam();
    ref::AdamStep(h, step, p, g, m, v, unused);
    const Segment s = t.Part(0, n, step, 5, 1000, true);
    AdamWSteps({&s, 1}, runtime);

    for (auto [buf, r, name] :
         {std::tuple{&t.m, &m, "exp_avg"}, std::tuple{&t.v, &v, "exp_avg_sq"}}) {
      double sum = 0.0;
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double want = (*r)[i];
        const double ulp =
            Ulp16(kBF16, std::max(std::fabs(want), std::fabs(static_cast<double>(buf->Get(i)))));
        const double err = (buf->Get(i) - want) / ulp;
        // Within one ulp plus the f32 math's own error (a few 2^-24 relative = 2^-16 ulp).
        if (!(std::abs(err) < 1.0 + 1e-3)) {
          if (bad++ < 5)
            ADD_FAILURE() << name << " step " << step << " i=" << i << ": " << buf->Get(i) << " vs "
                          << want;
        }
        sum += err;
      }
      const double mean = sum / static_cast<double>(n);
      EXPECT_LT(std::abs(mean), 5.0 * 0.5 / std::sqrt(static_cast<double>(n)))
          << name << " step " << step << ": mean signed error " << mean << " ulp";
    }
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(t.param.Get(i), p[i], 1e-6 * std::abs(p[i]) + 1e-9) << "param i=" << i;
    }
  }
}

// Pure 16-bit SGD (no master copy) with updates of a fraction of an ulp: round-to-nearest-even
// never moves the params, stochastic rounding follows the exact trajectory on average, and each
// element stays within a Hoeffding bound of it.
TEST(Rounding, PureSixteenBitSgdFollowsTheDoubleReference) {
  const std::size_t n = SmallOnly() ? 4096 : 32768 + 5;
  const int steps = SmallOnly() ? 24 : 64;
  Runtime runtime(1);  // many small calls: no thread start-up per call
  TargetGuard guard;
  for (const std::string& target : test::KernelTargets()) {
    ForceTarget(target);
    for (DType t : {kBF16, kF16}) {
      SCOPED_TRACE(target + " " + std::string(DTypeName(t)));
      const double ulp = Ulp16(t, 1.5);  // params stay in [1, 2)
      Rng rng(31);
      Buffer grad(kF32, n);
      std::vector<double> p0(n), want(n);
      Buffer param_sr(t, n), param_rne(t, n);
      for (std::size_t i = 0; i < n; ++i) {
        param_sr.Set(i, static_cast<float>(rng.Uniform(1.3, 1.7)));
        p0[i] = param_sr.Get(i);
        // lr·g between 0.05 and 0.45 ulp, either sign: never half an ulp.
        const double sign = rng.Next() % 2 ? 1.0 : -1.0;
        grad.Set(i, static_cast<float>(sign * rng.Uniform(0.05, 0.45) * ulp / 0.5));
      }
      param_rne = param_sr;
      const SgdHyper h{.lr = 0.5};
      for (int k = 1; k <= steps; ++k) {
        for (bool stochastic : {true, false}) {
          Segment s;
          s.param = (stochastic ? param_sr : param_rne).data();
          s.grad = grad.data();
          s.numel = n;
          s.param_dtype = t;
          s.step = k;
          s.stochastic_rounding = stochastic;
          s.rounding_seed = 2024;
          SgdStep({&h, 1}, {&s, 1}, runtime);
        }
      }
      double sum = 0.0;
      // Each element's error is a sum of `steps` independent errors of range 1 ulp and mean 0.
      const double hoeffding = std::sqrt(steps / 2.0 * std::log(2.0 * n / 1e-6));
      for (std::size_t i = 0; i < n; ++i) {
        const double lr_g = static_cast<double>(static_cast<float>(0.5 * grad.Get(i)));
        want[i] = p0[i] - steps * lr_g;
        const double err = (param_sr.Get(i) - want[i]) / ulp;
        ASSERT_LT(std::abs(err), hoeffding) << "i=" << i;
        sum += err;
        ASSERT_EQ(param_rne.Get(i), p0[i]) << "RNE moved i=" << i;
      }
      const double mean = sum / static_cast<double>(n);
      const double sigma = 0.5 * std::sqrt(steps / static_cast<double>(n));
      EXPECT_LT(std::abs(mean), 5.0 * sigma) << "mean error " << mean << " ulp";
      // The expected drift is large: stagnation (RNE) would be off by many sigma.
      double drift = 0.0;
      for (std::size_t i = 0; i < n; ++i) drift += std::abs(want[i] - p0[i]) / ulp;
      EXPECT_GT(drift / static_cast<double>(n), 100.0 * sigma);
    }
  }
}

// The noise through the kernels is unbiased too: one value, stored by 10^5 elements of one step.
TEST(Rounding, KernelStochasticRoundingIsUnbiased) {
  const std::size_t n = SmallOnly() ? 20000 : 100000;
  for (DType t : {kBF16, kF16}) {
    const float x = t == kBF16 ? 1.0f + 0.3f * 0x1p-7f : 1.0f + 0.3f * 0x1p-10f;
    for (bool stochastic : {true, false}) {
      // SGD with lr = 1 from param 0: param = −g = x.
      Buffer param(t, n), grad(kF32, n);
      param.Fill(0.0f);
      grad.Fill(-x);
      Segment s;
      s.param = param.data();
      s.grad = grad.data();
      s.numel = n;
      s.param_dtype = t;
      s.stochastic_rounding = stochastic;
      s.rounding_seed = 8;
      s.global_offset = 1 << 20;
      const SgdHyper h{.lr = 1.0};
      Runtime runtime(2);
      SgdStep({&h, 1}, {&s, 1}, runtime);
      double sum = 0.0;
      for (std::size_t i = 0; i < n; ++i) sum += param.Get(i) - static_cast<double>(x);
      const double ulp = Ulp16(t, x), p = 0.3;
      const double mean = sum / static_cast<double>(n) / ulp;
      const double sigma = std::sqrt(p * (1 - p) / static_cast<double>(n));
      if (stochastic) {
        EXPECT_LE(std::abs(mean), 3.0 * sigma) << DTypeName(t);
      } else {
        // Every element rounds down to 1: the whole distance, 0.3 ulp.
        EXPECT_DOUBLE_EQ(mean, (1.0 - static_cast<double>(x)) / ulp) << DTypeName(t);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Adafactor: the param and a vector's variance (a 1×1 matrix's factors) are stored by the update
// kernel, a matrix's row_var and col_var by the host after it (src/core/factored_step.cc
// StoreFactor).

// One Adafactor tensor: param (16-bit without master, or with an f32 master), grad, and its states
// (row_var batch·rows and col_var batch·cols for matrices, variance numel for a vector; a 1×1
// matrix keeps numel of each factor).
struct AdafactorTensor {
  std::size_t rows, cols, numel;
  Buffer param, grad, row_var, col_var, variance;
  std::vector<float> master;

  AdafactorTensor(DType p, DType st, std::size_t r, std::size_t c, std::size_t n, bool with_master,
                  std::uint64_t seed)
      : rows(r),
        cols(c),
        numel(n),
        param(p, n),
        grad(p, n),
        row_var(st, r == 0 ? 0 : (r == 1 && c == 1 ? n : n / c)),
        col_var(st, r == 0 ? 0 : (r == 1 && c == 1 ? n : n / r)),
        variance(st, r == 0 ? n : 0),
        master(with_master ? n : 0) {
    Rng rng(seed);
    for (std::size_t i = 0; i < n; ++i) {
      const auto x = static_cast<float>(rng.Uniform(-1.0, 1.0));
      param.Set(i, x);
      if (with_master) master[i] = x;
    }
    for (Buffer* b : {&row_var, &col_var, &variance}) {
      for (std::size_t i = 0; i < b->size(); ++i)
        b->Set(i, static_cast<float>(rng.Uniform(1e-4, 0.02)));
    }
  }

  void NewGrad(std::uint64_t seed) {
    Rng rng(seed);
    for (std::size_t i = 0; i < numel; ++i) grad.Set(i, static_cast<float>(rng.Uniform(-0.1, 0.1)));
  }

  // The same tensor with f32 param and states (exact copies of the 16-bit values): its step gives
  // the f32 values the 16-bit run rounds.
  AdafactorTensor F32Copy() const {
    AdafactorTensor t(kF32, kF32, rows, cols, numel, false, 0);
    for (std::size_t i = 0; i < numel; ++i)
      t.param.Set(i, master.empty() ? param.Get(i) : master[i]);
    for (std::size_t i = 0; i < numel; ++i) t.grad.Set(i, grad.Get(i));
    for (auto [from, to] : {std::pair{&row_var, &t.row_var}, std::pair{&col_var, &t.col_var},
                            std::pair{&variance, &t.variance}}) {
      for (std::size_t i = 0; i < from->size(); ++i) to->Set(i, from->Get(i));
    }
    return t;
  }

  Segment MakeSegment(std::int64_t step, std::uint64_t seed, std::uint64_t global_offset,
                      bool stochastic) {
    Segment s;
    s.param = param.data();
    s.grad = grad.data();
    s.master = master.empty() ? nullptr : master.data();
    if (rows > 0) {
      s.state[kAdafactorRowVar] = row_var.data();
      s.state[kAdafactorColVar] = col_var.data();
    } else {
      s.state[kAdafactorVariance] = variance.data();
    }
    s.numel = numel;
    s.rows = rows;
    s.cols = cols;
    s.param_dtype = param.dtype();
    s.grad_dtype = grad.dtype();
    s.state_dtype = row_var.dtype();
    s.step = step;
    s.stochastic_rounding = stochastic;
    s.rounding_seed = seed;
    s.global_offset = global_offset;
    return s;
  }

  bool operator==(const AdafactorTensor& o) const {
    return param == o.param && row_var == o.row_var && col_var == o.col_var &&
           variance == o.variance && master == o.master;
  }
};

// Matrices over several tiles, a batch of small matrices grouped into tiles, 1×1 matrices
// (element-wise factors, stored by the kernel), a vector over two tiles, with global offsets that
// leave each tensor its own index range.
struct AdafactorSrCase {
  std::size_t rows, cols, numel;
  bool master;
  std::uint64_t global_offset;
};
std::vector<AdafactorSrCase> AdafactorSrCases() {
  return {{1100, 40, 44000, false, 0},
          {3, 3, std::size_t{9} * 5000, false, 50000},
          {2, 4100, std::size_t{3} * 2 * 4100, false, 100000},
          {1, 1, 4099, false, 130000},
          {0, 0, 40000 + 7, false, 140000},
          {5, 300, std::size_t{3} * 5 * 300, true, 190000}};
}

const AdafactorHyper kAdafactor{.lr = 0.01, .weight_decay = 0.1};

void AdafactorSteps(std::span<const Segment> segments, Runtime& runtime) {
  AdafactorStep({&kAdafactor, 1}, segments, runtime);
}

// Every stochastic store of an Adafactor step is the scalar rounding (rounding.h) of the f32 value
// the same step computes with f32 storage, with the noise of (seed, step, global_offset + index,
// stream): the param's index in the tensor on stream 0, a factor's index in its row_var / col_var
// buffer (an element's for variance) on 1 + slot. On every target, over three steps, bf16 and f16
// states, 16-bit params without master (and one with an f32 master, whose param copy rounds to
// nearest even). The mean signed error of each buffer is zero within 5σ (round to nearest even of
// these values is off by far more after the sub-ulp state updates; see the next test).
TEST(Rounding, AdafactorStoresAreTheScalarRoundingOnEveryTarget) {
  TargetGuard guard;
  Runtime runtime(2);
  const std::uint64_t seed = 1234;
  const std::vector<std::string> targets =
      SmallOnly() ? std::vector<std::string>{test::KernelTargets().front()} : test::KernelTargets();
  for (const std::string& target : targets) {
    ForceTarget(target);
    for (DType t : {kBF16, kF16}) {
      for (const AdafactorSrCase& c : AdafactorSrCases()) {
        SCOPED_TRACE(target + " " + std::string(DTypeName(t)) + " rows " + std::to_string(c.rows) +
                     " cols " + std::to_string(c.cols) + " numel " + std::to_string(c.numel));
        AdafactorTensor sr(t, t, c.rows, c.cols, c.numel, c.master, 7 + c.numel);
        for (std::int64_t step = 1; step <= 3; ++step) {
          sr.NewGrad(100 * step + c.numel);
          AdafactorTensor exact = sr.F32Copy();
          const Segment se = exact.MakeSegment(step, seed, c.global_offset, false);
          AdafactorSteps({&se, 1}, runtime);
          const Segment ss = sr.MakeSegment(step, seed, c.global_offset, true);
          AdafactorSteps({&ss, 1}, runtime);
          const auto check = [&](const Buffer& got, const Buffer& f32, std::uint32_t stream,
                                 bool stochastic, const char* name) {
            double sum = 0.0;
            int failures = 0;
            for (std::size_t i = 0; i < got.size(); ++i) {
              const float v = f32.Get(i);
              const std::uint16_t want =
                  stochastic ? RoundStochastic(
                                   t, v, RoundingNoise(seed, step, c.global_offset + i, stream))
                             : (t == kBF16 ? F32ToBF16(v) : F32ToF16(v));
              if (got.Bits16(i) != want && failures++ < 5) {
                ADD_FAILURE() << name << " step " << step << " i=" << i << ": "
                              << Hex(got.Bits16(i)) << " for " << v << ", want " << Hex(want);
              }
              sum += (got.Get(i) - static_cast<double>(v)) / Ulp16(t, v);
            }
            if (stochastic && got.size() >= 4000) {
              const double mean = sum / static_cast<double>(got.size());
              EXPECT_LT(std::abs(mean), 5.0 * 0.5 / std::sqrt(static_cast<double>(got.size())))
                  << name << " step " << step << ": mean signed error " << mean << " ulp";
            }
          };
          check(sr.param, exact.param, kRoundingStreamParam, !c.master, "param");
          if (c.master) {
            for (std::size_t i = 0; i < c.numel; ++i) {
              ASSERT_EQ(Bits(sr.master[i]), exact.param.Bits32(i)) << "master i=" << i;
            }
          }
          check(sr.row_var, exact.row_var, RoundingStreamState(kAdafactorRowVar), true, "row_var");
          check(sr.col_var, exact.col_var, RoundingStreamState(kAdafactorColVar), true, "col_var");
          check(sr.variance, exact.variance, RoundingStreamState(kAdafactorVariance), true,
                "variance");
        }
      }
    }
  }
}

// 1 vs 2 threads, the segments in another order in one call, or one call each: the same bits. A
// different seed changes them.
TEST(Rounding, AdafactorSameBitsForAnyThreadCountAndSegmentOrder) {
  const std::vector<AdafactorSrCase> cases = AdafactorSrCases();
  const std::uint64_t seed = 5;
  const auto fresh = [&] {
    std::vector<AdafactorTensor> ts;
    ts.reserve(cases.size());
    for (const AdafactorSrCase& c : cases)
      ts.emplace_back(kBF16, kBF16, c.rows, c.cols, c.numel, c.master, c.numel);
    return ts;
  };
  // mode 0: one call, in order; 1: one call, reversed; 2: one call per tensor.
  const auto run = [&](std::vector<AdafactorTensor>& ts, int threads, int mode, std::uint64_t sd) {
    Runtime runtime(threads);
    for (std::int64_t step = 1; step <= 3; ++step) {
      std::vector<Segment> segs;
      for (std::size_t k = 0; k < ts.size(); ++k) {
        ts[k].NewGrad(step * 31 + k);
        segs.push_back(ts[k].MakeSegment(step, sd, cases[k].global_offset, true));
      }
      if (mode == 1) std::reverse(segs.begin(), segs.end());
      if (mode == 2) {
        for (const Segment& s : segs) AdafactorSteps({&s, 1}, runtime);
      } else {
        AdafactorSteps(segs, runtime);
      }
    }
  };
  std::vector<AdafactorTensor> ref = fresh();
  run(ref, 1, 0, seed);
  for (auto [threads, mode] : {std::pair{2, 0}, std::pair{2, 1}, std::pair{1, 2}}) {
    std::vector<AdafactorTensor> ts = fresh();
    run(ts, threads, mode, seed);
    for (std::size_t k = 0; k < ts.size(); ++k) {
      EXPECT_TRUE(ts[k] == ref[k]) << "threads " << threads << " mode " << mode << " tensor " << k;
    }
  }
  std::vector<AdafactorTensor> other = fresh();
  run(other, 2, 0, seed + 1);
  for (std::size_t k = 0; k < other.size(); ++k) {
    EXPECT_FALSE(other[k] == ref[k]) << "seed " << seed + 1 << " tensor " << k;
  }
  EXPECT_FALSE(other[0].row_var == ref[0].row_var);
  EXPECT_FALSE(other[0].col_var == ref[0].col_var);
  EXPECT_FALSE(other[4].variance == ref[4].variance);
}

// Pure bf16 Adafactor (bf16 param without master, bf16 states) over many steps with positive
// gradients and updates of a fraction of an ulp of the param (about 0.05 ulp a step): round to
// nearest even never moves the param, stochastic rounding follows the f32 run (same grads, f32
// storage) on average, within 5σ of the sum of `steps` zero-mean rounding errors per element.
TEST(Rounding, AdafactorPureBf16FollowsTheF32Run) {
  const int steps = SmallOnly() ? 30 : 60;
  for (const AdafactorSrCase& c : {AdafactorSrCase{64, 128, std::size_t{2} * 64 * 128, false, 0},
                                   AdafactorSrCase{0, 0, 16384, false, 0}}) {
    SCOPED_TRACE("rows " + std::to_string(c.rows));
    AdafactorTensor sr(kBF16, kBF16, c.rows, c.cols, c.numel, false, 3);
    for (std::size_t i = 0; i < c.numel; ++i)
      sr.param.Set(i, 1.0f + 0.5f * std::abs(sr.param.Get(i)));
    AdafactorTensor rne = sr;
    AdafactorTensor f32 = sr.F32Copy();
    const AdafactorTensor start = f32;
    const AdafactorHyper h{.lr = 3e-4};
    Runtime runtime(2);
    for (std::int64_t step = 1; step <= steps; ++step) {
      Rng rng(step);
      for (std::size_t i = 0; i < c.numel; ++i) {
        sr.grad.Set(i, static_cast<float>(rng.Uniform(0.02, 0.1)));
        rne.grad.Set(i, sr.grad.Get(i));
        f32.grad.Set(i, sr.grad.Get(i));
      }
      for (AdafactorTensor* t : {&sr, &rne, &f32}) {
        const Segment s = t->MakeSegment(step, 9, 0, t == &sr);
        AdafactorStep({&h, 1}, {&s, 1}, runtime);
      }
    }
    double err_sr = 0.0, drift = 0.0;
    for (std::size_t i = 0; i < c.numel; ++i) {
      const double want = f32.param.Get(i);
      const double ulp = Ulp16(kBF16, 1.5);  // params stay in [1, 2)
      err_sr += (sr.param.Get(i) - want) / ulp;
      drift += (start.param.Get(i) - want) / ulp;
      ASSERT_EQ(rne.param.Get(i), start.param.Get(i)) << "round to nearest moved i=" << i;
    }
    const double n = static_cast<double>(c.numel);
    EXPECT_LT(std::abs(err_sr / n), 5.0 * 0.5 * std::sqrt(steps / n))
        << "mean error " << err_sr / n << " ulp";
    EXPECT_GT(drift / n, 1.0) << "the f32 run should move the params by more than an ulp";
  }
}

// ------------------------------------------------------------------------------------------------
// Validation

TEST(Rounding, GlobalOffsetMustLeaveRoomForTheTensor) {
  std::vector<std::uint16_t> p(10), g(10);
  Segment s;
  s.param = p.data();
  s.grad = g.data();
  s.numel = 10;
  s.param_dtype = kBF16;
  s.grad_dtype = kBF16;
  s.stochastic_rounding = true;
  const SgdHyper h{.lr = 0.0};
  s.global_offset = kU64Max - 10;  // last index kU64Max − 1: fine
  EXPECT_NO_THROW(SgdStep({&h, 1}, {&s, 1}));
  s.global_offset = kU64Max - 5;
  try {
    SgdStep({&h, 1}, {&s, 1});
    ADD_FAILURE() << "no error for global_offset " << s.global_offset;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("SgdStep"), std::string::npos) << what;
    EXPECT_NE(what.find("segment 0"), std::string::npos) << what;
    EXPECT_NE(what.find("global_offset"), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(kU64Max - 5)), std::string::npos) << what;
  }
  s.stochastic_rounding = false;  // only read with the flag
  EXPECT_NO_THROW(SgdStep({&h, 1}, {&s, 1}));
}

}  // namespace
}  // namespace fusedopt
