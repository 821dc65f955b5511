// Adadelta, one vector (or one lane) at a time, in torch 2.x's single-tensor operation order
// (torch/optim/adadelta.py, _single_tensor_adadelta; shared/docs/algorithms-more.md §2.1). Included
// per target; no include guard (see lerp_math.h).

// p: param (f32), g: gradient, v: square_avg, u: acc_delta.
template <bool kWeightDecay, class Ops, class V>
FOPT_HOST_DEVICE inline void AdadeltaMath(const Ops& o, const AdadeltaScalars& s, V& p, V g, V& v,
                                          V& u) {
  // g = ±∇ (maximize)
  g = o.Mul(g, o.Set(s.grad_mul));
  // g = g + λθ                                  grad.add(param, alpha=weight_decay)
  if constexpr (kWeightDecay) g = o.MulAdd(o.Set(s.weight_decay), p, g);
  // v = ρ·v + (1 − ρ)·g²                        square_avg.mul_(rho).addcmul_(grad, grad, 1 - rho)
  v = o.MulAdd(o.Mul(o.Set(s.one_minus_rho), g), g, o.Mul(v, o.Set(s.rho)));
  // std = √(v + ε)                              square_avg.add(eps).sqrt_()
  const V std_dev = o.Sqrt(o.Add(v, o.Set(s.eps)));
  // Δ = √(u + ε) / std · g                      acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
  const V delta = o.Mul(o.Div(o.Sqrt(o.Add(u, o.Set(s.eps))), std_dev), g);
  // u = ρ·u + (1 − ρ)·Δ²                        acc_delta.mul_(rho).addcmul_(delta, delta, 1 - rho)
  u = o.MulAdd(o.Mul(o.Set(s.one_minus_rho), delta), delta, o.Mul(u, o.Set(s.rho)));
  // θ = θ − γ·Δ                                 param.add_(delta, alpha=-lr)
  p = o.MulAdd(o.Set(s.neg_lr), delta, p);
}
