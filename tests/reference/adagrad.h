// The double-precision oracle of Adagrad (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// torch.optim.Adagrad (dense). `sum` must hold initial_accumulator_value before the first step.
inline void AdagradStep(const AdagradHyper& h, std::int64_t step, std::span<double> p,
                        std::span<const double> g, std::span<double> sum) {
  const double clr =
      h.lr / (1.0 + static_cast<double>(step - 1) * h.lr_decay);  // γ̃ = γ / (1 + (t − 1) η)
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];  // g = -∇ if maximize else ∇
    if (h.weight_decay != 0.0)
      gi += h.weight_decay * p[i];                   // g = g + λθ (used in both lines below)
    sum[i] += gi * gi;                               // G = G + g²
    p[i] -= clr * gi / (std::sqrt(sum[i]) + h.eps);  // θ = θ − γ̃ g / (√G + ε)
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
template <>
struct KernelCases<AdagradHyper> {
  using Hyper = AdagradHyper;
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    AdagradStep(h, t, p, g, st[kSum]);
  }
  // lr_decay {0, 0.01} × weight_decay × initial_accumulator_value {0, 0.1} × maximize.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double lr_decay : {0.0, 0.01}) {
      for (double wd : {0.0, 0.01}) {
        for (double init : {0.0, 0.1}) {
          for (bool maximize : {false, true}) {
            out.push_back({.lr = 0.05,
                           .lr_decay = lr_decay,
                           .weight_decay = wd,
                           .initial_accumulator_value = init,
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
    h.lr_decay = h.lr_decay == 0.0 ? 0.05 : 0.0;
    return h;
  }
  // initial_accumulator_value at step 1 (the caller fills it, as torch's constructor); later more.
  template <class Rng>
  static double InitState(const Hyper& h, int /*slot*/, std::int64_t step, Rng& rng) {
    return h.initial_accumulator_value + (step == 1 ? 0.0 : rng.Uniform(0.0, 2.0));
  }

  // The standard step: lr_decay × weight_decay × maximize.
  static std::vector<Hyper> StandardOptions() {
    std::vector<Hyper> out;
    for (double lr_decay : {0.0, 0.01}) {
      for (double wd : {0.0, 0.01}) {
        for (bool maximize : {false, true})
          out.push_back({.lr_decay = lr_decay, .weight_decay = wd, .maximize = maximize});
      }
    }
    return out;
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// torch.optim.Adagrad's constructor checks: lr, eps, weight_decay, lr_decay,
// initial_accumulator_value >= 0. Each with the parts its message must contain.
inline std::vector<std::pair<AdagradHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<AdagradHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {AdagradHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {AdagradHyper{.lr = kNaN}, {"lr", "nan"}},
      {AdagradHyper{.eps = -0.25}, {"eps", "-0.25"}},
      {AdagradHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
      {AdagradHyper{.lr_decay = -0.5}, {"lr_decay", "-0.5"}},
      {AdagradHyper{.initial_accumulator_value = -0.5}, {"initial_accumulator_value", "-0.5"}},
  };
}

// The edges torch accepts: lr and eps 0.
inline std::vector<AdagradHyper> AcceptedHypers(std::type_identity<AdagradHyper> /*tag*/) {
  return {AdagradHyper{.lr = 0.0, .eps = 0.0}};
}

// Hyper-parameters under which every state slot is in use.
inline AdagradHyper AllStatesHyper(std::type_identity<AdagradHyper> /*tag*/) { return {}; }

// torch's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<AdagradHyper> /*tag*/) {
  return {"sum", "", ""};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<AdagradHyper, int>> MissingStates(
    std::type_identity<AdagradHyper> /*tag*/) {
  return {{AdagradHyper{}, kSum}};
}

// sum, whatever the options.
inline std::vector<std::pair<AdagradHyper, unsigned>> RequiredStatesCases(
    std::type_identity<AdagradHyper> /*tag*/) {
  return {{AdagradHyper{}, 0b001u}, {AdagradHyper{.initial_accumulator_value = 0.1}, 0b001u}};
}

// torch: sum = full_like(p, initial_accumulator_value), the double rounded to the state's dtype.
inline std::vector<std::pair<AdagradHyper, std::vector<float>>> InitialStates(
    std::type_identity<AdagradHyper> /*tag*/) {
  return {{AdagradHyper{.initial_accumulator_value = 0.5}, {0.5f}},
          {AdagradHyper{.initial_accumulator_value = 0.1}, {static_cast<float>(0.1)}}};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<AdagradHyper>, Options>> OptimizerCases(
    std::type_identity<AdagradHyper> /*tag*/) {
  return {
      {{{.lr = 0.1, .lr_decay = 0.01, .initial_accumulator_value = 0.1},
        {.lr = 0.05, .weight_decay = 0.01, .eps = 1e-6}},
       {}},
      {{{.lr = 0.1, .initial_accumulator_value = 0.5},
        {.lr = 0.05, .lr_decay = 0.1, .maximize = true}},
       {.param_dtype = DType::kBF16,
        .grad_dtype = DType::kF32,
        .state_dtype = DType::kBF16,
        .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).

}  // namespace fusedopt::ref
