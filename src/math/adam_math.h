// Adam / AdamW, one vector (or one lane) at a time, in torch 2.x's single-tensor operation order
// (torch-semantics.md §3; exp_avg uses lerp_ as torch 2.x does). Included per target; no include
// guard (see lerp_math.h).

// p: param (f32), g: gradient, m: exp_avg, v: exp_avg_sq, v_max: max_exp_avg_sq (amsgrad only).
// Mode flags are template parameters: each combination compiles to a branch-free loop.
template <bool kCoupledWeightDecay, bool kAmsgrad, class Ops, class V>
FOPT_HOST_DEVICE inline void AdamMath(const Ops& o, const AdamScalars& s, V& p, V g, V& m, V& v,
                                      V& v_max) {
  // g = ±∇ (maximize)
  g = o.Mul(g, o.Set(s.grad_mul));
  // Adam (L2): g = g + λθ                       grad.add(param, alpha=weight_decay)
  if constexpr (kCoupledWeightDecay) g = o.MulAdd(o.Set(s.weight_decay), p, g);
  // AdamW: θ = θ·(1 − γλ); the factor is exactly 1 when off        param.mul_(1 - lr *
  // weight_decay)
  p = o.Mul(p, o.Set(s.decay_mul));
  // m = m + (1 − β1)(g − m)                     exp_avg.lerp_(grad, 1 - beta1)
  m = Lerp(o, m, g, s.beta1_lerp);
  // v = β2·v + (1 − β2)·g²                      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, ...)
  v = o.MulAdd(o.Mul(o.Set(s.one_minus_beta2), g), g, o.Mul(v, o.Set(s.beta2)));
  // v_max = max(v_max, v), over the raw v       torch.maximum(max_exp_avg_sq, exp_avg_sq)
  if constexpr (kAmsgrad) v_max = o.Max(v_max, v);
  // denom = √v / √bc2 + ε                       (exp_avg_sq.sqrt() /
  // bias_correction2_sqrt).add_(eps)
  const V denom = o.Add(DivByCorrection(o, o.Sqrt(kAmsgrad ? v_max : v), s.bias_correction2_sqrt),
                        o.Set(s.eps));
  // θ = θ − (γ / bc1)·m / denom                 param.addcdiv_(exp_avg, denom, value=-step_size)
  p = o.Add(p, o.Div(o.Mul(o.Set(s.neg_step_size), m), denom));
}
