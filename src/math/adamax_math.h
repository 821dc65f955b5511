// Adamax, one vector (or one lane) at a time, in torch 2.x's single-tensor operation order
// (torch/optim/adamax.py, _single_tensor_adamax; shared/docs/algorithms-more.md §2.2). Included per
// target; no include guard (see lerp_math.h).

// p: param (f32), g: gradient, m: exp_avg, u: exp_inf.
template <bool kWeightDecay, class Ops, class V>
FOPT_HOST_DEVICE inline void AdamaxMath(const Ops& o, const AdamaxScalars& s, V& p, V g, V& m,
                                        V& u) {
  // g = ±∇ (maximize)
  g = o.Mul(g, o.Set(s.grad_mul));
  // g = g + λθ                                  grad.add(param, alpha=weight_decay)
  if constexpr (kWeightDecay) g = o.MulAdd(o.Set(s.weight_decay), p, g);
  // m = m + (1 − β1)(g − m)                     exp_avg.lerp_(grad, 1 - beta1)
  m = Lerp(o, m, g, s.beta1_lerp);
  // u = max(β2·u, |g| + ε), NaN if either is   torch.maximum(exp_inf.mul_(beta2),
  //                                              grad.abs().add_(eps), out=exp_inf)
  u = o.Max(o.Mul(u, o.Set(s.beta2)), o.Add(o.Abs(g), o.Set(s.eps)));
  // θ = θ − (γ / bc1)·m / u                     param.addcdiv_(exp_avg, exp_inf, value=-clr)
  p = o.Add(p, o.Div(o.Mul(o.Set(s.neg_clr), m), u));
}
