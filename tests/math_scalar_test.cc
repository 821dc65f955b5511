// The math bodies (src/math/<algo>_math.h) hold no Highway types: instantiated here with plain
// scalar float Ops (fma for MulAdd, IEEE sqrt), they must give, bit for bit, what the engine's
// kernels give on every FMA target. This is what lets another backend (CUDA) reuse them.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "src/algos/registry.h"

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

#include "src/math/adadelta_math.h"
#include "src/math/adam_math.h"
#include "src/math/adamax_math.h"
#include "src/math/asgd_math.h"
#include "src/math/lerp_math.h"
#include "src/math/lion_math.h"
#include "src/math/nadam_math.h"
#include "src/math/radam_math.h"
#include "src/math/rmsprop_math.h"
#include "src/math/rprop_math.h"
#include "src/math/sgd_math.h"

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
  for (const std::string& t : AvailableTargets()) {
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
    std::array<float, kMaxScalars> scalars{};  // the scalar states (NAdam's mu_product)
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

using scalar_math::ScalarOps;

TEST(MathScalarOps, SgdNesterovWeightDecay) {
  const SgdHyper h{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  ExpectEngineEqualsScalarMath<algos::Sgd>(
      h, RequiredStates(h), [](const SgdScalars& c, float& p, float g, float& b, float&, float&) {
        scalar_math::SgdMath<true, true, true>(ScalarOps{}, c, p, g, b);
      });
}

TEST(MathScalarOps, AdamWAmsgrad) {
  const AdamWHyper h{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true};
  ExpectEngineEqualsScalarMath<algos::AdamW>(
      h, RequiredStates(h),
      [](const AdamScalars& c, float& p, float g, float& m, float& v, float& v_max) {
        scalar_math::AdamMath<false, true>(ScalarOps{}, c, p, g, m, v, v_max);
      });
}

TEST(MathScalarOps, RmspropCenteredMomentum) {
  const RmspropHyper h{.lr = 1e-2, .weight_decay = 0.01, .momentum = 0.5, .centered = true};
  ExpectEngineEqualsScalarMath<algos::Rmsprop>(
      h, RequiredStates(h),
      [](const RmspropScalars& c, float& p, float g, float& sq, float& buf, float& ga) {
        scalar_math::RmspropMath<true, true, true>(ScalarOps{}, c, p, g, sq, buf, ga);
      });
}

TEST(MathScalarOps, LionWeightDecay) {
  const LionHyper h{.lr = 1e-3, .weight_decay = 0.1};
  ExpectEngineEqualsScalarMath<algos::Lion>(
      h, RequiredStates(h), [](const LionScalars& c, float& p, float g, float& m, float&, float&) {
        scalar_math::LionMath(ScalarOps{}, c, p, g, m);
      });
}

TEST(MathScalarOps, AdamaxWeightDecay) {
  const AdamaxHyper h{.lr = 1e-2, .weight_decay = 0.1};
  ExpectEngineEqualsScalarMath<algos::Adamax>(
      h, RequiredStates(h),
      [](const AdamaxScalars& c, float& p, float g, float& m, float& u, float&) {
        scalar_math::AdamaxMath<true>(ScalarOps{}, c, p, g, m, u);
      });
}

TEST(MathScalarOps, AdadeltaWeightDecay) {
  const AdadeltaHyper h{.lr = 0.5, .weight_decay = 0.1};
  ExpectEngineEqualsScalarMath<algos::Adadelta>(
      h, RequiredStates(h),
      [](const AdadeltaScalars& c, float& p, float g, float& v, float& u, float&) {
        scalar_math::AdadeltaMath<true>(ScalarOps{}, c, p, g, v, u);
      });
}

// Steps 4-6: step 6 is the first rectified one (rho_t > 5), so both branches run.
TEST(MathScalarOps, NadamCoupledAndDecoupled) {
  for (const bool decoupled : {false, true}) {
    const NadamHyper h{.lr = 1e-2, .weight_decay = 0.1, .decoupled_weight_decay = decoupled};
    ExpectEngineEqualsScalarMath<algos::Nadam>(
        h, RequiredStates(h),
        [&](const NadamScalars& c, float& p, float g, float& m, float& v, float&) {
          if (decoupled) {
            scalar_math::NadamMath<false>(ScalarOps{}, c, p, g, m, v);
          } else {
            scalar_math::NadamMath<true>(ScalarOps{}, c, p, g, m, v);
          }
        });
  }
}

// t0 0: steps 1 and 2 copy the param into ax, step 3 averages (mu = 1/2).
TEST(MathScalarOps, AsgdWeightDecayAveraging) {
  const AsgdHyper h{.lr = 0.05, .lambd = 0.1, .t0 = 0.0, .weight_decay = 0.1, .maximize = true};
  ExpectEngineEqualsScalarMath<algos::Asgd>(
      h, RequiredStates(h), [](const AsgdScalars& c, float& p, float g, float& ax, float&, float&) {
        if (c.average) {
          scalar_math::AsgdMath<true, true>(ScalarOps{}, c, p, g, ax);
        } else {
          scalar_math::AsgdMath<true, false>(ScalarOps{}, c, p, g, ax);
        }
      });
}

// Steps 1-3 from prev 0: every sign case (gradients of random signs), and step sizes that clamp.
TEST(MathScalarOps, RpropClamped) {
  const RpropHyper h{.lr = 0.05,
                     .etaminus = 0.25,
                     .etaplus = 3.0,
                     .step_size_min = 0.02,
                     .step_size_max = 0.2,
                     .maximize = true};
  ExpectEngineEqualsScalarMath<algos::Rprop>(
      h, RequiredStates(h),
      [](const RpropScalars& c, float& p, float g, float& prev, float& step_size, float&) {
        scalar_math::RpropMath(ScalarOps{}, c, p, g, prev, step_size);
      });
}

TEST(MathScalarOps, RadamDecoupledRectified) {
  const RadamHyper h{.lr = 1e-2, .weight_decay = 0.1, .decoupled_weight_decay = true};
  ExpectEngineEqualsScalarMath<algos::Radam>(
      h, RequiredStates(h),
      [](const RadamScalars& c, float& p, float g, float& m, float& v, float&) {
        if (c.rectified) {
          scalar_math::RadamMath<false, true>(ScalarOps{}, c, p, g, m, v);
        } else {
          scalar_math::RadamMath<false, false>(ScalarOps{}, c, p, g, m, v);
        }
      },
      /*first_step=*/4);
}

}  // namespace
}  // namespace fusedopt
