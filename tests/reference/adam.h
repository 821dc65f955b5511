// The double-precision oracle of Adam and AdamW (tests/reference/common.h says what the oracle is)
// and the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// torch.optim.Adam; with decoupled_weight_decay, torch.optim.AdamW. `max_exp_avg_sq` is used with
// amsgrad.
inline void AdamStep(const AdamHyper& h, std::int64_t step, std::span<double> p,
                     std::span<const double> g, std::span<double> exp_avg,
                     std::span<double> exp_avg_sq, std::span<double> max_exp_avg_sq) {
  const auto t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);        // bc1 = 1 − β1^t
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);        // bc2 = 1 − β2^t
  const double step_size = h.lr / bias_correction1;                  // γ / bc1
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);  // √bc2
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];  // g = -∇ if maximize else ∇
    if (h.decoupled_weight_decay) {
      p[i] *= 1.0 - h.lr * h.weight_decay;  // AdamW: θ = θ (1 − γλ)
    } else if (h.weight_decay != 0.0) {
      gi += h.weight_decay * p[i];  // Adam: g = g + λθ
    }
    double& m = exp_avg[i];
    double& v = exp_avg_sq[i];
    m += (1.0 - h.beta1) * (gi - m);  // m = lerp(m, g, 1 − β1) = β1 m + (1 − β1) g
    v = h.beta2 * v + (1.0 - h.beta2) * gi * gi;  // v = β2 v + (1 − β2) g²
    double second = v;                            // v, or with amsgrad:
    if (h.amsgrad) {
      max_exp_avg_sq[i] =
          MaximumPropagatingNaN(max_exp_avg_sq[i], v);  // v_max = max(v_max, v) (raw v)
      second = max_exp_avg_sq[i];
    }
    const double denom =
        std::sqrt(second) / bias_correction2_sqrt + h.eps;  // denom = √v / √bc2 + ε
    p[i] -= step_size * m / denom;                          // θ = θ − (γ / bc1) m / denom
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
// Adam and AdamW: AdamW's Hyper meets the oracle as an AdamHyper with decoupled_weight_decay.
template <class H, bool kDecoupled>
struct AdamKernelCases {
  using Hyper = H;
  // Written out here rather than with AdamWHyper::ToAdam, so that the conversion is tested too.
  static AdamHyper AsAdam(const Hyper& h) {
    return {.lr = h.lr,
            .beta1 = h.beta1,
            .beta2 = h.beta2,
            .eps = h.eps,
            .weight_decay = h.weight_decay,
            .amsgrad = h.amsgrad,
            .maximize = h.maximize,
            .decoupled_weight_decay = kDecoupled};
  }
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    AdamStep(AsAdam(h), t, p, g, st[kExpAvg], st[kExpAvgSq], st[kMaxExpAvgSq]);
  }
  // amsgrad × weight_decay {0, 0.05} × maximize. The standard step runs the same.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (bool amsgrad : {false, true}) {
      for (double wd : {0.0, 0.05}) {
        for (bool maximize : {false, true}) {
          Hyper h;
          h.lr = 0.01;
          h.weight_decay = wd;
          h.amsgrad = amsgrad;
          h.maximize = maximize;
          out.push_back(h);
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
    return h;
  }
  // Zero at step 1 (as torch); later a plausible state with max_exp_avg_sq ≥ exp_avg_sq (Start).
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.01, 0.5);  // exp_avg_sq; max_exp_avg_sq is raised to it in Start
  }
  template <class Rng>
  static void Start(const Hyper& h, std::size_t /*i*/, std::int64_t first_step, double& /*p*/,
                    std::array<double, kMaxStates>& st, Rng& rng) {
    if (first_step > 1 && h.amsgrad) st[kMaxExpAvgSq] = st[kExpAvgSq] + rng.Uniform(0.0, 0.2);
  }
};
template <>
struct KernelCases<AdamHyper> : AdamKernelCases<AdamHyper, false> {};
template <>
struct KernelCases<AdamWHyper> : AdamKernelCases<AdamWHyper, true> {
  static std::vector<Hyper> MathHypers() {
    return {{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true}};
  }
  template <class Ops, class Scalars>
  static void Math(Ops o, const Hyper& /*h*/, const Scalars& c, float& p, float g, float& m,
                   float& v, float& v_max) {
    AdamMath<false, true>(o, c, p, g, m, v, v_max);
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// torch.optim.Adam's constructor checks: lr, eps, weight_decay >= 0, betas in [0, 1). Each with
// the parts its message must contain.
inline std::vector<std::pair<AdamHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<AdamHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {AdamHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {AdamHyper{.lr = kNaN}, {"lr", "nan"}},
      {AdamHyper{.eps = -0.25}, {"eps", "-0.25"}},
      {AdamHyper{.beta1 = 1.0}, {"beta1: 1"}},
      {AdamHyper{.beta2 = 1.0}, {"beta2: 1"}},
      {AdamHyper{.beta2 = -0.1}, {"beta2", "-0.1"}},
      {AdamHyper{.beta1 = -0.1}, {"beta1", "-0.1"}},
      {AdamHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
  };
}

// lr 0 (a schedule may reach it).
inline std::vector<AdamHyper> AcceptedHypers(std::type_identity<AdamHyper> /*tag*/) {
  return {AdamHyper{.lr = 0.0}};
}

// Hyper-parameters under which every state slot is in use.
inline AdamHyper AllStatesHyper(std::type_identity<AdamHyper> /*tag*/) { return {.amsgrad = true}; }

// torch's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<AdamHyper> /*tag*/) {
  return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<AdamHyper, int>> MissingStates(std::type_identity<AdamHyper> /*tag*/) {
  return {
      {AdamHyper{}, kExpAvg}, {AdamHyper{}, kExpAvgSq}, {AdamHyper{.amsgrad = true}, kMaxExpAvgSq}};
}

// max_exp_avg_sq only with amsgrad.
inline std::vector<std::pair<AdamHyper, unsigned>> RequiredStatesCases(
    std::type_identity<AdamHyper> /*tag*/) {
  return {{AdamHyper{}, 0b011u},
          {AdamHyper{.amsgrad = true}, 0b111u},
          {AdamHyper{.decoupled_weight_decay = true}, 0b011u}};
}

// The value each state slot starts from (torch: zeros).
inline std::vector<std::pair<AdamHyper, std::vector<float>>> InitialStates(
    std::type_identity<AdamHyper> /*tag*/) {
  return {{AdamHyper{.amsgrad = true}, {0.0f, 0.0f, 0.0f}}};
}

// AdamW: torch.optim.AdamW's checks, as Adam's.
inline std::vector<std::pair<AdamWHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<AdamWHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {AdamWHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {AdamWHyper{.lr = kNaN}, {"lr", "nan"}},
      {AdamWHyper{.eps = -0.25}, {"eps", "-0.25"}},
      {AdamWHyper{.beta1 = 1.0}, {"beta1: 1"}},
      {AdamWHyper{.beta2 = -0.1}, {"beta2", "-0.1"}},
      {AdamWHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
  };
}

// lr and weight_decay 0.
inline std::vector<AdamWHyper> AcceptedHypers(std::type_identity<AdamWHyper> /*tag*/) {
  return {AdamWHyper{.lr = 0.0, .weight_decay = 0.0}};
}

// Hyper-parameters under which every state slot is in use.
inline AdamWHyper AllStatesHyper(std::type_identity<AdamWHyper> /*tag*/) {
  return {.amsgrad = true};
}

inline std::vector<const char*> StateKeys(std::type_identity<AdamWHyper> /*tag*/) {
  return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
}

inline std::vector<std::pair<AdamWHyper, int>> MissingStates(
    std::type_identity<AdamWHyper> /*tag*/) {
  return {{AdamWHyper{}, kExpAvg},
          {AdamWHyper{}, kExpAvgSq},
          {AdamWHyper{.amsgrad = true}, kMaxExpAvgSq}};
}

inline std::vector<std::pair<AdamWHyper, unsigned>> RequiredStatesCases(
    std::type_identity<AdamWHyper> /*tag*/) {
  return {{AdamWHyper{}, 0b011u}, {AdamWHyper{.amsgrad = true}, 0b111u}};
}

inline std::vector<std::pair<AdamWHyper, std::vector<float>>> InitialStates(
    std::type_identity<AdamWHyper> /*tag*/) {
  return {{AdamWHyper{.amsgrad = true}, {0.0f, 0.0f, 0.0f}}};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<AdamHyper>, Options>> OptimizerCases(
    std::type_identity<AdamHyper> /*tag*/) {
  return {
      {{{.lr = 1e-2, .amsgrad = true},
        {.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .weight_decay = 0.1}},
       {}},
      {{{.lr = 1e-2, .weight_decay = 0.1, .decoupled_weight_decay = true},
        {.lr = 1e-3, .maximize = true}},
       {.param_dtype = DType::kF16, .grad_dtype = DType::kF32, .state_dtype = DType::kF16}},
  };
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<AdamWHyper>, Options>> OptimizerCases(
    std::type_identity<AdamWHyper> /*tag*/) {
  return {
      {{{.lr = 1e-2, .weight_decay = 0.05}, {.lr = 2e-3, .amsgrad = true}}, {}},
      {{{.lr = 1e-2, .weight_decay = 0.05}, {.lr = 2e-3, .amsgrad = true, .maximize = true}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).

}  // namespace fusedopt::ref
