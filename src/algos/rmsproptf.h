// RMSpropTF (torch_npu's NpuFusedRMSpropTF, the old timm RMSpropTF; shared/docs/algorithms-more.md
// §1.4): the descriptor the engine, the bindings and the tools read. The update rule is
// src/math/rmsproptf_math.h, run by src/cpu/rmsproptf.cc.
#pragma once

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

// Weight decay of RMSpropTF: none, added to the gradient, or multiplying the param.
enum class RmsproptfDecay : unsigned char { kNone, kCoupled, kDecoupled };

struct RmsproptfScalars {
  float grad_mul;      // grad_scale (no maximize in the reference)
  float weight_decay;  // coupled: g = g + wd·p
  float neg_decay;     // decoupled: p = p + (−wd)·p, f32(−wd)
  float one_minus_alpha;
  float eps;
  float momentum;
  // Momentum: buf = μ·buf + (grad_coef·g)/avg, p = p + neg_buf_coef·buf, with (lr, −1) under
  // lr_in_momentum and (1, −lr) without: the products by 1 and −1 are exact, so one body rounds as
  // either reference line.
  float grad_coef;
  float neg_buf_coef;
  float neg_lr;  // no momentum: p = p + (−lr·g)/avg
  RmsproptfDecay decay;
  bool centered;
  bool has_momentum;
};

// Its kernel (src/cpu/rmsproptf.cc), which runs src/math/rmsproptf_math.h (src/core/kernels.h says
// what the entry points do).
void RunRmsproptfChunks(const StepPlan<RmsproptfScalars>& plan, std::size_t chunk_begin,
                        std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Rmsproptf {
  using Hyper = RmsproptfHyper;
  using Scalars = RmsproptfScalars;
  static constexpr const char* kName = "rmsproptf";
  static constexpr const char* kTorchName = "RMSpropTF";
  static constexpr const char* kStepName = "RmsproptfStep";
  static constexpr StateNames kStates = {"square_avg", "momentum_buffer", "grad_avg"};
  static constexpr unsigned kUnsignedMapStates = 0b001;  // square_avg >= 0
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"alpha", &Hyper::alpha}, Field{"eps", &Hyper::eps},
             Field{"weight_decay", &Hyper::weight_decay}, Field{"momentum", &Hyper::momentum},
             Field{"centered", &Hyper::centered}, Field{"decoupled_decay", &Hyper::decoupled_decay},
             Field{"lr_in_momentum", &Hyper::lr_in_momentum});

  static unsigned RequiredStates(const Hyper& h) {
    return 1u | (h.momentum > 0.0 ? 0b010u : 0u) | (h.centered ? 0b100u : 0u);
  }
  // square_avg starts at one (torch.ones_like), the others at zero.
  static float InitialState(const Hyper& /*h*/, int slot) {
    return slot == kRmsproptfSquareAvg ? 1.0f : 0.0f;
  }

  // The reference's constructor checks (each `< 0`; NaN rejected too), which a schedule or a group
  // edit may break later. alpha has no upper bound there.
  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.AtLeast("eps", h.eps, 0.0);
    c.AtLeast("momentum", h.momentum, 0.0);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
    c.AtLeast("alpha", h.alpha, 0.0);
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    RmsproptfDecay decay = RmsproptfDecay::kNone;
    if (h.weight_decay != 0.0) {
      decay = h.decoupled_decay ? RmsproptfDecay::kDecoupled : RmsproptfDecay::kCoupled;
    }
    return {
        .grad_mul = GradMul(false, s.grad_scale),
        .weight_decay = static_cast<float>(h.weight_decay),
        .neg_decay = static_cast<float>(-h.weight_decay),
        .one_minus_alpha = static_cast<float>(1.0 - h.alpha),
        .eps = static_cast<float>(h.eps),
        .momentum = static_cast<float>(h.momentum),
        .grad_coef = h.lr_in_momentum ? static_cast<float>(h.lr) : 1.0f,
        .neg_buf_coef = h.lr_in_momentum ? -1.0f : static_cast<float>(-h.lr),
        .neg_lr = static_cast<float>(-h.lr),
        .decay = decay,
        .centered = h.centered,
        .has_momentum = h.momentum > 0.0,
    };
  }

  static constexpr auto kRun = RunRmsproptfChunks;

  // NpuFusedRMSpropTF._group_step (torch_npu/optim/npu_fused_rmsprop_tf.py), per tensor, one tensor
  // op per line (descriptor.h), as tools/rmsproptf_reference.py writes it. The deprecated
  // (Number, Tensor) overloads are the alpha= / value= forms.
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      if (h.weight_decay != 0.0) {
        if (h.decoupled_decay) {
          t.add_(t.param(), t.param(), -h.weight_decay);  // p.add_(-wd, p)
        } else {
          grad = t.add(grad, t.param(), h.weight_decay);  // grad = grad.add(wd, p)
        }
      }
      const auto square_avg = t.state(kRmsproptfSquareAvg);
      auto diff = t.mul(grad, grad);            // grad.pow(2)
      diff = t.add(diff, square_avg, -1.0);     //   - square_avg
      t.add_(square_avg, diff, 1.0 - h.alpha);  // square_avg.add_(1 - alpha, ...)
      auto avg = square_avg;
      if (h.centered) {
        const auto grad_avg = t.state(kRmsproptfGradAvg);
        auto gdiff = t.add(grad, grad_avg, -1.0);               // grad - grad_avg
        t.add_(grad_avg, gdiff, 1.0 - h.alpha);                 // grad_avg.add_(1 - alpha, ...)
        avg = t.addcmul(square_avg, grad_avg, grad_avg, -1.0);  // square_avg.addcmul(-1, ga, ga)
        avg = t.add(avg, h.eps);                                //   .add(eps)
        t.sqrt_(avg);                                           //   .sqrt_()
      } else {
        avg = t.add(square_avg, h.eps);  // square_avg.add(eps)
        t.sqrt_(avg);                    //   .sqrt_()
      }
      if (h.momentum > 0.0) {
        const auto buf = t.state(kRmsproptfMomentumBuffer);
        t.mul_(buf, h.momentum);  // buf.mul_(momentum)
        if (h.lr_in_momentum) {
          t.addcdiv_(buf, grad, avg, h.lr);  //   .addcdiv_(lr, grad, avg)
          const auto neg = t.neg(buf);       // -buf
          t.add_(t.param(), neg, 1.0);       // p.add_(-buf)
        } else {
          t.addcdiv_(buf, grad, avg, 1.0);  //   .addcdiv_(grad, avg)
          t.add_(t.param(), buf, -h.lr);    // p.add_(-lr, buf)
        }
      } else {
        t.addcdiv_(t.param(), grad, avg, -h.lr);  // p.addcdiv_(-lr, grad, avg)
      }
    });
  }
};

}  // namespace fusedopt::algos
