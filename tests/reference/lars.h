// The double-precision oracle of LARS (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// LARS as apex LARC computes it around torch.optim.SGD (weight decay 0 inside): per tensor the
// local rate tc·‖θ‖ / (‖g‖ + λ‖θ‖ + ε), in clip mode min(rate / γ, 1); where both norms are
// non-zero d = (g + λθ)·rate, else d = g (no decay). Then SGD's momentum step on d.
// `momentum_buffer` is used when momentum != 0; at step 1 it is (re)started.
inline void LarsStep(const LarsHyper& h, std::int64_t step, std::span<double> p,
                     std::span<const double> g, std::span<double> momentum_buffer) {
  double param_sq = 0.0;
  double grad_sq = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    param_sq += p[i] * p[i];  // ‖θ‖²
    grad_sq += g[i] * g[i];   // ‖g‖²
  }
  const double param_norm = std::sqrt(param_sq);
  const double grad_norm = std::sqrt(grad_sq);
  const bool trust = param_norm != 0.0 && grad_norm != 0.0;
  // rate = tc‖θ‖ / (‖g‖ + λ‖θ‖ + ε); clip: rate = min(rate / γ, 1), NaN kept (Python's min)
  double rate =
      h.trust_coefficient * param_norm / (grad_norm + param_norm * h.weight_decay + h.eps);
  if (h.clip) rate = 1.0 < rate / h.lr ? 1.0 : rate / h.lr;
  for (std::size_t i = 0; i < p.size(); ++i) {
    double d = g[i];
    if (trust) d = (d + h.weight_decay * p[i]) * rate;  // d = (g + λθ)·rate
    if (h.momentum != 0.0) {
      double& b = momentum_buffer[i];
      if (step == 1) {
        b = d;  // b_1 = d
      } else {
        b = h.momentum * b + (1.0 - h.dampening) * d;  // b_t = μ b_{t-1} + (1 − τ) d
      }
      d = h.nesterov ? d + h.momentum * b : b;  // d = d + μ b_t (nesterov) | d = b_t
    }
    p[i] -= h.lr * d;  // θ = θ − γ d
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
// The kernel sweep: LARC's trust ratio from ‖θ‖ and ‖g‖ (the oracle computes its own, in double),
// then SGD's momentum modes. With the sweep's inputs LARC's rate tc·‖θ‖/(‖g‖ + λ‖θ‖ + ε) is about
// 0.02·0.58/0.6: lr 0.005 puts clip mode's min(rate / lr, 1) at 1 (and OtherGroup's 0.0125 too),
// lr 0.05 below 1, so both sides of the min are swept; |g| >= 0.2 keeps g + λθ away from 0.
template <>
struct KernelCases<LarsHyper> {
  using Hyper = LarsHyper;
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    LarsStep(h, t, p, g, st[kLarsMomentumBuffer]);
  }
  // {no momentum, momentum 0.9, with dampening 0.1, nesterov} × weight_decay {0, 0.01} ×
  // {clip at lr 0.005 (ratio 1), clip at lr 0.05 (ratio < 1), scale mode}; the last has every
  // feature.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (int mode = 0; mode < 4; ++mode) {
      for (double wd : {0.0, 0.01}) {
        for (int clip = 0; clip < 3; ++clip) {
          out.push_back({.lr = clip == 0 ? 0.005 : 0.05,
                         .momentum = mode == 0 ? 0.0 : 0.9,
                         .dampening = mode == 2 ? 0.1 : 0.0,
                         .weight_decay = wd,
                         .nesterov = mode == 3,
                         .clip = clip != 2});
        }
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.trust_coefficient = 0.05;
    h.eps = 1e-4;
    return h;
  }
  // As SGD's: at step 1 the buffer is not read (NaN).
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int /*slot*/, std::int64_t step, Rng& rng) {
    return step == 1 ? std::numeric_limits<double>::quiet_NaN() : rng.Uniform(-0.5, 0.5);
  }
  // The norms come from the same fixed-order sums as LAMB's: targets of one class agree bit for
  // bit (scale mode, and clip mode below and at the clip).
  static std::vector<AcrossTargets<Hyper>> TargetRuns() {
    const std::vector<Hyper> options = Options();
    std::vector<std::vector<Hyper>> per_class;
    for (const Hyper& h : {options.front(), options[options.size() - 2], options.back()})
      per_class.push_back({h, OtherGroup(h)});
    return {{.group_sets = per_class}};
  }

  // The standard step: momentum modes × weight decay × clip and scale mode. LARC's local rate
  // tc·‖θ‖/(‖g‖ + λ‖θ‖ + ε) is about 20 (gradients of ±1e-3) or 2 (±1e-2) without weight decay, so
  // at lr 5 clip mode's min(rate / lr, 1) is 1 for the first and below 1 for the second.
  static std::vector<Hyper> StandardOptions() {
    std::vector<Hyper> out;
    for (int mode = 0; mode < 4; ++mode) {
      for (double wd : {0.0, 0.01}) {
        for (bool clip : {true, false}) {
          out.push_back({.lr = 5.0,
                         .momentum = mode == 0 ? 0.0 : 0.9,
                         .dampening = mode == 2 ? 0.1 : 0.0,
                         .weight_decay = wd,
                         .nesterov = mode == 3,
                         .clip = clip});
        }
      }
    }
    return out;
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// torch.optim.SGD's rules (lr, momentum, weight_decay >= 0, a finite dampening, Nesterov with
// momentum and no dampening) and trust_coefficient, eps >= 0. Each with the parts its message must
// contain.
inline std::vector<std::pair<LarsHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<LarsHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {LarsHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {LarsHyper{.lr = kNaN}, {"lr", "nan"}},
      {LarsHyper{.momentum = -0.5}, {"momentum", "-0.5"}},
      {LarsHyper{.dampening = kNaN}, {"dampening", "nan"}},
      {LarsHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
      {LarsHyper{.weight_decay = kNaN}, {"weight_decay", "nan"}},
      {LarsHyper{.trust_coefficient = -0.02}, {"trust_coefficient", "-0.02"}},
      {LarsHyper{.trust_coefficient = kNaN}, {"trust_coefficient", "nan"}},
      {LarsHyper{.eps = -0.25}, {"eps", "-0.25"}},
      {LarsHyper{.eps = kNaN}, {"eps", "nan"}},
      {LarsHyper{.momentum = 0.0, .nesterov = true}, {"Nesterov", "momentum 0"}},
      {LarsHyper{.momentum = 0.9, .dampening = 0.5, .nesterov = true},
       {"Nesterov", "dampening 0.5"}},
  };
}

// lr 0 in clip mode too (LARC's adaptive_lr / lr is +inf there, min(inf, 1) = 1; see the Python
// tests for the values), trust_coefficient and eps 0, and scale mode.
inline std::vector<LarsHyper> AcceptedHypers(std::type_identity<LarsHyper> /*tag*/) {
  return {LarsHyper{.lr = 0.0},
          LarsHyper{.lr = 0.0, .clip = false},
          LarsHyper{.trust_coefficient = 0.0},
          LarsHyper{.eps = 0.0},
          LarsHyper{.momentum = 0.9, .nesterov = true},
          LarsHyper{.momentum = 0.9, .dampening = 0.5}};
}

// Hyper-parameters under which every state slot is in use.
inline LarsHyper AllStatesHyper(std::type_identity<LarsHyper> /*tag*/) {
  return {.momentum = 0.9, .weight_decay = 0.1};
}

// torch's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<LarsHyper> /*tag*/) {
  return {"momentum_buffer", "", ""};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<LarsHyper, int>> MissingStates(std::type_identity<LarsHyper> /*tag*/) {
  return {{LarsHyper{.momentum = 0.9}, kLarsMomentumBuffer}};
}

// momentum_buffer only with momentum, as SGD.
inline std::vector<std::pair<LarsHyper, unsigned>> RequiredStatesCases(
    std::type_identity<LarsHyper> /*tag*/) {
  return {{LarsHyper{}, 0b000u},
          {LarsHyper{.weight_decay = 0.1, .clip = false}, 0b000u},
          {LarsHyper{.momentum = 0.9}, 0b001u}};
}

// The value each state slot starts from (a momentum buffer of zeros before its first momentum
// step, as SGD's).
inline std::vector<std::pair<LarsHyper, std::vector<float>>> InitialStates(
    std::type_identity<LarsHyper> /*tag*/) {
  return {{LarsHyper{.momentum = 0.9}, {0.0f}}};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<LarsHyper>, Options>> OptimizerCases(
    std::type_identity<LarsHyper> /*tag*/) {
  return {
      {{{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01},
        {.lr = 0.05, .weight_decay = 1e-3, .clip = false}},
       {}},
      {{{.lr = 1e-3, .momentum = 0.5, .nesterov = true}, {.lr = 0.02, .trust_coefficient = 0.1}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .state_dtype = DType::kBF16}},
  };
}

// Momentum switched on after a plain step, as SGD's: the hyper-parameters before and after, the
// momentum buffer's slot, and the param and the buffer after each step (every grad 2, the param 0
// at first; no buffer after the plain step). The plain step has ‖p‖ = 0: no trust ratio,
// p = 0 - 0.5·2. The next starts the buffer as a copy of the scaled gradient (no dampening):
// rate = 0.02·‖p‖ / (‖g‖ + 1e-8), clip mode: rate / lr; buf = 2·rate, p = -1 - 0.5·buf.
inline std::pair<std::pair<LarsHyper, LarsHyper>, int> MomentumSwitchedOnLater(
    std::type_identity<LarsHyper> /*tag*/) {
  return {{{.lr = 0.5}, {.lr = 0.5, .momentum = 0.9, .dampening = 0.5}}, kLarsMomentumBuffer};
}
inline std::vector<std::pair<float, float>> MomentumSwitchedOnLaterSteps(
    std::type_identity<LarsHyper> /*tag*/) {
  const float param_norm = std::sqrt(3.0f);
  const float grad_norm = 2.0f * std::sqrt(3.0f);
  const float rate = 0.02f * param_norm / (grad_norm + param_norm * 0.0f + 1e-8f) / 0.5f;
  const float d = (2.0f + 0.0f * -1.0f) * rate;
  return {{-1.0f, 0.0f}, {-1.0f - 0.5f * d, d}};
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).
template <>
struct TorchCase<LarsHyper> {
  static LarsHyper TestHyper() { return {.lr = 5e-2, .momentum = 0.9, .weight_decay = 0.1}; }
  static constexpr const char* kTensorKeys[] = {"momentum_buffer"};
};

}  // namespace fusedopt::ref
