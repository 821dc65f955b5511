// The double-precision oracle of ASGD (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// torch.optim.ASGD: θ = θ(1 − λη) − ηg, then the average ax: a copy of θ until averaging starts
// (μ = 1), ax = ax + μ(θ − ax) after. A step uses the η and μ of the step before: η_0 = γ, μ_0 = 1,
// and after step t η_t = γ / (1 + λγt)^α, μ_t = 1 / max(1, t − t0), rebuilt from the step in
// double.
inline void AsgdStep(const AsgdHyper& h, std::int64_t step, std::span<double> p,
                     std::span<const double> g, std::span<double> ax) {
  const auto before = static_cast<double>(step - 1);
  const double eta = h.lr / std::pow(1.0 + h.lambd * h.lr * before, h.alpha);  // η_{t−1}
  const double mu = 1.0 / std::max(1.0, before - h.t0);                        // μ_{t−1}
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = h.maximize ? -g[i] : g[i];                   // g = -∇ if maximize else ∇
    if (h.weight_decay != 0.0) gi += h.weight_decay * p[i];  // g = g + λ_wd θ
    p[i] = p[i] * (1.0 - h.lambd * eta) - eta * gi;          // θ = θ(1 − λη) − ηg
    ax[i] = mu == 1.0 ? p[i] : ax[i] + mu * (p[i] - ax[i]);  // ax = θ | ax + μ(θ − ax)
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
template <>
struct KernelCases<AsgdHyper> {
  using Hyper = AsgdHyper;
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    AsgdStep(h, t, p, g, st[kAsgdAx]);
  }
  // weight_decay {0, 0.05} × maximize × t0 {torch's 1e6: ax a copy of the param; 2: averaging from
  // step 5 on, so the sweep's tensors starting at step 7 average and its 20-step cases cross into
  // it}; the last has every feature and a larger lambd, another alpha.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double t0 : {1e6, 2.0}) {
      for (double wd : {0.0, 0.05}) {
        for (bool maximize : {false, true}) {
          out.push_back({.lr = 0.05, .t0 = t0, .weight_decay = wd, .maximize = maximize});
        }
      }
    }
    out.push_back({.lr = 0.05,
                   .lambd = 0.1,
                   .alpha = 0.5,
                   .t0 = 2.0,
                   .weight_decay = 0.05,
                   .maximize = true});
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.maximize = !h.maximize;
    h.lambd = 0.01;
    h.alpha = 0.6;
    h.t0 = h.t0 == 2.0 ? 1e6 : 3.0;
    return h;
  }
  // Zero at step 1 (as torch); later an average near the params.
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int /*slot*/, std::int64_t step, Rng& rng) {
    return step == 1 ? 0.0 : rng.Uniform(-1.0, 1.0);
  }
  // eta and mu before step `step`, as step - 1 left them (torch's f32 0-d tensors): lr / (1 +
  // lambd·lr·(step − 1))^alpha and 1 / max(1, step − 1 − t0), each rounded once.
  static void InitScalars(const Hyper& h, std::int64_t step, std::span<float, kMaxScalars> out) {
    const auto before = static_cast<double>(step - 1);
    out[kAsgdEta] = static_cast<float>(h.lr / std::pow(1.0 + h.lambd * h.lr * before, h.alpha));
    out[kAsgdMu] = static_cast<float>(1.0 / std::max(1.0, before - h.t0));
  }

  // The standard step: t0 {1e6, 0} × weight_decay {0, 0.01} × maximize. t0 0: steps 1 and 2 copy
  // the param into ax, step 3 averages.
  static std::vector<Hyper> StandardOptions() {
    std::vector<Hyper> out;
    for (double t0 : {1e6, 0.0}) {
      for (double wd : {0.0, 0.01}) {
        for (bool maximize : {false, true}) {
          out.push_back(
              {.lr = 0.05, .lambd = 0.01, .t0 = t0, .weight_decay = wd, .maximize = maximize});
        }
      }
    }
    return out;
  }

  // t0 0: steps 1 and 2 copy the param into ax, step 3 averages (mu = 1/2).
  static std::vector<Hyper> MathHypers() {
    return {{.lr = 0.05, .lambd = 0.1, .t0 = 0.0, .weight_decay = 0.1, .maximize = true}};
  }
  template <class Ops, class Scalars>
  static void Math(Ops o, const Hyper& /*h*/, const Scalars& c, float& p, float g, float& ax,
                   float& /*s1*/, float& /*s2*/) {
    if (c.average) {
      AsgdMath<true, true>(o, c, p, g, ax);
    } else {
      AsgdMath<true, false>(o, c, p, g, ax);
    }
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// torch.optim.ASGD's constructor checks (lr and weight_decay >= 0); lambd, alpha and t0 have none.
// Each with the parts its message must contain.
inline std::vector<std::pair<AsgdHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<AsgdHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {AsgdHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {AsgdHyper{.lr = kNaN}, {"lr", "nan"}},
      {AsgdHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
      {AsgdHyper{.weight_decay = kNaN}, {"weight_decay", "nan"}},
      {AsgdHyper{.weight_decay = -1.0}, {"weight_decay"}},
  };
}

// What torch accepts: lr 0, any lambd, alpha and t0.
inline std::vector<AsgdHyper> AcceptedHypers(std::type_identity<AsgdHyper> /*tag*/) {
  return {AsgdHyper{.lr = 0.0, .lambd = 0.0, .alpha = 0.0, .t0 = -3.0},
          AsgdHyper{.lambd = -1e-3, .alpha = 2.0, .t0 = 0.5}};
}

// Hyper-parameters under which every state slot is in use.
inline AsgdHyper AllStatesHyper(std::type_identity<AsgdHyper> /*tag*/) {
  return {.weight_decay = 0.1};
}

// torch's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<AsgdHyper> /*tag*/) {
  return {"ax", "", ""};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<AsgdHyper, int>> MissingStates(std::type_identity<AsgdHyper> /*tag*/) {
  return {{AsgdHyper{}, kAsgdAx}};
}

// ax, whatever the options (a copy of the param until averaging starts).
inline std::vector<std::pair<AsgdHyper, unsigned>> RequiredStatesCases(
    std::type_identity<AsgdHyper> /*tag*/) {
  return {{AsgdHyper{}, 0b001u},
          {AsgdHyper{.t0 = 0.0, .weight_decay = 0.1, .maximize = true}, 0b001u}};
}

// The value each state slot starts from (torch: ax = zeros_like(p)).
inline std::vector<std::pair<AsgdHyper, std::vector<float>>> InitialStates(
    std::type_identity<AsgdHyper> /*tag*/) {
  return {{AsgdHyper{}, {0.0f}}};
}

// The per-tensor scalar states: torch's state_dict key of each Segment::scalars entry.
inline std::vector<const char*> ScalarStateKeys(std::type_identity<AsgdHyper> /*tag*/) {
  return {"eta", "mu"};
}

// Hyper-parameters the scalar-state tests step with (a small t0, so that mu moves).
inline std::vector<AsgdHyper> ScalarStateHypers(std::type_identity<AsgdHyper> /*tag*/) {
  return {AsgdHyper{.lr = 0.05, .lambd = 0.1, .t0 = 4.0},
          AsgdHyper{.lr = 0.03, .lambd = 0.1, .t0 = 1.0}};
}

// torch: state['eta'] = as_tensor(lr) (f32), state['mu'] = ones(()).
inline std::vector<float> InitialScalars(const AsgdHyper& h) {
  return {static_cast<float>(h.lr), 1.0f};
}

// What step t leaves: eta = f32(lr / (1 + lambd·lr·t)^alpha), mu = f32(1 / max(1, t − t0)); neither
// reads the old values.
inline std::vector<float> ScalarsAfter(const AsgdHyper& h, std::int64_t step,
                                       const std::vector<float>& /*old*/) {
  const auto t = static_cast<double>(step);
  return {static_cast<float>(h.lr / std::pow(1.0 + h.lambd * h.lr * t, h.alpha)),
          t - h.t0 > 1.0 ? static_cast<float>(1.0 / (t - h.t0)) : 1.0f};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<AsgdHyper>, Options>> OptimizerCases(
    std::type_identity<AsgdHyper> /*tag*/) {
  return {
      {{{.lr = 0.05, .lambd = 0.1, .t0 = 2.0}, {.lr = 0.01, .weight_decay = 0.1, .maximize = true}},
       {}},
      {{{.lr = 0.05, .t0 = 1.0}, {.lr = 0.01, .alpha = 0.5}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).
template <>
struct TorchCase<AsgdHyper> {
  static AsgdHyper TestHyper() {
    return {.lr = 5e-2, .t0 = 2, .weight_decay = 0.1};  // averaging from the third step on
  }
  static constexpr const char* kTensorKeys[] = {"ax"};
  // After one step, as torch: η_1 = γ / (1 + λγ)^α, μ_1 = 1 / max(1, 1 − t0) = 1.
  template <class F>
  static void ForEachScalar(F&& f) {
    const AsgdHyper h = TestHyper();
    const double eta = h.lr / std::pow(1.0 + h.lambd * h.lr, h.alpha);
    f("eta", eta, 1e-6 * eta);
    f("mu", 1.0, 0.0);
  }
};

}  // namespace fusedopt::ref
