// The double-precision oracle of BertAdam (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// BertAdam (torch_npu NpuFusedBertAdam / HF BertAdam, shared/docs/algorithms-more.md §1.2) with
// fusedopt's schedules (warmup −1 as 0, cosine with cos, poly 0 from x = 1). The gradient clipping
// is per (group, dtype) buffer: BertAdamClip gives the factor from the buffer's Σg², and the caller
// passes it to every tensor of the buffer as `clip`.
inline double BertAdamClip(double max_grad_norm, double sum_of_squares) {
  if (!(max_grad_norm > 0.0)) return 1.0;
  const double c = max_grad_norm / (std::sqrt(sum_of_squares) + 1e-6);  // max / (‖g‖ + 1e-6)
  return c < 1.0 ? c : 1.0;  // applied when below 1 (a NaN norm: never)
}

// lr · the schedule at the step before this one (s = step − 1; x = s / t_total), or lr.
inline double BertAdamScheduledLr(const BertAdamHyper& h, std::int64_t step) {
  if (h.t_total == -1.0) return h.lr;
  const double x = static_cast<double>(step - 1) / h.t_total;
  const double w = h.warmup < 0.0 ? 0.0 : h.warmup;
  if (x < w) return h.lr * x / w;  // linear warmup
  switch (h.schedule) {
    case kBertAdamWarmupConstant:
      return h.lr;
    case kBertAdamWarmupCosine:
      return h.lr * 0.5 * (1.0 + std::cos(3.14159265358979323846 * x));
    case kBertAdamWarmupPoly:
      return x >= 1.0 ? 0.0 : h.lr * std::sqrt(1.0 - x);
    default:
      return h.lr * std::max((x - 1.0) / (w - 1.0), 0.0);  // from 1 at x = w to 0 at x = 1
  }
}

inline void BertAdamStep(const BertAdamHyper& h, std::int64_t step, double clip,
                         std::span<double> p, std::span<const double> g, std::span<double> exp_avg,
                         std::span<double> exp_avg_sq) {
  const double lr = BertAdamScheduledLr(h, step);
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double gi = g[i] * clip;
    double& m = exp_avg[i];
    double& v = exp_avg_sq[i];
    m = h.b1 * m + (1.0 - h.b1) * gi;                      // m = β1 m + (1 − β1) g
    v = h.b2 * v + (1.0 - h.b2) * gi * gi;                 // v = β2 v + (1 − β2) g²
    double u = m / (std::sqrt(v) + h.e);                   // u = m / (√v + e)
    if (h.weight_decay > 0.0) u += h.weight_decay * p[i];  // u = u + λθ
    p[i] -= lr * u;                                        // θ = θ − lr_s u
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
// The kernel sweep: the oracle clips per (group, param dtype) as the reference's flat buffers
// (ScaleGrads, before Ref). With the sweep's inputs (|g| < 1, 0-65 elements a segment) a group's
// norm is a few units: max_grad_norm 1 clips on every step, 5 on some, -1 never. The schedules run
// past t_total (first steps 1, 7, 2 and 20 steps).
template <>
struct KernelCases<BertAdamHyper> {
  using Hyper = BertAdamHyper;
  static void Ref(const Hyper& h, std::int64_t t, std::span<double> p, std::span<const double> g,
                  const StateSpans& st) {
    BertAdamStep(h, t, 1.0, p, g, st[kBertAdamExpAvg], st[kBertAdamExpAvgSq]);  // g: clipped
  }
  // Each (group, param dtype)'s factor from its Σg², applied to its segments' oracle gradients.
  template <class Seg>
  static void ScaleGrads(std::span<const Hyper> groups, const std::vector<Seg>& segs,
                         std::vector<std::vector<double>>& grads) {
    std::map<std::pair<std::uint32_t, DType>, double> sums;
    for (std::size_t i = 0; i < segs.size(); ++i) {
      double& sum = sums[{segs[i].spec.group, segs[i].spec.combo.param}];
      for (double x : grads[i]) sum += x * x;
    }
    for (std::size_t i = 0; i < segs.size(); ++i) {
      const double clip = BertAdamClip(groups[segs[i].spec.group].max_grad_norm,
                                       sums[{segs[i].spec.group, segs[i].spec.combo.param}]);
      for (double& x : grads[i]) x *= clip;
    }
  }
  // Constant lr with clipping and weight decay (the reference's defaults), neither, and each
  // schedule with a warmup (cosine: none), clipped at 1, 5 or 2.
  static std::vector<Hyper> Options() {
    return {
        {.lr = 0.01},
        {.lr = 0.01, .weight_decay = 0.0, .max_grad_norm = -1.0},
        {.lr = 0.01, .warmup = 0.2, .t_total = 10, .max_grad_norm = 5.0},
        {.lr = 0.01, .warmup = 0.1, .t_total = 30, .schedule = kBertAdamWarmupConstant},
        {.lr = 0.01, .t_total = 25, .schedule = kBertAdamWarmupCosine, .weight_decay = 0.05},
        {.lr = 0.01,
         .warmup = 0.3,
         .t_total = 15,
         .schedule = kBertAdamWarmupPoly,
         .max_grad_norm = 2.0},
    };
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 2.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.b1 = 0.8;
    h.e = 1e-4;
    h.max_grad_norm = h.max_grad_norm == 1.0 ? 3.0 : 1.0;
    return h;
  }
  // Zero at step 1; later a plausible state.
  template <class Rng>
  static double InitState(const Hyper& /*h*/, int slot, std::int64_t step, Rng& rng) {
    if (step == 1) return 0.0;
    if (slot == kBertAdamExpAvg) return rng.Uniform(-0.3, 0.3);
    return rng.Uniform(0.01, 0.5);
  }
  // The clip factors come from the same fixed-order sums as LAMB's norms: targets of one class
  // agree bit for bit (clipped and not).
  static std::vector<AcrossTargets<Hyper>> TargetRuns() {
    const std::vector<Hyper> options = Options();
    std::vector<std::vector<Hyper>> per_class;
    for (const Hyper& h : {options.front(), options[1], options.back()})
      per_class.push_back({h, OtherGroup(h)});
    return {{.group_sets = per_class}};
  }

  // The standard step: the reference's defaults (clipping at 1: the larger gradients only), no
  // clipping and no decay, and each schedule.
  static std::vector<Hyper> StandardOptions() {
    return {{.lr = 0.01},
            {.lr = 0.01, .weight_decay = 0.0, .max_grad_norm = -1.0},
            {.lr = 0.01, .warmup = 0.5, .t_total = 4},
            {.lr = 0.01, .warmup = 0.2, .t_total = 5, .schedule = kBertAdamWarmupConstant},
            {.lr = 0.01, .t_total = 5, .schedule = kBertAdamWarmupCosine},
            {.lr = 0.01, .t_total = 3, .schedule = kBertAdamWarmupPoly, .max_grad_norm = 0.5}};
  }
  // The standard step clips the gradients of each (group, dtype) buffer (there: all, one f32
  // group): the oracle's, in double.
  template <class Standard>
  static void StandardClip(const Hyper& h, const Standard& /*o*/,
                           std::vector<std::vector<double>>& grads) {
    double total = 0.0;
    for (const auto& gi : grads)
      for (const double x : gi) total += x * x;
    const double clip = BertAdamClip(h.max_grad_norm, total);
    for (auto& gi : grads)
      for (double& x : gi) x *= clip;
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// NpuFusedBertAdam's constructor checks (lr >= 0; warmup -1 or in [0, 1); b1, b2 in [0, 1);
// e >= 0), a schedule code of the four, and what the reference cannot run: t_total 0 or another
// negative one than -1, a NaN max_grad_norm, a non-finite weight_decay. Each with the parts its
// message must contain.
inline std::vector<std::pair<BertAdamHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<BertAdamHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {BertAdamHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {BertAdamHyper{.lr = kNaN}, {"lr", "nan"}},
      {BertAdamHyper{.warmup = -0.5}, {"warmup", "-0.5"}},
      {BertAdamHyper{.warmup = 1.0}, {"warmup: 1", "[0, 1)"}},
      {BertAdamHyper{.warmup = kNaN}, {"warmup", "nan"}},
      {BertAdamHyper{.t_total = 0.0}, {"t_total: 0", "-1 or > 0"}},
      {BertAdamHyper{.t_total = -2.0}, {"t_total", "-2"}},
      {BertAdamHyper{.schedule = 4}, {"schedule code: 4"}},
      {BertAdamHyper{.schedule = -1}, {"schedule code: -1"}},
      {BertAdamHyper{.b1 = 1.0}, {"b1: 1", "[0, 1)"}},
      {BertAdamHyper{.b2 = -0.1}, {"b2", "-0.1"}},
      {BertAdamHyper{.e = -1e-6}, {"e", "-1e-06"}},
      {BertAdamHyper{.weight_decay = kNaN}, {"weight_decay", "nan"}},
      {BertAdamHyper{.max_grad_norm = kNaN}, {"max_grad_norm", "nan"}},
  };
}

// Unchecked by the reference and fine here: a negative weight decay (skipped: wd > 0 is the test),
// max_grad_norm <= 0 (no clipping), lr 0, warmup 0 and -1, e 0.
inline std::vector<BertAdamHyper> AcceptedHypers(std::type_identity<BertAdamHyper> /*tag*/) {
  return {BertAdamHyper{.lr = 0.0, .warmup = 0.0, .t_total = 5}, BertAdamHyper{.e = 0.0},
          BertAdamHyper{.weight_decay = -0.1, .max_grad_norm = 0.0},
          BertAdamHyper{.t_total = 1e9, .schedule = kBertAdamWarmupPoly, .max_grad_norm = -1.0}};
}

// Hyper-parameters under which every state slot is in use.
inline BertAdamHyper AllStatesHyper(std::type_identity<BertAdamHyper> /*tag*/) {
  return {.t_total = 10};
}

// The reference's state_dict key of each state slot ("" for an unused one).
inline std::vector<const char*> StateKeys(std::type_identity<BertAdamHyper> /*tag*/) {
  return {"exp_avg", "exp_avg_sq", ""};
}

// Hyper-parameters and a state slot they need.
inline std::vector<std::pair<BertAdamHyper, int>> MissingStates(
    std::type_identity<BertAdamHyper> /*tag*/) {
  return {{BertAdamHyper{}, kBertAdamExpAvg},
          {BertAdamHyper{.weight_decay = 0.0}, kBertAdamExpAvgSq}};
}

// exp_avg and exp_avg_sq, whatever the options.
inline std::vector<std::pair<BertAdamHyper, unsigned>> RequiredStatesCases(
    std::type_identity<BertAdamHyper> /*tag*/) {
  return {{BertAdamHyper{}, 0b011u},
          {BertAdamHyper{.weight_decay = 0.0, .max_grad_norm = -1.0}, 0b011u}};
}

// The value each state slot starts from (the reference: zeros).
inline std::vector<std::pair<BertAdamHyper, std::vector<float>>> InitialStates(
    std::type_identity<BertAdamHyper> /*tag*/) {
  return {{BertAdamHyper{}, {0.0f, 0.0f}}};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<BertAdamHyper>, Options>> OptimizerCases(
    std::type_identity<BertAdamHyper> /*tag*/) {
  return {
      {{{.lr = 1e-3, .warmup = 0.1, .t_total = 10},
        {.lr = 2e-3, .weight_decay = 0.0, .max_grad_norm = -1.0}},
       {}},
      {{{.lr = 1e-3, .t_total = 20, .schedule = kBertAdamWarmupCosine}, {.lr = 2e-3}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).
template <>
struct TorchCase<BertAdamHyper> {
  // A schedule that reads the step (linear decay over 50 steps, no warmup: the first step moves
  // the params) and clipping that fires.
  static BertAdamHyper TestHyper() {
    return {.lr = 5e-3, .t_total = 50, .weight_decay = 0.1, .max_grad_norm = 0.5};
  }
  static constexpr const char* kTensorKeys[] = {"exp_avg", "exp_avg_sq"};
  // The reference decays only `if weight_decay > 0`: a negative one is no error.
  static constexpr bool kTakesNegativeWeightDecay = true;
};

}  // namespace fusedopt::ref
