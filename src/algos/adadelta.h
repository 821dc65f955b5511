// Adadelta (torch.optim.Adadelta, maximize): the descriptor the engine, the bindings and the tools
// read. The update rule is src/math/adadelta_math.h, run by src/cpu/adadelta.cc.
#pragma once

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

struct AdadeltaScalars {
  float grad_mul;
  float weight_decay;
  float rho;
  float one_minus_rho;
  float eps;
  float neg_lr;
  bool has_weight_decay;
};

// Its kernel (src/cpu/adadelta.cc), which runs src/math/adadelta_math.h (src/core/kernels.h says
// what the entry points do).
void RunAdadeltaChunks(const StepPlan<AdadeltaScalars>& plan, std::size_t chunk_begin,
                       std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Adadelta {
  using Hyper = AdadeltaHyper;
  using Scalars = AdadeltaScalars;
  static constexpr const char* kName = "adadelta";
  static constexpr const char* kTorchName = "Adadelta";
  static constexpr const char* kStepName = "AdadeltaStep";
  static constexpr StateNames kStates = {"square_avg", "acc_delta", ""};
  static constexpr unsigned kUnsignedMapStates = 0b11;  // both >= 0
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"rho", &Hyper::rho}, Field{"eps", &Hyper::eps},
             Field{"weight_decay", &Hyper::weight_decay}, Field{"maximize", &Hyper::maximize});

  static unsigned RequiredStates(const Hyper& /*h*/) { return 0b011u; }
  static float InitialState(const Hyper& /*h*/, int /*slot*/) { return 0.0f; }

  // torch's constructor checks (rho in [0, 1], 1 included), which a group edit may break later.
  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    c.Beta("rho", h.rho, /*one_allowed=*/true);
    c.AtLeast("eps", h.eps, 0.0);
    c.AtLeast("weight_decay", h.weight_decay, 0.0);
  }

  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    return {
        .grad_mul = GradMul(h.maximize, s.grad_scale),
        .weight_decay = static_cast<float>(h.weight_decay),
        .rho = static_cast<float>(h.rho),
        .one_minus_rho = static_cast<float>(1.0 - h.rho),
        .eps = static_cast<float>(h.eps),
        .neg_lr = static_cast<float>(-h.lr),
        .has_weight_decay = h.weight_decay != 0.0,
    };
  }

  static constexpr auto kRun = RunAdadeltaChunks;

  // torch/optim/adadelta.py (torch 2.13), _single_tensor_adadelta, one tensor op per line
  // (descriptor.h). The scalar step += 1 (281) moves no tensor data.
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      if (h.maximize) grad = t.neg(grad);  // 282: grad = grad if not maximize else -grad
      if (h.weight_decay != 0.0)
        grad = t.add(grad, t.param(), h.weight_decay);  // 285: grad.add(param, alpha=wd)
      const auto square_avg = t.state(kAdadeltaSquareAvg);
      const auto acc_delta = t.state(kAccDelta);
      t.mul_(square_avg, h.rho);                         // 292: square_avg.mul_(rho)
      t.addcmul_(square_avg, grad, grad, 1.0 - h.rho);   //   .addcmul_(grad, grad, value=1 - rho)
      const auto std_dev = t.add(square_avg, h.eps);     // 293: std = square_avg.add(eps)
      t.sqrt_(std_dev);                                  //   .sqrt_()
      const auto delta = t.add(acc_delta, h.eps);        // 294: delta = acc_delta.add(eps)
      t.sqrt_(delta);                                    //   .sqrt_()
      t.div_(delta, std_dev);                            // 297: delta.div_(std)
      t.mul_(delta, grad);                               //   .mul_(grad)
      t.mul_(acc_delta, h.rho);                          // 298: acc_delta.mul_(rho)
      t.addcmul_(acc_delta, delta, delta, 1.0 - h.rho);  //   .addcmul_(delta, delta, 1 - rho)
      t.add_(t.param(), delta, -h.lr);                   // 302: param.add_(delta, alpha=-lr)
    });
  }
};

}  // namespace fusedopt::algos
