// The double-precision oracle of RMSpropTF (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// RMSpropTF (torch_npu's NpuFusedRMSpropTF, shared/docs/algorithms-more.md §1.4): eps inside the
// sqrt; square_avg must hold 1 before the first step. `momentum_buffer` is used when momentum > 0,
// `grad_avg` when centered.
inline void RmsproptfStep(const RmsproptfHyper& h, std::span<double> p, std::span<const double> g,
                          std::span<double> square_avg, std::span<double> momentum_buffer,
                          std::span<double> grad_avg) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = g[i];
    if (h.weight_decay != 0.0) {
      if (h.decoupled_decay) {
        p[i] *= 1.0 - h.weight_decay;  // θ = θ (1 − λ), not scaled by γ
      } else {
        gi += h.weight_decay * p[i];  // g = g + λθ
      }
    }
    double& v = square_avg[i];
    v += (1.0 - h.alpha) * (gi * gi - v);  // v = v + (1 − α)(g² − v)
    double avg;
    if (h.centered) {
      double& ga = grad_avg[i];
      ga += (1.0 - h.alpha) * (gi - ga);     // ḡ = ḡ + (1 − α)(g − ḡ)
      avg = std::sqrt(v - ga * ga + h.eps);  // √(v − ḡ² + ε)
    } else {
      avg = std::sqrt(v + h.eps);  // √(v + ε)
    }
    if (h.momentum > 0.0) {
      double& b = momentum_buffer[i];
      if (h.lr_in_momentum) {
        b = h.momentum * b + h.lr * gi / avg;  // b = μ b + γ g / avg
        p[i] -= b;                             // θ = θ − b
      } else {
        b = h.momentum * b + gi / avg;  // b = μ b + g / avg
        p[i] -= h.lr * b;               // θ = θ − γ b
      }
    } else {
      p[i] -= h.lr * gi / avg;  // θ = θ − γ g / avg
    }
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
template <>
struct KernelCases<RmsproptfHyper> {
  using Hyper = RmsproptfHyper;
  static void Ref(const Hyper& h, std::int64_t /*t*/, std::span<double> p,
                  std::span<const double> g, const StateSpans& st) {
    RmsproptfStep(h, p, g, st[kRmsproptfSquareAvg], st[kRmsproptfMomentumBuffer],
                  st[kRmsproptfGradAvg]);
  }
  // All 18 modes: weight decay {none, coupled, decoupled} × centered × momentum {none, lr in the
  // buffer, lr on the step}.
  static std::vector<Hyper> Options() { return Modes(0.05); }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.alpha = 0.8;
    h.eps = 1e-6;
    return h;
  }
  // square_avg is 1 at step 1 (as the reference), the others 0; later square_avg > 0 and
  // grad_avg² ≤ square_avg / 4 (Start scales grad_avg).
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return slot == kRmsproptfSquareAvg ? 1.0 : 0.0;
    if (slot == kRmsproptfSquareAvg) return rng.Uniform(0.05, 1.0);
    return rng.Uniform(-0.5, 0.5);
  }
  template <class Rng>
  static void Start(const Hyper& h, std::size_t /*i*/, std::int64_t first_step, double& /*p*/,
                    std::array<double, kMaxStates>& st, Rng& rng) {
    if (first_step > 1 && h.centered)
      st[kRmsproptfGradAvg] = rng.Uniform(-0.5, 0.5) * std::sqrt(st[kRmsproptfSquareAvg]);
  }

  // The standard step: the same 18 modes with a weight decay of 0.01.
  static std::vector<Hyper> StandardOptions() { return Modes(0.01); }

  static std::vector<Hyper> Modes(double weight_decay) {
    std::vector<Hyper> out;
    for (int decay = 0; decay < 3; ++decay) {
      for (bool centered : {false, true}) {
        for (int mode = 0; mode < 3; ++mode) {
          out.push_back({.lr = 0.01,
                         .weight_decay = decay == 0 ? 0.0 : weight_decay,
                         .momentum = mode == 0 ? 0.0 : 0.9,
                         .centered = centered,
                         .decoupled_decay = decay == 2,
                         .lr_in_momentum = mode != 2});
        }
      }
    }
    return out;
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// NpuFusedRMSpropTF's constructor checks (lr, eps, momentum, weight_decay, alpha each >= 0; alpha
// has no upper bound). Each with the parts its message must contain.
inline std::vector<std::pair<RmsproptfHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<RmsproptfHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {RmsproptfHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {RmsproptfHyper{.lr = kNaN}, {"lr", "nan"}},
      {RmsproptfHyper{.eps = -0.25}, {"eps", "-0.25"}},
      {RmsproptfHyper{.momentum = -0.9}, {"momentum", "-0.9"}},
      {RmsproptfHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
      {RmsproptfHyper{.weight_decay = kNaN}, {"weight_decay", "nan"}},
      {RmsproptfHyper{.alpha = -0.1}, {"alpha", "-0.1"}},
      {RmsproptfHyper{.alpha = kNaN}, {"alpha", "nan"}},
  };
}

// lr, alpha, eps and momentum 0, and an alpha above 1.
inline std::vector<RmsproptfHyper> AcceptedHypers(std::type_identity<RmsproptfHyper> /*tag*/) {
  return {RmsproptfHyper{.lr = 0.0, .alpha = 0.0, .eps = 0.0, .momentum = 0.0},
          RmsproptfHyper{.alpha = 1.5, .weight_decay = 0.0}};
}

// Hyper-parameters under which every state slot is in use.
inline RmsproptfHyper AllStatesHyper(std::type_identity<RmsproptfHyper> /*tag*/) {
  return {.weight_decay = 0.1, .momentum = 0.5, .centered = true};
}

// The reference's state_dict key of each state slot.
inline std::vector<const char*> StateKeys(std::type_identity<RmsproptfHyper> /*tag*/) {
  return {"square_avg", "momentum_buffer", "grad_avg"};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<RmsproptfHyper, int>> MissingStates(
    std::type_identity<RmsproptfHyper> /*tag*/) {
  return {{RmsproptfHyper{}, kRmsproptfSquareAvg},
          {RmsproptfHyper{.centered = true}, kRmsproptfGradAvg},
          {RmsproptfHyper{.momentum = 0.5, .lr_in_momentum = false}, kRmsproptfMomentumBuffer}};
}

// square_avg, momentum_buffer with momentum > 0, grad_avg when centered.
inline std::vector<std::pair<RmsproptfHyper, unsigned>> RequiredStatesCases(
    std::type_identity<RmsproptfHyper> /*tag*/) {
  return {{RmsproptfHyper{}, 0b001u},
          {RmsproptfHyper{.weight_decay = 0.1, .decoupled_decay = true}, 0b001u},
          {RmsproptfHyper{.momentum = 0.9}, 0b011u},
          {RmsproptfHyper{.momentum = 0.9, .lr_in_momentum = false}, 0b011u},
          {RmsproptfHyper{.centered = true}, 0b101u},
          {RmsproptfHyper{.momentum = 0.9, .centered = true}, 0b111u}};
}

// The reference: square_avg = ones_like(p) (TF's start), the others zeros.
inline std::vector<std::pair<RmsproptfHyper, std::vector<float>>> InitialStates(
    std::type_identity<RmsproptfHyper> /*tag*/) {
  return {{RmsproptfHyper{.momentum = 0.9, .centered = true}, {1.0f, 0.0f, 0.0f}}};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<RmsproptfHyper>, Options>> OptimizerCases(
    std::type_identity<RmsproptfHyper> /*tag*/) {
  return {
      {{{.lr = 1e-2, .momentum = 0.9, .centered = true},
        {.lr = 5e-3, .weight_decay = 0.01, .decoupled_decay = true}},
       {}},
      {{{.lr = 1e-2, .momentum = 0.9, .lr_in_momentum = false}, {.lr = 5e-3}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).
template <>
struct TorchCase<RmsproptfHyper> {
  // Every state (momentum, centered); the decay coupled, so that lr 0 leaves a param as it is.
  static RmsproptfHyper TestHyper() {
    return {.lr = 5e-3, .weight_decay = 0.1, .momentum = 0.9, .centered = true};
  }
  static constexpr const char* kTensorKeys[] = {"square_avg", "momentum_buffer", "grad_avg"};
};

}  // namespace fusedopt::ref
