// The double-precision oracle of RMSprop (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// torch.optim.RMSprop (eps outside the sqrt). `momentum_buffer` is used when momentum > 0,
// `grad_avg` when centered.
inline void RmspropStep(const RmspropHyper& h, std::int64_t /*step*/, std::span<double> p,
                        std::span<const double> g, std::span<double> square_avg,
                        std::span<double> momentum_buffer, std::span<double> grad_avg) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];                   // g = -∇ if maximize else ∇
    if (h.weight_decay != 0.0) gi += h.weight_decay * p[i];  // g = g + λθ
    double& v = square_avg[i];
    v = h.alpha * v + (1.0 - h.alpha) * gi * gi;  // v = α v + (1 − α) g²
    double avg;
    if (h.centered) {
      double& ga = grad_avg[i];
      ga += (1.0 - h.alpha) * (gi - ga);  // ḡ = lerp(ḡ, g, 1 − α) = α ḡ + (1 − α) g
      avg = std::sqrt(v - ga * ga);       // √(v − ḡ²)
    } else {
      avg = std::sqrt(v);  // √v
    }
    avg += h.eps;  // avg = √(…) + ε
    if (h.momentum > 0.0) {
      double& b = momentum_buffer[i];
      b = h.momentum * b + gi / avg;  // b = μ b + g / avg
      p[i] -= h.lr * b;               // θ = θ − γ b
    } else {
      p[i] -= h.lr * gi / avg;  // θ = θ − γ g / avg
    }
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
template <>
struct KernelCases<RmspropHyper> {
  using Hyper = RmspropHyper;
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    RmspropStep(h, t, p, g, st[kSquareAvg], st[kRmspropMomentumBuffer], st[kGradAvg]);
  }
  // centered × momentum {0, 0.9} × weight_decay × maximize.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (bool centered : {false, true}) {
      for (double momentum : {0.0, 0.9}) {
        for (double wd : {0.0, 0.01}) {
          for (bool maximize : {false, true}) {
            out.push_back({.lr = 0.01,
                           .weight_decay = wd,
                           .momentum = momentum,
                           .centered = centered,
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
    h.alpha = 0.9;
    return h;
  }
  // Zero at step 1; later square_avg > 0 and grad_avg² ≤ square_avg / 4 (as any running average
  // keeps it).
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kSquareAvg) return rng.Uniform(0.05, 1.0);
    return rng.Uniform(-0.5, 0.5);  // momentum_buffer; grad_avg is scaled by √square_avg in Start
  }
  template <class Rng>
  static void Start(const Hyper& h, std::size_t /*i*/, std::int64_t first_step, double& /*p*/,
                    std::array<double, kMaxStates>& st, Rng& rng) {
    if (first_step > 1 && h.centered)
      st[kGradAvg] = rng.Uniform(-0.5, 0.5) * std::sqrt(st[kSquareAvg]);
  }

  // The standard step: centered × momentum × weight_decay, maximize with both.
  static std::vector<Hyper> StandardOptions() {
    std::vector<Hyper> out;
    for (bool centered : {false, true}) {
      for (double momentum : {0.0, 0.9}) {
        for (double wd : {0.0, 0.01}) {
          out.push_back({.lr = 0.01,
                         .weight_decay = wd,
                         .momentum = momentum,
                         .centered = centered,
                         .maximize = centered && momentum != 0.0});
        }
      }
    }
    return out;
  }

  static std::vector<Hyper> MathHypers() {
    return {{.lr = 1e-2, .weight_decay = 0.01, .momentum = 0.5, .centered = true}};
  }
  template <class Ops, class Scalars>
  static void Math(Ops o, const Hyper& /*h*/, const Scalars& c, float& p, float g, float& sq,
                   float& buf, float& ga) {
    RmspropMath<true, true, true>(o, c, p, g, sq, buf, ga);
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// torch.optim.RMSprop's constructor checks: lr, eps, weight_decay, momentum, alpha >= 0. Each with
// the parts its message must contain.
inline std::vector<std::pair<RmspropHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<RmspropHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {RmspropHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {RmspropHyper{.lr = kNaN}, {"lr", "nan"}},
      {RmspropHyper{.eps = -0.25}, {"eps", "-0.25"}},
      {RmspropHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
      {RmspropHyper{.momentum = -0.5}, {"momentum", "-0.5"}},
      {RmspropHyper{.alpha = -0.5}, {"alpha", "-0.5"}},
  };
}

// alpha above 1: torch checks only alpha >= 0.
inline std::vector<RmspropHyper> AcceptedHypers(std::type_identity<RmspropHyper> /*tag*/) {
  return {RmspropHyper{.alpha = 1.5}};
}

// Hyper-parameters under which every state slot is in use.
inline RmspropHyper AllStatesHyper(std::type_identity<RmspropHyper> /*tag*/) {
  return {.momentum = 0.5, .centered = true};
}

// torch's state_dict key of each state slot.
inline std::vector<const char*> StateKeys(std::type_identity<RmspropHyper> /*tag*/) {
  return {"square_avg", "momentum_buffer", "grad_avg"};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<RmspropHyper, int>> MissingStates(
    std::type_identity<RmspropHyper> /*tag*/) {
  return {{RmspropHyper{}, kSquareAvg},
          {RmspropHyper{.centered = true}, kGradAvg},
          {RmspropHyper{.momentum = 0.5}, kRmspropMomentumBuffer}};
}

// square_avg always, momentum_buffer with momentum, grad_avg when centered.
inline std::vector<std::pair<RmspropHyper, unsigned>> RequiredStatesCases(
    std::type_identity<RmspropHyper> /*tag*/) {
  return {{RmspropHyper{}, 0b001u},
          {RmspropHyper{.momentum = 0.5}, 0b011u},
          {RmspropHyper{.centered = true}, 0b101u},
          {RmspropHyper{.momentum = 0.5, .centered = true}, 0b111u}};
}

// The value each state slot starts from (torch: zeros).
inline std::vector<std::pair<RmspropHyper, std::vector<float>>> InitialStates(
    std::type_identity<RmspropHyper> /*tag*/) {
  return {{RmspropHyper{.momentum = 0.5, .centered = true}, {0.0f, 0.0f, 0.0f}}};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<RmspropHyper>, Options>> OptimizerCases(
    std::type_identity<RmspropHyper> /*tag*/) {
  return {
      {{{.lr = 1e-2, .alpha = 0.9, .momentum = 0.5, .centered = true},
        {.lr = 5e-3, .weight_decay = 0.01}},
       {}},
      {{{.lr = 1e-2, .centered = true}, {.lr = 5e-3, .momentum = 0.9, .maximize = true}},
       {.param_dtype = DType::kF16, .grad_dtype = DType::kF16, .state_dtype = DType::kF32}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).

}  // namespace fusedopt::ref
