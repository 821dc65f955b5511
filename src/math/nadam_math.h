// NAdam, one vector (or one lane) at a time, in torch 2.x's single-tensor operation order
// (torch/optim/nadam.py, _single_tensor_nadam; shared/docs/algorithms-more.md §2.3). The host
// advances mu_product and folds it into the two addcdiv coefficients. Included per target; no
// include guard (see lerp_math.h).

// p: param (f32), g: gradient, m: exp_avg, v: exp_avg_sq.
template <bool kCoupledWeightDecay, class Ops, class V>
FOPT_HOST_DEVICE inline void NadamMath(const Ops& o, const NadamScalars& s, V& p, V g, V& m, V& v) {
  // g = ±∇ (maximize)
  g = o.Mul(g, o.Set(s.grad_mul));
  // decoupled: θ = θ·(1 − γλ); exactly 1 when off   param.mul_(1 - lr * weight_decay)
  p = o.Mul(p, o.Set(s.decay_mul));
  // NAdam (L2): g = g + λθ                      grad.add(param, alpha=weight_decay)
  if constexpr (kCoupledWeightDecay) g = o.MulAdd(o.Set(s.weight_decay), p, g);
  // m = m + (1 − β1)(g − m)                     exp_avg.lerp_(grad, 1 - beta1)
  m = Lerp(o, m, g, s.beta1_lerp);
  // v = β2·v + (1 − β2)·g²                      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, ...)
  v = o.MulAdd(o.Mul(o.Set(s.one_minus_beta2), g), g, o.Mul(v, o.Set(s.beta2)));
  // d = √(v / bc2) + ε                          exp_avg_sq.div(bias_correction2).sqrt(); add_(eps)
  const V d = o.Add(o.Sqrt(DivByCorrection(o, v, s.bias_correction2)), o.Set(s.eps));
  // θ = θ + c1·g / d,  c1 = −γ(1 − μ_t)/(1 − Πμ)   param.addcdiv_(grad, denom, value=c1)
  p = o.Add(p, o.Div(o.Mul(o.Set(s.grad_coef), g), d));
  // θ = θ + c2·m / d,  c2 = −γμ_{t+1}/(1 − Πμ·μ_{t+1})   param.addcdiv_(exp_avg, denom, value=c2)
  p = o.Add(p, o.Div(o.Mul(o.Set(s.exp_avg_coef), m), d));
}
