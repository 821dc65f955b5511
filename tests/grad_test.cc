// The gradient passes (grad.h) and Segment::grad_scale: the overflow check must see a single
// non-finite element anywhere (any dtype, any position, any target, any thread count), the explicit
// unscale must equal an element-wise scalar multiply, and a step given grad_scale must equal a step
// on gradients unscaled beforehand.

#include "fusedopt/grad.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/error.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "tests/test_support.h"

namespace fusedopt {
namespace {

using test::TargetGuard;

// Two gradient buffers of one dtype filled with random finite values, stored as raw bytes.
struct Grads {
  DType dtype;
  std::vector<std::vector<unsigned char>> bytes;

  Grads(DType t, const std::vector<std::size_t>& sizes, unsigned seed) : dtype(t) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 100.0f);
    for (std::size_t n : sizes) {
      // One element more: buffers start at element 1, off every vector alignment.
      bytes.emplace_back((n + 1) * DTypeSize(t));
      for (std::size_t i = 0; i < n; ++i) Set(bytes.size() - 1, i, normal(rng));
    }
  }
  void* Data(std::size_t b) { return bytes[b].data() + DTypeSize(dtype); }
  std::size_t Numel(std::size_t b) const { return bytes[b].size() / DTypeSize(dtype) - 1; }
  void Set(std::size_t b, std::size_t i, float v) { StoreFromF32(Data(b), dtype, i, v); }
  float Get(std::size_t b, std::size_t i) { return LoadAsF32(Data(b), dtype, i); }
  std::vector<GradBuffer> Buffers() {
    std::vector<GradBuffer> out;
    for (std::size_t b = 0; b < bytes.size(); ++b) out.push_back({Data(b), Numel(b), dtype});
    return out;
  }
};

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST(Grad, HasNonFiniteFindsAnySingleElementOnEveryTargetAndThreadCount) {
  const bool small = std::getenv("FOPT_TEST_SMALL") != nullptr;
  const std::size_t big = small ? 70 : kGrainElements + 70;  // two chunks: one per thread
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  TargetGuard guard;
  for (const std::string& target : test::KernelTargets()) {
    ForceTarget(target);
    for (DType t : kDTypes) {
      for (int threads : {1, 2}) {
        SCOPED_TRACE(target + " " + std::string(DTypeName(t)) + " threads " +
                     std::to_string(threads));
        Runtime runtime(threads);
        Grads grads(t, {9, big}, 1);
        EXPECT_FALSE(HasNonFinite(grads.Buffers(), runtime));
        for (float special : specials) {
          for (auto [b, i] : {std::pair<std::size_t, std::size_t>{0, 0},
                              {0, 8},
                              {1, 0},
                              {1, big / 2},
                              {1, big - 1}}) {
            const float before = grads.Get(b, i);
            grads.Set(b, i, special);
            EXPECT_TRUE(HasNonFinite(grads.Buffers(), runtime)) << "buffer " << b << " index " << i;
            grads.Set(b, i, before);
          }
        }
        EXPECT_FALSE(HasNonFinite(grads.Buffers(), runtime));  // and it wrote nothing
      }
    }
  }
}

TEST(Grad, LargestFiniteValuesAreNotOverflow) {
  for (DType t : kDTypes) {
    const float largest = t == DType::kF32   ? std::numeric_limits<float>::max()
                          : t == DType::kF16 ? 65504.0f
                                             : BF16ToF32(0x7F7F);
    Grads grads(t, {33}, 2);
    for (std::size_t i = 0; i < 33; ++i) grads.Set(0, i, i % 2 == 0 ? largest : -largest);
    EXPECT_FALSE(HasNonFinite(grads.Buffers())) << DTypeName(t);
  }
}

TEST(Grad, UnscaleMultipliesEveryElementAndReportsNonFiniteInput) {
  TargetGuard guard;
  for (const std::string& target : test::KernelTargets()) {
    ForceTarget(target);
    for (DType t : kDTypes) {
      SCOPED_TRACE(target + " " + std::string(DTypeName(t)));
      Grads grads(t, {1, 67, 1000}, 3);
      Grads expected = grads;
      const float scale = 1.0f / 3.0f;  // not a power of two: every product rounds
      for (std::size_t b = 0; b < expected.bytes.size(); ++b) {
        for (std::size_t i = 0; i < expected.Numel(b); ++i) {
          expected.Set(b, i, expected.Get(b, i) * scale);  // f32 product, RNE to the dtype
        }
      }
      EXPECT_FALSE(UnscaleGrads(grads.Buffers(), scale));
      EXPECT_EQ(grads.bytes, expected.bytes);

      grads.Set(2, 999, std::numeric_limits<float>::quiet_NaN());
      EXPECT_TRUE(UnscaleGrads(grads.Buffers(), scale));
    }
  }
}

TEST(Grad, InvalidArgumentsAreRejected) {
  Grads grads(DType::kF32, {4}, 4);
  EXPECT_THROW(UnscaleGrads(grads.Buffers(), std::numeric_limits<float>::infinity()), Error);
  const std::vector<GradBuffer> null_data = {{nullptr, 4, DType::kF32}};
  EXPECT_THROW(HasNonFinite(null_data), Error);
  const std::vector<GradBuffer> bad_dtype = {{grads.Data(0), 4, static_cast<DType>(7)}};
  EXPECT_THROW(HasNonFinite(bad_dtype), Error);
  const std::vector<GradBuffer> empty = {{nullptr, 0, DType::kF32}};
  EXPECT_FALSE(HasNonFinite(empty));
}

// Runs `steps` Adam steps on one f32 tensor whose gradient is `grad * scale_in`, with the segment
// unscaling by grad_scale. Returns the param bits.
std::vector<float> AdamTrajectory(float scale_in, float grad_scale, bool maximize) {
  const std::size_t n = 4099;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(n), g(n), m(n, 0.0f), v(n, 0.0f);
  for (float& x : p) x = normal(rng);
  AdamHyper h;
  h.weight_decay = 0.01;
  h.maximize = maximize;
  for (int step = 1; step <= 5; ++step) {
    for (float& x : g) x = normal(rng) * scale_in;
    Segment s{.param = p.data(), .grad = g.data(), .state = {m.data(), v.data()}, .numel = n};
    s.step = step;
    s.grad_scale = grad_scale;
    AdamStep(std::span<const AdamHyper>(&h, 1), std::span<const Segment>(&s, 1));
  }
  return p;
}

TEST(Grad, GradScaleInTheStepEqualsUnscaledGradients) {
  for (bool maximize : {false, true}) {
    const std::vector<float> reference = AdamTrajectory(1.0f, 1.0f, maximize);
    // A power-of-two loss scale is undone exactly by multiplying with its reciprocal.
    EXPECT_EQ(AdamTrajectory(65536.0f, 1.0f / 65536.0f, maximize), reference);
    EXPECT_NE(AdamTrajectory(1.0f, 0.5f, maximize), reference);  // and it is applied at all
  }
}

TEST(Grad, NonFiniteGradScaleIsRejectedBeforeAnyWrite) {
  std::vector<float> p(8, 1.0f), g(8, 1.0f), m(8, 0.0f), v(8, 0.0f);
  Segment s{.param = p.data(), .grad = g.data(), .state = {m.data(), v.data()}, .numel = 8};
  s.grad_scale = std::numeric_limits<float>::quiet_NaN();
  const AdamHyper h;
  EXPECT_THROW(AdamStep(std::span<const AdamHyper>(&h, 1), std::span<const Segment>(&s, 1)), Error);
  EXPECT_EQ(p, std::vector<float>(8, 1.0f));
  EXPECT_EQ(m, std::vector<float>(8, 0.0f));
}

}  // namespace
}  // namespace fusedopt
