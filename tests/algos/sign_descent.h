// Sign descent, a test-only algorithm (p ← p·(1 − lr·wd) − lr·sign(±g)): the proof that
// docs/adding-an-optimizer.md's steps are the whole work. It is added as a product algorithm is, by
// its descriptor (this file: Hyper, Scalars, kernel declaration, descriptor), its math body
// (sign_descent_math.h) and its kernel file (sign_descent.cc), plus its test data
// (SignDescentSweep: the double-precision oracle and the option sweep of tests/kernel_test.cc) and
// one line in tests/algos/registry.h. The generic kernel sweep, golden replay
// (tests/algos/signdescent.json, written by make_sign_descent_golden.py from torch ops) and
// checkpoint tests then run it.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt::test_algos {

struct SignDescentHyper {
  double lr = 1e-3;
  double weight_decay = 0.0;  // decoupled: p.mul_(1 − lr·wd) before the sign step
  bool maximize = false;
};

struct SignDescentScalars {
  float grad_mul;   // −grad_scale with maximize, else grad_scale (only its sign matters)
  float decay_mul;  // f32(1 − lr·wd), used when decay
  float neg_lr;     // f32(−lr)
  bool decay;       // weight_decay != 0
};

// The kernel (sign_descent.cc), which runs sign_descent_math.h.
void RunSignDescentChunks(const StepPlan<SignDescentScalars>& plan, std::size_t chunk_begin,
                          std::size_t chunk_end);

struct SignDescent {
  using Hyper = SignDescentHyper;
  using Scalars = SignDescentScalars;
  static constexpr const char* kName = "sign_descent";
  static constexpr const char* kTorchName = "SignDescent";
  static constexpr const char* kStepName = "SignDescentStep";
  static constexpr bool kCountsSteps = false;  // no state at all
  static constexpr algos::StateNames kStates = {"", "", ""};
  static constexpr auto kFields = algos::Fields(
      algos::Field{"lr", &Hyper::lr}, algos::Field{"weight_decay", &Hyper::weight_decay},
      algos::Field{"maximize", &Hyper::maximize}.Optional());

  static unsigned RequiredStates(const Hyper& /*h*/) { return 0u; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }

  static void Validate(const algos::HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.Finite("weight_decay", h.weight_decay);
  }

  // Python floats meeting f32 tensors: each rounded once.
  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    return {.grad_mul = algos::GradMul(h.maximize, s.grad_scale),
            .decay_mul = static_cast<float>(1.0 - h.lr * h.weight_decay),
            .neg_lr = static_cast<float>(-h.lr),
            .decay = h.weight_decay != 0.0};
  }

  static constexpr auto kRun = RunSignDescentChunks;

  // The reference (make_sign_descent_golden.py), one tensor op per line (descriptor.h).
  template <class Step>
  static void StandardStep(const Hyper& h, const algos::StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      if (h.maximize) grad = t.neg(grad);
      if (h.weight_decay != 0.0) t.mul_(t.param(), 1.0 - h.lr * h.weight_decay);
      t.add_(t.param(), t.sign(grad), -h.lr);
    });
  }
};

// The kernel sweep's data (tests/kernel_test.cc, Algo): the oracle in double, the option
// sweep, a second group's options and the initial states (none).
struct SignDescentSweep {
  using Hyper = SignDescentHyper;
  static void Ref(const Hyper& h, std::int64_t /*t*/, std::span<double> p,
                  std::span<const double> g, const std::array<std::span<double>, kMaxStates>&) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double d = h.maximize ? -g[i] : g[i];
      const double sign = d > 0.0 ? 1.0 : (d < 0.0 ? -1.0 : 0.0);  // 0 for NaN, as torch.sign
      if (h.weight_decay != 0.0) p[i] *= 1.0 - h.lr * h.weight_decay;
      p[i] -= h.lr * sign;
    }
  }
  // weight_decay {0, 0.1} × maximize.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double wd : {0.0, 0.1}) {
      for (bool maximize : {false, true}) {
        out.push_back({.lr = 0.01, .weight_decay = wd, .maximize = maximize});
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.maximize = !h.maximize;
    return h;
  }
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int /*slot*/, std::int64_t /*step*/, Rng& /*rng*/) {
    return 0.0;
  }
};

}  // namespace fusedopt::test_algos

namespace fusedopt {
// The step and its state slots: the engine's generic ones (src/core/run_step.h) over the
// descriptor, as the registry's algorithms get theirs in src/algos/steps.cc.
template <>
void FusedStep<test_algos::SignDescentHyper>(std::span<const test_algos::SignDescentHyper> groups,
                                             std::span<const Segment> segments, Runtime& runtime);
template <>
unsigned RequiredStates<test_algos::SignDescentHyper>(const test_algos::SignDescentHyper& h);
}  // namespace fusedopt
