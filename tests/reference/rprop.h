// The double-precision oracle of Rprop (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// torch.optim.Rprop: per element, the step size Δ grows by η+ while g keeps the sign of the last
// gradient used, shrinks by η− when it flips (and then the gradient counts as 0: no move, and 0 is
// what the next step compares with), is kept when either is 0, and stays in [Δmin, Δmax];
// θ = θ − sgn(g)·Δ. NaN products and gradients have sign 0, as torch.sign (NaN Δ stays NaN).
inline void RpropStep(const RpropHyper& h, std::span<double> p, std::span<const double> g,
                      std::span<double> prev, std::span<double> step_size) {
  const auto sgn = [](double x) { return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : 0.0); };
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];  // g = -∇ if maximize else ∇
    const double s = sgn(gi * prev[i]);     // s = sgn(g·prev)
    const double factor = s > 0.0 ? h.etaplus : (s < 0.0 ? h.etaminus : 1.0);
    double& d = step_size[i];
    d *= factor;  // Δ = Δ·η
    if (!std::isnan(d)) d = std::min(std::max(d, h.step_size_min), h.step_size_max);
    if (s < 0.0) gi = 0.0;  // g = 0 where the sign flipped
    p[i] -= sgn(gi) * d;    // θ = θ − sgn(g)Δ
    prev[i] = gi;           // prev = g
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
template <>
struct KernelCases<RpropHyper> {
  using Hyper = RpropHyper;
  static void Ref(const Hyper& h, std::int64_t /*t*/, std::span<double> p,
                  std::span<const double> g, const StateSpans& st) {
    RpropStep(h, p, g, st[kRpropPrev], st[kRpropStepSize]);
  }
  // maximize × {torch's etas and step sizes, other etas, step sizes that clamp (the sweep's step
  // sizes start in [1e-4, 0.05] and grow or shrink by 1.5 or 0.25 a step)}.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (bool maximize : {false, true}) {
      out.push_back({.lr = 0.01, .maximize = maximize});
      out.push_back({.lr = 0.01, .etaminus = 0.25, .etaplus = 1.5, .maximize = maximize});
      out.push_back({.lr = 0.01,
                     .etaminus = 0.25,
                     .etaplus = 1.5,
                     .step_size_min = 1e-3,
                     .step_size_max = 0.02,
                     .maximize = maximize});
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.maximize = !h.maximize;
    h.etaminus = 0.4;
    h.etaplus = 1.3;
    return h;
  }
  // At step 1 as torch: prev 0, step_size lr. Later a previous gradient of either sign (or 0) and
  // a step size within the bounds.
  template <class Rng>
  static double InitState(const Hyper& h, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return slot == kRpropStepSize ? h.lr : 0.0;
    if (slot == kRpropStepSize)
      return rng.Uniform(h.step_size_min, std::min(h.step_size_max, 0.05));
    const double u = rng.Uniform(-1.0, 1.0);
    return std::abs(u) < 0.1 ? 0.0 : u;
  }

  // The standard step: torch's defaults, maximize, and step sizes that clamp.
  static std::vector<Hyper> StandardOptions() {
    return {Hyper{}, Hyper{.maximize = true},
            Hyper{.lr = 0.05,
                  .etaminus = 0.25,
                  .etaplus = 1.5,
                  .step_size_min = 0.02,
                  .step_size_max = 0.06}};
  }

  // Steps 1-3 from prev 0: every sign case (gradients of random signs), and step sizes that clamp.
  static std::vector<Hyper> MathHypers() {
    return {{.lr = 0.05,
             .etaminus = 0.25,
             .etaplus = 3.0,
             .step_size_min = 0.02,
             .step_size_max = 0.2,
             .maximize = true}};
  }
  template <class Ops, class Scalars>
  static void Math(Ops o, const Hyper& /*h*/, const Scalars& c, float& p, float g, float& prev,
                   float& step_size, float& /*s2*/) {
    RpropMath(o, c, p, g, prev, step_size);
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// torch.optim.Rprop's constructor checks (lr >= 0, 0 < etaminus < 1 < etaplus); the step sizes
// have none. Each with the parts its message must contain.
inline std::vector<std::pair<RpropHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<RpropHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {RpropHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {RpropHyper{.lr = kNaN}, {"lr", "nan"}},
      {RpropHyper{.etaminus = 0.0}, {"eta values: 0, 1.2"}},
      {RpropHyper{.etaminus = 1.0}, {"eta values: 1, 1.2"}},
      {RpropHyper{.etaminus = kNaN}, {"eta values: nan"}},
      {RpropHyper{.etaplus = 1.0}, {"eta values: 0.5, 1"}},
      {RpropHyper{.etaplus = kNaN}, {"eta values: 0.5, nan"}},
  };
}

// What torch accepts: lr 0, extreme etas, step sizes of any order or value.
inline std::vector<RpropHyper> AcceptedHypers(std::type_identity<RpropHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {RpropHyper{.lr = 0.0, .etaminus = 1e-50, .etaplus = 1e300},
          RpropHyper{.step_size_min = 1.0, .step_size_max = 0.5},  // min > max: every step is max
          RpropHyper{.step_size_min = -1.0, .step_size_max = kNaN}};
}

// Hyper-parameters under which every state slot is in use.
inline RpropHyper AllStatesHyper(std::type_identity<RpropHyper> /*tag*/) {
  return {.maximize = true};
}

// torch's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<RpropHyper> /*tag*/) {
  return {"prev", "step_size", ""};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<RpropHyper, int>> MissingStates(
    std::type_identity<RpropHyper> /*tag*/) {
  return {{RpropHyper{}, kRpropPrev}, {RpropHyper{}, kRpropStepSize}};
}

// prev and step_size, whatever the options.
inline std::vector<std::pair<RpropHyper, unsigned>> RequiredStatesCases(
    std::type_identity<RpropHyper> /*tag*/) {
  return {{RpropHyper{}, 0b011u}, {RpropHyper{.maximize = true}, 0b011u}};
}

// torch: prev = zeros_like(p), step_size = full_like(grad, lr), each group its own lr.
inline std::vector<std::pair<RpropHyper, std::vector<float>>> InitialStates(
    std::type_identity<RpropHyper> /*tag*/) {
  return {{RpropHyper{.lr = 0.25}, {0.0f, 0.25f}},
          {RpropHyper{.lr = 0.125, .etaminus = 0.25}, {0.0f, 0.125f}}};
}

// The first step of a tensor whose every param is `param` and every grad `grad`, from the initial
// state: the param and each state slot after it. prev 0 keeps every step size (factor 1), the
// param moves by −sgn(g)·lr and prev becomes g.
inline std::vector<float> AfterFirstStep(const RpropHyper& h, float param, float grad) {
  const auto lr = static_cast<float>(h.lr);
  return {param - (grad > 0.0f ? lr : -lr), grad, lr};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<RpropHyper>, Options>> OptimizerCases(
    std::type_identity<RpropHyper> /*tag*/) {
  return {
      {{{.lr = 0.01}, {.lr = 0.05, .etaminus = 0.3, .maximize = true}}, {}},
      {{{.lr = 0.01, .step_size_max = 0.02}, {.lr = 0.05, .etaplus = 1.5}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).
template <>
struct TorchCase<RpropHyper> {
  static RpropHyper TestHyper() {  // no weight decay
    return {.lr = 5e-2, .etaminus = 0.4, .etaplus = 1.3};
  }
  static constexpr const char* kTensorKeys[] = {"prev", "step_size"};
  // lr is only the first step size, clamped to [step_size_min, step_size_max] (torch's).
  static double StepSizeFloor() { return TestHyper().step_size_min; }
};

}  // namespace fusedopt::ref
