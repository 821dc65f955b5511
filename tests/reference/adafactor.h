// The double-precision oracle of Adafactor (tests/reference/common.h says what the oracle is) and
// the cases the generic C++ tests run for it.
#pragma once

#include "tests/reference/common.h"

namespace fusedopt::ref {

// torch.optim.Adafactor (torch 2.13, shared/docs/algorithms-more.md §2.5). `rows`, `cols`: the
// param's last two dimensions when it has more than one (a batch of p.size() / (rows·cols)
// row-major matrices; row_var holds batch·rows values, col_var batch·cols), both 0 for a vector
// (variance holds p.size() values). eps1 is used as given (the caller resolves torch's None).
inline void AdafactorStep(const AdafactorHyper& h, std::int64_t step, std::size_t rows,
                          std::size_t cols, std::span<double> p, std::span<const double> grad,
                          std::span<double> row_var, std::span<double> col_var,
                          std::span<double> variance) {
  const auto t = static_cast<double>(step);
  const std::size_t n = p.size();
  const double w = std::pow(t, h.beta2_decay);            // 1 − β2_t = t^beta2_decay
  const double rho = std::min(h.lr, 1.0 / std::sqrt(t));  // ρ = min(lr, 1/√t)
  double param_sq = 0.0;
  for (const double x : p) param_sq += x * x;
  const double rms = std::sqrt(param_sq) / std::sqrt(static_cast<double>(n));  // RMS(p)
  const double alpha = std::max(h.eps2, rms) * rho;  // α = max(ε2, RMS(p))·ρ
  std::vector<double> g(n), u(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = h.maximize ? -grad[i] : grad[i];
  if (rows > 0) {
    const std::size_t batch = n / (rows * cols);
    for (std::size_t b = 0; b < batch; ++b) {
      const std::size_t base = b * rows * cols;
      for (std::size_t r = 0; r < rows; ++r) {  // R = lerp(R, mean_c g², w)
        double sum = 0.0;
        for (std::size_t c = 0; c < cols; ++c)
          sum += g[base + r * cols + c] * g[base + r * cols + c];
        double& x = row_var[b * rows + r];
        x += w * (sum / static_cast<double>(cols) - x);
      }
      for (std::size_t c = 0; c < cols; ++c) {  // C = lerp(C, mean_r g², w)
        double sum = 0.0;
        for (std::size_t r = 0; r < rows; ++r)
          sum += g[base + r * cols + c] * g[base + r * cols + c];
        double& x = col_var[b * cols + c];
        x += w * (sum / static_cast<double>(rows) - x);
      }
      double mean = 0.0;  // max(mean_r R, ε1)
      for (std::size_t r = 0; r < rows; ++r) mean += row_var[b * rows + r];
      mean = std::max(mean / static_cast<double>(rows), h.eps1);
      for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t c = 0; c < cols; ++c) {
          const std::size_t i = base + r * cols + c;
          const double v = row_var[b * rows + r] * col_var[b * cols + c] / mean;  // V = R C / mean
          u[i] = g[i] / std::sqrt(std::max(v, h.eps1 * h.eps1));  // U = g / √max(V, ε1²)
        }
      }
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      variance[i] += w * (g[i] * g[i] - variance[i]);  // V = lerp(V, g², w)
      u[i] = g[i] / std::sqrt(std::max(variance[i], h.eps1 * h.eps1));
    }
  }
  double update_sq = 0.0;
  for (const double x : u) update_sq += x * x;
  // den = max(1, RMS(U) / d)
  const double denom =
      std::max(1.0, std::sqrt(update_sq) / (std::sqrt(static_cast<double>(n)) * h.d));
  for (std::size_t i = 0; i < n; ++i) {
    if (h.weight_decay != 0.0) p[i] *= 1.0 - h.lr * h.weight_decay;  // θ = θ(1 − γλ)
    p[i] -= alpha / denom * u[i];                                    // θ = θ − α/den·U
  }
}

// Kernel sweep, standard step and scalar math (tests/kernel_test.cc, standard_test.cc,
// math_scalar_test.cc).
// Factored states: the kernel runs the shaped sweep (tests/kernel_test.cc), not the flat one.
template <>
struct KernelCases<AdafactorHyper> {
  using Hyper = AdafactorHyper;
  // The oracle on a tensor of `rows` × `cols` matrices (0 × 0: a vector).
  static void ShapedRef(const Hyper& h, std::int64_t t, std::size_t rows, std::size_t cols,
                        std::span<double> p, std::span<const double> g, const StateSpans& st) {
    const std::size_t batch = rows > 0 ? p.size() / (rows * cols) : 0;
    AdafactorStep(h, t, rows, cols, p, g, st[kAdafactorRowVar].first(batch * rows),
                  st[kAdafactorColVar].first(batch * cols), st[kAdafactorVariance]);
  }
  // torch's defaults; a larger lr with weight decay, a larger eps1 and maximize; eps2 above the
  // params' RMS (alpha's other branch) with d 0.5, so that the update's RMS is clipped.
  static std::vector<Hyper> StandardOptions() {
    return {Hyper{},
            {.lr = 0.05, .eps1 = 1e-3, .weight_decay = 0.1, .maximize = true},
            {.beta2_decay = -0.5, .eps2 = 1.0, .d = 0.5}};
  }
  // Besides the vectors, matrices (rows = size(-2), cols = size(-1)) of shapes [3, 70, 400]
  // (crosses the grain), [7, 5000] (column blocks with a remainder), [6, 5, 3, 3] and [8, 4, 1, 1]
  // (1×1 matrices).
  template <class Tensor>
  static void StandardTensors(std::vector<Tensor>& tensors) {
    tensors.push_back({.numel = 3 * 70 * 400, .rows = 70, .cols = 400});
    tensors.push_back({.numel = 7 * 5000, .rows = 7, .cols = 5000});
    tensors.push_back({.numel = 6 * 5 * 3 * 3, .rows = 3, .cols = 3});
    tensors.push_back({.numel = 8 * 4, .rows = 1, .cols = 1});
  }
  // The states start as torch's, zeros: the first lerp weight is 1 (1^beta2_decay), so a start
  // value of another scale than g² would only cancel, in the oracle's a + w·(b − a) with a rounding
  // error of a's size.
  static constexpr bool kStandardZeroStates = true;

  // The kernel's shaped sweep (tests/kernel_test.cc). torch's defaults; lr above 1/√t (ρ = 1/√t),
  // decay, maximize, a large eps1 (V clamped), clipping at d = 1; eps2 above RMS(p), a large d (no
  // clipping), slow decay of β2.
  static std::vector<Hyper> Options() {
    return {
        Hyper{},
        Hyper{.lr = 1.0, .eps1 = 0.3, .weight_decay = 0.1, .maximize = true},
        Hyper{.lr = 0.05,
              .beta2_decay = -0.3,
              .eps1 = 1e-30,
              .eps2 = 2.0,
              .d = 50.0,
              .weight_decay = 0.0},
    };
  }
  static Hyper OtherGroup(Hyper h) {
    h.lr *= 0.5;
    h.weight_decay = h.weight_decay == 0.0 ? 0.02 : 0.0;
    h.beta2_decay = -0.6;
    return h;
  }
  // {rows, cols, numel}: every shape kind (vectors; matrices of one tile, several row tiles,
  // several column tiles, a batch).
  static std::vector<std::array<std::size_t, 3>> Shapes() {
    return {{0, 0, 1},
            {0, 0, 7},
            {0, 0, 65},
            {0, 0, 40000},
            {1, 1, 1},
            {3, 5, 15},
            {7, 33, 231},
            {2, 4100, std::size_t{3} * 2 * 4100},
            {1100, 40, 44000},
            {5, 300, std::size_t{3} * 5 * 300},
            {9, 1, 9},
            {1, 64, std::size_t{2} * 64},
            // small matrices grouped into tiles (a conv's 3x3 and 1x1 kernels), two tiles each
            {3, 3, std::size_t{9} * 5000},
            {1, 1, 40000}};
  }
  // The determinism workload: shapes of many tiles in two groups.
  static std::vector<Hyper> DeterminismGroups() {
    return {Hyper{.weight_decay = 0.01}, Hyper{.lr = 0.5, .maximize = true}};
  }
  static std::vector<std::array<std::size_t, 3>> DeterminismShapes() {
    return {{0, 0, 100003},     {3, 9000, 27000},
            {2000, 70, 140000}, {30, 50, std::size_t{4} * 1500},
            {1, 1, 70000},      {3, 3, std::size_t{9} * 4000}};
  }
};

// Validation and the Optimizer (tests/validation_test.cc, optimizer_test.cc).

namespace validation {

// torch's rules (lr, eps1, eps2, weight_decay >= 0, beta2_decay <= 0, d >= 1; NaN fails them all).
// Each with the parts its message must contain.
inline std::vector<std::pair<AdafactorHyper, std::vector<const char*>>> RejectedHypers(
    std::type_identity<AdafactorHyper> /*tag*/) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  return {
      {AdafactorHyper{.lr = -0.5}, {"lr", "-0.5"}},
      {AdafactorHyper{.lr = kNaN}, {"lr", "nan"}},
      {AdafactorHyper{.beta2_decay = 0.25}, {"beta2_decay", "0.25", "<= 0"}},
      {AdafactorHyper{.beta2_decay = kNaN}, {"beta2_decay", "nan"}},
      {AdafactorHyper{.eps1 = -1e-3}, {"eps1", "-0.001"}},
      {AdafactorHyper{.eps2 = -2.0}, {"eps2", "-2"}},
      {AdafactorHyper{.d = 0.5}, {"invalid d: 0.5", ">= 1"}},
      {AdafactorHyper{.weight_decay = -0.01}, {"weight_decay", "-0.01"}},
  };
}

// Every edge at once.
inline std::vector<AdafactorHyper> AcceptedHypers(std::type_identity<AdafactorHyper> /*tag*/) {
  return {AdafactorHyper{
      .lr = 0.0, .beta2_decay = 0.0, .eps1 = 0.0, .eps2 = 0.0, .d = 1.0, .weight_decay = 0.0}};
}

// Hyper-parameters under which every state slot is in use.
inline AdafactorHyper AllStatesHyper(std::type_identity<AdafactorHyper> /*tag*/) { return {}; }

// torch's state_dict key of each state slot.
inline std::vector<const char*> StateKeys(std::type_identity<AdafactorHyper> /*tag*/) {
  return {"row_var", "col_var", "variance"};
}

// Hyper-parameters and a state slot they need: the tests' segments are vectors (no rows or cols),
// which need variance only (a matrix's factors: the factored-segment test).
inline std::vector<std::pair<AdafactorHyper, int>> MissingStates(
    std::type_identity<AdafactorHyper> /*tag*/) {
  return {{AdafactorHyper{}, kAdafactorVariance}};
}

// Every slot a segment may need (which ones it does: its shape).
inline std::vector<std::pair<AdafactorHyper, unsigned>> RequiredStatesCases(
    std::type_identity<AdafactorHyper> /*tag*/) {
  return {{AdafactorHyper{}, 0b111u}};
}

// The value each state slot starts from (torch: zeros).
inline std::vector<std::pair<AdafactorHyper, std::vector<float>>> InitialStates(
    std::type_identity<AdafactorHyper> /*tag*/) {
  return {{AdafactorHyper{}, {0.0f, 0.0f, 0.0f}}};
}

// A param of more than one dimension is factored: the state slots of a matrix's row and column
// factors (Segment::rows and cols values) and of a vector's variance, in that order.
inline std::vector<int> FactoredSlots(std::type_identity<AdafactorHyper> /*tag*/) {
  return {kAdafactorRowVar, kAdafactorColVar, kAdafactorVariance};
}

// Hyper-parameters the factored-shape test steps with.
inline AdafactorHyper ShapedHyper(std::type_identity<AdafactorHyper> /*tag*/) {
  return {.lr = 0.5, .weight_decay = 0.1};
}

// Groups the Optimizer<> wiring test steps, each with its storage options (StorageOptions of
// fusedopt/optimizer.h: a template, so that this file needs no Optimizer header).
template <class Options>
std::vector<std::pair<std::vector<AdafactorHyper>, Options>> OptimizerCases(
    std::type_identity<AdafactorHyper> /*tag*/) {
  return {
      {{{.lr = 1e-2}, {.lr = 5e-3, .weight_decay = 0.1, .maximize = true}}, {}},
      {{{.lr = 1e-2, .beta2_decay = -0.5}, {.lr = 5e-3, .d = 2.0}},
       {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true}},
  };
}

}  // namespace validation

// The libtorch adapter (tests/torch/generic_test.cc).
template <>
struct TorchCase<AdafactorHyper> {
  // Every option away from its default; eps1 that of bfloat16 (torch's None for the bf16 params of
  // StateKeys).
  static AdafactorHyper TestHyper() {
    return {.lr = 5e-2,
            .beta2_decay = -0.6,
            .eps1 = 7.8125e-3,
            .eps2 = 2e-3,
            .d = 1.5,
            .weight_decay = 0.1};
  }
  // A matrix's factors: row_var [..., R, 1] and col_var [..., 1, C].
  static constexpr const char* kTensorKeys[] = {"row_var", "col_var"};
  static constexpr int kFactoredDims[] = {-1, -2};
  static constexpr bool kRefusesEmptyParams = true;  // torch's step divides by numel
};

}  // namespace fusedopt::ref
