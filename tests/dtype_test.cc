// Converters: the scalar round-to-nearest-even rules of dtype.h against an independent
// double-precision definition, and the SIMD stores (through ConvertBuffer) against the scalar rules
// on every target.

#include "fusedopt/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "fusedopt/convert.h"
#include "fusedopt/runtime.h"
#include "tests/test_support.h"

namespace fusedopt {
namespace {

// Round-to-nearest-even to a binary format with `mant_bits` stored mantissa bits and the given
// exponent range, computed in double: independent of the integer tricks under test. Returns the
// rounded value (as double; +-inf on overflow).
double RoundToFormat(double x, int mant_bits, int min_normal_exp, double max_finite) {
  if (x == 0.0 || std::isinf(x)) return x;
  const double a = std::fabs(x);
  int e = std::ilogb(a);
  if (e < min_normal_exp) e = min_normal_exp;  // subnormals share the smallest normal quantum
  const double quantum = std::ldexp(1.0, e - mant_bits);
  const double q = a / quantum;  // exact: a power-of-two scaling
  double r = std::floor(q);
  const double frac = q - r;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) == 1.0)) r += 1.0;
  double out = r * quantum;
  // Overflow: values at or beyond the midpoint between max_finite and the next (absent) value round
  // to inf.
  const double limit = max_finite + std::ldexp(1.0, std::ilogb(max_finite) - mant_bits - 1);
  if (a >= limit) out = std::numeric_limits<double>::infinity();
  return std::copysign(out, x);
}

double RefBF16(float f) { return RoundToFormat(f, 7, -126, 3.3895313892515355e38); }
double RefF16(float f) { return RoundToFormat(f, 10, -14, 65504.0); }

// Bit patterns that exercise every rounding case: all 2^16 upper halves with low halves at and
// around the tie point, plus a strided sweep over all 2^32 patterns.
std::vector<std::uint32_t> InterestingPatterns() {
  std::vector<std::uint32_t> out;
  for (std::uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x0FFFu, 0x1000u, 0x1001u, 0x7FFFu, 0x8000u, 0x8001u,
                             0xEFFFu, 0xF000u, 0xFFFFu}) {
      out.push_back(hi << 16 | lo);
    }
  }
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 4099)
    out.push_back(static_cast<std::uint32_t>(u));
  return out;
}

TEST(DType, BF16RoundToNearestEvenMatchesDefinition) {
  for (std::uint32_t u : InterestingPatterns()) {
    const float f = std::bit_cast<float>(u);
    const std::uint16_t h = F32ToBF16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(BF16ToF32(h))) << std::hex << u;
      ASSERT_EQ(h >> 15, u >> 31) << "NaN sign lost for " << std::hex << u;
      continue;
    }
    ASSERT_EQ(static_cast<double>(BF16ToF32(h)), RefBF16(f)) << std::hex << "bits 0x" << u;
  }
}

TEST(DType, F16RoundToNearestEvenMatchesDefinition) {
  for (std::uint32_t u : InterestingPatterns()) {
    const float f = std::bit_cast<float>(u);
    const std::uint16_t h = F32ToF16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(F16ToF32(h))) << std::hex << u;
      continue;
    }
    const double got = F16ToF32(h);
    ASSERT_EQ(got, RefF16(f)) << std::hex << "bits 0x" << u;
    ASSERT_EQ(std::signbit(got), std::signbit(f)) << std::hex << "bits 0x" << u;
  }
}

TEST(DType, SixteenBitRoundTripsExactly) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    if (std::isnan(BF16ToF32(b))) {
      EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(BF16ToF32(b)))));
    } else {
      ASSERT_EQ(F32ToBF16(BF16ToF32(b)), b) << std::hex << h;
    }
    if (std::isnan(F16ToF32(b))) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(F16ToF32(b)))));
    } else {
      ASSERT_EQ(F32ToF16(F16ToF32(b)), b) << std::hex << h;
    }
  }
}

TEST(DType, NamesParse) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    DType parsed = DType::kF32;
    ASSERT_TRUE(ParseDType(DTypeName(t), &parsed));
    EXPECT_EQ(parsed, t);
  }
  DType unused = DType::kF32;
  EXPECT_FALSE(ParseDType("fp8", &unused));
}

float Widen(DType t, std::uint16_t h) { return t == DType::kBF16 ? BF16ToF32(h) : F16ToF32(h); }

using test::TargetGuard;

// Every SIMD store must give the scalar converters' bits, NaNs included (F16C keeps a NaN's payload
// where the rule is one quiet NaN); every load must be exact.
TEST(DType, SimdConversionsMatchScalarOnEveryTarget) {
  const std::vector<std::uint32_t> patterns = InterestingPatterns();
  const std::size_t n = 1 << 20;  // not a multiple of any chunk: tails run too (n + 3 below)
  std::vector<float> src(n + 3);
  std::mt19937 rng(42);
  for (std::size_t i = 0; i < src.size(); ++i) {
    src[i] = std::bit_cast<float>(
        i < patterns.size() ? patterns[i * (patterns.size() / src.size() + 1) % patterns.size()]
                            : static_cast<std::uint32_t>(rng()));
  }
  TargetGuard guard;
  for (const std::string& target : test::KernelTargets()) {
    SCOPED_TRACE(target);
    ForceTarget(target);
    ASSERT_EQ(ActiveTargetName(), target);
    for (DType t : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::string(DTypeName(t)));
      std::vector<std::uint16_t> low(src.size());
      std::vector<float> back(src.size());
      Runtime runtime(2);
      ConvertBuffer(src.data(), DType::kF32, low.data(), t, src.size(), runtime);
      ConvertBuffer(low.data(), t, back.data(), DType::kF32, src.size(), runtime);
      for (std::size_t i = 0; i < src.size(); ++i) {
        const std::uint16_t want = t == DType::kBF16 ? F32ToBF16(src[i]) : F32ToF16(src[i]);
        ASSERT_EQ(low[i], want) << "i=" << i << " bits 0x" << std::hex
                                << std::bit_cast<std::uint32_t>(src[i]);
        ASSERT_EQ(std::bit_cast<std::uint32_t>(back[i]),
                  std::bit_cast<std::uint32_t>(Widen(t, want)))
            << i;
      }
    }
  }
}

}  // namespace
}  // namespace fusedopt
