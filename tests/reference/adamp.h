// The double-precision oracle of AdamP (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// AdamP as clovaai's adamp.AdamP computes it (shared/docs/algorithms-more.md §1.1). `rows`: the
// param's size(0) when it has more than one dimension (its channel view is rows × numel / rows),
// 0 for a param with at most one dimension, which is never projected. Two passes, as the
// reference: the moments and the perturbation u of every element, then per view (the channel rows,
// then the whole tensor) the cosine similarity of the raw gradient and the param; the first view
// whose largest |cos| is below delta / √(row length) projects u row by row.
inline void AdampStep(const AdampHyper& h, std::int64_t step, std::size_t rows, std::span<double> p,
                      std::span<const double> g, std::span<double> exp_avg,
                      std::span<double> exp_avg_sq) {
  const auto t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);  // bc1 = 1 − β1^t
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);  // bc2 = 1 − β2^t
  const std::size_t n = p.size();
  std::vector<double> u(n);
  for (std::size_t i = 0; i < n; ++i) {
    double& m = exp_avg[i];
    double& v = exp_avg_sq[i];
    m = h.beta1 * m + (1.0 - h.beta1) * g[i];         // m = β1 m + (1 − β1) g
    v = h.beta2 * v + (1.0 - h.beta2) * g[i] * g[i];  // v = β2 v + (1 − β2) g²
    const double denom = std::sqrt(v) / std::sqrt(bias_correction2) + h.eps;  // √v / √bc2 + ε
    u[i] = h.nesterov ? (h.beta1 * m + (1.0 - h.beta1) * g[i]) / denom  // (β1 m + (1 − β1) g) / d
                      : m / denom;                                      // m / d
  }
  double wd_ratio = 1.0;
  if (rows > 0 && n > 0) {
    for (const std::size_t view_rows : {rows, std::size_t{1}}) {
      const std::size_t length = n / view_rows;
      double largest = 0.0;
      bool nan = false;
      for (std::size_t r = 0; r < view_rows; ++r) {
        double gp = 0.0, gg = 0.0, pp = 0.0;
        for (std::size_t i = r * length; i < (r + 1) * length; ++i) {
          gp += g[i] * p[i];
          gg += g[i] * g[i];
          pp += p[i] * p[i];
        }
        // |cos| = |g·p| / (max(‖g‖, ε) max(‖p‖, ε))
        const double c =
            std::abs(gp) / (std::max(std::sqrt(gg), h.eps) * std::max(std::sqrt(pp), h.eps));
        nan = nan || std::isnan(c);
        largest = std::max(largest, c);
      }
      if (nan || !(largest < h.delta / std::sqrt(static_cast<double>(length)))) continue;
      for (std::size_t r = 0; r < view_rows; ++r) {
        double pp = 0.0;
        for (std::size_t i = r * length; i < (r + 1) * length; ++i) pp += p[i] * p[i];
        const double norm = std::sqrt(pp) + h.eps;  // ‖p_r‖ + ε
        double radial = 0.0;                        // Σ p̂ u, p̂ = p / (‖p_r‖ + ε)
        for (std::size_t i = r * length; i < (r + 1) * length; ++i) radial += p[i] / norm * u[i];
        for (std::size_t i = r * length; i < (r + 1) * length; ++i) {
          u[i] -= p[i] / norm * radial;  // u = u − p̂ Σ p̂ u
        }
      }
      wd_ratio = h.wd_ratio;
      break;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (h.weight_decay > 0.0) p[i] *= 1.0 - h.lr * h.weight_decay * wd_ratio;  // θ = θ(1 − γλr)
    p[i] -= h.lr / bias_correction1 * u[i];  // θ = θ − γ/bc1 u
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
// The oracle decides the projection from its own double sums. In the kernel sweep, segments of the
// sweep's and the determinism workload's sizes get channel rows (Rows): a (1, 1) param, 2-8 rows of
// 4-13 elements, rows spanning ATen's grain and chunks; the others are 1-D. delta 10 projects every
// channel view (|cos| ≤ 1 < 10 / √13), delta 1 some channel and many layer views, 0.1 few.
template <>
struct KernelCases<AdampHyper> {
  using Hyper = AdampHyper;
  static std::size_t Rows(std::size_t n) {
    switch (n) {
      case 1:
        return 1;
      case 8:
        return 2;
      case 9:
      case 33333:
        return 3;
      case 63:
        return 7;
      case 64:
        return 8;
      case 65:
        return 5;
      case 40000:
        return 16;
      default:
        return 0;
    }
  }
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    ShapedRef(h, t, Rows(p.size()), 0, p, g, st);
  }
  // The oracle on a tensor of `rows` channel rows (0: one dimension).
  static void ShapedRef(const Hyper& h, std::int64_t t, std::size_t rows, std::size_t /*cols*/,
                        std::span<double> p, std::span<const double> g, const StateSpans& st) {
    AdampStep(h, t, rows, p, g, st[kAdampExpAvg], st[kAdampExpAvgSq]);
  }
  // delta {10, 1, 0.1} × nesterov × weight_decay {0, 0.05}; the first projects every channel view.
  static std::vector<Hyper> Options() {
    std::vector<Hyper> out;
    for (double delta : {10.0, 1.0, 0.1}) {
      for (bool nesterov : {false, true}) {
        for (double wd : {0.05, 0.0}) {
          out.push_back({.lr = 0.01, .weight_decay = wd, .delta = delta, .nesterov = nesterov});
        }
      }
    }
    return out;
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.wd_ratio = 0.5;
    h.beta1 = 0.8;
    return h;
  }
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kAdampExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.01, 0.5);
  }
  // The per-row sums come from the same fixed-order accumulators as LAMB's norms: targets of one
  // class agree bit for bit, projected per channel (delta 10) or not.
  static std::vector<AcrossTargets<Hyper>> TargetRuns() {
    const std::vector<Hyper> options = Options();
    std::vector<std::vector<Hyper>> per_class;
    for (const Hyper& h : {options.front(), options.back()})
      per_class.push_back({h, OtherGroup(h)});
    return {{.group_sets = per_class}};
  }

  // The standard step: delta 10 (every channel view of the first tensor projected) and 0.1 (mostly
  // none) × nesterov × weight decay.
  static std::vector<Hyper> StandardOptions() {
    std::vector<Hyper> out;
    for (double delta : {10.0, 0.1}) {
      for (bool nesterov : {false, true}) {
        for (double wd : {0.0, 0.1}) {
          out.push_back({.lr = 0.01, .weight_decay = wd, .delta = delta, .nesterov = nesterov});
        }
      }
    }
    return out;
  }
  // Its first tensor (2·grain + 37 = 65573 elements) has 23 channel rows of 2851, the second one
  // dimension.
  template <class Tensor>
  static void StandardTensors(std::vector<Tensor>& tensors) {
    tensors[0].rows = 23;
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// torch.optim.Adam's rules (lr, eps, weight_decay >= 0, betas in [0, 1)) and delta >= 0, a finite
// wd_ratio >= 0 (clovaai checks nothing). Each with the parts its message must contain.
inline std::vector<std::pair<AdampHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<AdampHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {AdampHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {AdampHyper{.lr = kNaN}, {"lr", "nan"}},
      {AdampHyper{.beta1 = 1.0}, {"beta1: 1", "[0, 1)"}},
      {AdampHyper{.beta2 = -0.1}, {"beta2", "-0.1"}},
      {AdampHyper{.eps = -0.25}, {"eps", "-0.25"}},
      {AdampHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
      {AdampHyper{.delta = -0.1}, {"delta", "-0.1"}},
      {AdampHyper{.delta = kNaN}, {"delta", "nan"}},
      {AdampHyper{.wd_ratio = -0.5}, {"wd_ratio", "-0.5"}},
      {AdampHyper{.wd_ratio = std::numeric_limits<double>::infinity()}, {"wd_ratio", "inf"}},
  };
}

// The edges: lr, delta and wd_ratio 0.
inline std::vector<AdampHyper> AcceptedHypers(std::type_identity<AdampHyper> /*tag*/) {
  return {AdampHyper{.lr = 0.0, .delta = 0.0, .wd_ratio = 0.0}};
}

// Hyper-parameters under which every state slot is in use.
inline AdampHyper AllStatesHyper(std::type_identity<AdampHyper> /*tag*/) {
  return {.weight_decay = 0.1};
}

// torch's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<AdampHyper> /*tag*/) {
  return {"exp_avg", "exp_avg_sq", ""};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<AdampHyper, int>> MissingStates(
    std::type_identity<AdampHyper> /*tag*/) {
  return {{AdampHyper{}, kAdampExpAvg}, {AdampHyper{}, kAdampExpAvgSq}};
}

// exp_avg and exp_avg_sq, whatever the options.
inline std::vector<std::pair<AdampHyper, unsigned>> RequiredStatesCases(
    std::type_identity<AdampHyper> /*tag*/) {
  return {{AdampHyper{}, 0b011u}, {AdampHyper{.weight_decay = 0.1, .nesterov = true}, 0b011u}};
}

// The value each state slot starts from (clovaai: zeros).
inline std::vector<std::pair<AdampHyper, std::vector<float>>> InitialStates(
    std::type_identity<AdampHyper> /*tag*/) {
  return {{AdampHyper{}, {0.0f, 0.0f}}};
}

// A param is Segment::rows channel rows (torch's view(size(0), -1)): the rows a 64-element segment
// may have (0: a 1-D param). The others (3) must be rejected.
inline std::vector<std::size_t> ChannelRowsOf64(std::type_identity<AdampHyper> /*tag*/) {
  return {0, 1, 8, 64};
}

// Hyper-parameters under which the channel rows change the step: a delta so large that every
// channel is projected.
inline AdampHyper ShapedHyper(std::type_identity<AdampHyper> /*tag*/) {
  return {.lr = 1e-2, .weight_decay = 0.1, .delta = 10.0};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<AdampHyper>, Options>> OptimizerCases(
    std::type_identity<AdampHyper> /*tag*/) {
  return {
      {{{.lr = 1e-2, .weight_decay = 0.1}, {.lr = 1e-3, .nesterov = true}}, {}},
      {{{.lr = 1e-2, .delta = 10.0}, {.lr = 1e-3, .weight_decay = 0.01}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).
template <>
struct TorchCase<AdampHyper> {
  static AdampHyper TestHyper() { return {.lr = 5e-3, .weight_decay = 0.1, .nesterov = true}; }
  static constexpr const char* kTensorKeys[] = {"exp_avg", "exp_avg_sq"};
};

}  // namespace fusedopt::ref
