// Adamax (torch.optim.Adamax, maximize): the descriptor the engine, the bindings and the tools
// read. The update rule is src/math/adamax_math.h, run by src/cpu/adamax.cc.
#pragma once

#include <cmath>

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

struct AdamaxScalars {
  float grad_mul;
  float weight_decay;
  LerpCoef beta1_lerp;  // exp_avg.lerp_(grad, 1 − beta1)
  float beta2;
  float eps;
  float neg_clr;  // −lr / (1 − beta1^step)
  bool has_weight_decay;
};

// Its kernel (src/cpu/adamax.cc), which runs src/math/adamax_math.h (src/core/kernels.h says what
// the entry points do).
void RunAdamaxChunks(const StepPlan<AdamaxScalars>& plan, std::size_t chunk_begin,
                     std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Adamax {
  using Hyper = AdamaxHyper;
  using Scalars = AdamaxScalars;
  static constexpr const char* kName = "adamax";
  static constexpr const char* kTorchName = "Adamax";
  static constexpr const char* kStepName = "AdamaxStep";
  static constexpr StateNames kStates = {"exp_avg", "exp_inf", ""};
  static constexpr unsigned kUnsignedMapStates = 0b10;  // exp_inf >= 0
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"beta1", &Hyper::beta1, "betas", 0},
             Field{"beta2", &Hyper::beta2, "betas", 1}, Field{"eps", &Hyper::eps},
             Field{"weight_decay", &Hyper::weight_decay}, Field{"maximize", &Hyper::maximize});

  static unsigned RequiredStates(const Hyper& /*h*/) { return 0b011u; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }

  // torch's constructor checks, which a schedule or a group edit may break later.
  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.AtLeast("eps", h.eps, 0.0);
    c.Beta("beta1", h.beta1);
    c.Beta("beta2", h.beta2);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    const auto t = static_cast<double>(s.step);
    const double bias_correction = 1.0 - std::pow(h.beta1, t);  // 1 - beta1 ** step
    return {
        .grad_mul = GradMul(h.maximize, s.grad_scale),
        .weight_decay = static_cast<float>(h.weight_decay),
        .beta1_lerp = MakeLerp(1.0 - h.beta1),
        .beta2 = static_cast<float>(h.beta2),
        .eps = static_cast<float>(h.eps),
        .neg_clr = static_cast<float>(-(h.lr / bias_correction)),  // clr = lr / bias_correction
        .has_weight_decay = h.weight_decay != 0.0,
    };
  }

  static constexpr auto kRun = RunAdamaxChunks;

  // torch/optim/adamax.py (torch 2.13), _single_tensor_adamax, one tensor op per line
  // (descriptor.h). The scalar step_t += 1 (265) moves no tensor data.
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      if (h.maximize) grad = t.neg(grad);  // 248: grad = grad if not maximize else -grad
      if (h.weight_decay != 0.0)
        grad = t.add(grad, t.param(), h.weight_decay);  // 268: grad.add(param, alpha=wd)
      const auto exp_avg = t.state(kAdamaxExpAvg);
      const auto exp_inf = t.state(kExpInf);
      t.lerp_(exp_avg, grad, 1.0 - h.beta1);  // 277: exp_avg.lerp_(grad, 1 - beta1)
      t.mul_(exp_inf, h.beta2);               // 281: exp_inf.mul_(beta2)
      const auto norm = t.abs(grad);          // 282: grad.abs()
      t.add_(norm, h.eps);                    //   .add_(eps)
      t.maximum(exp_inf, norm, exp_inf);      // 280: torch.maximum(..., out=exp_inf)
      const auto step_t = static_cast<double>(t.step());
      const double clr = h.lr / (1.0 - std::pow(h.beta1, step_t));  // 300, 301
      t.addcdiv_(t.param(), exp_avg, exp_inf, -clr);  // 303: param.addcdiv_(..., value=-clr)
    });
  }
};

}  // namespace fusedopt::algos
