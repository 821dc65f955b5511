// The double-precision oracle of RAdam (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// torch.optim.RAdam; with decoupled_weight_decay the decay is AdamW's. Steps whose SMA length rho_t
// is at most 5 take p −= lr·m̂ (v is still updated); later ones the rectified adaptive step.
inline void RadamStep(const RadamHyper& h, std::int64_t step, std::span<double> p,
                      std::span<const double> g, std::span<double> exp_avg,
                      std::span<double> exp_avg_sq) {
  const auto t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);  // bc1 = 1 − β1^t
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);  // bc2 = 1 − β2^t
  const double rho_inf = 2.0 / (1.0 - h.beta2) - 1.0;          // ρ∞ = 2 / (1 − β2) − 1
  const double rho_t =
      rho_inf - 2.0 * t * std::pow(h.beta2, t) / bias_correction2;  // ρt = ρ∞ − 2t β2^t / bc2
  const bool rectified = rho_t > 5.0;
  const double rect = rectified ? std::sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf /
                                            ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t))
                                : 0.0;  // r = √((ρt − 4)(ρt − 2)ρ∞ / ((ρ∞ − 4)(ρ∞ − 2)ρt))
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];  // g = -∇ if maximize else ∇
    if (h.weight_decay != 0.0) {
      if (h.decoupled_weight_decay) {
        p[i] *= 1.0 - h.lr * h.weight_decay;  // θ = θ (1 − γλ)
      } else {
        gi += h.weight_decay * p[i];  // g = g + λθ
      }
    }
    double& m = exp_avg[i];
    double& v = exp_avg_sq[i];
    m += (1.0 - h.beta1) * (gi - m);              // m = lerp(m, g, 1 − β1)
    v = h.beta2 * v + (1.0 - h.beta2) * gi * gi;  // v = β2 v + (1 − β2) g²
    const double m_hat = m / bias_correction1;    // m̂ = m / bc1
    if (rectified) {
      p[i] -= h.lr * m_hat * rect * std::sqrt(bias_correction2) /
              (std::sqrt(v) + h.eps);  // θ = θ − γ m̂ r √bc2 / (√v + ε)
    } else {
      p[i] -= h.lr * m_hat;  // θ = θ − γ m̂
    }
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
template <>
struct KernelCases<RadamHyper> {
  using Hyper = RadamHyper;
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    RadamStep(h, t, p, g, st[kRadamExpAvg], st[kRadamExpAvgSq]);
  }
  // decoupled_weight_decay × weight_decay {0, 0.05} × maximize. With beta2 = 0.999 steps 1-5 are
  // not rectified and later ones are: the sweep's tensors start at steps 1, 2 and 7, and its
  // 20-step cases cross step 6.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (bool decoupled : {false, true}) {
      for (double wd : {0.0, 0.05}) {
        for (bool maximize : {false, true}) {
          out.push_back({.lr = 0.01,
                         .weight_decay = wd,
                         .decoupled_weight_decay = decoupled,
                         .maximize = maximize});
        }
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
  // Zero at step 1 (as torch); later a plausible state.
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kRadamExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.01, 0.5);
  }

  // The standard step: weight_decay {0, 0.01} × decoupled_weight_decay × maximize, from step 5:
  // steps 1-5 are never rectified (rho_t <= 5 for any beta2), so steps 5, 6 and 7 take both of its
  // branches.
  static std::vector<Hyper> StandardOptions() {
    std::vector<Hyper> out;
    for (double wd : {0.0, 0.01}) {
      for (bool decoupled : {false, true}) {
        for (bool maximize : {false, true}) {
          out.push_back({.lr = 0.01,
                         .weight_decay = wd,
                         .decoupled_weight_decay = decoupled,
                         .maximize = maximize});
        }
      }
    }
    return out;
  }
  static constexpr std::int64_t kStandardFirstStep = 5;

  // Steps 4-6: step 6 is the first rectified one (rho_t > 5), so both branches run.
  static std::vector<Hyper> MathHypers() {
    return {{.lr = 1e-2, .weight_decay = 0.1, .decoupled_weight_decay = true}};
  }
  static constexpr int kMathFirstStep = 4;
  template <class Ops, class Scalars>
  static void Math(Ops o, const Hyper& /*h*/, const Scalars& c, float& p, float g, float& m,
                   float& v, float& /*s2*/) {
    if (c.rectified) {
      RadamMath<false, true>(o, c, p, g, m, v);
    } else {
      RadamMath<false, false>(o, c, p, g, m, v);
    }
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// torch.optim.RAdam's constructor checks (lr, eps, weight_decay >= 0; betas in [0, 1)). Each with
// the parts its message must contain.
inline std::vector<std::pair<RadamHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<RadamHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {RadamHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {RadamHyper{.lr = kNaN}, {"lr", "nan"}},
      {RadamHyper{.eps = -0.25}, {"eps", "-0.25"}},
      {RadamHyper{.beta1 = 1.0}, {"beta1: 1", "[0, 1)"}},
      {RadamHyper{.beta2 = 1.0}, {"beta2: 1"}},
      {RadamHyper{.beta2 = -0.5}, {"beta2", "-0.5"}},
      {RadamHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
  };
}

// The edges torch accepts: lr, eps and both betas 0.
inline std::vector<RadamHyper> AcceptedHypers(std::type_identity<RadamHyper> /*tag*/) {
  return {RadamHyper{.lr = 0.0, .beta1 = 0.0, .beta2 = 0.0, .eps = 0.0}};
}

// Hyper-parameters under which every state slot is in use.
inline RadamHyper AllStatesHyper(std::type_identity<RadamHyper> /*tag*/) {
  return {.weight_decay = 0.1};
}

// torch's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<RadamHyper> /*tag*/) {
  return {"exp_avg", "exp_avg_sq", ""};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<RadamHyper, int>> MissingStates(
    std::type_identity<RadamHyper> /*tag*/) {
  return {{RadamHyper{}, kRadamExpAvg}, {RadamHyper{}, kRadamExpAvgSq}};
}

// exp_avg and exp_avg_sq, whatever the options.
inline std::vector<std::pair<RadamHyper, unsigned>> RequiredStatesCases(
    std::type_identity<RadamHyper> /*tag*/) {
  return {{RadamHyper{}, 0b011u},
          {RadamHyper{.weight_decay = 0.1, .decoupled_weight_decay = true}, 0b011u}};
}

// The value each state slot starts from (torch: zeros).
inline std::vector<std::pair<RadamHyper, std::vector<float>>> InitialStates(
    std::type_identity<RadamHyper> /*tag*/) {
  return {{RadamHyper{}, {0.0f, 0.0f}}};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<RadamHyper>, Options>> OptimizerCases(
    std::type_identity<RadamHyper> /*tag*/) {
  return {
      {{{.lr = 1e-2, .weight_decay = 0.1},
        {.lr = 1e-3, .weight_decay = 0.1, .decoupled_weight_decay = true}},
       {}},
      {{{.lr = 1e-2, .maximize = true}, {.lr = 1e-3, .beta1 = 0.8}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).
template <>
struct TorchCase<RadamHyper> {
  static RadamHyper TestHyper() {
    return {.lr = 5e-3, .weight_decay = 0.1, .decoupled_weight_decay = true};
  }
  static constexpr const char* kTensorKeys[] = {"exp_avg", "exp_avg_sq"};
};

}  // namespace fusedopt::ref
