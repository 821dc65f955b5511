// The double-precision oracle of LAMB (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// LAMB as apex FusedLAMB computes it, per tensor; `g` is the gradient already clipped (apex's
// global max_grad_norm clipping is the caller's). Two passes: the Adam update u of every element,
// then p −= ratio·u with the trust ratio of the whole tensor.
inline void LambStep(const LambHyper& h, std::int64_t step, std::span<double> p,
                     std::span<const double> g, std::span<double> exp_avg,
                     std::span<double> exp_avg_sq) {
  const auto t = static_cast<double>(step);
  const double bias_correction1 =
      h.bias_correction ? 1.0 - std::pow(h.beta1, t) : 1.0;  // bc1 = 1 − β1^t (or 1)
  const double bias_correction2 =
      h.bias_correction ? 1.0 - std::pow(h.beta2, t) : 1.0;     // bc2 = 1 − β2^t (or 1)
  const double beta3 = h.grad_averaging ? 1.0 - h.beta1 : 1.0;  // β3 = 1 − β1 (or 1)
  const bool decay = h.weight_decay != 0.0;
  std::vector<double> u(p.size());
  double param_sq = 0.0;
  double update_sq = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = g[i];
    if (!h.adam_w_mode && decay) gi += h.weight_decay * p[i];  // L2 mode: g = g + λθ
    double& m = exp_avg[i];
    double& v = exp_avg_sq[i];
    m = h.beta1 * m + beta3 * gi;                 // m = β1 m + β3 g
    v = h.beta2 * v + (1.0 - h.beta2) * gi * gi;  // v = β2 v + (1 − β2) g²
    u[i] = (m / bias_correction1) /
           (std::sqrt(v / bias_correction2) + h.eps);  // u = (m / bc1) / (√(v / bc2) + ε)
    if (h.adam_w_mode && decay) u[i] += h.weight_decay * p[i];  // AdamW mode: u = u + λθ
    param_sq += p[i] * p[i];                                    // ‖θ‖² (θ before the update)
    update_sq += u[i] * u[i];                                   // ‖u‖²
  }
  const double param_norm = std::sqrt(param_sq);
  const double update_norm = std::sqrt(update_sq);
  // ratio = γ ‖θ‖ / ‖u‖ where (nvlamb or λ ≠ 0) and both norms are non-zero, else γ
  const double ratio = (h.use_nvlamb || decay) && param_norm != 0.0 && update_norm != 0.0
                           ? h.lr * (param_norm / update_norm)
                           : h.lr;
  for (std::size_t i = 0; i < p.size(); ++i) p[i] -= ratio * u[i];  // θ = θ − ratio u
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
// LAMB moves a one-element tensor by lr·|θ|·sign(u) (the trust ratio is lr·|θ|/|u|), so there a u
// that cancels to near 0 (m = β1·m + β3·g with m against g, or u + λθ against u) may take another
// sign in f32 than in double, as Lion's c. The kernel sweep's inputs therefore give element i's
// gradients the sign ElementSign(i) on every step, and its momentum and param that sign at the
// start: m never cancels, and u + λθ adds terms of one sign until θ crosses 0, which a one-element
// θ never does (it shrinks by lr·|θ|). In longer tensors a near-zero u costs only its own tiny
// share of the update.
template <>
struct KernelCases<LambHyper> {
  using Hyper = LambHyper;
  // The oracle computes its own ‖θ‖ and ‖u‖ of the whole tensor in double.
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    LambStep(h, t, p, g, st[kLambExpAvg], st[kLambExpAvgSq]);
  }
  // Weight decay {0.02, 0, 0 with use_nvlamb} × adam_w_mode, each with two of the four
  // (bias_correction, grad_averaging) pairs, so that every pair meets both modes and all three
  // decays. The first has FusedLAMB's default modes; first and last have a trust ratio.
  static std::vector<Hyper> Options() {
    struct Row {
      double wd;
      bool nvlamb, adam_w_mode, bias_correction, grad_averaging;
    };
    constexpr Row kRows[] = {
        {0.02, false, true, true, true},   {0.02, false, true, false, false},
        {0.0, false, true, true, false},   {0.0, false, true, false, true},
        {0.0, true, true, true, true},     {0.0, true, true, false, false},
        {0.0, false, false, true, true},   {0.0, false, false, false, false},
        {0.0, true, false, true, false},   {0.0, true, false, false, true},
        {0.02, false, false, true, false}, {0.02, false, false, false, true},
    };
    std::vector<Hyper> out;
    for (const Row& r : kRows) {
      out.push_back({.lr = 0.01,
                     .weight_decay = r.wd,
                     .bias_correction = r.bias_correction,
                     .adam_w_mode = r.adam_w_mode,
                     .grad_averaging = r.grad_averaging,
                     .use_nvlamb = r.nvlamb});
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.05 : 0.0;
    h.use_nvlamb = !h.use_nvlamb;
    h.beta1 = 0.8;
    return h;
  }
  // Zero at step 1 (as apex); later a plausible state.
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kLambExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.01, 0.5);
  }
  // The element's sign on its param and momentum.
  template <class Rng>
  static void Start(const Hyper& /*h*/, std::size_t i, std::int64_t /*first_step*/, double& p,
                    std::array<double, kMaxStates>& st, Rng& /*rng*/) {
    p = ElementSign(i) * std::abs(p);
    st[kLambExpAvg] = ElementSign(i) * std::abs(st[kLambExpAvg]);
  }
  // ... and on its gradients.
  template <class Kind, class Rng, class Default>
  static double Grad(Kind /*kind*/, std::size_t i, Rng& /*rng*/, Default default_grad) {
    return ElementSign(i) * std::abs(default_grad());
  }
  // Targets of one class agree bit for bit: the per-tensor norms are reduced in a fixed order of 16
  // accumulators, never per lane. Every target does where every MulAdd is exact: β1 = β2 = 0, no
  // grad averaging or bias correction, eps 0, no weight decay, use_nvlamb, and 16-bit gradients (g²
  // exact in f32) give m = g, v = g², u = ±1 exactly, so p ∓ ratio rounds once on every target and
  // the result checks ‖θ‖ and the trust ratio across vector widths.
  static std::vector<AcrossTargets<Hyper>> TargetRuns() {
    const std::vector<Hyper> options = Options();
    std::vector<std::vector<Hyper>> per_class;
    for (const Hyper& h : {options.front(), options.back()})
      per_class.push_back({h, OtherGroup(h)});
    const Hyper exact{.lr = 0.01,
                      .beta1 = 0.0,
                      .beta2 = 0.0,
                      .eps = 0.0,
                      .weight_decay = 0.0,
                      .bias_correction = false,
                      .grad_averaging = false,
                      .use_nvlamb = true};
    Hyper exact_other = exact;
    exact_other.lr = 0.03;
    return {{.group_sets = per_class},
            {.group_sets = {{exact, exact_other}},
             .combos = {{DType::kF32, DType::kBF16, DType::kF32},
                        {DType::kBF16, DType::kBF16, DType::kBF16},
                        {DType::kF16, DType::kF16, DType::kF32, true}},
             .all_targets_agree = true}};
  }

  // The standard step: every combination of weight decay, adam_w_mode, bias_correction and
  // grad_averaging, one with use_nvlamb.
  static std::vector<Hyper> StandardOptions() {
    std::vector<Hyper> out;
    for (int mode = 0; mode < 16; ++mode) {
      Hyper h;
      h.weight_decay = (mode & 1) != 0 ? 0.0 : 0.01;
      h.adam_w_mode = (mode & 2) == 0;
      h.bias_correction = (mode & 4) == 0;
      h.grad_averaging = (mode & 8) == 0;
      h.use_nvlamb = mode == 1;
      out.push_back(h);
    }
    return out;
  }
  // The standard step clips the gradients by their global norm first (tools/lamb_reference.py):
  // the oracle's, in double.
  template <class Standard>
  static void StandardClip(const Hyper& /*h*/, const Standard& o,
                           std::vector<std::vector<double>>& grads) {
    double total = 0.0;
    for (const auto& gi : grads)
      for (const double x : gi) total += x * x;
    const double norm = std::sqrt(total);
    if (norm > o.max_grad_norm) {
      for (auto& gi : grads)
        for (double& x : gi) x *= o.max_grad_norm / norm;
    }
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// lr >= 0, eps >= 0, betas in [0, 1), weight_decay >= 0 (tools/lamb_reference.py's checks). Each
// with the parts its message must contain.
inline std::vector<std::pair<LambHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<LambHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {LambHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {LambHyper{.lr = kNaN}, {"lr", "nan"}},
      {LambHyper{.eps = -0.25}, {"eps", "-0.25"}},
      {LambHyper{.eps = kNaN}, {"eps", "nan"}},
      {LambHyper{.beta1 = 1.0}, {"beta1: 1", "[0, 1)"}},
      {LambHyper{.beta1 = -0.1}, {"beta1", "-0.1"}},
      {LambHyper{.beta2 = 1.0}, {"beta2: 1", "[0, 1)"}},
      {LambHyper{.beta2 = -0.1}, {"beta2", "-0.1"}},
      {LambHyper{.beta2 = kNaN}, {"beta2", "nan"}},
      {LambHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
      {LambHyper{.weight_decay = kNaN}, {"weight_decay", "nan"}},
  };
}

inline std::vector<LambHyper> AcceptedHypers(std::type_identity<LambHyper> /*tag*/) {
  return {LambHyper{.lr = 0.0}, LambHyper{.beta1 = 0.0, .beta2 = 0.0}, LambHyper{.eps = 0.0},
          LambHyper{.weight_decay = 0.0}, LambHyper{.weight_decay = 0.0, .use_nvlamb = true}};
}

// Hyper-parameters under which every state slot is in use.
inline LambHyper AllStatesHyper(std::type_identity<LambHyper> /*tag*/) { return {}; }

// torch's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<LambHyper> /*tag*/) {
  return {"exp_avg", "exp_avg_sq", ""};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<LambHyper, int>> MissingStates(std::type_identity<LambHyper> /*tag*/) {
  return {{LambHyper{}, kLambExpAvg}, {LambHyper{}, kLambExpAvgSq}};
}

// exp_avg and exp_avg_sq, whatever the options.
inline std::vector<std::pair<LambHyper, unsigned>> RequiredStatesCases(
    std::type_identity<LambHyper> /*tag*/) {
  return {{LambHyper{}, 0b011u},
          {LambHyper{.weight_decay = 0.0}, 0b011u},
          {LambHyper{.bias_correction = false,
                     .adam_w_mode = false,
                     .grad_averaging = false,
                     .use_nvlamb = true},
           0b011u}};
}

// The value each state slot starts from (apex: zeros).
inline std::vector<std::pair<LambHyper, std::vector<float>>> InitialStates(
    std::type_identity<LambHyper> /*tag*/) {
  return {{LambHyper{}, {0.0f, 0.0f}}};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<LambHyper>, Options>> OptimizerCases(
    std::type_identity<LambHyper> /*tag*/) {
  return {
      {{{.lr = 1e-2}, {.lr = 3e-3, .weight_decay = 0.0, .use_nvlamb = true}}, {}},
      {{{.lr = 1e-2, .bias_correction = false},
        {.lr = 3e-3, .adam_w_mode = false, .grad_averaging = false}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).
template <>
struct TorchCase<LambHyper> {
  static LambHyper TestHyper() {
    return {.lr = 1e-2, .beta1 = 0.85, .beta2 = 0.99, .weight_decay = 0.05};
  }
  static constexpr const char* kTensorKeys[] = {"exp_avg", "exp_avg_sq"};
  // The constructor's words, as apex FusedLAMB's checks.
  static constexpr const char* kLrError = "Invalid learning rate: ";
  static constexpr const char* kWeightDecayError = "Invalid weight_decay value: ";
};

}  // namespace fusedopt::ref
