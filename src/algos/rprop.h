// Rprop (torch.optim.Rprop: etas, step_sizes, maximize): the descriptor the engine, the bindings
// and the tools read. The update rule is src/math/rprop_math.h, run by src/cpu/rprop.cc.
#pragma once

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/algos/descriptor.h"
#include "src/core/kernels.h"
#include "src/math/scalars.h"

namespace fusedopt {

// Rprop's factors and bounds, each a Python float rounded to f32 as torch's masked fills and clamp_
// round it.
struct RpropScalars {
  float grad_mul;
  float etaminus;
  float etaplus;
  float step_size_min;
  float step_size_max;
};

// Its kernel (src/cpu/rprop.cc), which runs src/math/rprop_math.h (src/core/kernels.h says what the
// entry points do).
void RunRpropChunks(const StepPlan<RpropScalars>& plan, std::size_t chunk_begin,
                    std::size_t chunk_end);

}  // namespace fusedopt

namespace fusedopt::algos {

struct Rprop {
  using Hyper = RpropHyper;
  using Scalars = RpropScalars;
  static constexpr const char* kName = "rprop";
  static constexpr const char* kTorchName = "Rprop";
  static constexpr const char* kStepName = "RpropStep";
  static constexpr StateNames kStates = {"prev", "step_size", ""};
  static constexpr unsigned kUnsignedMapStates = 0b10;  // step_size > 0
  static constexpr auto kFields =
      Fields(Field{"lr", &Hyper::lr}, Field{"etaminus", &Hyper::etaminus, "etas", 0},
             Field{"etaplus", &Hyper::etaplus, "etas", 1},
             Field{"step_size_min", &Hyper::step_size_min, "step_sizes", 0},
             Field{"step_size_max", &Hyper::step_size_max, "step_sizes", 1},
             Field{"maximize", &Hyper::maximize});

  static unsigned RequiredStates(const Hyper& /*h*/) { return 0b011u; }
  // torch: state['prev'] = zeros_like(p), state['step_size'] = full_like(grad, lr)
  static float InitialState(const Hyper& h, int slot) {
    return slot == kRpropStepSize ? static_cast<float>(h.lr) : 0.0f;
  }

  // torch's constructor checks (step_sizes have none), which a schedule or a group edit may break
  // later.
  static void Validate(const HyperCheck& c, const Hyper& h) {
    c.AtLeast("lr", h.lr, 0.0);
    if (!(0.0 < h.etaminus && h.etaminus < 1.0 && 1.0 < h.etaplus)) {
      c.Reject("invalid eta values: ", h.etaminus, ", ", h.etaplus,
               " (must be 0 < etaminus < 1 < etaplus)");
    }
  }

  // Every coefficient is a Python float meeting an f32 tensor: rounded once.
  static Scalars MakeScalars(const Hyper& h, const Segment& s) {
    return {
        .grad_mul = GradMul(h.maximize, s.grad_scale),
        .etaminus = static_cast<float>(h.etaminus),
        .etaplus = static_cast<float>(h.etaplus),
        .step_size_min = static_cast<float>(h.step_size_min),
        .step_size_max = static_cast<float>(h.step_size_max),
    };
  }

  static constexpr auto kRun = RunRpropChunks;

  // torch/optim/rprop.py (torch 2.13), _single_tensor_rprop (capturable=False), one tensor op per
  // line (descriptor.h). step += 1 (257) moves no tensor data. torch runs each masked fill
  // (`x[c.gt(0)] = v`) as two kernels, the bool mask and the fill; masked_fill_ counts it as one
  // pass over x and c.
  template <class Step>
  static void StandardStep(const Hyper& h, const StandardOptions& /*o*/, Step& step) {
    step.ForEachTensor([&](auto& t) {
      auto grad = t.grad();
      if (h.maximize) grad = t.neg(grad);  // 241: grad = grad if not maximize else -grad
      const auto prev = t.state(kRpropPrev);
      const auto step_size = t.state(kRpropStepSize);
      const auto sign = t.sign(t.mul(grad, prev));  // 267: sign = grad.mul(prev).sign()
      // 274-276: sign[sign.gt(0)] = etaplus; sign[sign.lt(0)] = etaminus; sign[sign.eq(0)] = 1
      t.masked_fill_(sign, sign, Compare::kGt, 0.0, h.etaplus);
      t.masked_fill_(sign, sign, Compare::kLt, 0.0, h.etaminus);
      t.masked_fill_(sign, sign, Compare::kEq, 0.0, 1.0);
      t.mul_(step_size, sign);                                // 279: step_size.mul_(sign)
      t.clamp_(step_size, h.step_size_min, h.step_size_max);  //   .clamp_(min, max)
      grad = t.clone(grad);                                   // 283: grad = grad.clone()
      // 287: grad[sign.eq(etaminus)] = 0
      t.masked_fill_(grad, sign, Compare::kEq, h.etaminus, 0.0);
      // 290: param.addcmul_(grad.sign(), step_size, value=-1)
      t.addcmul_(t.param(), t.sign(grad), step_size, -1.0);
      t.copy_(prev, grad);  // 291: prev.copy_(grad)
    });
  }
};

}  // namespace fusedopt::algos
