// 8-bit block-wise states (include/fusedopt/quantize.h): the nearest-code search against a brute
// force search, the block format, and the fused step with 8-bit states against the engine's own f32
// step on the dequantized states followed by quantization (scalar code), bit for bit, for every
// algorithm of the registry whose update pass is element-wise (LAMB, LARS and BertAdam after their
// sums), on every SIMD target and thread count.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/quantize.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "src/algos/registry.h"
#include "src/core/quantize_tables.h"
#include "src/core/step_traits.h"
#include "tests/test_support.h"

namespace fusedopt {
namespace {

using test::Rng;

// The nearest code by brute force over all 256 entries, in double: the entry closest to x among
// those its sign allows (a negative x never the signed map's zero or positives; a non-negative x
// never a negative), ties to the smaller magnitude. `near_tie` is set when x lies within one f32
// ulp of the exact midpoint of the two best entries, where bitsandbytes' f32 midpoint
// ((a + b) · 0.5f, rounded) decides and the exact midpoint need not agree.
std::uint8_t BruteForceCode(float x, QuantMap which, bool* near_tie) {
  const std::array<float, 256>& map = DynamicMap(which);
  if (which == QuantMap::kUnsigned && x < 0.0f) return 0;
  int best = -1;
  int second = -1;
  for (int j = 0; j < 256; ++j) {
    const float m = map[static_cast<std::size_t>(j)];
    if (which == QuantMap::kSigned && (x < 0.0f ? m >= 0.0f : m < 0.0f)) continue;
    const double d = std::fabs(static_cast<double>(x) - m);
    if (best < 0) {
      best = j;
      continue;
    }
    const double db = std::fabs(static_cast<double>(x) - map[static_cast<std::size_t>(best)]);
    if (d < db || (d == db && std::fabs(m) < std::fabs(map[static_cast<std::size_t>(best)]))) {
      second = best;
      best = j;
    } else if (second < 0 ||
               d < std::fabs(static_cast<double>(x) - map[static_cast<std::size_t>(second)])) {
      second = j;
    }
  }
  if (second >= 0) {
    const double mid = (static_cast<double>(map[static_cast<std::size_t>(best)]) +
                        map[static_cast<std::size_t>(second)]) /
                       2.0;
    const double ulp =
        std::fabs(std::nextafter(static_cast<float>(mid), 2.0f) - static_cast<float>(mid));
    *near_tie = std::fabs(static_cast<double>(x) - mid) <= ulp;
  }
  return static_cast<std::uint8_t>(best);
}

// The values where a search goes wrong if it does: every entry and midpoint with the f32 values
// around them, every interval edge of the fast search, and random values, with both signs.
std::vector<float> SearchProbes() {
  std::vector<float> probes;
  const auto around = [&](float v) {
    float lo = v;
    float hi = v;
    for (int k = 0; k < 3; ++k) {
      probes.push_back(lo);
      probes.push_back(hi);
      lo = std::nextafter(lo, -2.0f);
      hi = std::nextafter(hi, 2.0f);
    }
  };
  for (QuantMap which : {QuantMap::kSigned, QuantMap::kUnsigned}) {
    const std::array<float, 256>& map = DynamicMap(which);
    for (std::size_t j = 0; j < 256; ++j) {
      around(map[j]);
      if (j + 1 < 256) around((map[j] + map[j + 1]) * 0.5f);
    }
  }
  for (std::size_t k = 0; k < kQuantIntervals; ++k) {
    around(std::bit_cast<float>(kQuantIntervalBase +
                                static_cast<std::uint32_t>(k << kQuantIntervalShift)));
  }
  Rng rng(7);
  for (int i = 0; i < 200000; ++i) {
    // log-uniform magnitudes over the map's range, and uniform ones
    probes.push_back(static_cast<float>(std::pow(10.0, rng.Uniform(-8.0, 0.0))));
    probes.push_back(static_cast<float>(rng.Uniform(0.0, 1.0)));
  }
  probes.push_back(0.0f);
  probes.push_back(1.0f);
  const std::size_t positive = probes.size();
  for (std::size_t i = 0; i < positive; ++i) probes.push_back(-probes[i]);
  probes.erase(
      std::remove_if(probes.begin(), probes.end(), [](float v) { return !(std::fabs(v) <= 1.0f); }),
      probes.end());
  return probes;
}

TEST(QuantizedStates, MapsHaveBitsandbytesShape) {
  const std::array<float, 256>& s = DynamicMap(QuantMap::kSigned);
  const std::array<float, 256>& u = DynamicMap(QuantMap::kUnsigned);
  EXPECT_TRUE(std::is_sorted(s.begin(), s.end()));
  EXPECT_TRUE(std::is_sorted(u.begin(), u.end()));
  EXPECT_EQ(s[127], 0.0f);
  EXPECT_EQ(s[255], 1.0f);
  EXPECT_EQ(u[0], 0.0f);
  EXPECT_EQ(u[255], 1.0f);
  EXPECT_NEAR(s[0], -0.99297f, 1e-5f);
  EXPECT_NEAR(s[128], 5.5e-7f, 1e-8f);
  EXPECT_NEAR(u[1], 3.25e-7f, 1e-8f);
  // The negatives are the positives negated (the search mirrors them), 1.0 aside.
  for (std::size_t c = 128; c <= 254; ++c) EXPECT_EQ(s[254 - c], -s[c]) << c;
}

TEST(QuantizedStates, NearestCodeEqualsBruteForce) {
  for (QuantMap which : {QuantMap::kSigned, QuantMap::kUnsigned}) {
    const std::array<float, 256>& map = DynamicMap(which);
    // (probes within an ulp of a midpoint are there on purpose: each must follow the f32 rule)
    for (float x : SearchProbes()) {
      bool near_tie = false;
      const std::uint8_t want = BruteForceCode(x, which, &near_tie);
      const std::uint8_t got = QuantizeValue(x, which);
      if (got == want) continue;
      // Within an ulp of a midpoint, the f32 midpoint rule may take the neighbour, and only it.
      ASSERT_TRUE(near_tie) << "x=" << x << " code " << int(got) << " want " << int(want);
      ASSERT_EQ(std::abs(int(got) - int(want)), 1) << x;
      const float mid = (map[got] + map[want]) * 0.5f;
      // the larger magnitude only past the f32 midpoint
      ASSERT_TRUE(std::fabs(map[got]) > std::fabs(map[want]) ? std::fabs(x) > std::fabs(mid)
                                                             : std::fabs(x) <= std::fabs(mid))
          << x;
    }
  }
}

// The run search (QuantRuns) needs no threshold lookup because each run's line puts every inner
// threshold, and the value just above it, within the band of the code it starts, and the values
// just past the run's lower edge inside its first code, clear of the band. With the line monotone
// in m, every value outside the band then floors to its code: checked here for every threshold of
// both maps with the one rounding of the vector code's fused multiply-add, in its fixed point
// (t = kQuantLineOrigin + u + band, whose fraction's bits kQuantLineNearBits are zero exactly in
// the band).
TEST(QuantizedStates, RunLinesPutEveryThresholdInsideTheBand) {
  for (QuantMap which : {QuantMap::kSigned, QuantMap::kUnsigned}) {
    SCOPED_TRACE(which == QuantMap::kSigned ? "signed" : "unsigned");
    const QuantTables& t = QuantTablesOf(which);
    const QuantRuns& runs = t.runs;
    EXPECT_EQ(runs.first[0], t.zero_code);
    EXPECT_EQ(runs.last[kQuantRuns - 2], 254);
    EXPECT_EQ(runs.first[kQuantRuns - 1], 255);  // 1.0's code alone, on a flat line
    EXPECT_EQ(runs.last[kQuantRuns - 1], 255);
    EXPECT_EQ(runs.transition[kQuantRuns - 2], t.threshold[254]);
    for (int r = 0; r < kQuantRuns; ++r) {
      SCOPED_TRACE("run " + std::to_string(r));
      const auto i = static_cast<std::size_t>(r);
      // The line as the vector code computes it, and where it puts m: its integer part (the code)
      // and whether its fraction lies in the band.
      const auto line = [&](float m) {
        return std::min(std::fma(m, runs.slope[i], runs.base[i]), runs.cap[i]);
      };
      const auto code = [&](float m) {
        const float at = line(m);
        EXPECT_GE(at, kQuantLineOrigin) << m;
        EXPECT_LT(at, 2 * kQuantLineOrigin) << m;
        return static_cast<int>(std::bit_cast<std::uint32_t>(at) >> kQuantLineShift) -
               static_cast<int>(kQuantLineCodeBias);
      };
      const auto near = [&](float m) {
        return (std::bit_cast<std::uint32_t>(line(m)) & kQuantLineNearBits) == 0;
      };
      ASSERT_GE(runs.slope[i], 0.0f);
      EXPECT_EQ(line(1.0f), kQuantLineOrigin + runs.last[i] + 0.5f + kQuantRunBand);
      if (r > 0) {
        ASSERT_EQ(runs.first[i], runs.last[i - 1] + 1);
        ASSERT_EQ(runs.transition[i - 1], t.threshold[runs.last[i - 1]]);
      }
      const float edge = r == 0 ? 0.0f : std::nextafter(runs.transition[i - 1], 2.0f);
      EXPECT_EQ(code(edge), runs.first[i]) << edge;
      EXPECT_FALSE(near(edge)) << edge;
      for (int c = runs.first[i]; c < runs.last[i]; ++c) {
        const float threshold = t.threshold[static_cast<std::size_t>(c)];
        for (float m : {threshold, std::nextafter(threshold, 2.0f)}) {
          EXPECT_EQ(code(m), c + 1) << m;
          EXPECT_TRUE(near(m)) << c << " " << m;
        }
      }
    }
  }
}

// The octave tables (AVX-512's run search) and the exponent table (AVX-512 VBMI's) give every
// magnitude the run that counting the transitions it is past gives: checked at each transition, its
// neighbours and every octave's edges, subnormals included.
TEST(QuantizedStates, OctaveTablesGiveTheRunOfEveryMagnitude) {
  for (QuantMap which : {QuantMap::kSigned, QuantMap::kUnsigned}) {
    SCOPED_TRACE(which == QuantMap::kSigned ? "signed" : "unsigned");
    const QuantRuns& runs = QuantTablesOf(which).runs;
    std::vector<float> magnitudes = {0.0f, 1e-30f, 1.0f};
    for (float transition : runs.transition) {
      magnitudes.insert(magnitudes.end(), {std::nextafter(transition, 0.0f), transition,
                                           std::nextafter(transition, 2.0f)});
    }
    for (int e = -149; e <= 0; ++e) {
      const float edge = std::ldexp(1.0f, e);
      magnitudes.insert(magnitudes.end(), {std::nextafter(edge, 0.0f), edge});
    }
    for (float m : magnitudes) {
      int want = 0;
      for (float transition : runs.transition) want += m > transition ? 1 : 0;
      const std::uint32_t bits = std::max(std::bit_cast<std::uint32_t>(m), kQuantIntervalBase);
      const std::size_t k = (bits >> 23) & 31;
      EXPECT_EQ(runs.octave_run[k] + (m > runs.octave_transition[k] ? 1 : 0), want) << m;
      // VBMI's lookup: the exponent unclamped
      const std::uint32_t e = std::bit_cast<std::uint32_t>(m) >> 23;
      EXPECT_EQ(runs.exponent_run[e] + (m > runs.octave_transition[e & 31] ? 1 : 0), want) << m;
    }
  }
}

// The vectorized search inside the step gives QuantizeValue's codes for every probe, on every
// target: SGD's first step stores the gradient itself as its momentum (signed map, a state alone),
// Adam with beta1 = beta2 = 0 stores g as its first moment and g² as its second (signed and
// unsigned, searched as a pair), and with AMSGrad g² again as the third (a pair and one alone).
// The probes come in blocks led by 1.0, whose absmax leaves them as they are, again times 3 in
// blocks led by 3.0 (x · f32(1/3) is not x / 3: near a threshold the two may take different codes),
// then a block of subnormals, whose reciprocal overflows (Quantize divides there).
TEST(QuantizedStates, VectorSearchEqualsScalarSearchOnEveryTarget) {
  const std::vector<float> probes = SearchProbes();
  std::vector<float> grad;
  for (const float scale : {1.0f, 3.0f}) {
    for (std::size_t next = 0; next < probes.size();) {
      grad.push_back(grad.size() % kQuantBlock == 0 ? scale : probes[next++] * scale);
    }
    grad.resize(NumQuantBlocks(grad.size()) * kQuantBlock, scale);
  }
  for (std::size_t i = 0; i < kQuantBlock; ++i) grad.push_back(1e-39f * probes[i * 97]);
  grad[grad.size() - kQuantBlock] = 1e-39f;
  const std::size_t n = grad.size();
  std::vector<float> root(n);
  std::vector<float> squares(n);
  for (std::size_t i = 0; i < n; ++i) {
    root[i] = std::copysign(std::sqrt(std::fabs(grad[i])), grad[i]);
    squares[i] = root[i] * root[i];  // what the step computes
  }
  std::vector<std::uint8_t> want_signed(n), want_root(n), want_squares(n);
  std::vector<float> want_absmax(NumQuantBlocks(n)), want_root_absmax(NumQuantBlocks(n)),
      want_squares_absmax(NumQuantBlocks(n));
  Quantize(grad.data(), n, QuantMap::kSigned, want_signed.data(), want_absmax.data());
  Quantize(root.data(), n, QuantMap::kSigned, want_root.data(), want_root_absmax.data());
  Quantize(squares.data(), n, QuantMap::kUnsigned, want_squares.data(), want_squares_absmax.data());
  const auto expect_codes = [&](const std::vector<std::uint8_t>& codes,
                                const std::vector<float>& absmax,
                                const std::vector<std::uint8_t>& want,
                                const std::vector<float>& absmax_want, const char* what) {
    ASSERT_EQ(absmax, absmax_want) << what;
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(codes[i], want[i]) << what << " of g=" << grad[i];
  };
  test::TargetGuard guard;
  for (const std::string& target : AvailableTargets()) {
    SCOPED_TRACE(target);
    ForceTarget(target);
    std::vector<float> param(n, 0.0f);
    std::vector<std::uint8_t> codes[3];
    std::vector<float> absmax[3];
    for (int k = 0; k < 3; ++k) {
      codes[k].assign(n, 0);
      absmax[k].assign(NumQuantBlocks(n), 0.0f);
    }
    Segment s{.param = param.data(),
              .grad = grad.data(),
              .state = {codes[0].data(), nullptr, nullptr},
              .absmax = {absmax[0].data(), nullptr, nullptr},
              .numel = n,
              .state_dtype = DType::kQ8};
    const SgdHyper sgd{.lr = 0.0, .momentum = 0.9};
    SgdStep(std::span<const SgdHyper>(&sgd, 1), std::span<const Segment>(&s, 1));
    expect_codes(codes[0], absmax[0], want_signed, want_absmax, "SGD's momentum");

    for (const bool amsgrad : {false, true}) {
      SCOPED_TRACE(amsgrad ? "AMSGrad" : "Adam");
      const int states = amsgrad ? 3 : 2;
      for (int k = 0; k < states; ++k) {
        codes[k].assign(n, k == 0 ? 127 : 0);  // zero states
        absmax[k].assign(NumQuantBlocks(n), 0.0f);
        s.state[k] = codes[k].data();
        s.absmax[k] = absmax[k].data();
      }
      s.grad = root.data();
      const AdamWHyper adam{
          .lr = 0.0, .beta1 = 0.0, .beta2 = 0.0, .weight_decay = 0.0, .amsgrad = amsgrad};
      AdamWStep(std::span<const AdamWHyper>(&adam, 1), std::span<const Segment>(&s, 1));
      expect_codes(codes[0], absmax[0], want_root, want_root_absmax, "m");
      expect_codes(codes[1], absmax[1], want_squares, want_squares_absmax, "v");
      if (amsgrad) expect_codes(codes[2], absmax[2], want_squares, want_squares_absmax, "v_max");
    }
  }
}

// The step's decode of every code, on every target (AVX3_DL's byte permutes take 64 codes at a
// time, the rest of a block the lookup of AVX3): SGD with momentum 1, lr 1 and a zero gradient
// sets each param to 0 − its decoded momentum, which must be −Dequantize's value. Two blocks of
// all 256 codes (in another order in the second) and a partial third.
TEST(QuantizedStates, StepDecodesEveryCodeOnEveryTarget) {
  const std::size_t n = 2 * kQuantBlock + 100;
  std::vector<std::uint8_t> codes(n);
  for (std::size_t i = 0; i < n; ++i)
    codes[i] = static_cast<std::uint8_t>(i < kQuantBlock ? i : 7 * i + 3);
  const std::vector<float> absmax = {0.75f, 3e-5f, 1.5f};
  std::vector<float> want(n);
  Dequantize(codes.data(), absmax.data(), n, QuantMap::kSigned, want.data());
  test::TargetGuard guard;
  for (const std::string& target : AvailableTargets()) {
    SCOPED_TRACE(target);
    ForceTarget(target);
    std::vector<float> param(n, 0.0f), grad(n, 0.0f), state_absmax = absmax;
    std::vector<std::uint8_t> state = codes;
    const SgdHyper sgd{.lr = 1.0, .momentum = 1.0};
    const Segment s{.param = param.data(),
                    .grad = grad.data(),
                    .state = {state.data(), nullptr, nullptr},
                    .absmax = {state_absmax.data(), nullptr, nullptr},
                    .numel = n,
                    .state_dtype = DType::kQ8,
                    .step = 2};  // the momentum buffer is not new
    SgdStep(std::span<const SgdHyper>(&sgd, 1), std::span<const Segment>(&s, 1));
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(param[i]),
                std::bit_cast<std::uint32_t>(0.0f - want[i]))
          << "code " << int{codes[i]} << " at " << i;
    }
  }
}

TEST(QuantizedStates, SignedCodesKeepTheSign) {
  EXPECT_EQ(QuantizeValue(0.0f, QuantMap::kSigned), 127);
  EXPECT_EQ(QuantizeValue(1e-12f, QuantMap::kSigned), 127);   // a positive may round to zero
  EXPECT_EQ(QuantizeValue(-1e-12f, QuantMap::kSigned), 126);  // a negative never does
  EXPECT_EQ(QuantizeValue(-1.0f, QuantMap::kSigned), 0);      // no −1.0: −0.99297
  EXPECT_EQ(QuantizeValue(1.0f, QuantMap::kSigned), 255);
  EXPECT_EQ(QuantizeValue(-1e-3f, QuantMap::kUnsigned), 0);
}

TEST(QuantizedStates, BlocksRoundTripWithTheirAbsmax) {
  Rng rng(3);
  const std::size_t n = 3 * kQuantBlock + 17;  // a partial last block
  std::vector<float> x(n);
  for (float& v : x)
    v = static_cast<float>(rng.Uniform(-2.0, 2.0) * std::pow(10.0, rng.Uniform(-6, 0)));
  for (std::size_t i = 2 * kQuantBlock; i < 3 * kQuantBlock; ++i) x[i] *= 1e-39f;  // subnormals
  x[5] = 0.0f;
  std::fill(x.begin() + kQuantBlock, x.begin() + 2 * kQuantBlock, 0.0f);  // an all-zero block
  std::vector<std::uint8_t> codes(n);
  std::vector<float> absmax(NumQuantBlocks(n));
  std::vector<float> back(n);
  for (QuantMap which : {QuantMap::kSigned, QuantMap::kUnsigned}) {
    std::vector<float> in = x;
    if (which == QuantMap::kUnsigned) {
      for (float& v : in) v = std::fabs(v);
    }
    Quantize(in.data(), n, which, codes.data(), absmax.data());
    Dequantize(codes.data(), absmax.data(), n, which, back.data());
    for (std::size_t b = 0; b < absmax.size(); ++b) {
      float max = 0.0f;
      for (std::size_t i = b * kQuantBlock; i < std::min(n, (b + 1) * kQuantBlock); ++i) {
        max = std::max(max, std::fabs(in[i]));
      }
      ASSERT_EQ(absmax[b], max) << b;
    }
    for (std::size_t i = 0; i < n; ++i) {
      const float a = absmax[i / kQuantBlock];
      if (a == 0.0f) {
        ASSERT_EQ(back[i], 0.0f);
        continue;
      }
      const float inverse = 1.0f / a;  // a division only where the reciprocal overflows
      ASSERT_EQ(codes[i], QuantizeValue(std::isinf(inverse) ? in[i] / a : in[i] * inverse, which))
          << i;
      ASSERT_EQ(back[i], DynamicMap(which)[codes[i]] * a) << i;
    }
    EXPECT_EQ(back[5], 0.0f) << "zero stays zero";
  }
  // A NaN poisons its block's absmax (and only its block), with zero codes.
  std::vector<float> with_nan = x;
  with_nan[2 * kQuantBlock + 3] = std::numeric_limits<float>::quiet_NaN();
  Quantize(with_nan.data(), n, QuantMap::kSigned, codes.data(), absmax.data());
  EXPECT_TRUE(std::isnan(absmax[2]));
  EXPECT_FALSE(std::isnan(absmax[0]));
  for (std::size_t i = 2 * kQuantBlock; i < 3 * kQuantBlock; ++i) ASSERT_EQ(codes[i], 127);
}

// ------------------------------------------------------------------------------------------------
// The fused step with 8-bit states

// One tensor under test: its param (f32 or bf16) and grad, its states as 8-bit codes with absmax,
// and its scalar states.
struct QuantizedTensor {
  std::size_t n = 0;
  DType param_dtype = DType::kF32;
  std::vector<std::uint8_t> param_bytes;
  std::vector<std::uint8_t> grad_bytes;
  std::vector<std::uint8_t> codes[kMaxStates];
  std::vector<float> absmax[kMaxStates];
  float scalars[kMaxScalars] = {};
  std::int64_t step = 1;
};

void FillRandom(std::vector<std::uint8_t>& bytes, DType t, std::size_t n, Rng& rng, double scale) {
  bytes.assign(n * DTypeSize(t), 0);
  for (std::size_t i = 0; i < n; ++i) {
    // Some exact zeros (zero-gradient elements), the rest over several decades.
    const double v =
        i % 11 == 3 ? 0.0 : scale * rng.Uniform(-1.0, 1.0) * std::pow(10.0, rng.Uniform(-3, 0));
    StoreFromF32(bytes.data(), t, i, static_cast<float>(v));
  }
}

template <class A>
typename A::Hyper TestHyper() {
  if constexpr (requires { A::BenchHyper(); }) {
    return A::BenchHyper();
  } else {
    return typename A::Hyper{};
  }
}

template <class A>
QuantizedTensor MakeTensor(std::size_t n, DType param_dtype, Rng& rng) {
  const typename A::Hyper h = TestHyper<A>();
  QuantizedTensor t;
  t.n = n;
  t.param_dtype = param_dtype;
  FillRandom(t.param_bytes, param_dtype, n, rng, 1.0);
  const unsigned required = A::RequiredStates(h);
  for (int slot = 0; slot < kMaxStates; ++slot) {
    if ((required >> slot & 1u) == 0) continue;
    // Start from the algorithm's initial value, quantized, as a fresh 8-bit state is.
    const std::vector<float> f32(n, A::InitialState(h, slot));
    const QuantMap which =
        (algos::UnsignedMapStates<A>() >> slot & 1u) != 0 ? QuantMap::kUnsigned : QuantMap::kSigned;
    t.codes[slot].resize(n);
    t.absmax[slot].resize(NumQuantBlocks(n));
    Quantize(f32.data(), n, which, t.codes[slot].data(), t.absmax[slot].data());
  }
  if constexpr (algos::HasScalarStates<A>) {
    for (std::size_t k = 0; k < A::kScalarStates.size(); ++k) {
      t.scalars[k] = A::InitialScalar(h, static_cast<int>(k));
    }
  }
  return t;
}

// Steps every tensor once with 8-bit states; the expectation steps a copy of each with f32 states
// (the dequantized codes) through the f32 path and quantizes the result with the scalar code.
// Both must agree bit for bit: params, codes, absmax, scalar states.
template <class A>
void StepAndCompare(std::vector<QuantizedTensor>& tensors, int threads, const std::string& where) {
  using Hyper = typename A::Hyper;
  const std::vector<Hyper> groups = {TestHyper<A>()};
  const unsigned unsigned_map = algos::UnsignedMapStates<A>();
  const auto map_of = [&](int slot) {
    return (unsigned_map >> slot & 1u) != 0 ? QuantMap::kUnsigned : QuantMap::kSigned;
  };
  std::vector<QuantizedTensor> expected = tensors;
  std::vector<std::vector<float>> f32_states(tensors.size() * kMaxStates);
  std::vector<Segment> q8;
  std::vector<Segment> f32;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    QuantizedTensor& t = tensors[i];
    QuantizedTensor& e = expected[i];
    Segment s{.param = t.param_bytes.data(),
              .grad = t.grad_bytes.data(),
              .numel = t.n,
              .param_dtype = t.param_dtype,
              .grad_dtype = t.param_dtype,
              .state_dtype = DType::kQ8,
              .step = t.step};
    Segment f = s;
    f.param = e.param_bytes.data();
    f.state_dtype = DType::kF32;
    for (int slot = 0; slot < kMaxStates; ++slot) {
      if (t.codes[slot].empty()) continue;
      s.state[slot] = t.codes[slot].data();
      s.absmax[slot] = t.absmax[slot].data();
      std::vector<float>& states = f32_states[i * kMaxStates + static_cast<std::size_t>(slot)];
      states.resize(t.n);
      Dequantize(e.codes[slot].data(), e.absmax[slot].data(), t.n, map_of(slot), states.data());
      f.state[slot] = states.data();
    }
    for (int k = 0; k < kMaxScalars; ++k) {
      s.scalars[k] = &t.scalars[k];
      f.scalars[k] = &e.scalars[k];
    }
    q8.push_back(s);
    f32.push_back(f);
  }
  Runtime runtime(threads);
  FusedStep<Hyper>(groups, q8, runtime);
  FusedStep<Hyper>(groups, f32, runtime);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    QuantizedTensor& t = tensors[i];
    QuantizedTensor& e = expected[i];
    const std::string what = where + " tensor " + std::to_string(i) + " (" + std::to_string(t.n) +
                             " elements, " + std::string(DTypeName(t.param_dtype)) + ")";
    ASSERT_EQ(t.param_bytes, e.param_bytes) << what << ": params";
    for (int slot = 0; slot < kMaxStates; ++slot) {
      if (t.codes[slot].empty()) continue;
      Quantize(f32_states[i * kMaxStates + static_cast<std::size_t>(slot)].data(), t.n,
               map_of(slot), e.codes[slot].data(), e.absmax[slot].data());
      ASSERT_EQ(std::memcmp(t.absmax[slot].data(), e.absmax[slot].data(),
                            t.absmax[slot].size() * sizeof(float)),
                0)
          << what << ": absmax of state " << slot;
      ASSERT_EQ(t.codes[slot], e.codes[slot]) << what << ": codes of state " << slot;
    }
    // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison): bit-exact on purpose
    ASSERT_EQ(std::memcmp(t.scalars, e.scalars, sizeof(t.scalars)), 0) << what << ": scalars";
    ++t.step;
  }
}

template <class A>
void RunQuantizedSteps(const char* stem) {
  test::TargetGuard guard;
  // Sizes around the block and the chunk (kGrainElements): partial blocks, a block split by a
  // chunk edge, tensors that share a chunk.
  std::vector<std::size_t> sizes = {1, 255, 256, 257, 4097, kGrainElements + 300, 3 * 1000 + 7};
  if (!test::SmallOnly()) sizes.push_back(2 * kGrainElements + 129);
  for (const std::string& target : AvailableTargets()) {
    ForceTarget(target);
    for (const int threads : {1, 3}) {
      for (DType param_dtype : {DType::kF32, DType::kBF16}) {
        Rng rng(11);
        std::vector<QuantizedTensor> tensors;
        tensors.reserve(sizes.size());
        for (std::size_t n : sizes) tensors.push_back(MakeTensor<A>(n, param_dtype, rng));
        for (int step = 0; step < 3; ++step) {
          for (QuantizedTensor& t : tensors) FillRandom(t.grad_bytes, param_dtype, t.n, rng, 1.0);
          StepAndCompare<A>(tensors, threads,
                            std::string(stem) + " on " + target + ", " + std::to_string(threads) +
                                " threads, step " + std::to_string(step + 1));
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

// A zero gradient leaves its element as it was, also beside non-zero ones in its block (the
// lookup table of bitsandbytes' CPU path moves it): AdamW without weight decay.
TEST(QuantizedStates, ZeroGradientElementsNeverMove) {
  const std::size_t n = 4 * kQuantBlock;
  std::vector<float> param(n);
  std::vector<float> grad(n);
  Rng rng(5);
  for (std::size_t i = 0; i < n; ++i) {
    param[i] = static_cast<float>(rng.Uniform(-1, 1));
    grad[i] = i % 3 == 0 ? 0.0f : static_cast<float>(rng.Uniform(-1, 1));
  }
  const std::vector<float> before = param;
  std::vector<std::uint8_t> m(n, 127);
  std::vector<std::uint8_t> v(n, 0);
  std::vector<float> absmax_m(NumQuantBlocks(n), 0.0f);
  std::vector<float> absmax_v(NumQuantBlocks(n), 0.0f);
  const AdamWHyper h{.lr = 1e-2, .weight_decay = 0.0};
  for (std::int64_t step = 1; step <= 5; ++step) {
    Segment s{.param = param.data(),
              .grad = grad.data(),
              .state = {m.data(), v.data(), nullptr},
              .absmax = {absmax_m.data(), absmax_v.data(), nullptr},
              .numel = n,
              .state_dtype = DType::kQ8,
              .step = step};
    AdamWStep(std::span<const AdamWHyper>(&h, 1), std::span<const Segment>(&s, 1));
  }
  for (std::size_t i = 0; i < n; i += 3) {
    ASSERT_EQ(param[i], before[i]) << i;
    ASSERT_EQ(m[i], 127) << i;
    ASSERT_EQ(v[i], 0) << i;
  }
  EXPECT_NE(param[1], before[1]);
}

TEST(QuantizedStates, RefusedWhereBlocksWouldCutTheSums) {
  std::vector<float> param(300, 1.0f);
  std::vector<float> grad(300, 1.0f);
  std::vector<std::uint8_t> m(300, 127);
  std::vector<std::uint8_t> v(300, 0);
  std::vector<float> absmax(2, 0.0f);
  Segment s{.param = param.data(),
            .grad = grad.data(),
            .state = {m.data(), v.data(), nullptr},
            .absmax = {absmax.data(), absmax.data(), nullptr},
            .numel = 300,
            .state_dtype = DType::kQ8};
  const AdampHyper adamp{};
  try {  // AdamP's sums are per row of a tensor
    AdampStep(std::span<const AdampHyper>(&adamp, 1), std::span<const Segment>(&s, 1));
    FAIL() << "AdamP took 8-bit states";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("8-bit states (state dtype q8) are not for adamp: its "
                                         "sums are per row of a tensor"),
              std::string::npos)
        << e.what();
  }
  const AdamWHyper adamw{};
  s.absmax[1] = nullptr;
  try {
    AdamWStep(std::span<const AdamWHyper>(&adamw, 1), std::span<const Segment>(&s, 1));
    FAIL() << "a null absmax was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("absmax[1] (exp_avg_sq) is null"), std::string::npos)
        << e.what();
  }
  for (float p : param) ASSERT_EQ(p, 1.0f);
  for (std::uint8_t c : m) ASSERT_EQ(c, 127);
}

// QuantizedStep.<Stem> for every algorithm of the registry that takes 8-bit states, registered at
// start-up (the others refuse them: RefusedWhereBlocksWouldCutTheSums). The two-phase ones run with
// their sums in use (TestHyper: LAMB's weight decay, LARS's trust ratio, BertAdam's clipping).
class QuantizedStepTest : public ::testing::Test {
 public:
  explicit QuantizedStepTest(void (*run)()) : run_(run) {}
  void TestBody() override { run_(); }

 private:
  void (*run_)();
};

template <class A>
void RegisterQuantizedStep(const char* stem) {
  if constexpr (algos::QuantizableStates<A>) {
    static const char* const kStem = stem;
    ::testing::RegisterTest("QuantizedStep", stem, nullptr, nullptr, __FILE__, __LINE__,
                            []() -> ::testing::Test* {
                              return new QuantizedStepTest([] { RunQuantizedSteps<A>(kStem); });
                            });
  }
}

#define FOPT_REGISTER_QUANTIZED_STEP(Stem) RegisterQuantizedStep<algos::Stem>(#Stem);
[[maybe_unused]] const bool kRegistered = [] {
  FOPT_FOR_EACH_ALGORITHM(FOPT_REGISTER_QUANTIZED_STEP)
  return true;
}();
#undef FOPT_REGISTER_QUANTIZED_STEP

}  // namespace
}  // namespace fusedopt
