// Adagrad (torch.optim.Adagrad, dense): the descriptor the engine, the bindings and the tools read.
// The update rule is src/math/adagrad_math.h, run by src/cpu/adagrad.cc.
#pragma once

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

struct AdagradScalars {
  float grad_mul;
  float weight_decay;
  float eps;
  float neg_clr;  // −lr / (1 + (step − 1)·lr_decay)
  bool has_weight_decay;
};

// Its kernel (src/cpu/adagrad.cc), which runs src/math/adagrad_math.h (src/core/kernels.h says what
// the entry points do).
void RunAdagradChunks(const StepPlan<AdagradScalars>& plan, std::size_t chunk_begin,
                      std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Adagrad {
  using Hyper = AdagradHyper;
  using Scalars = AdagradScalars;
  static constexpr const char* kName = "adagrad";
  static constexpr const char* kTorchName = "Adagrad";
  static constexpr const char* kStepName = "AdagradStep";
  static constexpr StateNames kStates = {"sum", "", ""};
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"lr_decay", &Hyper::lr_decay},
             Field{"weight_decay", &Hyper::weight_decay},
             Field{"initial_accumulator_value", &Hyper::initial_accumulator_value},
             Field{"eps", &Hyper::eps}, Field{"maximize", &Hyper::maximize});

  static unsigned RequiredStates(const Hyper& /*h*/) { return 1u; }
  // torch creates the sum eagerly, filled with initial_accumulator_value.
  static float InitialState(const Hyper& h, int /*slot*/) {
    return static_cast<float>(h.initial_accumulator_value);
  }

  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.AtLeast("lr_decay", h.lr_decay, 0.0);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
    c.AtLeast("initial_accumulator_value", h.initial_accumulator_value, 0.0);
    c.AtLeast("eps", h.eps, 0.0);
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    const double clr = h.lr / (1.0 + static_cast<double>(s.step - 1) * h.lr_decay);
    return {
        .grad_mul = GradMul(h.maximize, s.grad_scale),
        .weight_decay = static_cast<float>(h.weight_decay),
        .eps = static_cast<float>(h.eps),
        .neg_clr = static_cast<float>(-clr),
        .has_weight_decay = h.weight_decay != 0.0,
    };
  }

  static constexpr auto kRun = RunAdagradChunks;

  // torch/optim/adagrad.py (torch 2.13), _single_tensor_adagrad (dense), one tensor op per line
  // (descriptor.h).
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      if (h.maximize) grad = t.neg(grad);  // 393: grad = -grad if maximize
      if (h.weight_decay != 0.0)
        grad = t.add(grad, t.param(), h.weight_decay);  // 400: grad.add(param, alpha=weight_decay)
      const double clr = h.lr / (1.0 + static_cast<double>(t.step() - 1) * h.lr_decay);  // 402
      const auto state_sum = t.state(kSum);
      t.addcmul_(state_sum, grad, grad, 1.0);      // 421: state_sum.addcmul_(grad, grad, value=1)
      const auto std_dev = t.sqrt(state_sum);      // 425: std = state_sum.sqrt()
      t.add_(std_dev, h.eps);                      //   .add_(eps)
      t.addcdiv_(t.param(), grad, std_dev, -clr);  // 426: param.addcdiv_(grad, std, value=-clr)
    });
  }
};

}  // namespace fusedopt::algos
