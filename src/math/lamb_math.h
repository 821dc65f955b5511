// LAMB (apex FusedLAMB's formulas, shared/docs/algorithms-more.md §3.1), one vector (or one lane)
// at a time. Both passes call LambUpdate, so the update u whose norm the first pass reduces is,
// bit for bit, the one the second pass applies. Included per target; no include guard (see
// lerp_math.h).

// p: param (f32), g: gradient, m: exp_avg, v: exp_avg_sq (updated in place); returns u. The
// weight-decay modes are template parameters, as in every math body: one branch-free loop each.
template <bool kL2WeightDecay, bool kDecoupledWeightDecay, class Ops, class V>
FOPT_HOST_DEVICE inline V LambUpdate(const Ops& o, const LambScalars& s, V p, V g, V& m, V& v) {
  // g = g·grad_scale: unscaled and clipped as it is read
  g = o.Mul(g, o.Set(s.grad_mul));
  // L2 mode: g = g + λθ                         sg = sg + wd * p
  if constexpr (kL2WeightDecay) g = o.MulAdd(o.Set(s.weight_decay), p, g);
  // m = β1·m + β3·g                             m = m * b1 + b3 * sg
  m = o.MulAdd(o.Set(s.beta3), g, o.Mul(m, o.Set(s.beta1)));
  // v = β2·v + (1 − β2)·g²                      v = v * b2 + (1 - b2) * sg * sg
  v = o.MulAdd(o.Mul(o.Set(s.one_minus_beta2), g), g, o.Mul(v, o.Set(s.beta2)));
  // u = (m / bc1) / (√(v / bc2) + ε)            (m / bc1) / (sqrtf(v / bc2) + eps)
  V u = o.Div(DivByCorrection(o, m, s.bias_correction1),
              o.Add(o.Sqrt(DivByCorrection(o, v, s.bias_correction2)), o.Set(s.eps)));
  // AdamW mode: u = u + λθ                      u = u + wd * p
  if constexpr (kDecoupledWeightDecay) u = o.MulAdd(o.Set(s.weight_decay), p, u);
  return u;
}

// Second pass: θ = θ − ratio·u                  p = p - ratio * u
template <class Ops, class V>
FOPT_HOST_DEVICE inline void LambApply(const Ops& o, const LambScalars& s, V& p, V u) {
  p = o.MulAdd(o.Set(s.neg_ratio), u, p);
}
