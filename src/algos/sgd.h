// SGD (torch.optim.SGD: momentum, dampening, Nesterov): the descriptor the engine, the bindings and
// the tools read. The update rule itself is src/math/sgd_math.h, run by src/cpu/sgd.cc.
#pragma once

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

struct SgdScalars {
  float grad_mul;  // -1 with maximize, else 1 (exact either way)
  float weight_decay;
  float momentum;
  float one_minus_dampening;
  float neg_lr;
  bool has_weight_decay;
  bool has_momentum;
  bool nesterov;
  bool first_step;  // momentum buffer starts as a copy of the gradient (no dampening), as torch
};

// Its kernel (src/cpu/sgd.cc), which runs src/math/sgd_math.h (src/core/kernels.h says what the
// entry points do).
void RunSgdChunks(const StepPlan<SgdScalars>& plan, std::size_t chunk_begin, std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Sgd {
  using Hyper = SgdHyper;
  using Scalars = SgdScalars;
  static constexpr const char* kName = "sgd";
  static constexpr const char* kTorchName = "SGD";
  // `fusedopt bench` and the doctor: lr 1e-2 and momentum 0.9 (a buffer to read and write).
  static Hyper BenchHyper() { return {.lr = 1e-2, .momentum = 0.9}; }
  static constexpr const char* kStepName = "SgdStep";
  // torch's state keeps no step count for it, nor do checkpoints (descriptor.h: CountsSteps).
  static constexpr bool kCountsSteps = false;
  static constexpr StateNames kStates = {"momentum_buffer", "", ""};
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"momentum", &Hyper::momentum},
             Field{"dampening", &Hyper::dampening}, Field{"weight_decay", &Hyper::weight_decay},
             Field{"nesterov", &Hyper::nesterov}, Field{"maximize", &Hyper::maximize});

  static unsigned RequiredStates(const Hyper& h) { return h.momentum != 0.0 ? 1u : 0u; }
  // A tensor's Segment::step counts its momentum buffer's steps (HasBufferSteps).
  static bool CountsBufferSteps(const Hyper& h) { return h.momentum != 0.0; }
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

  // torch/optim/sgd.py (torch 2.13), _single_tensor_sgd, one tensor op per line (descriptor.h).
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      if (h.maximize) grad = t.neg(grad);  // 344: grad = -grads[i] if maximize
      if (h.weight_decay != 0.0)
        grad = t.add(grad, t.param(), h.weight_decay);  // 355: grad.add(param, alpha=weight_decay)
      if (h.momentum != 0.0) {
        const auto buf = t.state(kMomentumBuffer);
        if (t.step() == 1) {
          t.copy_(buf, grad);  // 361: buf = grad.detach().clone() (into the state's buffer)
        } else {
          t.mul_(buf, h.momentum);               // 364: buf.mul_(momentum)
          t.add_(buf, grad, 1.0 - h.dampening);  //        .add_(grad, alpha=1 - dampening)
        }
        if (h.nesterov) {
          grad = t.add(grad, buf, h.momentum);  // 367: grad = grad.add(buf, alpha=momentum)
        } else {
          grad = buf;  // 369: grad = buf
        }
      }
      t.add_(t.param(), grad, -h.lr);  // 379: param.add_(grad, alpha=-lr)
    });
  }
};

}  // namespace fusedopt::algos
