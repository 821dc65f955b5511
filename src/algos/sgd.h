// SGD (torch.optim.SGD: momentum, dampening, Nesterov): the descriptor the engine, the bindings and
// the tools read. The update rule itself is src/math/sgd_math.h, run by src/cpu/sgd.cc.
#pragma once

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt::algos {

struct Sgd {
  using Hyper = SgdHyper;
  using Scalars = SgdScalars;
  static constexpr const char* kName = "sgd";
  static constexpr const char* kStepName = "SgdStep";
  static constexpr StateNames kStates = {"momentum_buffer", "", ""};
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"momentum", &Hyper::momentum},
             Field{"dampening", &Hyper::dampening}, Field{"weight_decay", &Hyper::weight_decay},
             Field{"nesterov", &Hyper::nesterov}, Field{"maximize", &Hyper::maximize});

  static unsigned RequiredStates(const Hyper& h) { return h.momentum != 0.0 ? 1u : 0u; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }

  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.AtLeast("momentum", h.momentum, 0.0);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
    c.Finite("dampening", h.dampening);
    if (h.nesterov && (h.momentum <= 0.0 || h.dampening != 0.0)) {
      c.Reject("Nesterov momentum requires a momentum and zero dampening (momentum ", h.momentum,
               ", dampening ", h.dampening, ")");
    }
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    return {
        .grad_mul = GradMul(h.maximize, s.grad_scale),
        .weight_decay = static_cast<float>(h.weight_decay),
        .momentum = static_cast<float>(h.momentum),
        .one_minus_dampening = static_cast<float>(1.0 - h.dampening),
        .neg_lr = static_cast<float>(-h.lr),
        .has_weight_decay = h.weight_decay != 0.0,
        .has_momentum = h.momentum != 0.0,
        .nesterov = h.nesterov,
        .first_step = s.step == 1,
    };
  }

  static constexpr auto kRun = RunSgdChunks;
};

}  // namespace fusedopt::algos
