// Lion (lucidrains' lion-pytorch, shared/docs/algorithms-more.md §4): the descriptor the engine,
// the bindings and the tools read. The update rule is src/math/lion_math.h, run by src/cpu/lion.cc.
#pragma once

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt::algos {

struct Lion {
  using Hyper = LionHyper;
  using Scalars = LionScalars;
  static constexpr const char* kName = "lion";
  static constexpr const char* kStepName = "LionStep";
  static constexpr StateNames kStates = {"exp_avg", "", ""};
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"beta1", &Hyper::beta1}, Field{"beta2", &Hyper::beta2},
             Field{"weight_decay", &Hyper::weight_decay}, Field{"maximize", &Hyper::maximize});

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
};

}  // namespace fusedopt::algos
