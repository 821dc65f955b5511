// Adafactor as torch 2.13's torch.optim.Adafactor computes it (_single_tensor_adafactor,
// shared/docs/algorithms-more.md §2.5): the descriptor the engine, the bindings and the tools read.
// A factored algorithm: its state buffers are not shaped like the param. A param with more than one
// dimension (Segment::rows = size(-2), Segment::cols = size(-1), a batch of numel / (rows·cols)
// matrices) keeps row_var (batch·rows) and col_var (batch·cols); a vector keeps variance (numel).
// The step (src/core/factored_step.h, RunFactoredStep) runs over tiles (src/core/tiles.h): the
// stats pass gives Σp² and each matrix's row and column sums of g² (a vector: Σp² and ΣU²),
// the host lerps the small factors (Factors, RowMean) and computes Alpha, the norm pass gives ΣU²
// of a matrix from the new factors, NegAlpha the clipping, and the update pass writes the param
// (and a vector's variance); the new factors are stored last. The math is
// src/math/adafactor_math.h.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

// Adafactor's coefficients of one tensor. The factors and neg_alpha are set between the passes (by
// Adafactor::FinishStats and FinishNorm), from the sums of the passes before.
struct AdafactorScalars {
  float grad_mul;          // −grad_scale with maximize, else grad_scale
  LerpCoef variance_lerp;  // variance.lerp_(grad * grad, t^beta2_decay) (vectors)
  float eps1_sq;           // clamp_(min=eps1 * eps1): the double product, rounded once
  float decay_mul;         // param.mul_(1 − lr·wd): rounded once; 1 when wd = 0
  float neg_alpha;         // −alpha / denom, set after the ‖U‖ pass
  std::size_t rows;        // Segment::rows (size(-2)); 0: a vector (variance)
  std::size_t cols;        // Segment::cols (size(-1))
  const float* row_var;    // batch·rows: the row factors after this step's lerp
  const float* col_var;    // batch·cols: the column factors after this step's lerp
  const float* row_mean;   // batch: row_var.mean(dim=-2).clamp_(min=eps1)
  bool decay;              // weight_decay != 0
};

// Its kernel (src/cpu/adafactor.cc), which runs src/math/adafactor_math.h (src/core/kernels.h says
// what the entry points do). A factored algorithm runs over tiles (src/core/tiles.h): one pass over
// tiles [tile_begin, tile_end), writing each reduction pass's sums at sums + tile.out.
void RunAdafactorTiles(const TilePlan<AdafactorScalars>& plan, TilePass pass,
                       std::size_t tile_begin, std::size_t tile_end, double* sums);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Adafactor {
  using Hyper = AdafactorHyper;
  using Scalars = AdafactorScalars;
  static constexpr const char* kName = "adafactor";
  static constexpr const char* kTorchName = "Adafactor";
  static constexpr const char* kStepName = "AdafactorStep";
  static constexpr StateNames kStates = {"row_var", "col_var", "variance"};
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"beta2_decay", &Hyper::beta2_decay},
             Field{"eps1", &Hyper::eps1, "eps", 0}.Nullable(),
             Field{"eps2", &Hyper::eps2, "eps", 1}, Field{"d", &Hyper::d},
             Field{"weight_decay", &Hyper::weight_decay}, Field{"maximize", &Hyper::maximize});

  // Every slot may be needed: row_var and col_var by a param with more than one dimension,
  // variance by the others (SegmentStates says which one a segment needs).
  static unsigned RequiredStates(const Hyper& /*h*/) { return 0b111u; }
  static unsigned SegmentStates(const Segment& s) { return s.rows > 0 ? 0b011u : 0b100u; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }

  // torch's checks (its messages: "Learning rate should be >= 0 but is: ...", ...).
  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    if (!(h.beta2_decay <= 0.0)) {
      c.Reject("invalid beta2_decay: ", h.beta2_decay, " (must be <= 0)");
    }
    c.AtLeast("eps1", h.eps1, 0.0);
    c.AtLeast("eps2", h.eps2, 0.0);
    c.AtLeast("d", h.d, 1.0);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
  }

  // A factored algorithm (RunFactoredStep in src/core/factored_step.h instead of the chunk passes).
  static constexpr bool kFactored = true;
  static constexpr int kRowFactorSlot = kAdafactorRowVar;  // a matrix's factors
  static constexpr int kColFactorSlot = kAdafactorColVar;
  static constexpr auto kRunTiles = RunAdafactorTiles;

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    const auto t = static_cast<double>(s.step);  // step_float = step_t.item()
    return {
        .grad_mul = GradMul(h.maximize, s.grad_scale),
        .variance_lerp = MakeLerp(std::pow(t, h.beta2_decay)),  // one_minus_beta2_t
        .eps1_sq = static_cast<float>(h.eps1 * h.eps1),
        .decay_mul = h.weight_decay != 0.0 ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f,
        .neg_alpha = 0.0f,
        .rows = s.rows,
        .cols = s.cols,
        .row_var = nullptr,
        .col_var = nullptr,
        .row_mean = nullptr,
        .decay = h.weight_decay != 0.0,
    };
  }

  // f32 lerp_(end, w) of one element, as the kernels' Lerp (src/math/lerp_math.h).
  static float Lerp(float self, float end, const LerpCoef& c) {
    const float diff = end - self;
    return c.from_end ? std::fma(c.weight_minus_one, diff, end) : std::fma(c.weight, diff, self);
  }

  // alpha = max(eps2, param.norm(2).item() / (param.numel() ** 0.5)) * rho_t, from Σp² (the
  // norm is an f32 tensor, read as a double) and the param's numel (its whole tensor's, for a
  // shard).
  static double Alpha(const Hyper& h, const Segment& s, std::size_t numel, double param_sq) {
    const auto t = static_cast<double>(s.step);
    const double inv_sqrt_t = 1.0 / std::pow(t, 0.5);
    const double rho = inv_sqrt_t < h.lr ? inv_sqrt_t : h.lr;  // min(lr, 1 / (step_float**0.5))
    const double rms =
        static_cast<float>(std::sqrt(param_sq)) / std::pow(static_cast<double>(numel), 0.5);
    return (rms > h.eps2 ? rms : h.eps2) * rho;  // Python's max(eps2, rms): eps2 unless rms > eps2
  }

  // A factored param's new factors, from its row sums (batch·rows) and column sums (batch·cols) of
  // g²; row_var and col_var hold the old factors and receive the new ones. `rows` is the whole
  // matrix's size(-2) (a shard may hold some of its rows only: its column sums are the whole's):
  //   row_mean = torch.norm(grad, dim=-1, keepdim=True).square_().div_(grad.size(-1))
  //   row_var.lerp_(row_mean, one_minus_beta2_t)
  //   col_mean = torch.norm(grad, dim=-2, keepdim=True).square_().div_(grad.size(-2))
  //   col_var.lerp_(col_mean, one_minus_beta2_t)
  static void Factors(const Hyper& /*h*/, const Scalars& sc, std::size_t rows,
                      std::span<const double> row_sums, std::span<const double> col_sums,
                      std::span<float> row_var, std::span<float> col_var) {
    const auto mean_square = [](double sum, std::size_t n) {
      const auto norm = static_cast<float>(std::sqrt(sum));  // the f32 norm
      return norm * norm / static_cast<float>(n);            // .square_().div_(n)
    };
    for (std::size_t i = 0; i < row_var.size(); ++i) {
      row_var[i] = Lerp(row_var[i], mean_square(row_sums[i], sc.cols), sc.variance_lerp);
    }
    for (std::size_t i = 0; i < col_var.size(); ++i) {
      col_var[i] = Lerp(col_var[i], mean_square(col_sums[i], rows), sc.variance_lerp);
    }
  }

  // row_var.mean(dim=-2, keepdim=True).clamp_(min=eps1) of one matrix, from the sum (in double, in
  // row order) of its `rows` new row factors.
  static float RowMean(const Hyper& h, double row_var_sum, std::size_t rows) {
    const auto mean = static_cast<float>(row_var_sum / static_cast<double>(rows));
    const auto eps1 = static_cast<float>(h.eps1);
    return std::isnan(mean) || mean > eps1 ? mean : eps1;  // clamp_ keeps a NaN
  }

  //   denom = max(1.0, update.norm(2).item() / ((update.numel() ** 0.5) * d))
  //   param.add_(update, alpha=-alpha / denom)
  static float NegAlpha(const Hyper& h, std::size_t numel, double alpha, double update_sq) {
    const double ratio = static_cast<float>(std::sqrt(update_sq)) /
                         (std::pow(static_cast<double>(numel), 0.5) * h.d);
    const double denom = ratio > 1.0 ? ratio : 1.0;  // Python's max(1.0, ratio)
    return static_cast<float>(-alpha / denom);
  }

  // The shape of each state slot's tensor in StandardStep (torch's _init_group: row_var
  // grad.shape with size(-1) 1, col_var with size(-2) 1, variance the param's).
  static constexpr std::array<Shape, kMaxStates> kStateShapes = {Shape::kRows, Shape::kCols,
                                                                 Shape::kParam};

  // torch 2.13's _single_tensor_adafactor, one tensor op per line (descriptor.h), a new tensor
  // where the reference makes one. The norms' .item() are f32 values read as doubles; Python's
  // min(a, b) is a unless b < a, max(a, b) a unless b > a.
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    step.ForEachTensor([&](auto& t) {
      const auto param = t.param();
      // grad = grads[i] if not maximize else -grads[i]
      const auto grad = h.maximize ? t.neg(t.grad()) : t.grad();
      const auto step_float = static_cast<double>(t.step());  // step_t += 1; step_t.item()
      const double one_minus_beta2_t = std::pow(step_float, h.beta2_decay);
      const double inv_sqrt = 1.0 / std::pow(step_float, 0.5);
      const double rho_t = inv_sqrt < h.lr ? inv_sqrt : h.lr;  // min(lr, 1 / (step_float**0.5))
      const double sqrt_numel = std::pow(static_cast<double>(t.numel()), 0.5);
      const double rms = static_cast<float>(t.norm(param)) / sqrt_numel;
      const double alpha = (rms > h.eps2 ? rms : h.eps2) * rho_t;  // max(eps2, ...) * rho_t
      if (h.weight_decay != 0.0) t.mul_(param, 1.0 - h.lr * h.weight_decay);
      const auto var_estimate = [&] {
        if (t.matrices()) {  // if grad.dim() > 1
          const auto row_var = t.state(kAdafactorRowVar, kStateShapes[kAdafactorRowVar]);
          const auto col_var = t.state(kAdafactorColVar, kStateShapes[kAdafactorColVar]);
          const auto row_mean = t.norm(grad, -1);  // torch.norm(grad, dim=-1, keepdim=True)
          t.square_(row_mean);                     //   .square_()
          t.div_(row_mean, static_cast<double>(t.size(-1)));  //   .div_(grad.size(-1))
          t.lerp_(row_var, row_mean, one_minus_beta2_t);      // row_var.lerp_(row_mean, ...)
          const auto col_mean = t.norm(grad, -2);  // torch.norm(grad, dim=-2, keepdim=True)
          t.square_(col_mean);                     //   .square_()
          t.div_(col_mean, static_cast<double>(t.size(-2)));  //   .div_(grad.size(-2))
          t.lerp_(col_var, col_mean, one_minus_beta2_t);      // col_var.lerp_(col_mean, ...)
          auto estimate = t.matmul(row_var, col_var);         // var_estimate = row_var @ col_var
          const auto mean = t.mean(row_var, -2);              // row_var.mean(dim=-2, keepdim=True)
          t.clamp_(mean, h.eps1, kInf);                       //   .clamp_(min=eps1)
          t.div_(estimate, mean);                             // var_estimate.div_(...)
          return estimate;
        }
        const auto variance = t.state(kAdafactorVariance, kStateShapes[kAdafactorVariance]);
        const auto grad_squared = t.mul(grad, grad);         // grad_squared = grad * grad
        t.lerp_(variance, grad_squared, one_minus_beta2_t);  // variance.lerp_(grad_squared, ...)
        return t.clone(variance);                            // var_estimate = variance.clone()
      }();
      // update = var_estimate.clamp_(min=eps1 * eps1).rsqrt_()
      t.clamp_(var_estimate, h.eps1 * h.eps1, kInf);
      const auto update = t.rsqrt_(var_estimate);
      t.mul_(update, grad);  // update.mul_(grad)
      // denom = max(1.0, update.norm(2).item() / ((update.numel() ** 0.5) * d))
      const double ratio = static_cast<float>(t.norm(update)) / (sqrt_numel * h.d);
      const double denom = ratio > 1.0 ? ratio : 1.0;
      t.add_(param, update, -alpha / denom);  // param.add_(update, alpha=-alpha / denom)
    });
  }
};

}  // namespace fusedopt::algos
