// RMSprop (torch.optim.RMSprop: eps outside the sqrt, centered, momentum): the descriptor the
// engine, the bindings and the tools read. The update rule is src/math/rmsprop_math.h, run by
// src/cpu/rmsprop.cc.
#pragma once

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt::algos {

struct Rmsprop {
  using Hyper = RmspropHyper;
  using Scalars = RmspropScalars;
  static constexpr const char* kName = "rmsprop";
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
};

}  // namespace fusedopt::algos
