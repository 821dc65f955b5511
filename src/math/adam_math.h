// Adam / AdamW, one vector (or one lane) at a time, in torch 2.x's single-tensor operation order
// (torch-semantics.md §3; exp_avg uses lerp_ as torch 2.x does). Included per target; no include
// guard.

// p: param (f32), g: gradient, m: exp_avg, v: exp_avg_sq, v_max: max_exp_avg_sq (only with
// amsgrad).
template <bool kCoupledWeightDecay, bool kAmsgrad, class Ops, class V>
inline void AdamMath(const Ops& o, const AdamScalars& s, V& p, V g, V& m, V& v, V& v_max) {
  g = o.Mul(g, o.Set(s.grad_mul));  // g = ±∇       (maximize)
  if constexpr (kCoupledWeightDecay)
    g = o.MulAdd(o.Set(s.weight_decay), p, g);  // g = g + λθ   (Adam L2)
  p = o.Mul(p, o.Set(s.decay_mul));             // θ = θ(1−γλ)  (AdamW)
  m = Lerp(o, m, g, s.beta1_lerp);              // m = m + (1−β1)(g − m)
  v = o.MulAdd(o.Mul(o.Set(s.one_minus_beta2), g), g,
               o.Mul(v, o.Set(s.beta2)));  // v = β2·v + (1−β2)g²
  if (s.amsgrad) v_max = o.Max(v_max, v);  // v_max = max(v_max, v)
  const V second = s.amsgrad ? v_max : v;
  const V denom =
      o.Add(o.Div(o.Sqrt(second), o.Set(s.bias_correction2_sqrt)), o.Set(s.eps));  // √v/√bc2 + ε
  p = o.Add(p, o.Div(o.Mul(o.Set(s.neg_step_size), m), denom));  // θ = θ − (γ/bc1)·m/denom
}
