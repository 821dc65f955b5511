// Adam and AdamW (torch.optim.Adam / AdamW, amsgrad, maximize): the descriptors the engine, the
// bindings and the tools read. The update rule is src/math/adam_math.h, run by src/cpu/adam.cc.
#pragma once

#include <cmath>

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

struct AdamScalars {
  float grad_mul;
  float weight_decay;   // coupled (Adam) L2 term, used when coupled_weight_decay
  float decay_mul;      // decoupled (AdamW) factor f32(1 − lr·wd); exactly 1 when off
  LerpCoef beta1_lerp;  // exp_avg.lerp_(grad, 1 − beta1)
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;
  float eps;
  float neg_step_size;  // −lr / (1 − beta1^step)
  bool coupled_weight_decay;
  bool amsgrad;
};

// Its kernel (src/cpu/adam.cc), which runs src/math/adam_math.h (src/core/kernels.h says what the
// entry points do).
void RunAdamChunks(const StepPlan<AdamScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Adam {
  using Hyper = AdamHyper;
  using Scalars = AdamScalars;
  static constexpr const char* kName = "adam";
  static constexpr const char* kTorchName = "Adam";
  static constexpr const char* kStepName = "AdamStep";
  static constexpr StateNames kStates = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  // 8-bit codes of the second moments on the unsigned map, as bitsandbytes' Adam8bit keeps state2.
  static constexpr unsigned kUnsignedMapStates = 0b110;
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"beta1", &Hyper::beta1, "betas", 0},
             Field{"beta2", &Hyper::beta2, "betas", 1}, Field{"eps", &Hyper::eps},
             Field{"weight_decay", &Hyper::weight_decay}, Field{"amsgrad", &Hyper::amsgrad},
             Field{"maximize", &Hyper::maximize},
             Field{"decoupled_weight_decay", &Hyper::decoupled_weight_decay}.Optional());

  static unsigned RequiredStates(const Hyper& h) { return h.amsgrad ? 0b111u : 0b011u; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }

  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.AtLeast("eps", h.eps, 0.0);
    c.Beta("beta1", h.beta1);
    c.Beta("beta2", h.beta2);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    const auto t = static_cast<double>(s.step);
    const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
    const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
    const bool decoupled = h.decoupled_weight_decay && h.weight_decay != 0.0;
    return {
        .grad_mul = GradMul(h.maximize, s.grad_scale),
        .weight_decay = static_cast<float>(h.weight_decay),
        .decay_mul = decoupled ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f,
        .beta1_lerp = MakeLerp(1.0 - h.beta1),
        .beta2 = static_cast<float>(h.beta2),
        .one_minus_beta2 = static_cast<float>(1.0 - h.beta2),
        .bias_correction2_sqrt =
            static_cast<float>(std::pow(bias_correction2, 0.5)),  // Python's bc2**0.5
        .eps = static_cast<float>(h.eps),
        .neg_step_size = static_cast<float>(-(h.lr / bias_correction1)),
        .coupled_weight_decay = !h.decoupled_weight_decay && h.weight_decay != 0.0,
        .amsgrad = h.amsgrad,
    };
  }

  static constexpr auto kRun = RunAdamChunks;

  // torch/optim/adam.py (torch 2.13), _single_tensor_adam (AdamW: decoupled_weight_decay), one
  // tensor op per line (descriptor.h). The scalar step_t += 1 (414) moves no tensor data.
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      if (h.maximize) grad = t.neg(grad);  // 397: grad = -grads[i] if maximize
      if (h.weight_decay != 0.0) {
        if (h.decoupled_weight_decay) {
          t.mul_(t.param(), 1.0 - h.lr * h.weight_decay);  // 419: param.mul_(1 - lr * weight_decay)
        } else {
          grad = t.add(grad, t.param(), h.weight_decay);  // 428: grad.add(param, alpha=wd)
        }
      }
      const auto exp_avg = t.state(kExpAvg);
      const auto exp_avg_sq = t.state(kExpAvgSq);
      t.lerp_(exp_avg, grad, 1.0 - h.beta1);              // 456: exp_avg.lerp_(grad, 1 - beta1)
      t.mul_(exp_avg_sq, h.beta2);                        // 475: exp_avg_sq.mul_(beta2)
      t.addcmul_(exp_avg_sq, grad, grad, 1.0 - h.beta2);  //   .addcmul_(grad, grad, 1 - beta2)
      const auto step_t = static_cast<double>(t.step());
      const double step_size = h.lr / (1.0 - std::pow(h.beta1, step_t));  // 530, 533
      const double bias_correction2_sqrt =
          std::pow(1.0 - std::pow(h.beta2, step_t), 0.5);  // 531, 535: bias_correction2**0.5
      auto second = exp_avg_sq;
      if (h.amsgrad) {
        second = t.state(kMaxExpAvgSq);
        t.maximum(second, exp_avg_sq, second);  // 539: torch.maximum(max_exp_avg_sqs[i], ..., out=)
      }
      const auto root = t.sqrt(second);                       // 544: denom = (exp_avg_sq.sqrt()
      const auto denom = t.div(root, bias_correction2_sqrt);  //   / bias_correction2_sqrt)
      t.add_(denom, h.eps);                                   //   .add_(eps)
      t.addcdiv_(t.param(), exp_avg, denom, -step_size);  // 546: param.addcdiv_(..., -step_size)
    });
  }
};

// AdamW is Adam with decoupled weight decay and torch's AdamW defaults (weight_decay 1e-2).
struct AdamW {
  using Hyper = AdamWHyper;
  using Scalars = AdamScalars;
  static constexpr const char* kName = "adamw";
  static constexpr const char* kTorchName = "AdamW";
  static constexpr const char* kStepName = "AdamWStep";
  static constexpr StateNames kStates = Adam::kStates;
  static constexpr unsigned kUnsignedMapStates = Adam::kUnsignedMapStates;
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"beta1", &Hyper::beta1, "betas", 0},
             Field{"beta2", &Hyper::beta2, "betas", 1}, Field{"eps", &Hyper::eps},
             Field{"weight_decay", &Hyper::weight_decay}, Field{"amsgrad", &Hyper::amsgrad},
             Field{"maximize", &Hyper::maximize});

  static unsigned RequiredStates(const Hyper& h) { return Adam::RequiredStates(h.ToAdam()); }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }
  static void Validate(const HyperCheck& c, const Hyper& h) { Adam::Validate(c, h.ToAdam()); }
  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    return Adam::MakeScalars(h.ToAdam(), s);
  }

  static constexpr auto kRun = RunAdamChunks;

  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& o, Step& step) {
    Adam::StandardStep(h.ToAdam(), o, step);
  }
};

}  // namespace fusedopt::algos
