// RMSprop (torch's: eps outside the sqrt), one vector (or one lane) at a time, in torch 2.x's
// single-tensor operation order. Included per target; no include guard.

// p: param (f32), g: gradient, sq: square_avg, buf: momentum_buffer, ga: grad_avg.
template <bool kWeightDecay, bool kCentered, bool kMomentum, class Ops, class V>
inline void RmspropMath(const Ops& o, const RmspropScalars& s, V& p, V g, V& sq, V& buf, V& ga) {
  g = o.Mul(g, o.Set(s.grad_mul));                                        // g = ±∇
  if constexpr (kWeightDecay) g = o.MulAdd(o.Set(s.weight_decay), p, g);  // g = g + λθ
  sq = o.MulAdd(o.Mul(o.Set(s.one_minus_alpha), g), g,
                o.Mul(sq, o.Set(s.alpha)));                       // v = αv + (1−α)g²
  if constexpr (kCentered) ga = Lerp(o, ga, g, s.grad_avg_lerp);  // ḡ = ḡ + (1−α)(g − ḡ)
  const V var = kCentered ? o.MulAdd(o.Mul(ga, o.Set(-1.0f)), ga, sq) : sq;  // v − ḡ²  |  v
  const V avg = o.Add(o.Sqrt(var), o.Set(s.eps));                            // √var + ε
  if constexpr (kMomentum) {
    buf = o.Add(o.Mul(buf, o.Set(s.momentum)), o.Div(g, avg));  // b = μb + g/avg
    p = o.MulAdd(o.Set(s.neg_lr), buf, p);                      // θ = θ − γb
  } else {
    p = o.Add(p, o.Div(o.Mul(o.Set(s.neg_lr), g), avg));  // θ = θ − γg/avg
  }
}
