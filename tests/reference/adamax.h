// The double-precision oracle of Adamax (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// torch.optim.Adamax: the first moment and the exponentially weighted infinity norm u (eps inside
// the max, no bias correction of u).
inline void AdamaxStep(const AdamaxHyper& h, std::int64_t step, std::span<double> p,
                       std::span<const double> g, std::span<double> exp_avg,
                       std::span<double> exp_inf) {
  const double clr = h.lr / (1.0 - std::pow(h.beta1, static_cast<double>(step)));  // γ / (1 − β1^t)
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];                   // g = -∇ if maximize else ∇
    if (h.weight_decay != 0.0) gi += h.weight_decay * p[i];  // g = g + λθ
    double& m = exp_avg[i];
    double& u = exp_inf[i];
    m += (1.0 - h.beta1) * (gi - m);  // m = lerp(m, g, 1 − β1) (Inf − Inf: NaN, as torch)
    u = MaximumPropagatingNaN(h.beta2 * u, std::abs(gi) + h.eps);  // u = max(β2 u, |g| + ε)
    p[i] -= clr * m / u;                                           // θ = θ − γ̃ m / u
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
template <>
struct KernelCases<AdamaxHyper> {
  using Hyper = AdamaxHyper;
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    AdamaxStep(h, t, p, g, st[kAdamaxExpAvg], st[kExpInf]);
  }
  // weight_decay {0, 0.05} × maximize.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double wd : {0.0, 0.05}) {
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
    h.beta1 = 0.8;
    h.beta2 = 0.99;
    return h;
  }
  // Zero at step 1 (as torch); later a plausible state: exp_inf is a decayed max of |g| + eps.
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kAdamaxExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.05, 1.0);
  }

  // The standard step: weight_decay {0, 0.01} × maximize.
  static std::vector<Hyper> StandardOptions() {
    std::vector<Hyper> out;
    for (double wd : {0.0, 0.01}) {
      for (bool maximize : {false, true})
        out.push_back({.lr = 0.01, .weight_decay = wd, .maximize = maximize});
    }
    return out;
  }

  static std::vector<Hyper> MathHypers() { return {{.lr = 1e-2, .weight_decay = 0.1}}; }
  template <class Ops, class Scalars>
  static void Math(Ops o, const Hyper& /*h*/, const Scalars& c, float& p, float g, float& m,
                   float& u, float& /*s2*/) {
    AdamaxMath<true>(o, c, p, g, m, u);
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// torch.optim.Adamax's constructor checks (lr, eps, weight_decay >= 0; betas in [0, 1)). Each with
// the parts its message must contain.
inline std::vector<std::pair<AdamaxHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<AdamaxHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {AdamaxHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {AdamaxHyper{.lr = kNaN}, {"lr", "nan"}},
      {AdamaxHyper{.eps = -0.25}, {"eps", "-0.25"}},
      {AdamaxHyper{.beta1 = 1.0}, {"beta1: 1", "[0, 1)"}},
      {AdamaxHyper{.beta1 = -0.1}, {"beta1", "-0.1"}},
      {AdamaxHyper{.beta2 = 1.0}, {"beta2: 1"}},
      {AdamaxHyper{.beta2 = kNaN}, {"beta2", "nan"}},
      {AdamaxHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
      {AdamaxHyper{.weight_decay = kNaN}, {"weight_decay", "nan"}},
  };
}

// The edges torch accepts: lr, eps and both betas 0.
inline std::vector<AdamaxHyper> AcceptedHypers(std::type_identity<AdamaxHyper> /*tag*/) {
  return {AdamaxHyper{.lr = 0.0, .beta1 = 0.0, .beta2 = 0.0, .eps = 0.0}};
}

// Hyper-parameters under which every state slot is in use.
inline AdamaxHyper AllStatesHyper(std::type_identity<AdamaxHyper> /*tag*/) {
  return {.weight_decay = 0.1};
}

// torch's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<AdamaxHyper> /*tag*/) {
  return {"exp_avg", "exp_inf", ""};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<AdamaxHyper, int>> MissingStates(
    std::type_identity<AdamaxHyper> /*tag*/) {
  return {{AdamaxHyper{}, kAdamaxExpAvg}, {AdamaxHyper{}, kExpInf}};
}

// exp_avg and exp_inf, whatever the options.
inline std::vector<std::pair<AdamaxHyper, unsigned>> RequiredStatesCases(
    std::type_identity<AdamaxHyper> /*tag*/) {
  return {{AdamaxHyper{}, 0b011u}, {AdamaxHyper{.weight_decay = 0.1, .maximize = true}, 0b011u}};
}

// The value each state slot starts from (torch: zeros).
inline std::vector<std::pair<AdamaxHyper, std::vector<float>>> InitialStates(
    std::type_identity<AdamaxHyper> /*tag*/) {
  return {{AdamaxHyper{}, {0.0f, 0.0f}}};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<AdamaxHyper>, Options>> OptimizerCases(
    std::type_identity<AdamaxHyper> /*tag*/) {
  return {
      {{{.lr = 2e-3, .weight_decay = 0.1}, {.lr = 1e-3, .beta1 = 0.8, .maximize = true}}, {}},
      {{{.lr = 2e-3}, {.lr = 1e-3, .beta2 = 0.99, .weight_decay = 0.01}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).
template <>
struct TorchCase<AdamaxHyper> {
  static AdamaxHyper TestHyper() { return {.lr = 5e-3, .beta1 = 0.85, .weight_decay = 0.1}; }
  static constexpr const char* kTensorKeys[] = {"exp_avg", "exp_inf"};
};

}  // namespace fusedopt::ref
