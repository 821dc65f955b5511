// Global gradient norm, clipping, accumulation and the fused pre-pass (grad.h): values against a
// long-double oracle, bit-identical norms for every target and thread count, torch's clip
// coefficient, and a step after GradPrePass equal to unscale → clip → step done in separate passes.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/error.h"
#include "fusedopt/grad.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "tests/test_support.h"

namespace fusedopt {
namespace {

using test::TargetGuard;

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
constexpr NormType kNormTypes[] = {NormType::kL1, NormType::kL2, NormType::kInf};

using test::SmallOnly;

// Gradient buffers of one dtype with random values; element-aligned storage.
struct Grads {
  DType dtype;
  std::vector<std::vector<float>> f32;  // storage (2-byte dtypes use the front half)
  std::vector<std::size_t> sizes;

  Grads(DType t, std::vector<std::size_t> n, unsigned seed, float sigma = 3.0f)
      : dtype(t), sizes(std::move(n)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, sigma);
    for (std::size_t size : sizes) {
      f32.emplace_back(size + 1);
      for (std::size_t i = 0; i < size; ++i) Set(f32.size() - 1, i, normal(rng));
    }
  }
  void* Data(std::size_t b) { return f32[b].data(); }
  void Set(std::size_t b, std::size_t i, float v) { StoreFromF32(Data(b), dtype, i, v); }
  float Get(std::size_t b, std::size_t i) { return LoadAsF32(Data(b), dtype, i); }
  std::vector<GradBuffer> Buffers() {
    std::vector<GradBuffer> out;
    for (std::size_t b = 0; b < sizes.size(); ++b) out.push_back({Data(b), sizes[b], dtype});
    return out;
  }
  std::vector<unsigned char> Bytes() const {
    std::vector<unsigned char> out;
    for (const auto& v : f32) {
      const auto* p = reinterpret_cast<const unsigned char*>(v.data());
      out.insert(out.end(), p, p + v.size() * sizeof(float));
    }
    return out;
  }
};

// The oracle: every f32(element · scale) in long double.
long double ReferenceNorm(Grads& g, NormType type, float scale) {
  long double acc = 0.0L;
  for (std::size_t b = 0; b < g.sizes.size(); ++b) {
    for (std::size_t i = 0; i < g.sizes[b]; ++i) {
      const long double x = std::fabs(g.Get(b, i) * scale);
      if (type == NormType::kInf) {
        acc = std::max(acc, x);
      } else {
        acc += type == NormType::kL2 ? x * x : x;
      }
    }
  }
  return type == NormType::kL2 ? std::sqrt(acc) : acc;
}

TEST(GradNorm, MatchesTheOracleForEveryNormDTypeAndScale) {
  const std::size_t big = SmallOnly() ? 300 : kGrainElements + 301;
  for (DType t : kDTypes) {
    Grads grads(t, {1, 17, big, 5}, 11);
    for (NormType type : kNormTypes) {
      for (float scale : {1.0f, 1.0f / 1024.0f, 0.3f}) {
        SCOPED_TRACE(std::string(DTypeName(t)) + " type " + std::to_string(static_cast<int>(type)) +
                     " scale " + std::to_string(scale));
        const GradStats stats = GradNorm(grads.Buffers(), type, scale);
        EXPECT_FALSE(stats.non_finite);
        const long double want = ReferenceNorm(grads, type, scale);
        EXPECT_NEAR(stats.norm, static_cast<double>(want), 1e-12 * static_cast<double>(want));
      }
    }
  }
}

TEST(GradNorm, IsBitIdenticalOnEveryTargetAndThreadCount) {
  // Sizes that cut chunks and 16-element blocks at odd places; several chunks per thread.
  const std::size_t big = SmallOnly() ? 1000 : 3 * kGrainElements + 1234;
  Grads grads(DType::kBF16, {3, big, 29, 1000}, 12);
  Grads f32(DType::kF32, {big, 7}, 13);
  TargetGuard guard;
  for (NormType type : kNormTypes) {
    ForceTarget("");
    Runtime one(1);
    const double want = GradNorm(grads.Buffers(), type, 0.5f, one).norm;
    const double want32 = GradNorm(f32.Buffers(), type, 1.0f, one).norm;
    for (const std::string& target : test::KernelTargets()) {
      ForceTarget(target);
      for (int threads : {1, 2, 3}) {
        Runtime runtime(threads);
        const double got = GradNorm(grads.Buffers(), type, 0.5f, runtime).norm;
        const double got32 = GradNorm(f32.Buffers(), type, 1.0f, runtime).norm;
        // NOLINTBEGIN(bugprone-suspicious-memory-comparison): bit-exact on purpose
        EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
            << target << " threads " << threads << ": " << got << " vs " << want;
        EXPECT_EQ(std::memcmp(&got32, &want32, sizeof got32), 0) << target << " " << threads;
        // NOLINTEND(bugprone-suspicious-memory-comparison)
      }
    }
  }
}

TEST(GradNorm, AnySingleNonFiniteElementIsReported) {
  const std::size_t big = SmallOnly() ? 100 : kGrainElements + 100;
  const float inf = std::numeric_limits<float>::infinity();
  TargetGuard guard;
  for (const std::string& target : test::KernelTargets()) {
    ForceTarget(target);
    for (DType t : kDTypes) {
      Grads grads(t, {9, big}, 14);
      for (NormType type : kNormTypes) {
        for (float special : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
          for (auto [b, i] :
               {std::pair<std::size_t, std::size_t>{0, 0}, {0, 8}, {1, big - 1}, {1, big / 2}}) {
            const float before = grads.Get(b, i);
            grads.Set(b, i, special);
            const GradStats s = GradNorm(grads.Buffers(), type);
            EXPECT_TRUE(s.non_finite) << target << " " << DTypeName(t) << " " << b << "," << i;
            if (std::isnan(special)) {
              EXPECT_TRUE(std::isnan(s.norm));
            } else {
              EXPECT_EQ(s.norm, inf);
            }
            grads.Set(b, i, before);
          }
        }
      }
    }
  }
}

TEST(GradNorm, LargestFiniteValuesDoNotOverflow) {
  Grads grads(DType::kF32, {1000}, 15);
  for (std::size_t i = 0; i < 1000; ++i) grads.Set(0, i, std::numeric_limits<float>::max());
  const GradStats s = GradNorm(grads.Buffers());
  EXPECT_FALSE(s.non_finite);
  EXPECT_NEAR(s.norm, std::sqrt(1000.0) * std::numeric_limits<float>::max(), 1e-10 * s.norm);
}

TEST(ClipCoefficient, IsTorchsF32Formula) {
  // torch: (f32(norm) + f32(1e-6)).reciprocal() * max_norm, clamped to 1 (NaN kept).
  for (double norm : {0.0, 1e-8, 0.5, 1.0, 3.0, 12345.678, 1e30}) {
    for (double max_norm : {0.1, 1.0, 5.0}) {
      const float want = std::min(
          (1.0f / (static_cast<float>(norm) + 1e-6f)) * static_cast<float>(max_norm), 1.0f);
      EXPECT_EQ(ClipCoefficient(norm, max_norm), want) << norm << " " << max_norm;
    }
  }
  EXPECT_EQ(ClipCoefficient(std::numeric_limits<double>::infinity(), 1.0), 0.0f);
  EXPECT_TRUE(std::isnan(ClipCoefficient(std::nan(""), 1.0)));
  EXPECT_EQ(ClipCoefficient(1e30, std::numeric_limits<double>::infinity()), 1.0f);
}

TEST(ClipCoefficient, LambRuleIsApexsF32Division) {
  // apex FusedLAMB divides by norm / max_norm where norm > max_norm; the factor is the f32 division
  // f32(max_norm) / f32(norm), and 1 (no clipping) otherwise.
  for (double norm : {1e-8, 0.5, 1.0, 3.0, 12345.678, 1e30}) {
    for (double max_norm : {0.1, 1.0, 5.0, 1e9}) {
      const float want =
          norm > max_norm ? static_cast<float>(max_norm) / static_cast<float>(norm) : 1.0f;
      EXPECT_EQ(LambClipCoefficient(norm, max_norm), want) << norm << " " << max_norm;
    }
  }
  // Exactly at the limit: not clipped (torch's rule would give max / (norm + 1e-6)).
  EXPECT_EQ(LambClipCoefficient(3.0, 3.0), 1.0f);
  // max_norm = 0 does not disable clipping: every non-zero norm gives 0 (apex: g / inf).
  for (double norm : {1e-30, 1e-8, 1.0, 1e30}) EXPECT_EQ(LambClipCoefficient(norm, 0.0), 0.0f);
  // A zero norm is never clipped, whatever max_norm.
  EXPECT_EQ(LambClipCoefficient(0.0, 0.0), 1.0f);
  EXPECT_EQ(LambClipCoefficient(0.0, 1.0), 1.0f);
  // An infinite norm gives 0; an infinite max_norm never clips.
  EXPECT_EQ(LambClipCoefficient(std::numeric_limits<double>::infinity(), 1.0), 0.0f);
  EXPECT_EQ(LambClipCoefficient(1e30, std::numeric_limits<double>::infinity()), 1.0f);
}

TEST(ClipGradNorm, ScalesEveryElementByTheCoefficientAndReturnsTheNorm) {
  for (DType t : kDTypes) {
    for (NormType type : kNormTypes) {
      Grads grads(t, {100, 33}, 16);
      Grads expected = grads;
      const double norm = static_cast<double>(ReferenceNorm(grads, type, 1.0f));
      const float coef = ClipCoefficient(norm, 1.0);
      ASSERT_LT(coef, 1.0f);
      for (std::size_t b = 0; b < 2; ++b) {
        for (std::size_t i = 0; i < expected.sizes[b]; ++i) {
          expected.Set(b, i, expected.Get(b, i) * coef);
        }
      }
      EXPECT_NEAR(ClipGradNorm(grads.Buffers(), 1.0, type), norm, 1e-12 * norm);
      EXPECT_EQ(grads.Bytes(), expected.Bytes()) << DTypeName(t);
    }
  }
}

TEST(ClipGradNorm, BelowTheLimitNothingChanges) {
  Grads grads(DType::kBF16, {50}, 17, 1e-3f);
  const auto before = grads.Bytes();
  const double norm = ClipGradNorm(grads.Buffers(), 10.0);
  EXPECT_GT(norm, 0.0);
  EXPECT_EQ(grads.Bytes(), before);
}

TEST(ClipGradNorm, NonFiniteNormRaisesOnRequestWithoutChangingAnything) {
  Grads grads(DType::kF32, {50}, 18);
  grads.Set(0, 7, std::numeric_limits<float>::infinity());
  const auto before = grads.Bytes();
  EXPECT_THROW(ClipGradNorm(grads.Buffers(), 1.0, NormType::kL2, true), Error);
  EXPECT_EQ(grads.Bytes(), before);
  // Without the request it does what torch does: coefficient 0, so Inf·0 = NaN and the rest 0.
  EXPECT_EQ(ClipGradNorm(grads.Buffers(), 1.0), std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(grads.Get(0, 7)));
  EXPECT_EQ(grads.Get(0, 8), 0.0f);
}

TEST(ClipGradValue, ClampsEveryElementAndKeepsNaN) {
  for (DType t : kDTypes) {
    Grads grads(t, {1, 300}, 19);
    grads.Set(1, 5, std::numeric_limits<float>::quiet_NaN());
    Grads expected = grads;
    const float c = 0.75f;
    for (std::size_t i = 0; i < 300; ++i) {
      const float x = expected.Get(1, i);
      expected.Set(1, i, std::isnan(x) ? x : std::min(std::max(x, -c), c));
    }
    expected.Set(0, 0, std::min(std::max(expected.Get(0, 0), -c), c));
    ClipGradValue(grads.Buffers(), c);
    EXPECT_TRUE(std::isnan(grads.Get(1, 5)));
    grads.Set(1, 5, 0.0f);
    expected.Set(1, 5, 0.0f);
    EXPECT_EQ(grads.Bytes(), expected.Bytes()) << DTypeName(t);
  }
  Grads grads(DType::kF32, {4}, 20);
  EXPECT_THROW(ClipGradValue(grads.Buffers(), -1.0), Error);
  EXPECT_THROW(ClipGradValue(grads.Buffers(), std::nan("")), Error);
}

TEST(AccumulateGrads, OverwritesThenAddsScaledMicroBatches) {
  TargetGuard guard;
  for (const std::string& target : test::KernelTargets()) {
    ForceTarget(target);
    for (DType t : kDTypes) {
      Grads a(t, {70, 5}, 21), b(t, {70, 5}, 22);
      std::vector<float> acc0(70, 123.0f), acc1(5, 123.0f);
      const std::vector<float*> accumulators = {acc0.data(), acc1.data()};
      const float scale = 1.0f / 3.0f;
      EXPECT_FALSE(AccumulateGrads(a.Buffers(), accumulators, scale, /*overwrite=*/true));
      EXPECT_FALSE(AccumulateGrads(b.Buffers(), accumulators, scale, /*overwrite=*/false));
      for (std::size_t i = 0; i < 70; ++i) {
        const float want = a.Get(0, i) * scale + b.Get(0, i) * scale;  // each product rounded
        ASSERT_EQ(acc0[i], want) << target << " " << DTypeName(t) << " " << i;
      }
      EXPECT_EQ(acc1[4], a.Get(1, 4) * scale + b.Get(1, 4) * scale);
      b.Set(1, 2, std::numeric_limits<float>::quiet_NaN());
      EXPECT_TRUE(AccumulateGrads(b.Buffers(), accumulators, scale, false));
      EXPECT_TRUE(std::isnan(acc1[2]));
    }
  }
  Grads g(DType::kF32, {4}, 23);
  std::vector<float*> none;
  EXPECT_THROW(AccumulateGrads(g.Buffers(), none, 1.0f, true), Error);
}

// Adam over two f32 tensors, gradients multiplied by loss_scale, three ways.
struct AdamRun {
  std::vector<float> p0, p1, m0, m1, v0, v1;
  AdamRun() {
    std::mt19937 rng(30);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto* v : {&p0, &p1}) {
      v->resize(v == &p0 ? 1000 : 77);
      for (float& x : *v) x = normal(rng);
    }
    m0.assign(1000, 0.0f);
    v0.assign(1000, 0.0f);
    m1.assign(77, 0.0f);
    v1.assign(77, 0.0f);
  }
  std::vector<Segment> Segments(Grads& g, float grad_scale) {
    std::vector<Segment> s(2);
    s[0] = {.param = p0.data(), .grad = g.Data(0), .state = {m0.data(), v0.data()}, .numel = 1000};
    s[1] = {.param = p1.data(), .grad = g.Data(1), .state = {m1.data(), v1.data()}, .numel = 77};
    for (Segment& x : s) x.grad_scale = grad_scale;
    return s;
  }
};

TEST(GradPrePass, FoldedClipAndUnscaleEqualSeparatePasses) {
  const AdamHyper h{.lr = 1e-2, .weight_decay = 0.1};
  const float loss_scale = 1024.0f;
  for (NormType type : kNormTypes) {
    AdamRun fused, separate;
    for (int step = 1; step <= 4; ++step) {
      Grads g(DType::kF32, {1000, 77}, 40 + step, 2.0f * loss_scale);
      Grads g2 = g;
      // Fused: one read for overflow + norm, the factors folded into grad_scale.
      std::vector<Segment> s = fused.Segments(g, 1.0f / loss_scale);
      const PrePassResult pre = GradPrePass(s, {.max_norm = 5.0, .norm_type = type});
      ASSERT_FALSE(pre.non_finite);
      ASSERT_LT(pre.clip_coef, 1.0f);
      for (Segment& x : s) x.step = step;
      AdamStep(std::span<const AdamHyper>(&h, 1), s);
      // Separate passes, as torch's GradScaler.unscale_ + clip_grad_norm_ + step.
      const auto buffers = g2.Buffers();
      UnscaleGrads(buffers, 1.0f / loss_scale);
      const double norm = ClipGradNorm(buffers, 5.0, type);
      EXPECT_EQ(norm, pre.norm);  // power-of-two unscale: the same values were summed
      std::vector<Segment> s2 = separate.Segments(g2, 1.0f);
      for (Segment& x : s2) x.step = step;
      AdamStep(std::span<const AdamHyper>(&h, 1), s2);
    }
    EXPECT_EQ(fused.p0, separate.p0);
    EXPECT_EQ(fused.p1, separate.p1);
    EXPECT_EQ(fused.v0, separate.v0);
  }
}

// ClipRule::kLamb: the pre-pass folds LambClipCoefficient(norm, max_norm) into every grad_scale
// (on top of the unscale factor), and LAMB after it equals LAMB on gradients multiplied by that
// factor beforehand, as tools/lamb_reference.py clips them.
TEST(GradPrePass, LambRuleFoldsTheLambCoefficientIntoGradScale) {
  const LambHyper h{.lr = 1e-2, .weight_decay = 0.01};
  const float unscale = 0.5f;
  for (double max_norm : {5.0, 0.0, 1e9}) {
    SCOPED_TRACE("max_norm " + std::to_string(max_norm));
    AdamRun fused, separate;  // two tensors with states in slots 0 and 1, as LAMB's
    for (int step = 1; step <= 3; ++step) {
      Grads g(DType::kF32, {1000, 77}, 60 + step);  // norm about 3·√1077 / 2 ≈ 49 after unscale
      Grads g2 = g;
      std::vector<Segment> s = fused.Segments(g, unscale);
      const PrePassResult pre =
          GradPrePass(s, {.max_norm = max_norm, .clip_rule = ClipRule::kLamb});
      ASSERT_FALSE(pre.non_finite);
      const float coef = LambClipCoefficient(pre.norm, max_norm);
      EXPECT_EQ(pre.clip_coef, coef);
      const float expected_kind = max_norm == 0.0 ? 0.0f : 1.0f;  // 0: all clipped, 1e9: none
      if (max_norm == 5.0) {
        EXPECT_LT(coef, 1.0f);
      } else {
        EXPECT_EQ(coef, expected_kind);
      }
      for (const Segment& x : s) EXPECT_EQ(x.grad_scale, unscale * coef);
      for (Segment& x : s) x.step = step;
      LambStep(std::span<const LambHyper>(&h, 1), s);
      // Separate: the gradients multiplied by the same f32 factor first, then a plain step.
      for (std::size_t b = 0; b < g2.sizes.size(); ++b) {
        for (std::size_t i = 0; i < g2.sizes[b]; ++i) g2.Set(b, i, g2.Get(b, i) * (unscale * coef));
      }
      std::vector<Segment> s2 = separate.Segments(g2, 1.0f);
      for (Segment& x : s2) x.step = step;
      LambStep(std::span<const LambHyper>(&h, 1), s2);
    }
    EXPECT_EQ(fused.p0, separate.p0);
    EXPECT_EQ(fused.p1, separate.p1);
    EXPECT_EQ(fused.m1, separate.m1);
    EXPECT_EQ(fused.v0, separate.v0);
  }
}

TEST(GradPrePass, OverflowLeavesSegmentsAloneAndOptionsAreChecked) {
  AdamRun run;
  Grads g(DType::kF16, {1000, 77}, 50);
  g.Set(1, 76, std::numeric_limits<float>::infinity());
  std::vector<Segment> s = run.Segments(g, 0.25f);
  for (Segment& x : s) x.grad_dtype = DType::kF16;
  const PrePassResult pre = GradPrePass(s, {.max_norm = 1.0});
  EXPECT_TRUE(pre.non_finite);
  EXPECT_EQ(s[0].grad_scale, 0.25f);
  EXPECT_EQ(s[1].grad_scale, 0.25f);
  EXPECT_THROW(GradPrePass(s, {.max_norm = -1.0}), Error);
  s[0].grad_scale = std::numeric_limits<float>::infinity();
  EXPECT_THROW(GradPrePass(s), Error);
}

}  // namespace
}  // namespace fusedopt
