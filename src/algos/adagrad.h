// Adagrad (torch.optim.Adagrad, dense): the descriptor the engine, the bindings and the tools read.
// The update rule is src/math/adagrad_math.h, run by src/cpu/adagrad.cc.
#pragma once

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt::algos {

struct Adagrad {
  using Hyper = AdagradHyper;
  using Scalars = AdagradScalars;
  static constexpr const char* kName = "adagrad";
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
};

}  // namespace fusedopt::algos
