// BertAdam (torch_npu NpuFusedBertAdam, shared/docs/algorithms-more.md §1.2; HF
// pytorch-pretrained-bert's BertAdam), one vector (or one lane) at a time, in the reference's op
// order. The reduction pass reads the gradient through BertAdamGrad, so the norm it clips by is
// that of the gradient the update reads. Included per target; no include guard (see lerp_math.h).

// The gradient as the step sees it: unscaled (grad_scale), before clipping.
template <class Ops, class V>
FOPT_HOST_DEVICE inline V BertAdamGrad(const Ops& o, const BertAdamScalars& s, V g) {
  return o.Mul(g, o.Set(s.grad_mul));
}

// p: param (f32), g: gradient as read, m: exp_avg, v: exp_avg_sq.
template <bool kWeightDecay, class Ops, class V>
FOPT_HOST_DEVICE inline void BertAdamMath(const Ops& o, const BertAdamScalars& s, V& p, V g, V& m,
                                          V& v) {
  // g = g·c (c = 1 unless this buffer's norm is clipped)   combined_grad.mul_(clip_coef)
  g = o.Mul(BertAdamGrad(o, s, g), o.Set(s.clip));
  // m = β1·m + (1 − β1)·g                       exp_avg.mul_(beta1).add_(1 - beta1, grad)
  m = o.MulAdd(o.Set(s.one_minus_b1), g, o.Mul(m, o.Set(s.b1)));
  // v = β2·v + (1 − β2)·g²                      exp_avg_sq.mul_(beta2).addcmul_(1 - beta2, g, g)
  v = o.MulAdd(o.Mul(o.Set(s.one_minus_b2), g), g, o.Mul(v, o.Set(s.b2)));
  // u = m / (√v + e), no bias correction       update = exp_avg / (exp_avg_sq.sqrt() + e)
  V u = o.Div(m, o.Add(o.Sqrt(v), o.Set(s.e)));
  // u = u + λ·θ (weight_decay > 0)              update += weight_decay * param
  if constexpr (kWeightDecay) u = o.Add(u, o.Mul(o.Set(s.weight_decay), p));
  // θ = θ − lr_s·u                              param.add_(-(lr_scheduled * update))
  p = o.Sub(p, o.Mul(o.Set(s.lr_scheduled), u));
}
