// Lion (lucidrains' lion-pytorch, shared/docs/algorithms-more.md §4): the descriptor the engine,
// the bindings and the tools read. The update rule is src/math/lion_math.h, run by src/cpu/lion.cc.
#pragma once

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

struct LionScalars {
  float grad_mul;
  float decay_mul;  // f32(1 − lr·wd): lion-pytorch multiplies even when wd = 0 (exactly 1 then)
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float neg_lr;
};

// Its kernel (src/cpu/lion.cc), which runs src/math/lion_math.h (src/core/kernels.h says what the
// entry points do).
void RunLionChunks(const StepPlan<LionScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Lion {
  using Hyper = LionHyper;
  using Scalars = LionScalars;
  static constexpr const char* kName = "lion";
  static constexpr const char* kTorchName = "Lion";
  // `fusedopt bench` and the doctor: lion-pytorch's lr 1e-4 and betas, decoupled weight decay 0.1
  // (lion-pytorch's default is 0; the Lion paper uses 3-10x AdamW's decay at a 3-10x smaller lr).
  static Hyper BenchHyper() { return {.weight_decay = 0.1}; }
  static constexpr const char* kStepName = "LionStep";
  // torch's state keeps no step count for it, nor do checkpoints (descriptor.h: CountsSteps).
  static constexpr bool kCountsSteps = false;
  static constexpr StateNames kStates = {"exp_avg", "", ""};
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"beta1", &Hyper::beta1, "betas", 0},
             Field{"beta2", &Hyper::beta2, "betas", 1}, Field{"weight_decay", &Hyper::weight_decay},
             Field{"maximize", &Hyper::maximize}.Optional());

  static unsigned RequiredStates(const Hyper& /*h*/) { return 1u; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }

  // lion-pytorch asserts 0 <= beta <= 1 (and lr > 0 in its constructor only: a schedule may reach
  // 0). It does not check weight_decay; a non-finite one would poison every param.
  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.Beta("beta1", h.beta1, /*one_allowed=*/true);
    c.Beta("beta2", h.beta2, /*one_allowed=*/true);
    c.Finite("weight_decay", h.weight_decay);
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    return {
        .grad_mul = GradMul(h.maximize, s.grad_scale),
        .decay_mul = static_cast<float>(1.0 - h.lr * h.weight_decay),
        .beta1 = static_cast<float>(h.beta1),
        .one_minus_beta1 = static_cast<float>(1.0 - h.beta1),
        .beta2 = static_cast<float>(h.beta2),
        .one_minus_beta2 = static_cast<float>(1.0 - h.beta2),
        .neg_lr = static_cast<float>(-h.lr),
    };
  }

  static constexpr auto kRun = RunLionChunks;

  // lion-pytorch 0.2.5's update_fn (lion_pytorch/lion_pytorch.py), one tensor op per line
  // (descriptor.h); its decay runs even when wd == 0. maximize is ours (lion-pytorch has none).
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      if (h.maximize) grad = t.neg(grad);  // grad = -grad if maximize
      const auto exp_avg = t.state(kLionExpAvg);
      t.mul_(t.param(), 1.0 - h.lr * h.weight_decay);  // 17: p.data.mul_(1. - lr * wd)
      auto update = t.clone(exp_avg);                  // 21: update = exp_avg.clone()
      t.mul_(update, h.beta1);                         //   .mul_(beta1)
      update = t.add(update, grad, 1.0 - h.beta1);     //   .add(grad, alpha=1. - beta1)
      t.sgn_(update);                                  //   .sgn_()
      t.add_(t.param(), update, -h.lr);                // 22: p.add_(update, alpha=-lr)
      t.mul_(exp_avg, h.beta2);                        // 26: exp_avg.mul_(beta2)
      t.add_(exp_avg, grad, 1.0 - h.beta2);            //   .add_(grad, alpha=1. - beta2)
    });
  }
};

}  // namespace fusedopt::algos
