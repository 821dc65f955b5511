#include "src/core/coefficients.h"

#include <cmath>

namespace fusedopt {
namespace {

// fl(g·scale) then negation is exact, so folding the sign into the multiplier changes nothing.
float GradMul(bool maximize, float grad_scale) { return maximize ? -grad_scale : grad_scale; }

// torch's lerp_(end, w) receives w as a double and evaluates in f32 (see LerpCoef).
LerpCoef MakeLerp(double w) {
  const auto wf = static_cast<float>(w);
  return {wf, wf - 1.0f, !(std::abs(wf) < 0.5f)};
}

}  // namespace

SgdScalars MakeSgdScalars(const SgdHyper& h, const Segment& s) {
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

AdamScalars MakeAdamScalars(const AdamHyper& h, const Segment& s) {
  const auto t = static_cast<double>(s.step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
  const bool decoupled = h.decoupled_weight_decay && h.weight_decay != 0.0;
  return {
      .grad_mul = GradMul(h.maximize, s.grad_scale),
      .weight_decay = static_cast<float>(h.weight_decay),
      .decay_mul = decoupled ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f,
      .beta1_lerp = MakeLerp(1.0 - h.beta1),
      .beta2 = static_cast<float>(h.beta2),
      .one_minus_beta2 = static_cast<float>(1.0 - h.beta2),
      .bias_correction2_sqrt =
          static_cast<float>(std::pow(bias_correction2, 0.5)),  // Python's bc2**0.5
      .eps = static_cast<float>(h.eps),
      .neg_step_size = static_cast<float>(-(h.lr / bias_correction1)),
      .coupled_weight_decay = !h.decoupled_weight_decay && h.weight_decay != 0.0,
      .amsgrad = h.amsgrad,
  };
}

RmspropScalars MakeRmspropScalars(const RmspropHyper& h, const Segment& s) {
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

AdagradScalars MakeAdagradScalars(const AdagradHyper& h, const Segment& s) {
  const double clr = h.lr / (1.0 + static_cast<double>(s.step - 1) * h.lr_decay);
  return {
      .grad_mul = GradMul(h.maximize, s.grad_scale),
      .weight_decay = static_cast<float>(h.weight_decay),
      .eps = static_cast<float>(h.eps),
      .neg_clr = static_cast<float>(-clr),
      .has_weight_decay = h.weight_decay != 0.0,
  };
}

}  // namespace fusedopt
