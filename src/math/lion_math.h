// Lion, one vector (or one lane) at a time, in lion-pytorch's operation order
// (shared/docs/algorithms-more.md §4). Included per target; no include guard (see lerp_math.h).

// p: param (f32), g: gradient, m: exp_avg.
template <class Ops, class V>
FOPT_HOST_DEVICE inline void LionMath(const Ops& o, const LionScalars& s, V& p, V g, V& m) {
  // g = ±∇ (maximize)
  g = o.Mul(g, o.Set(s.grad_mul));
  // θ = θ·(1 − γλ)                              p.data.mul_(1 - lr * wd)
  p = o.Mul(p, o.Set(s.decay_mul));
  // c = β1·m + (1 − β1)·g                       exp_avg.clone().mul_(beta1).add(grad,
  // alpha=1-beta1)
  const V c = o.MulAdd(o.Set(s.one_minus_beta1), g, o.Mul(m, o.Set(s.beta1)));
  // θ = θ − γ·sign(c), sign(±0) = sign(NaN) = 0 .sgn_(); p.add_(update, alpha=-lr)
  p = o.MulAdd(o.Set(s.neg_lr), o.Sign(c), p);
  // m = β2·m + (1 − β2)·g                       exp_avg.mul_(beta2).add_(grad, alpha=1-beta2)
  m = o.MulAdd(o.Set(s.one_minus_beta2), g, o.Mul(m, o.Set(s.beta2)));
}
