// RMSprop (torch.optim.RMSprop: eps outside the sqrt, centered, momentum): the descriptor the
// engine, the bindings and the tools read. The update rule is src/math/rmsprop_math.h, run by
// src/cpu/rmsprop.cc.
#pragma once

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

struct RmspropScalars {
  float grad_mul;
  float weight_decay;
  float alpha;
  float one_minus_alpha;
  LerpCoef grad_avg_lerp;  // grad_avg.lerp_(grad, 1 − alpha)
  float eps;
  float momentum;
  float neg_lr;
  bool has_weight_decay;
  bool centered;
  bool has_momentum;
};

// Its kernel (src/cpu/rmsprop.cc), which runs src/math/rmsprop_math.h (src/core/kernels.h says what
// the entry points do).
void RunRmspropChunks(const StepPlan<RmspropScalars>& plan, std::size_t chunk_begin,
                      std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Rmsprop {
  using Hyper = RmspropHyper;
  using Scalars = RmspropScalars;
  static constexpr const char* kName = "rmsprop";
  static constexpr const char* kTorchName = "RMSprop";
  static constexpr const char* kStepName = "RmspropStep";
  static constexpr StateNames kStates = {"square_avg", "momentum_buffer", "grad_avg"};
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"alpha", &Hyper::alpha}, Field{"eps", &Hyper::eps},
             Field{"weight_decay", &Hyper::weight_decay}, Field{"momentum", &Hyper::momentum},
             Field{"centered", &Hyper::centered}, Field{"maximize", &Hyper::maximize});

  static unsigned RequiredStates(const Hyper& h) {
    return 1u | (h.momentum > 0.0 ? 0b010u : 0u) | (h.centered ? 0b100u : 0u);
  }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }

  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.AtLeast("eps", h.eps, 0.0);
    c.AtLeast("momentum", h.momentum, 0.0);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
    c.AtLeast("alpha", h.alpha, 0.0);  // torch checks only alpha >= 0
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    return {
        .grad_mul = GradMul(h.maximize, s.grad_scale),
        .weight_decay = static_cast<float>(h.weight_decay),
        .alpha = static_cast<float>(h.alpha),
        .one_minus_alpha = static_cast<float>(1.0 - h.alpha),
        .grad_avg_lerp = MakeLerp(1.0 - h.alpha),
        .eps = static_cast<float>(h.eps),
        .momentum = static_cast<float>(h.momentum),
        .neg_lr = static_cast<float>(-h.lr),
        .has_weight_decay = h.weight_decay != 0.0,
        .centered = h.centered,
        .has_momentum = h.momentum > 0.0,
    };
  }

  static constexpr auto kRun = RunRmspropChunks;

  // torch/optim/rmsprop.py (torch 2.13), _single_tensor_rmsprop, one tensor op per line
  // (descriptor.h).
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      if (h.maximize) grad = t.neg(grad);  // 302: grad = -grad if maximize
      if (h.weight_decay != 0.0)
        grad = t.add(grad, t.param(), h.weight_decay);  // 308: grad.add(param, alpha=weight_decay)
      const auto square_avg = t.state(kSquareAvg);
      t.mul_(square_avg, h.alpha);                        // 316: square_avg.mul_(alpha)
      t.addcmul_(square_avg, grad, grad, 1.0 - h.alpha);  //   .addcmul_(grad, grad, value=1-alpha)
      auto avg = square_avg;
      if (h.centered) {
        const auto grad_avg = t.state(kGradAvg);
        t.lerp_(grad_avg, grad, 1.0 - h.alpha);  // 322: grad_avg.lerp_(grad, 1 - alpha)
        // 323: avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
        avg = t.addcmul(square_avg, grad_avg, grad_avg, -1.0);
        t.sqrt_(avg);
      } else {
        avg = t.sqrt(square_avg);  // 325: avg = square_avg.sqrt()
      }
      t.add_(avg, h.eps);  // 330: avg.add_(eps)
      if (h.momentum > 0.0) {
        const auto buf = t.state(kRmspropMomentumBuffer);
        t.mul_(buf, h.momentum);          // 336: buf.mul_(momentum)
        t.addcdiv_(buf, grad, avg, 1.0);  //   .addcdiv_(grad, avg)
        t.add_(t.param(), buf, -h.lr);    // 337: param.add_(buf, alpha=-lr)
      } else {
        t.addcdiv_(t.param(), grad, avg, -h.lr);  // 339: param.addcdiv_(grad, avg, value=-lr)
      }
    });
  }
};

}  // namespace fusedopt::algos
