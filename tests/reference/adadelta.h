// The double-precision oracle of Adadelta (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// torch.optim.Adadelta: running means of g² (square_avg) and of the squared steps (acc_delta); the
// step is √(acc_delta + ε) / √(square_avg + ε) · g.
inline void AdadeltaStep(const AdadeltaHyper& h, std::span<double> p, std::span<const double> g,
                         std::span<double> square_avg, std::span<double> acc_delta) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];                   // g = -∇ if maximize else ∇
    if (h.weight_decay != 0.0) gi += h.weight_decay * p[i];  // g = g + λθ
    double& v = square_avg[i];
    double& u = acc_delta[i];
    v = h.rho * v + (1.0 - h.rho) * gi * gi;  // v = ρ v + (1 − ρ) g²
    const double delta =
        std::sqrt(u + h.eps) / std::sqrt(v + h.eps) * gi;  // Δ = √(u + ε) / √(v + ε) g
    u = h.rho * u + (1.0 - h.rho) * delta * delta;         // u = ρ u + (1 − ρ) Δ²
    p[i] -= h.lr * delta;                                  // θ = θ − γ Δ
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
template <>
struct KernelCases<AdadeltaHyper> {
  using Hyper = AdadeltaHyper;
  static void Ref(const Hyper& h, std::int64_t /*t*/, std::span<double> p,
                  std::span<const double> g, const StateSpans& st) {
    AdadeltaStep(h, p, g, st[kAdadeltaSquareAvg], st[kAccDelta]);
  }
  // weight_decay {0, 0.05} × maximize.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double wd : {0.0, 0.05}) {
      for (bool maximize : {false, true}) {
        out.push_back({.lr = 0.5, .weight_decay = wd, .maximize = maximize});
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.0;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.maximize = !h.maximize;
    h.rho = 0.8;
    h.eps = 1e-4;
    return h;
  }
  // Zero at step 1 (as torch); later running means of g² and of the (smaller) squared steps.
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kAdadeltaSquareAvg) return rng.Uniform(0.05, 1.0);
    return rng.Uniform(1e-3, 0.1);
  }

  // The standard step: weight_decay {0, 0.01} × maximize.
  static std::vector<Hyper> StandardOptions() {
    std::vector<Hyper> out;
    for (double wd : {0.0, 0.01}) {
      for (bool maximize : {false, true})
        out.push_back({.lr = 0.5, .weight_decay = wd, .maximize = maximize});
    }
    return out;
  }

  static std::vector<Hyper> MathHypers() { return {{.lr = 0.5, .weight_decay = 0.1}}; }
  template <class Ops, class Scalars>
  static void Math(Ops o, const Hyper& /*h*/, const Scalars& c, float& p, float g, float& v,
                   float& u, float& /*s2*/) {
    AdadeltaMath<true>(o, c, p, g, v, u);
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// torch.optim.Adadelta's constructor checks (lr, eps, weight_decay >= 0; rho in [0, 1]). Each with
// the parts its message must contain.
inline std::vector<std::pair<AdadeltaHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<AdadeltaHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {AdadeltaHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {AdadeltaHyper{.lr = kNaN}, {"lr", "nan"}},
      {AdadeltaHyper{.rho = 1.5}, {"rho", "1.5", "[0, 1]"}},
      {AdadeltaHyper{.rho = -0.1}, {"rho", "-0.1"}},
      {AdadeltaHyper{.rho = kNaN}, {"rho", "nan"}},
      {AdadeltaHyper{.eps = -0.25}, {"eps", "-0.25"}},
      {AdadeltaHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
  };
}

// The edges torch accepts: lr 0, rho 0 and 1, eps 0.
inline std::vector<AdadeltaHyper> AcceptedHypers(std::type_identity<AdadeltaHyper> /*tag*/) {
  return {AdadeltaHyper{.lr = 0.0, .rho = 0.0, .eps = 0.0}, AdadeltaHyper{.rho = 1.0}};
}

// Hyper-parameters under which every state slot is in use.
inline AdadeltaHyper AllStatesHyper(std::type_identity<AdadeltaHyper> /*tag*/) {
  return {.weight_decay = 0.1};
}

// torch's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<AdadeltaHyper> /*tag*/) {
  return {"square_avg", "acc_delta", ""};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<AdadeltaHyper, int>> MissingStates(
    std::type_identity<AdadeltaHyper> /*tag*/) {
  return {{AdadeltaHyper{}, kAdadeltaSquareAvg}, {AdadeltaHyper{}, kAccDelta}};
}

// square_avg and acc_delta, whatever the options.
inline std::vector<std::pair<AdadeltaHyper, unsigned>> RequiredStatesCases(
    std::type_identity<AdadeltaHyper> /*tag*/) {
  return {{AdadeltaHyper{}, 0b011u},
          {AdadeltaHyper{.weight_decay = 0.1, .maximize = true}, 0b011u}};
}

// The value each state slot starts from (torch: zeros).
inline std::vector<std::pair<AdadeltaHyper, std::vector<float>>> InitialStates(
    std::type_identity<AdadeltaHyper> /*tag*/) {
  return {{AdadeltaHyper{}, {0.0f, 0.0f}}};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<AdadeltaHyper>, Options>> OptimizerCases(
    std::type_identity<AdadeltaHyper> /*tag*/) {
  return {
      {{{.lr = 1.0, .weight_decay = 0.1}, {.lr = 0.5, .rho = 0.8, .maximize = true}}, {}},
      {{{.lr = 1.0}, {.lr = 0.5, .eps = 1e-4}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).
template <>
struct TorchCase<AdadeltaHyper> {
  static AdadeltaHyper TestHyper() { return {.lr = 0.5, .rho = 0.8, .weight_decay = 0.1}; }
  static constexpr const char* kTensorKeys[] = {"square_avg", "acc_delta"};
};

}  // namespace fusedopt::ref
