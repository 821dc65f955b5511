// NAdam (torch.optim.NAdam: momentum_decay, decoupled_weight_decay, maximize): the descriptor the
// engine, the bindings and the tools read. The update rule is src/math/nadam_math.h, run by
// src/cpu/nadam.cc. Its per-tensor scalar state mu_product (Segment::scalars) is advanced here.
#pragma once

#include <cmath>
#include <span>

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

struct NadamScalars {
  float grad_mul;
  float weight_decay;   // coupled (L2) term, used when coupled_weight_decay
  float decay_mul;      // decoupled factor f32(1 − lr·wd); exactly 1 when off
  LerpCoef beta1_lerp;  // exp_avg.lerp_(grad, 1 − beta1)
  float beta2;
  float one_minus_beta2;
  float bias_correction2;  // 1 − beta2^step
  float eps;
  float grad_coef;     // c1 = −lr·(1 − mu) / (1 − mu_product)
  float exp_avg_coef;  // c2 = −lr·mu_next / (1 − mu_product·mu_next)
  bool coupled_weight_decay;
};

// Its kernel (src/cpu/nadam.cc), which runs src/math/nadam_math.h (src/core/kernels.h says what the
// entry points do).
void RunNadamChunks(const StepPlan<NadamScalars>& plan, std::size_t chunk_begin,
                    std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Nadam {
  using Hyper = NadamHyper;
  using Scalars = NadamScalars;
  static constexpr const char* kName = "nadam";
  static constexpr const char* kTorchName = "NAdam";
  static constexpr const char* kStepName = "NadamStep";
  static constexpr StateNames kStates = {"exp_avg", "exp_avg_sq", ""};
  static constexpr unsigned kUnsignedMapStates = 0b10;  // exp_avg_sq >= 0
  static constexpr std::array<const char*, 1> kScalarStates = {"mu_product"};
  static constexpr auto kFields = Fields(
      Field{"lr", &Hyper::lr}, Field{"beta1", &Hyper::beta1, "betas", 0},
      Field{"beta2", &Hyper::beta2, "betas", 1}, Field{"eps", &Hyper::eps},
      Field{"weight_decay", &Hyper::weight_decay}, Field{"momentum_decay", &Hyper::momentum_decay},
      Field{"decoupled_weight_decay", &Hyper::decoupled_weight_decay}.Optional(),
      Field{"maximize", &Hyper::maximize});

  static unsigned RequiredStates(const Hyper& /*h*/) { return 0b011u; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }
  // torch: state['mu_product'] = torch.tensor(1.0)
  static float InitialScalar(const Hyper& /*h*/, int /*k*/) { return 1.0f; }

  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.AtLeast("eps", h.eps, 0.0);
    c.Beta("beta1", h.beta1);
    c.Beta("beta2", h.beta2);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
    c.AtLeast("momentum_decay", h.momentum_decay, 0.0);
  }

  // The momentum coefficient of step t, in double (nadam.py 343-344):
  // mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay)).
  static double Mu(const Hyper& h, double t) {
    return h.beta1 * (1.0 - 0.5 * std::pow(0.96, t * h.momentum_decay));
  }

  // mu_product *= mu (351): the f32 0-d tensor times the double mu, which ATen rounds to f32 first.
  static void NextScalars(const Hyper& h, const Segment& s, std::span<float, 1> next) {
    const float mu = static_cast<float>(Mu(h, static_cast<double>(s.step)));
    next[kNadamMuProduct] = *s.scalars[kNadamMuProduct] * mu;
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s, std::span<const float, 1> next) {
    const auto t = static_cast<double>(s.step);
    const bool decoupled = h.decoupled_weight_decay && h.weight_decay != 0.0;
    const double mu = Mu(h, t);
    const double mu_next = Mu(h, t + 1.0);
    const double mu_product = next[kNadamMuProduct];  // mu_product.item(), the new value
    return {
        .grad_mul = GradMul(h.maximize, s.grad_scale),
        .weight_decay = static_cast<float>(h.weight_decay),
        .decay_mul = decoupled ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f,
        .beta1_lerp = MakeLerp(1.0 - h.beta1),
        .beta2 = static_cast<float>(h.beta2),
        .one_minus_beta2 = static_cast<float>(1.0 - h.beta2),
        .bias_correction2 = static_cast<float>(1.0 - std::pow(h.beta2, t)),
        .eps = static_cast<float>(h.eps),
        // 372: -lr * (1.0 - mu) / (1.0 - mu_product)
        .grad_coef = static_cast<float>(-h.lr * (1.0 - mu) / (1.0 - mu_product)),
        // 369, 376: (-lr * mu_next) / (1.0 - mu_product * mu_next)
        .exp_avg_coef = static_cast<float>((-h.lr * mu_next) / (1.0 - mu_product * mu_next)),
        .coupled_weight_decay = !h.decoupled_weight_decay && h.weight_decay != 0.0,
    };
  }

  static constexpr auto kRun = RunNadamChunks;

  // torch/optim/nadam.py (torch 2.13), _single_tensor_nadam, one tensor op per line
  // (descriptor.h). step_t += 1 (330) and mu_product *= mu (351) are 0-d host updates: the product
  // is rebuilt here from the step, in f32 as torch keeps it.
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      if (h.maximize) grad = t.neg(grad);  // 305: grad = grads[i] if not maximize else -grads[i]
      const auto step_t = static_cast<double>(t.step());
      const double bias_correction2 = 1.0 - std::pow(h.beta2, step_t);  // 337
      if (h.weight_decay != 0.0) {
        if (h.decoupled_weight_decay) {
          t.mul_(t.param(), 1.0 - h.lr * h.weight_decay);  // 342: param.mul_(1 - lr * wd)
        } else {
          grad = t.add(grad, t.param(), h.weight_decay);  // 344: grad.add(param, alpha=wd)
        }
      }
      const double mu = Mu(h, step_t);             // 347
      const double mu_next = Mu(h, step_t + 1.0);  // 348
      float mu_product = 1.0f;                     // 351: mu_product *= mu, for steps 1..t
      for (std::int64_t i = 1; i <= t.step(); ++i) {
        mu_product *= static_cast<float>(Mu(h, static_cast<double>(i)));
      }
      const auto exp_avg = t.state(kNadamExpAvg);
      const auto exp_avg_sq = t.state(kNadamExpAvgSq);
      t.lerp_(exp_avg, grad, 1.0 - h.beta1);              // 354: exp_avg.lerp_(grad, 1 - beta1)
      t.mul_(exp_avg_sq, h.beta2);                        // 355: exp_avg_sq.mul_(beta2)
      t.addcmul_(exp_avg_sq, grad, grad, 1.0 - h.beta2);  //   .addcmul_(grad, grad, 1 - beta2)
      const auto scaled = t.div(exp_avg_sq, bias_correction2);  // 356: exp_avg_sq.div(bc2)
      const auto denom = t.sqrt(scaled);                        //   .sqrt()
      t.add_(denom, h.eps);                                     // 370: denom.add_(eps)
      const double mp = mu_product;
      t.addcdiv_(t.param(), grad, denom,
                 -h.lr * (1.0 - mu) / (1.0 - mp));  // 371: addcdiv_(grad, ...)
      t.addcdiv_(t.param(), exp_avg, denom,
                 (-h.lr * mu_next) / (1.0 - mp * mu_next));  // 374: addcdiv_(exp_avg, denom)
    });
  }
};

}  // namespace fusedopt::algos
