// Rprop, one vector (or one lane) at a time, in torch 2.x's single-tensor operation order
// (torch/optim/rprop.py, _single_tensor_rprop, non-capturable). Included per target; no include
// guard (see lerp_math.h).

// p: param (f32), g: gradient, prev: the last gradient used (0 where its sign flipped), step_size:
// the per-element step. The three masked fills of torch's `sign` tensor run in its order, so that
// f32(etaminus) or f32(etaplus) rounding to 0 or 1 selects as in torch.
template <class Ops, class V>
FOPT_HOST_DEVICE inline void RpropMath(const Ops& o, const RpropScalars& s, V& p, V g, V& prev,
                                       V& step_size) {
  const V zero = o.Set(0.0f);
  // g = ±∇ (maximize)                           grad if not maximize else -grad
  g = o.Mul(g, o.Set(s.grad_mul));
  // f = sgn(g·prev) (0 for ±0 and NaN)          sign = grad.mul(prev).sign()
  V f = o.Sign(o.Mul(g, prev));
  // f = η+ where f > 0                          sign[sign.gt(0)] = etaplus
  f = o.IfThenElse(o.Gt(f, zero), o.Set(s.etaplus), f);
  // f = η− where f < 0                          sign[sign.lt(0)] = etaminus
  f = o.IfThenElse(o.Lt(f, zero), o.Set(s.etaminus), f);
  // f = 1 where f = 0                           sign[sign.eq(0)] = 1
  f = o.IfThenElse(o.Eq(f, zero), o.Set(1.0f), f);
  // Δ = clamp(Δ·f, Δmin, Δmax), NaN stays NaN   step_size.mul_(sign).clamp_(min, max)
  step_size = o.Min(o.Max(o.Mul(step_size, f), o.Set(s.step_size_min)), o.Set(s.step_size_max));
  // g = 0 where f = η− (the sign flipped)       grad = grad.clone(); grad[sign.eq(etaminus)] = 0
  g = o.IfThenElse(o.Eq(f, o.Set(s.etaminus)), zero, g);
  // θ = θ + (−1·sgn(g))·Δ                       param.addcmul_(grad.sign(), step_size, value=-1)
  p = o.Add(p, o.Mul(o.Mul(o.Set(-1.0f), o.Sign(g)), step_size));
  // prev = g                                    prev.copy_(grad)
  prev = g;
}
