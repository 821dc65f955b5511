// RAdam, one vector (or one lane) at a time, in torch 2.x's single-tensor operation order
// (torch/optim/radam.py, _single_tensor_radam; shared/docs/algorithms-more.md §2.4). Whether a step
// is rectified (rho_t > 5) depends only on the step, so the host chooses the branch per tensor.
// Included per target; no include guard (see lerp_math.h).

// p: param (f32), g: gradient, m: exp_avg, v: exp_avg_sq.
template <bool kCoupledWeightDecay, bool kRectified, class Ops, class V>
FOPT_HOST_DEVICE inline void RadamMath(const Ops& o, const RadamScalars& s, V& p, V g, V& m, V& v) {
  // g = ±∇ (maximize)
  g = o.Mul(g, o.Set(s.grad_mul));
  // RAdam (L2): g = g + λθ                      grad.add(param, alpha=weight_decay)
  if constexpr (kCoupledWeightDecay) g = o.MulAdd(o.Set(s.weight_decay), p, g);
  // decoupled: θ = θ·(1 − γλ); exactly 1 when off   param.mul_(1 - lr * weight_decay)
  p = o.Mul(p, o.Set(s.decay_mul));
  // m = m + (1 − β1)(g − m)                     exp_avg.lerp_(grad, 1 - beta1)
  m = Lerp(o, m, g, s.beta1_lerp);
  // v = β2·v + (1 − β2)·g²                      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, ...)
  v = o.MulAdd(o.Mul(o.Set(s.one_minus_beta2), g), g, o.Mul(v, o.Set(s.beta2)));
  // m̂·γ = (m / bc1)·γ                           bias_corrected_exp_avg = exp_avg / bias_correction1
  V u = o.Mul(o.Div(m, o.Set(s.bias_correction1)), o.Set(s.lr));  //   * lr
  if constexpr (kRectified) {
    // α = √bc2 / (√v + ε), as (1/(√v + ε))·√bc2  (bias_correction2**0.5) /
    // exp_avg_sq.sqrt().add_(eps)
    const V adaptive_lr =
        o.Mul(o.Div(o.Set(1.0f), o.Add(o.Sqrt(v), o.Set(s.eps))), o.Set(s.bias_correction2_sqrt));
    // u = m̂·γ·α·r                               * _compute_adaptive_lr() * _compute_rect()
    u = o.Mul(o.Mul(u, adaptive_lr), o.Set(s.rect));
  }
  // θ = θ − u                                   param.add_(update, alpha=-1.0)
  p = o.Sub(p, u);
}
