// Adagrad, one vector (or one lane) at a time, in torch's single-tensor operation order. The
// decayed gradient is used both for the sum and the numerator, as torch does. Included per target;
// no include guard (see lerp_math.h).

// p: param (f32), g: gradient, sum: state_sum. The weight-decay flag is a template parameter.
template <bool kWeightDecay, class Ops, class V>
FOPT_HOST_DEVICE inline void AdagradMath(const Ops& o, const AdagradScalars& s, V& p, V g, V& sum) {
  // g = ±∇ (maximize)
  g = o.Mul(g, o.Set(s.grad_mul));
  // g = g + λθ                                  grad.add(param, alpha=weight_decay)
  if constexpr (kWeightDecay) g = o.MulAdd(o.Set(s.weight_decay), p, g);
  // G = G + g²                                  state_sum.addcmul_(grad, grad, value=1)
  sum = o.MulAdd(g, g, sum);
  // θ = θ − γ̃·g / (√G + ε), γ̃ = γ/(1 + (t−1)·lr_decay)   param.addcdiv_(grad, std, value=-clr)
  const V std_dev = o.Add(o.Sqrt(sum), o.Set(s.eps));
  p = o.Add(p, o.Div(o.Mul(o.Set(s.neg_clr), g), std_dev));
}
