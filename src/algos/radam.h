// RAdam (torch.optim.RAdam: decoupled_weight_decay, maximize): the descriptor the engine, the
// bindings and the tools read. The update rule is src/math/radam_math.h, run by src/cpu/radam.cc.
#pragma once

#include <cmath>

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

struct RadamScalars {
  float grad_mul;
  float weight_decay;   // coupled (L2) term, used when coupled_weight_decay
  float decay_mul;      // decoupled factor f32(1 − lr·wd); exactly 1 when off
  LerpCoef beta1_lerp;  // exp_avg.lerp_(grad, 1 − beta1)
  float beta2;
  float one_minus_beta2;
  float bias_correction1;  // 1 − beta1^step
  float lr;
  float bias_correction2_sqrt;  // (1 − beta2^step)**0.5
  float eps;
  float rect;  // the rectification term (rectified steps only)
  bool coupled_weight_decay;
  bool rectified;  // rho_t > 5: the adaptive, rectified step; else p −= lr·m̂
};

// Its kernel (src/cpu/radam.cc), which runs src/math/radam_math.h (src/core/kernels.h says what the
// entry points do).
void RunRadamChunks(const StepPlan<RadamScalars>& plan, std::size_t chunk_begin,
                    std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Radam {
  using Hyper = RadamHyper;
  using Scalars = RadamScalars;
  static constexpr const char* kName = "radam";
  static constexpr const char* kTorchName = "RAdam";
  static constexpr const char* kStepName = "RadamStep";
  static constexpr StateNames kStates = {"exp_avg", "exp_avg_sq", ""};
  static constexpr unsigned kUnsignedMapStates = 0b10;  // exp_avg_sq >= 0
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"beta1", &Hyper::beta1, "betas", 0},
             Field{"beta2", &Hyper::beta2, "betas", 1}, Field{"eps", &Hyper::eps},
             Field{"weight_decay", &Hyper::weight_decay},
             Field{"decoupled_weight_decay", &Hyper::decoupled_weight_decay}.Optional(),
             Field{"maximize", &Hyper::maximize});

  static unsigned RequiredStates(const Hyper& /*h*/) { return 0b011u; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }

  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.AtLeast("eps", h.eps, 0.0);
    c.Beta("beta1", h.beta1);
    c.Beta("beta2", h.beta2);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
  }

  // rho_t and the rectification term of torch's step, in double (radam.py 321-331).
  struct Rectification {
    bool rectified;
    double rect;
  };
  static Rectification Rectify(const Hyper& h, double t) {
    const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
    const double rho_inf = 2.0 / (1.0 - h.beta2) - 1.0;
    const double rho_t = rho_inf - 2.0 * t * std::pow(h.beta2, t) / bias_correction2;
    if (!(rho_t > 5.0)) return {false, 1.0};
    const double rect = std::pow(
        (rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t), 0.5);
    return {true, rect};
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    const auto t = static_cast<double>(s.step);
    const bool decoupled = h.decoupled_weight_decay && h.weight_decay != 0.0;
    const Rectification r = Rectify(h, t);
    return {
        .grad_mul = GradMul(h.maximize, s.grad_scale),
        .weight_decay = static_cast<float>(h.weight_decay),
        .decay_mul = decoupled ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f,
        .beta1_lerp = MakeLerp(1.0 - h.beta1),
        .beta2 = static_cast<float>(h.beta2),
        .one_minus_beta2 = static_cast<float>(1.0 - h.beta2),
        .bias_correction1 = static_cast<float>(1.0 - std::pow(h.beta1, t)),
        .lr = static_cast<float>(h.lr),
        .bias_correction2_sqrt = static_cast<float>(std::pow(1.0 - std::pow(h.beta2, t), 0.5)),
        .eps = static_cast<float>(h.eps),
        .rect = static_cast<float>(r.rect),
        .coupled_weight_decay = !h.decoupled_weight_decay && h.weight_decay != 0.0,
        .rectified = r.rectified,
    };
  }

  static constexpr auto kRun = RunRadamChunks;

  // torch/optim/radam.py (torch 2.13), _single_tensor_radam, one tensor op per line
  // (descriptor.h). The scalar step_t += 1 (301) moves no tensor data; rho_t is host arithmetic.
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      if (h.maximize) grad = t.neg(grad);  // 278: grad = grads[i] if not maximize else -grads[i]
      if (h.weight_decay != 0.0) {
        if (h.decoupled_weight_decay) {
          t.mul_(t.param(), 1.0 - h.lr * h.weight_decay);  // 306: param.mul_(1 - lr * wd)
        } else {
          grad = t.add(grad, t.param(), h.weight_decay);  // 308: grad.add(param, alpha=wd)
        }
      }
      const auto exp_avg = t.state(kRadamExpAvg);
      const auto exp_avg_sq = t.state(kRadamExpAvgSq);
      t.lerp_(exp_avg, grad, 1.0 - h.beta1);              // 311: exp_avg.lerp_(grad, 1 - beta1)
      t.mul_(exp_avg_sq, h.beta2);                        // 312: exp_avg_sq.mul_(beta2)
      t.addcmul_(exp_avg_sq, grad, grad, 1.0 - h.beta2);  //   .addcmul_(grad, grad, 1 - beta2)
      const auto step_t = static_cast<double>(t.step());
      const double bias_correction1 = 1.0 - std::pow(h.beta1, step_t);  // 314
      const double bias_correction2 = 1.0 - std::pow(h.beta2, step_t);  // 315
      const auto corrected = t.div(exp_avg, bias_correction1);  // 318: exp_avg / bias_correction1
      const auto update = t.mul(corrected, h.lr);               // 351: bias_corrected_exp_avg * lr
      const Rectification r = Rectify(h, step_t);               // 321-331
      if (r.rectified) {
        const auto root = t.sqrt(exp_avg_sq);  // 334: exp_avg_sq.sqrt()
        t.add_(root, h.eps);                   // 338: .add_(eps)
        // 340: (bias_correction2**0.5) / exp_avg_sq_sqrt, as torch evaluates a scalar / tensor
        const auto inverse = t.reciprocal(root);
        const auto adaptive_lr = t.mul(inverse, std::pow(bias_correction2, 0.5));
        const auto scaled = t.mul(update, adaptive_lr);  // 353: * _compute_adaptive_lr()
        const auto rectified = t.mul(scaled, r.rect);    // 354: * _compute_rect()
        t.add_(t.param(), rectified, -1.0);              // 350: param.add_(..., alpha=-1.0)
      } else {
        t.add_(t.param(), update,
               -1.0);  // 358: param.add_(bias_corrected_exp_avg * lr, alpha=-1.0)
      }
    });
  }
};

}  // namespace fusedopt::algos
