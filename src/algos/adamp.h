// AdamP (Heo et al. 2021) as clovaai's adamp.AdamP computes it, the update torch_npu's
// NpuFusedAdamP ports (shared/docs/algorithms-more.md §1.1): the descriptor the engine, the
// bindings and the tools read. Two phases, per channel row: src/cpu/adamp.cc first reduces, for
// every row of a param with more than one dimension (its view(size(0), -1), Segment::rows), Σg·p,
// Σg², Σp² and Σp·u; Finish decides the projection (per channel, for the whole layer, or none) as
// the reference does, from the cosine similarity of the raw gradient and the param, and the update
// pass projects, decays and steps. The math is src/math/adamp_math.h.
#pragma once

#include <algorithm>
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

// AdamP's first pass reduces, per channel row of a param with more than one dimension, Σg·p, Σg²,
// Σp² and Σp·u (g the raw gradient, u the perturbation before the projection); Adamp::Finish picks
// the projection and fills its per-row values and the decay in between.
struct AdampScalars {
  float grad_mul;  // grad_scale: the loss-scale and clip factors, applied as the gradient is read
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;  // math.sqrt(1 − β2^t)
  float eps;
  float neg_step_size;  // −lr / (1 − β1^t)
  float decay_mul;  // 1 − lr·wd·wd_ratio (wd_ratio 1 unprojected), set after the reduction pass
  std::size_t reduce_row_length;   // numel / Segment::rows; 0: at most one dimension (no sums)
  std::size_t project_row_length;  // set by Finish: the channel row length, numel (the layer), 0
  const float* row_values;         // set by Finish: per projected row ‖p_r‖ + eps and Σ p̂·u
  bool nesterov;
  bool decay;  // weight_decay > 0
};

// Its kernel (src/cpu/adamp.cc), which runs src/math/adamp_math.h (src/core/kernels.h says what the
// entry points do).
void RunAdampReduceChunk(const StepPlan<AdampScalars>& plan, std::size_t chunk, double* sums);
void RunAdampChunks(const StepPlan<AdampScalars>& plan, std::size_t chunk_begin,
                    std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Adamp {
  using Hyper = AdampHyper;
  using Scalars = AdampScalars;
  static constexpr const char* kName = "adamp";
  static constexpr const char* kTorchName = "AdamP";
  static constexpr const char* kStepName = "AdampStep";
  static constexpr StateNames kStates = {"exp_avg", "exp_avg_sq", ""};
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"beta1", &Hyper::beta1, "betas", 0},
             Field{"beta2", &Hyper::beta2, "betas", 1}, Field{"eps", &Hyper::eps},
             Field{"weight_decay", &Hyper::weight_decay}, Field{"delta", &Hyper::delta},
             Field{"wd_ratio", &Hyper::wd_ratio}, Field{"nesterov", &Hyper::nesterov});

  static unsigned RequiredStates(const Hyper& /*h*/) { return 0b011u; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }

  // clovaai checks nothing; these are torch.optim.Adam's rules, and delta, wd_ratio >= 0 (finite).
  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.AtLeast("eps", h.eps, 0.0);
    c.Beta("beta1", h.beta1);
    c.Beta("beta2", h.beta2);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
    c.AtLeast("delta", h.delta, 0.0);
    c.AtLeast("wd_ratio", h.wd_ratio, 0.0);
    c.Finite("wd_ratio", h.wd_ratio);
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    const auto t = static_cast<double>(s.step);
    const double bias_correction1 = 1.0 - std::pow(h.beta1, t);  // 1 - beta1 ** state['step']
    const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
    return {
        .grad_mul = s.grad_scale,
        .beta1 = static_cast<float>(h.beta1),
        .one_minus_beta1 = static_cast<float>(1.0 - h.beta1),
        .beta2 = static_cast<float>(h.beta2),
        .one_minus_beta2 = static_cast<float>(1.0 - h.beta2),
        .bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2)),
        .eps = static_cast<float>(h.eps),
        .neg_step_size = static_cast<float>(-(h.lr / bias_correction1)),
        .decay_mul = 1.0f,
        .reduce_row_length = s.rows > 0 ? s.numel / s.rows : 0,
        .project_row_length = 0,
        .row_values = nullptr,
        .nesterov = h.nesterov,
        .decay = h.weight_decay > 0.0,
    };
  }

  // The reduction pass gives, per channel row, Σg·p, Σg², Σp² and Σp·u (g the raw gradient, u the
  // perturbation before the projection); Finish writes per projected row ‖p_r‖ + ε and Σ_r p̂·u.
  static constexpr int kReductions = 4;
  static constexpr int kRowValues = 2;
  static constexpr auto kReduce = RunAdampReduceChunk;
  // A param of at most one dimension has no rows to reduce (reduce_row_length 0): kReduce skips it.
  static bool ReducesSegment(const Segment& s) { return s.rows > 0; }

  // |cos| of the raw gradient and the param over one view row, as F.cosine_similarity(x, y, dim=1,
  // eps).abs_() (each norm clamped at eps), from the row's sums (the reference's f32 result only
  // decides a comparison).
  static float Cosine(double grad_param, double grad_sq, double param_sq, double eps) {
    return static_cast<float>(std::abs(grad_param) / (std::max(std::sqrt(grad_sq), eps) *
                                                      std::max(std::sqrt(param_sq), eps)));
  }

  // clovaai's _projection: the channel view (rows = size(0)) first, then the layer view (one row);
  // the first whose max |cos| is below delta / sqrt(row length) (compared in f32, as a 0-d f32
  // tensor against a Python float) projects u row by row and scales the decay by wd_ratio. A NaN
  // similarity compares false, so it projects nothing. p̂ = p / (‖p_r‖ + ε) in f32 and
  // Σ p̂·u = Σ p·u / (‖p_r‖ + ε), both from the row's sums. Params with at most one dimension
  // (rows 0) are never projected.
  static void Finish(const Hyper& h, const Segment& s, std::span<const double> sums,
                     Scalars& scalars, std::span<float> row_values) {
    double wd_ratio = 1.0;
    scalars.project_row_length = 0;
    scalars.row_values = row_values.data();
    if (s.rows > 0 && s.numel > 0) {
      const std::size_t rows = s.rows;
      const auto eps = static_cast<float>(h.eps);
      // Writes row r's ‖p_r‖ + ε and Σ p̂·u from its Σp² and Σp·u.
      const auto project = [&](std::size_t r, double param_sq, double param_update) {
        const float norm_eps = static_cast<float>(std::sqrt(param_sq)) + eps;
        row_values[2 * r] = norm_eps;
        row_values[2 * r + 1] = static_cast<float>(param_update / norm_eps);
      };
      // channel view: max over rows of |cos| (NaN if any is NaN, as torch's max)
      float channel_max = 0.0f;
      for (std::size_t r = 0; r < rows && !std::isnan(channel_max); ++r) {
        const float c = Cosine(sums[4 * r], sums[4 * r + 1], sums[4 * r + 2], h.eps);
        channel_max = std::isnan(c) ? c : std::max(channel_max, c);
      }
      const std::size_t row_length = s.numel / rows;
      if (channel_max < static_cast<float>(h.delta / std::sqrt(static_cast<double>(row_length)))) {
        for (std::size_t r = 0; r < rows; ++r) project(r, sums[4 * r + 2], sums[4 * r + 3]);
        scalars.project_row_length = row_length;
      } else {
        double total[4] = {};  // the layer view: the rows' sums, added in row order
        for (std::size_t r = 0; r < rows; ++r) {
          for (int k = 0; k < 4; ++k) total[k] += sums[4 * r + k];
        }
        const float layer = Cosine(total[0], total[1], total[2], h.eps);
        if (layer < static_cast<float>(h.delta / std::sqrt(static_cast<double>(s.numel)))) {
          project(0, total[2], total[3]);
          scalars.project_row_length = s.numel;
        }
      }
      if (scalars.project_row_length != 0) wd_ratio = h.wd_ratio;
    }
    // p.data.mul_(1 - lr * weight_decay * wd_ratio): a Python double, rounded once
    scalars.decay_mul = static_cast<float>(1.0 - h.lr * h.weight_decay * wd_ratio);
  }

  static constexpr auto kRun = RunAdampChunks;

  // clovaai's AdamP.step, one tensor op per line (descriptor.h), a new tensor where the reference
  // makes one. The projection's per-row reductions and broadcasts are the row ops of the
  // vocabulary; F.cosine_similarity(x, y, dim=1, eps) is ATen's: the two row norms clamped at eps,
  // x / ‖x_r‖ and y / ‖y_r‖, their product and its row sums. The reference branches on the values
  // (a host sync): here the branch taken depends on the row ops' results (the doctor's are zeros,
  // so it counts the channel projection of every tensor with rows).
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      const auto grad = t.grad();
      const auto exp_avg = t.state(kAdampExpAvg);
      const auto exp_avg_sq = t.state(kAdampExpAvgSq);
      const auto step_t = static_cast<double>(t.step());
      const double bias_correction1 = 1.0 - std::pow(h.beta1, step_t);
      const double bias_correction2 = 1.0 - std::pow(h.beta2, step_t);
      t.mul_(exp_avg, h.beta1);              // exp_avg.mul_(beta1)
      t.add_(exp_avg, grad, 1.0 - h.beta1);  //   .add_(grad, alpha=1 - beta1)
      t.mul_(exp_avg_sq, h.beta2);           // exp_avg_sq.mul_(beta2)
      t.addcmul_(exp_avg_sq, grad, grad,
                 1.0 - h.beta2);        //   .addcmul_(grad, grad, value=1 - beta2)
      auto denom = t.sqrt(exp_avg_sq);  // denom = (exp_avg_sq.sqrt()
      denom = t.div(denom, std::sqrt(bias_correction2));  //   / math.sqrt(bias_correction2))
      t.add_(denom, h.eps);                               //   .add_(eps)
      auto perturb = exp_avg;
      if (h.nesterov) {
        const auto momentum = t.mul(exp_avg, h.beta1);          // beta1 * exp_avg
        const auto current = t.mul(grad, 1.0 - h.beta1);        // (1 - beta1) * grad
        perturb = t.div(t.add(momentum, current, 1.0), denom);  // (... + ...) / denom
      } else {
        perturb = t.div(exp_avg, denom);  // perturb = exp_avg / denom
      }
      double wd_ratio = 1.0;
      // if len(p.shape) > 1: for view_func in [channel_view, layer_view]
      for (const std::size_t rows : {t.rows(), t.rows() > 0 ? std::size_t{1} : std::size_t{0}}) {
        if (rows == 0) break;
        // cosine_similarity(view(grad), view(p), dim=1, eps).abs_()
        std::vector<double> grad_norm = t.row_norms(grad, rows);        // vector_norm(x1, dim=1)
        std::vector<double> param_norm = t.row_norms(t.param(), rows);  // vector_norm(x2, dim=1)
        for (double& x : grad_norm) x = std::max(x, h.eps);             // .clamp_min_(eps)
        for (double& x : param_norm) x = std::max(x, h.eps);
        const auto grad_unit = t.div_rows(grad, grad_norm);            // x1 / x1_norm
        const auto param_unit = t.div_rows(t.param(), param_norm);     // x2 / x2_norm
        const auto product = t.mul(grad_unit, param_unit);             // (...) * (...)
        const std::vector<double> cosine = t.row_sums(product, rows);  // .sum(dim=1)
        float largest = 0.0f;                                          // .abs_() ... .max()
        for (const double c : cosine) largest = std::max(largest, static_cast<float>(std::abs(c)));
        // NOLINTNEXTLINE(bugprone-integer-division): exact, numel is rows * size(1)
        const double bound = h.delta / std::sqrt(static_cast<double>(t.numel() / rows));
        if (!(largest < static_cast<float>(bound))) continue;  // < delta / math.sqrt(size(1))
        // p_n = p.data / view_func(p.data).norm(dim=1).view(expand_size).add_(eps)
        std::vector<double> norm = t.row_norms(t.param(), rows);
        for (double& x : norm) x = static_cast<float>(x) + static_cast<float>(h.eps);
        const auto unit = t.div_rows(t.param(), norm);
        // perturb -= p_n * view_func(p_n * perturb).sum(dim=1).view(expand_size)
        const std::vector<double> radial = t.row_sums(t.mul(unit, perturb), rows);
        t.add_(perturb, t.mul_rows(unit, radial), -1.0);
        wd_ratio = h.wd_ratio;
        break;
      }
      if (h.weight_decay > 0.0) {
        t.mul_(t.param(),
               1.0 - h.lr * h.weight_decay * wd_ratio);  // p.data.mul_(1 - lr*wd*wd_ratio)
      }
      t.add_(t.param(), perturb,
             -(h.lr / bias_correction1));  // p.data.add_(perturb, alpha=-step_size)
    });
  }
};

}  // namespace fusedopt::algos
