// The math bodies (src/math/<algo>_math.h) hold no Highway types: instantiated here with plain
// scalar float Ops (fma for MulAdd, IEEE sqrt), they must give, bit for bit, what the engine's
// kernels give on every FMA target. This is what lets another backend (CUDA) reuse them.
// Run for every algorithm whose cases (tests/reference/<algo>.h, ref::KernelCases) have
// hyper-parameters for it and the call of its math body.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "src/algos/registry.h"
#include "tests/reference/reference.h"
#include "tests/test_support.h"

namespace fusedopt {
namespace scalar_math {

struct ScalarOps {
  float Set(float x) const { return x; }
  float Add(float a, float b) const { return a + b; }
  float Sub(float a, float b) const { return a - b; }
  float Mul(float a, float b) const { return a * b; }
  float Div(float a, float b) const { return a / b; }
  float MulAdd(float a, float b, float c) const { return std::fma(a, b, c); }
  float Sqrt(float a) const { return std::sqrt(a); }
  float Max(float a, float b) const {
    return std::isnan(a) || std::isnan(b) ? a + b : (a < b ? b : a);
  }
  float Abs(float a) const { return std::fabs(a); }
  float Sign(float a) const { return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : 0.0f); }
  float Min(float a, float b) const {
    return std::isnan(a) || std::isnan(b) ? a + b : (b < a ? b : a);
  }
  bool Gt(float a, float b) const { return a > b; }
  bool Lt(float a, float b) const { return a < b; }
  bool Eq(float a, float b) const { return a == b; }
  float IfThenElse(bool m, float a, float b) const { return m ? a : b; }
};

// Every math body (src/math/<algo>_math.h, the build's list) and the helpers they share, which
// they call with the ops as argument (found at instantiation, whatever the order here).
#include "fopt_generated/math_bodies.h"
#include "src/math/bias_correction_math.h"
#include "src/math/lerp_math.h"

}  // namespace scalar_math
namespace {

constexpr std::size_t kN = 1000;  // vectors and a tail on every target
constexpr int kSteps = 3;

std::vector<float> Random(std::uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(kN);
  for (float& x : v) x = dist(gen);
  return v;
}

// The targets whose MulAdd is one fused rounding, as std::fma.
std::vector<std::string> FmaTargets() {
  std::vector<std::string> out;
  for (const std::string& t : test::KernelTargets()) {
    if (t == "AVX2" || t == "AVX3" || t == "AVX3_DL" || t == "AVX3_ZEN4" || t == "NEON" ||
        t == "SVE" || t == "SVE2") {
      out.push_back(t);
    }
  }
  return out;
}

// Runs kSteps of algorithm A through the engine and through `scalar(s, p, g, states)` per element
// with the descriptor's own coefficients, and compares the bits of params and states. The steps are
// first_step, first_step + 1, ...; the states start at zero.
template <class A, class Scalar>
void ExpectEngineEqualsScalarMath(const typename A::Hyper& h, unsigned slots, const Scalar& scalar,
                                  int first_step = 1) {
  const std::vector<float> p0 = Random(1, -1.0f, 1.0f);
  if (FmaTargets().empty()) GTEST_SKIP() << "no FMA target on this CPU";
  for (const std::string& target : FmaTargets()) {
    ForceTarget(target);
    std::vector<float> p = p0, q = p0;
    std::vector<std::vector<float>> s(kMaxStates, std::vector<float>(kN, 0.0f)), t = s;
    constexpr std::size_t kScalars = algos::NumScalarStates<A>();
    std::array<float, kMaxScalars> scalars{};  // the per-tensor scalar states
    if constexpr (kScalars > 0) {
      for (std::size_t k = 0; k < kScalars; ++k) {
        scalars[k] = A::InitialScalar(h, static_cast<int>(k));
      }
    }
    for (int step = first_step; step < first_step + kSteps; ++step) {
      const std::vector<float> g = Random(100 + step, -2.0f, 2.0f);
      Segment seg{.param = p.data(), .grad = g.data(), .numel = kN, .step = step};
      for (int k = 0; k < kMaxStates; ++k) {
        if ((slots >> k & 1u) != 0) seg.state[k] = s[k].data();
      }
      for (int k = 0; k < kMaxScalars; ++k) seg.scalars[k] = &scalars[k];
      // The descriptor's coefficients from the scalar states before the step.
      const typename A::Scalars c = [&] {
        if constexpr (kScalars > 0) {
          std::array<float, kScalars> next{};
          A::NextScalars(h, seg, next);
          return A::MakeScalars(h, seg, std::span<const float, kScalars>(next));
        } else {
          return A::MakeScalars(h, seg);
        }
      }();
      FusedStep(std::span<const typename A::Hyper>(&h, 1), std::span<const Segment>(&seg, 1));
      for (std::size_t i = 0; i < kN; ++i) scalar(c, q[i], g[i], t[0][i], t[1][i], t[2][i]);
    }
    for (std::size_t i = 0; i < kN; ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(p[i]), std::bit_cast<std::uint32_t>(q[i]))
          << A::kName << " on " << target << ": param " << i << ": " << p[i] << " vs " << q[i];
      for (int k = 0; k < kMaxStates; ++k) {
        if ((slots >> k & 1u) == 0) continue;
        ASSERT_EQ(std::bit_cast<std::uint32_t>(s[k][i]), std::bit_cast<std::uint32_t>(t[k][i]))
            << A::kName << " on " << target << ": state " << A::kStates[k] << " " << i;
      }
    }
  }
  ForceTarget("");
}

template <class D>
using Cases = ref::KernelCases<typename D::Hyper>;

// The descriptors of a registry list whose cases (tests/reference/<algo>.h) have scalar-math
// cases: MathHypers(), Math(ops, h, scalars, p, g, s0, s1, s2) calling the algorithm's math body
// with the given ops, and optionally kMathFirstStep.
template <class D>
concept HasMathCases = requires {
  Cases<D>::MathHypers();
};
template <class Kept, class... Rest>
struct WithMath {
  using type = Kept;
};
template <class... Kept, class First, class... Rest>
struct WithMath<::testing::Types<Kept...>, First, Rest...> {
  using type =
      typename WithMath<std::conditional_t<HasMathCases<First>, ::testing::Types<Kept..., First>,
                                           ::testing::Types<Kept...>>,
                        Rest...>::type;
};
template <class L>
struct MathTypes;
template <class... A>
struct MathTypes<algos::List<A...>> {
  using type = typename WithMath<::testing::Types<>, A...>::type;
};

struct DescriptorName {
  template <class D>
  static std::string GetName(int /*i*/) {
    return D::kName;
  }
};

template <class D>
class MathScalarOps : public ::testing::Test {};
TYPED_TEST_SUITE(MathScalarOps, MathTypes<algos::All>::type, DescriptorName);

// Each of the cases' hyper-parameter sets, from kMathFirstStep (or 1).
TYPED_TEST(MathScalarOps, EngineEqualsScalarMath) {
  using D = TypeParam;
  using C = Cases<D>;
  int first_step = 1;
  if constexpr (requires { C::kMathFirstStep; }) first_step = C::kMathFirstStep;
  for (const typename D::Hyper& h : C::MathHypers()) {
    ExpectEngineEqualsScalarMath<D>(
        h, RequiredStates(h),
        [&](const typename D::Scalars& c, float& p, float g, float& s0, float& s1, float& s2) {
          C::Math(scalar_math::ScalarOps{}, h, c, p, g, s0, s1, s2);
        },
        first_step);
  }
}

// The same from step 2^20, where every bias correction is exactly 1 and the math bodies leave its
// division out (src/math/bias_correction_math.h): the same on every target.
TYPED_TEST(MathScalarOps, EngineEqualsScalarMathLateSteps) {
  using D = TypeParam;
  using C = Cases<D>;
  for (const typename D::Hyper& h : C::MathHypers()) {
    ExpectEngineEqualsScalarMath<D>(
        h, RequiredStates(h),
        [&](const typename D::Scalars& c, float& p, float g, float& s0, float& s1, float& s2) {
          C::Math(scalar_math::ScalarOps{}, h, c, p, g, s0, s1, s2);
        },
        1 << 20);
  }
}

}  // namespace
}  // namespace fusedopt
