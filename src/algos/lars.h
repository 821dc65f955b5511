// LARS with NVIDIA apex's LARC semantics around torch.optim.SGD (shared/docs/algorithms-more.md
// §3.2): the descriptor the engine, the bindings and the tools read. Two phases: src/cpu/lars.cc
// first reduces ‖p‖² and ‖g‖² of every tensor, then runs SGD's momentum step on the gradient
// scaled by the trust ratio from Finish. The math is src/math/lars_math.h; the reference is
// tools/lars_reference.py.
#pragma once

#include <cmath>
#include <span>

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

// The first pass of LARS reduces ‖p‖² and ‖g‖² per tensor (g unscaled); Lars::Finish sets the
// trust ratio and whether it applies, then the second pass runs SGD on (g + λθ)·ratio or on g.
struct LarsScalars {
  float grad_mul;  // grad_scale: the loss-scale and clip factors, applied as the gradient is read
  float weight_decay;
  float ratio;  // LARC's adaptive_lr (clipped to ≤ 1 in clip mode), set after the reduction pass
  float momentum;
  float one_minus_dampening;
  float neg_lr;
  bool trust;  // both norms non-zero: g = (g + λθ)·ratio; else g as it is (and no weight decay)
  bool has_momentum;
  bool nesterov;
  bool first_step;  // momentum buffer starts as a copy of the gradient (no dampening), as torch
};

// Its kernel (src/cpu/lars.cc), which runs src/math/lars_math.h (src/core/kernels.h says what the
// entry points do).
void RunLarsReduceChunk(const StepPlan<LarsScalars>& plan, std::size_t chunk, double* sums);
void RunLarsChunks(const StepPlan<LarsScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Lars {
  using Hyper = LarsHyper;
  using Scalars = LarsScalars;
  static constexpr const char* kName = "lars";
  static constexpr const char* kTorchName = "LARS";
  // `fusedopt bench` and the doctor: SGD's lr 1e-2 and momentum 0.9 (LARC's trust coefficient 0.02
  // and clip mode).
  static Hyper BenchHyper() { return {.lr = 1e-2, .momentum = 0.9}; }
  static constexpr const char* kStepName = "LarsStep";
  // torch's state keeps no step count for it, nor do checkpoints (descriptor.h: CountsSteps).
  static constexpr bool kCountsSteps = false;
  static constexpr StateNames kStates = {"momentum_buffer", "", ""};
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"momentum", &Hyper::momentum},
             Field{"dampening", &Hyper::dampening}, Field{"weight_decay", &Hyper::weight_decay},
             Field{"trust_coefficient", &Hyper::trust_coefficient}, Field{"eps", &Hyper::eps},
             Field{"nesterov", &Hyper::nesterov}, Field{"clip", &Hyper::clip});

  static unsigned RequiredStates(const Hyper& h) { return h.momentum != 0.0 ? 1u : 0u; }
  // A tensor's Segment::step counts its momentum buffer's steps (HasBufferSteps).
  static bool CountsBufferSteps(const Hyper& h) { return h.momentum != 0.0; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }

  // torch.optim.SGD's rules, and trust_coefficient, eps >= 0 (LARC checks nothing; torchlars
  // rejects negative ones). lr = 0 is accepted, as SGD accepts it: in clip mode LARC's
  // adaptive_lr / lr is then +inf, min(inf, 1) = 1, so the momentum buffer takes the unscaled
  // g + λθ while the params stay (docs/numerics.md).
  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.AtLeast("momentum", h.momentum, 0.0);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
    c.Finite("dampening", h.dampening);
    c.AtLeast("trust_coefficient", h.trust_coefficient, 0.0);
    c.AtLeast("eps", h.eps, 0.0);
    if (h.nesterov && (h.momentum <= 0.0 || h.dampening != 0.0)) {
      c.Reject("Nesterov momentum requires a momentum and zero dampening (momentum ", h.momentum,
               ", dampening ", h.dampening, ")");
    }
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    return {
        .grad_mul = s.grad_scale,
        .weight_decay = static_cast<float>(h.weight_decay),
        .ratio = 1.0f,
        .momentum = static_cast<float>(h.momentum),
        .one_minus_dampening = static_cast<float>(1.0 - h.dampening),
        .neg_lr = static_cast<float>(-h.lr),
        .trust = false,
        .has_momentum = h.momentum != 0.0,
        .nesterov = h.nesterov,
        .first_step = s.step == 1,
    };
  }

  // The reduction pass gives Σp² and Σg² of the tensor (g unscaled, as LARC reads p.grad).
  static constexpr int kReductions = 2;
  static constexpr ReductionReads kReductionReads = ReductionReads::kParamAndGrad;
  static constexpr auto kReduce = RunLarsReduceChunk;
  // LARC's adaptive_lr in its f32 tensor ops, from the norms rounded once to f32 (torch.norm's
  // 0-d f32 results): tc·‖p‖ / (‖g‖ + ‖p‖·λ + eps), then in clip mode min(· / lr, 1) (Python's
  // min: NaN stays NaN). Only where both norms are non-zero (NaN is non-zero, as in LARC).
  static void Finish(const Hyper& h, const Segment& /*s*/, std::span<const double, 2> sums,
                     Scalars& scalars) {
    const auto param_norm = static_cast<float>(std::sqrt(sums[0]));
    const auto grad_norm = static_cast<float>(std::sqrt(sums[1]));
    scalars.trust = param_norm != 0.0f && grad_norm != 0.0f;
    if (!scalars.trust) return;
    scalars.ratio = LarcRatio(h, param_norm, grad_norm);
  }

  // adaptive_lr = tc * param_norm / (grad_norm + param_norm * weight_decay + eps), f32 ops;
  // clip: adaptive_lr = min(adaptive_lr / lr, 1).
  static float LarcRatio(const Hyper& h, float param_norm, float grad_norm) {
    const float denom =
        (grad_norm + param_norm * static_cast<float>(h.weight_decay)) + static_cast<float>(h.eps);
    float ratio = static_cast<float>(h.trust_coefficient) * param_norm / denom;
    if (h.clip) {
      const float scaled = ratio / static_cast<float>(h.lr);
      ratio = 1.0f < scaled ? 1.0f : scaled;
    }
    return ratio;
  }

  static constexpr auto kRun = RunLarsChunks;

  // tools/lars_reference.py's step(), one tensor op per line (descriptor.h): LARC's norms and
  // gradient scaling, then torch.optim.SGD's _single_tensor_sgd with weight_decay 0. LARC writes
  // the scaled gradient into p.grad; here it goes into a temporary (the same reads and writes), so
  // the benchmark's gradients stay as they are. LARC's branch runs on every tensor (the sequence
  // must not depend on values): where a norm is 0 it runs with weight decay 0 and ratio 1, which
  // leave a finite gradient as it is.
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      const auto param_norm = static_cast<float>(t.norm(t.param()));  // 70: torch.norm(p.data)
      const auto grad_norm = static_cast<float>(t.norm(t.grad()));    // 71: torch.norm(p.grad.data)
      const bool trust = param_norm != 0.0f && grad_norm != 0.0f;     // 73: if both != 0
      const double ratio = trust ? LarcRatio(h, param_norm, grad_norm) : 1.0;  // 75-80
      auto grad = t.mul(t.param(), trust ? h.weight_decay : 0.0);  // 82: weight_decay * p.data
      grad = t.add(grad, t.grad(), 1.0);                           //     p.grad.data += ...
      t.mul_(grad, ratio);                                         // 83: p.grad.data *= adaptive_lr
      if (h.momentum != 0.0) {
        const auto buf = t.state(kLarsMomentumBuffer);
        if (t.step() == 1) {
          t.copy_(buf, grad);  // sgd.py 361: buf = grad.detach().clone()
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
