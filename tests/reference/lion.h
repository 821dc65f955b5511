// The double-precision oracle of Lion (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// Lion as lion-pytorch computes it (lion-pytorch has no step counter). weight_decay is the factor
// of lr (hyper.h: the decoupled_weight_decay division by the constructor's lr is the caller's).
inline void LionStep(const LionHyper& h, std::span<double> p, std::span<const double> g,
                     std::span<double> exp_avg) {
  // sign(c) as torch.sgn: +1, −1, or 0 for ±0 and NaN (neither comparison holds).
  const auto sign = [](double c) { return c > 0.0 ? 1.0 : (c < 0.0 ? -1.0 : 0.0); };
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double gi = h.maximize ? -g[i] : g[i];  // g = -∇ if maximize else ∇
    double& m = exp_avg[i];
    p[i] *= 1.0 - h.lr * h.weight_decay;                  // θ = θ (1 − γλ) (also when λ = 0)
    const double c = h.beta1 * m + (1.0 - h.beta1) * gi;  // c = β1 m + (1 − β1) g
    p[i] -= h.lr * sign(c);                               // θ = θ − γ sign(c)
    m = h.beta2 * m + (1.0 - h.beta2) * gi;               // m = β2 m + (1 − β2) g
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
// Lion's update is ±lr·sign(c), c = β1·m + (1 − β1)·g: where |c| is tiny next to its terms, f32
// and the double oracle may disagree on the sign, and the param then differs by 2·lr. The kernel
// sweep's inputs therefore keep c far from 0: element i has the sign s_i = ElementSign(i) and a
// class k_i (LionElementClass), the same on every step, so its gradients never change sign and its
// momentum does not cross 0 within a case (20 steps, β1 >= 0.8, β2 = 0.99):
//   k = 0: g = s·[0.2, 1],  m = s'·[0, 0.5]: c has the sign of g, |c| < 1;
//   k = 1: g = s·[50, 100], m = s'·[0, 0.5]: c has the sign of g, |c| >= 5;
//   k = 2: g = s·[0.2, 1],  m = −s'·[3, 6]:  c has the sign of m, against g; |c| ~ 1.6 to 5.4;
// s' = s, or −s with maximize. Fresh tensors start from m = 0, so there k = 2 acts as k = 0. A sign
// that is right only for |c| in [2, 4), as DeepSpeed's AVX Lion computes it (its mask keeps the
// exponent bits of −1), fails on classes 0 and 1; sign(g) or sign(m) alone fails on class 2 or on
// fresh tensors.
inline int LionElementClass(std::size_t i) {
  return static_cast<int>(((static_cast<std::uint64_t>(i) * 0xC2B2AE3D27D4EB4Full) >> 33) % 3u);
}

template <>
struct KernelCases<LionHyper> {
  using Hyper = LionHyper;
  static void Ref(const Hyper& h, std::int64_t /*t*/, std::span<double> p,
                  std::span<const double> g, const StateSpans& st) {
    LionStep(h, p, g, st[kLionExpAvg]);
  }
  // weight_decay {0, 0.5} × maximize.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double wd : {0.0, 0.5}) {
      for (bool maximize : {false, true}) {
        out.push_back({.lr = 0.01, .weight_decay = wd, .maximize = maximize});
      }
    }
    return out;
  }
  // β2 stays 0.99: the class-2 momentum must not decay through 0 within 20 steps.
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.2 : 0.0;
    h.maximize = !h.maximize;
    h.beta1 = 0.8;
    return h;
  }
  // Zero at step 1 (as lion-pytorch); later the magnitude u in [0, 1) of the class's momentum, to
  // which Start gives its sign.
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int /*slot*/, std::int64_t step, Rng& rng) {
    return step == 1 ? 0.0 : rng.Uniform(0.0, 1.0);
  }
  template <class Rng>
  static void Start(const Hyper& h, std::size_t i, std::int64_t first_step, double& /*p*/,
                    std::array<double, kMaxStates>& st, Rng& /*rng*/) {
    if (first_step == 1) return;
    const double s = ElementSign(i) * (h.maximize ? -1.0 : 1.0);
    const double u = st[kLionExpAvg];
    st[kLionExpAvg] = LionElementClass(i) == 2 ? -s * (3.0 + 3.0 * u) : s * 0.5 * u;
  }
  // Element i's gradient: the sign s_i on every step and, for random gradients, the class's
  // magnitude.
  template <class Kind, class Rng, class Default>
  static double Grad(Kind kind, std::size_t i, Rng& rng, Default /*default_grad*/) {
    const double s = ElementSign(i);
    switch (kind) {
      case Kind::kRandom:
      case Kind::kNonFinite:
        return s * (LionElementClass(i) == 1 ? rng.Uniform(50.0, 100.0) : rng.Uniform(0.2, 1.0));
      case Kind::kZero:
        return 0.0;
      case Kind::kHuge:
        return s * rng.Uniform(0.5, 1.0) * 1e4;
      case Kind::kTiny:
        return s * rng.Uniform(0.1, 1.0) * 1e-12;
    }
    return 0.0;
  }
  // Targets of one class agree bit for bit; every target does where every MulAdd is exact: with
  // β1 = β2 = 0.5, c and m are fma(0.5, g, 0.5·m), whose product is exact.
  static std::vector<AcrossTargets<Hyper>> TargetRuns() {
    const std::vector<Hyper> options = Options();
    std::vector<std::vector<Hyper>> per_class;
    for (const Hyper& h : {options.front(), options.back()})
      per_class.push_back({h, OtherGroup(h)});
    const Hyper exact{.lr = 0.01, .beta1 = 0.5, .beta2 = 0.5, .weight_decay = 0.5};
    const Hyper exact_other{
        .lr = 0.025, .beta1 = 0.5, .beta2 = 0.5, .weight_decay = 0.0, .maximize = true};
    return {{.group_sets = per_class},
            {.group_sets = {{exact, exact_other}}, .all_targets_agree = true}};
  }

  // The standard step: weight_decay {0, 0.1} × maximize.
  static std::vector<Hyper> StandardOptions() {
    std::vector<Hyper> out;
    for (double wd : {0.0, 0.1}) {
      for (bool maximize : {false, true}) out.push_back({.weight_decay = wd, .maximize = maximize});
    }
    return out;
  }

  static std::vector<Hyper> MathHypers() { return {{.lr = 1e-3, .weight_decay = 0.1}}; }
  template <class Ops, class Scalars>
  static void Math(Ops o, const Hyper& /*h*/, const Scalars& c, float& p, float g, float& m,
                   float& /*s1*/, float& /*s2*/) {
    LionMath(o, c, p, g, m);
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// lr >= 0 (lion-pytorch asserts lr > 0 in its constructor only), betas in [0, 1] (1 allowed, as
// lion-pytorch's assert), a finite weight_decay (lion-pytorch does not check it; a non-finite one
// would poison every param). Each with the parts its message must contain.
inline std::vector<std::pair<LionHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<LionHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  return {
      {LionHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {LionHyper{.lr = kNaN}, {"lr", "nan"}},
      {LionHyper{.beta1 = -0.1}, {"beta1", "-0.1", "[0, 1]"}},
      {LionHyper{.beta1 = 1.5}, {"beta1", "1.5", "[0, 1]"}},
      {LionHyper{.beta1 = kNaN}, {"beta1", "nan"}},
      {LionHyper{.beta2 = -0.25}, {"beta2", "-0.25"}},
      {LionHyper{.beta2 = 1.25}, {"beta2", "1.25"}},
      {LionHyper{.weight_decay = kInf}, {"weight_decay", "inf"}},
      {LionHyper{.weight_decay = -kInf}, {"weight_decay", "-inf"}},
      {LionHyper{.weight_decay = kNaN}, {"weight_decay", "nan"}},
  };
}

// The edges lion-pytorch accepts: lr 0 (a schedule may reach it), betas 0 and 1, and a negative
// (finite) weight_decay, which it does not check either.
inline std::vector<LionHyper> AcceptedHypers(std::type_identity<LionHyper> /*tag*/) {
  return {LionHyper{.lr = 0.0}, LionHyper{.beta1 = 1.0, .beta2 = 1.0},
          LionHyper{.beta1 = 0.0, .beta2 = 0.0}, LionHyper{.weight_decay = -0.5}};
}

// Hyper-parameters under which every state slot is in use.
inline LionHyper AllStatesHyper(std::type_identity<LionHyper> /*tag*/) { return {}; }

// torch's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<LionHyper> /*tag*/) {
  return {"exp_avg", "", ""};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<LionHyper, int>> MissingStates(std::type_identity<LionHyper> /*tag*/) {
  return {{LionHyper{}, kLionExpAvg}};
}

// exp_avg only, whatever the options.
inline std::vector<std::pair<LionHyper, unsigned>> RequiredStatesCases(
    std::type_identity<LionHyper> /*tag*/) {
  return {{LionHyper{}, 0b001u}, {LionHyper{.weight_decay = 0.1, .maximize = true}, 0b001u}};
}

// The value each state slot starts from (lion-pytorch: zeros).
inline std::vector<std::pair<LionHyper, std::vector<float>>> InitialStates(
    std::type_identity<LionHyper> /*tag*/) {
  return {{LionHyper{}, {0.0f}}};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<LionHyper>, Options>> OptimizerCases(
    std::type_identity<LionHyper> /*tag*/) {
  return {
      {{{.lr = 1e-3, .weight_decay = 0.1}, {.lr = 3e-4, .beta1 = 0.95, .maximize = true}}, {}},
      {{{.lr = 1e-3, .beta2 = 0.9}, {.lr = 3e-4, .weight_decay = 0.5}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).
template <>
struct TorchCase<LionHyper> {
  static LionHyper TestHyper() {
    return {.lr = 1e-3, .beta1 = 0.95, .beta2 = 0.98, .weight_decay = 0.1};
  }
  static constexpr const char* kTensorKeys[] = {"exp_avg"};
  // The constructor's words, as fusedopt.FusedLion's (lion-pytorch asserts lr > 0).
  static constexpr const char* kLrError = "Invalid learning rate: ";
  static constexpr const char* kWeightDecayError = "Invalid weight_decay value: ";
};

}  // namespace fusedopt::ref
