// The double-precision oracle of NAdam (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// torch.optim.NAdam; with decoupled_weight_decay the decay is AdamW's. μ_t = β1(1 − ½·0.96^(tψ)),
// and the product Π_{i≤t} μ_i (torch's state['mu_product']) rebuilt from the step, in double.
inline double NadamMu(const NadamHyper& h, double t) {
  return h.beta1 * (1.0 - 0.5 * std::pow(0.96, t * h.momentum_decay));  // μ_t
}
inline void NadamStep(const NadamHyper& h, std::int64_t step, std::span<double> p,
                      std::span<const double> g, std::span<double> exp_avg,
                      std::span<double> exp_avg_sq) {
  const auto t = static_cast<double>(step);
  double mu_product = 1.0;  // Π_{i≤t} μ_i
  for (std::int64_t i = 1; i <= step; ++i) mu_product *= NadamMu(h, static_cast<double>(i));
  const double mu = NadamMu(h, t);
  const double mu_next = NadamMu(h, t + 1.0);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);  // bc2 = 1 − β2^t
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
    m += (1.0 - h.beta1) * (gi - m);                               // m = lerp(m, g, 1 − β1)
    v = h.beta2 * v + (1.0 - h.beta2) * gi * gi;                   // v = β2 v + (1 − β2) g²
    const double denom = std::sqrt(v / bias_correction2) + h.eps;  // √(v / bc2) + ε
    // θ = θ − γ(1 − μ_t) g / ((1 − Π_t) d) − γ μ_{t+1} m / ((1 − Π_t μ_{t+1}) d)
    p[i] -= h.lr * (1.0 - mu) / (1.0 - mu_product) * gi / denom;
    p[i] -= h.lr * mu_next / (1.0 - mu_product * mu_next) * m / denom;
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
template <>
struct KernelCases<NadamHyper> {
  using Hyper = NadamHyper;
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    NadamStep(h, t, p, g, st[kNadamExpAvg], st[kNadamExpAvgSq]);
  }
  // decoupled_weight_decay × weight_decay {0, 0.05} × maximize, and a momentum_decay of 0 (mu
  // constant) besides torch's default.
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
    out.push_back({.lr = 0.01, .momentum_decay = 0.0});
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.maximize = !h.maximize;
    h.beta1 = 0.8;
    h.beta2 = 0.99;
    h.momentum_decay = 0.01;
    return h;
  }
  // Zero at step 1 (as torch); later a plausible state.
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kNadamExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.01, 0.5);
  }
  // mu_product before step `step`: the product of mu_1 .. mu_{step-1}, in f32 as torch keeps it.
  static void InitScalars(const Hyper& h, std::int64_t step, std::span<float, kMaxScalars> out) {
    float product = 1.0f;
    for (std::int64_t i = 1; i < step; ++i)
      product *= static_cast<float>(NadamMu(h, static_cast<double>(i)));
    out[kNadamMuProduct] = product;
  }

  // The standard step: weight_decay {0, 0.01} × decoupled_weight_decay × maximize, and a
  // momentum_decay of 0.
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
    out.push_back({.lr = 0.01, .momentum_decay = 0.0});
    return out;
  }

  // Coupled and decoupled weight decay.
  static std::vector<Hyper> MathHypers() {
    return {{.lr = 1e-2, .weight_decay = 0.1, .decoupled_weight_decay = false},
            {.lr = 1e-2, .weight_decay = 0.1, .decoupled_weight_decay = true}};
  }
  template <class Ops, class Scalars>
  static void Math(Ops o, const Hyper& h, const Scalars& c, float& p, float g, float& m, float& v,
                   float& /*s2*/) {
    if (h.decoupled_weight_decay) {
      NadamMath<false>(o, c, p, g, m, v);
    } else {
      NadamMath<true>(o, c, p, g, m, v);
    }
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// torch.optim.NAdam's constructor checks (lr, eps, weight_decay, momentum_decay >= 0; betas in
// [0, 1)). Each with the parts its message must contain.
inline std::vector<std::pair<NadamHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<NadamHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {NadamHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {NadamHyper{.lr = kNaN}, {"lr", "nan"}},
      {NadamHyper{.eps = -0.25}, {"eps", "-0.25"}},
      {NadamHyper{.beta1 = 1.0}, {"beta1: 1", "[0, 1)"}},
      {NadamHyper{.beta2 = 1.0}, {"beta2: 1"}},
      {NadamHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
      {NadamHyper{.momentum_decay = -0.004}, {"momentum_decay", "-0.004"}},
      {NadamHyper{.momentum_decay = kNaN}, {"momentum_decay", "nan"}},
      {NadamHyper{.momentum_decay = -1.0}, {"momentum_decay"}},
  };
}

// The edges torch accepts: lr and momentum_decay 0.
inline std::vector<NadamHyper> AcceptedHypers(std::type_identity<NadamHyper> /*tag*/) {
  return {NadamHyper{.lr = 0.0, .momentum_decay = 0.0}};
}

// Hyper-parameters under which every state slot is in use.
inline NadamHyper AllStatesHyper(std::type_identity<NadamHyper> /*tag*/) {
  return {.weight_decay = 0.1};
}

// torch's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<NadamHyper> /*tag*/) {
  return {"exp_avg", "exp_avg_sq", ""};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<NadamHyper, int>> MissingStates(
    std::type_identity<NadamHyper> /*tag*/) {
  return {{NadamHyper{}, kNadamExpAvg}, {NadamHyper{}, kNadamExpAvgSq}};
}

// exp_avg and exp_avg_sq, whatever the options.
inline std::vector<std::pair<NadamHyper, unsigned>> RequiredStatesCases(
    std::type_identity<NadamHyper> /*tag*/) {
  return {{NadamHyper{}, 0b011u},
          {NadamHyper{.weight_decay = 0.1, .decoupled_weight_decay = true}, 0b011u}};
}

// The value each state slot starts from (torch: zeros).
inline std::vector<std::pair<NadamHyper, std::vector<float>>> InitialStates(
    std::type_identity<NadamHyper> /*tag*/) {
  return {{NadamHyper{}, {0.0f, 0.0f}}};
}

// The per-tensor scalar state: torch's state_dict key of each Segment::scalars entry.
inline std::vector<const char*> ScalarStateKeys(std::type_identity<NadamHyper> /*tag*/) {
  return {"mu_product"};
}

// Hyper-parameters the scalar-state tests step with (a large momentum_decay, so that mu_t moves).
inline std::vector<NadamHyper> ScalarStateHypers(std::type_identity<NadamHyper> /*tag*/) {
  return {NadamHyper{.momentum_decay = 0.01}, NadamHyper{.lr = 1e-2, .momentum_decay = 0.02}};
}

// torch: state['mu_product'] = torch.ones((), dtype=float32).
inline std::vector<float> InitialScalars(const NadamHyper& /*h*/) { return {1.0f}; }

// What step t leaves: mu_product = f32(mu_product · f32(mu_t)), mu_t = β1(1 − ½·0.96^(t·ψ)).
inline std::vector<float> ScalarsAfter(const NadamHyper& h, std::int64_t step,
                                       const std::vector<float>& old) {
  const auto t = static_cast<double>(step);
  const auto mu = static_cast<float>(h.beta1 * (1.0 - 0.5 * std::pow(0.96, t * h.momentum_decay)));
  return {old[0] * mu};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<NadamHyper>, Options>> OptimizerCases(
    std::type_identity<NadamHyper> /*tag*/) {
  return {
      {{{.lr = 1e-2, .momentum_decay = 0.02},
        {.lr = 2e-3, .weight_decay = 0.1, .decoupled_weight_decay = true}},
       {}},
      {{{.lr = 1e-2, .weight_decay = 0.1}, {.lr = 2e-3, .maximize = true}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).
template <>
struct TorchCase<NadamHyper> {
  static NadamHyper TestHyper() {
    return {.lr = 5e-3, .weight_decay = 0.1, .momentum_decay = 5e-3};
  }
  static constexpr const char* kTensorKeys[] = {"exp_avg", "exp_avg_sq"};
  // mu_product after one step: 1·μ_1, μ_t = β1(1 − ½·0.96^(tψ)) (torch's), in (0, β1).
  template <class F>
  static void ForEachScalar(F&& f) {
    const NadamHyper h = TestHyper();
    const double mu = h.beta1 * (1.0 - 0.5 * std::pow(0.96, h.momentum_decay));
    f("mu_product", mu, 1e-6 * mu);
  }
};

}  // namespace fusedopt::ref
