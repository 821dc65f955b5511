// Adagrad, one vector (or one lane) at a time, in torch's single-tensor operation order. The
// decayed gradient is used both for the sum and the numerator, as torch does. Included per target;
// no include guard.

// p: param (f32), g: gradient, sum: state_sum.
template <bool kWeightDecay, class Ops, class V>
inline void AdagradMath(const Ops& o, const AdagradScalars& s, V& p, V g, V& sum) {
  g = o.Mul(g, o.Set(s.grad_mul));                                        // g = ±∇
  if constexpr (kWeightDecay) g = o.MulAdd(o.Set(s.weight_decay), p, g);  // g = g + λθ
  sum = o.MulAdd(g, g, sum);                                              // G = G + g²
  const V std_dev = o.Add(o.Sqrt(sum), o.Set(s.eps));                     // √G + ε
  p = o.Add(p, o.Div(o.Mul(o.Set(s.neg_clr), g), std_dev));  // θ = θ − γ̃g/(√G + ε)
}
