// The double-precision oracle of SGD (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// torch.optim.SGD. `momentum_buffer` is used when momentum != 0; at step 1 it is (re)started.
inline void SgdStep(const SgdHyper& h, std::int64_t step, std::span<double> p,
                    std::span<const double> g, std::span<double> momentum_buffer) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    double d = h.maximize ? -g[i] : g[i];                   // d = -g if maximize else g
    if (h.weight_decay != 0.0) d += h.weight_decay * p[i];  // d = d + λθ
    if (h.momentum != 0.0) {
      double& b = momentum_buffer[i];
      if (step == 1) {
        b = d;  // b_1 = d (clone of the gradient, no dampening)
      } else {
        b = h.momentum * b + (1.0 - h.dampening) * d;  // b_t = μ b_{t-1} + (1 − τ) d
      }
      d = h.nesterov ? d + h.momentum * b : b;  // d = d + μ b_t (nesterov) | d = b_t
    }
    p[i] -= h.lr * d;  // θ = θ − γ d
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
template <>
struct KernelCases<SgdHyper> {
  using Hyper = SgdHyper;
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    SgdStep(h, t, p, g, st[kMomentumBuffer]);
  }
  // {momentum 0, 0.9} × {dampening 0, 0.1, nesterov} × weight_decay × maximize; the last has every
  // feature. The standard step runs the same.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double momentum : {0.0, 0.9}) {
      for (int mode = 0; mode < 3; ++mode) {  // dampening 0, dampening 0.1, nesterov
        if (mode == 2 && momentum == 0.0) continue;
        for (double wd : {0.0, 0.01}) {
          for (bool maximize : {false, true}) {
            out.push_back({.lr = 0.05,
                           .momentum = momentum,
                           .dampening = mode == 1 ? 0.1 : 0.0,
                           .weight_decay = wd,
                           .nesterov = mode == 2,
                           .maximize = maximize});
          }
        }
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
  // Initial state of a tensor about to take step `step`. At step 1 the buffer is not read: fill it
  // with NaN.
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int /*slot*/, std::int64_t step, Rng& rng) {
    return step == 1 ? std::numeric_limits<double>::quiet_NaN() : rng.Uniform(-0.5, 0.5);
  }

  static std::vector<Hyper> MathHypers() {
    return {{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}};
  }
  template <class Ops, class Scalars>
  static void Math(Ops o, const Hyper& /*h*/, const Scalars& c, float& p, float g, float& b,
                   float& /*s1*/, float& /*s2*/) {
    SgdMath<true, true, true>(o, c, p, g, b);
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// torch.optim.SGD's constructor checks: lr, momentum, weight_decay >= 0; Nesterov needs momentum
// and no dampening. Each with the parts its message must contain.
inline std::vector<std::pair<SgdHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<SgdHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {SgdHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {SgdHyper{.lr = kNaN}, {"lr", "nan"}},
      {SgdHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
      {SgdHyper{.momentum = -0.5}, {"momentum", "-0.5"}},
      {SgdHyper{.momentum = 0.0, .nesterov = true}, {"Nesterov", "momentum 0"}},
      {SgdHyper{.momentum = 0.9, .dampening = 0.5, .nesterov = true},
       {"Nesterov", "dampening 0.5"}},
  };
}

// Nesterov with momentum and no dampening.
inline std::vector<SgdHyper> AcceptedHypers(std::type_identity<SgdHyper> /*tag*/) {
  return {SgdHyper{.momentum = 0.9, .nesterov = true}};
}

// Hyper-parameters under which every state slot is in use.
inline SgdHyper AllStatesHyper(std::type_identity<SgdHyper> /*tag*/) {
  return {.lr = 0.1, .momentum = 0.9};
}

// torch's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<SgdHyper> /*tag*/) {
  return {"momentum_buffer", "", ""};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<SgdHyper, int>> MissingStates(std::type_identity<SgdHyper> /*tag*/) {
  return {{SgdHyper{.momentum = 0.9}, kMomentumBuffer}};
}

// momentum_buffer only with momentum.
inline std::vector<std::pair<SgdHyper, unsigned>> RequiredStatesCases(
    std::type_identity<SgdHyper> /*tag*/) {
  return {{SgdHyper{}, 0u},
          {SgdHyper{.momentum = 0.9}, 0b001u},
          {SgdHyper{.momentum = 0.9, .nesterov = true}, 0b001u}};
}

// The value each state slot starts from (torch: a momentum buffer of zeros before its first
// momentum step).
inline std::vector<std::pair<SgdHyper, std::vector<float>>> InitialStates(
    std::type_identity<SgdHyper> /*tag*/) {
  return {{SgdHyper{.momentum = 0.9}, {0.0f}}};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<SgdHyper>, Options>> OptimizerCases(
    std::type_identity<SgdHyper> /*tag*/) {
  return {
      {{{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01},
        {.lr = 0.05, .maximize = true}},
       {}},
      {{{.lr = 0.1, .momentum = 0.5, .nesterov = true},
        {.lr = 0.02, .momentum = 0.9, .weight_decay = 0.1}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .state_dtype = DType::kBF16}},
  };
}

// Momentum switched on after a plain step: the hyper-parameters before and after, the momentum
// buffer's slot, and the param and the buffer after each step (every grad 2, the param 0 at
// first; no buffer after the plain step). torch starts the buffer as a copy of the gradient on its
// first momentum step (no dampening): buf = 2, p = -1 - 0.5·2; then buf = 0.9·2 + 0.5·2 = 2.8,
// p = -2 - 0.5·2.8.
inline std::pair<std::pair<SgdHyper, SgdHyper>, int> MomentumSwitchedOnLater(
    std::type_identity<SgdHyper> /*tag*/) {
  return {{{.lr = 0.5}, {.lr = 0.5, .momentum = 0.9, .dampening = 0.5}}, kMomentumBuffer};
}
inline std::vector<std::pair<float, float>> MomentumSwitchedOnLaterSteps(
    std::type_identity<SgdHyper> /*tag*/) {
  return {{-1.0f, 0.0f}, {-2.0f, 2.0f}, {-3.4f, 2.8f}};
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).

}  // namespace fusedopt::ref
