// RMSprop (torch's: eps outside the sqrt), one vector (or one lane) at a time, in torch 2.x's
// single-tensor operation order. Included per target; no include guard (see lerp_math.h).

// p: param (f32), g: gradient, sq: square_avg, buf: momentum_buffer, ga: grad_avg.
// Mode flags are template parameters: each combination compiles to a branch-free loop.
template <bool kWeightDecay, bool kCentered, bool kMomentum, class Ops, class V>
FOPT_HOST_DEVICE inline void RmspropMath(const Ops& o, const RmspropScalars& s, V& p, V g, V& sq,
                                         V& buf, V& ga) {
  // g = ±∇ (maximize)
  g = o.Mul(g, o.Set(s.grad_mul));
  // g = g + λθ                                  grad.add(param, alpha=weight_decay)
  if constexpr (kWeightDecay) g = o.MulAdd(o.Set(s.weight_decay), p, g);
  // v = α·v + (1 − α)·g²                        square_avg.mul_(alpha).addcmul_(grad, grad, ...)
  sq = o.MulAdd(o.Mul(o.Set(s.one_minus_alpha), g), g, o.Mul(sq, o.Set(s.alpha)));
  // ḡ = ḡ + (1 − α)(g − ḡ)                      grad_avg.lerp_(grad, 1 - alpha)
  if constexpr (kCentered) ga = Lerp(o, ga, g, s.grad_avg_lerp);
  // avg = √(v − ḡ²) + ε  or  √v + ε            square_avg.addcmul(grad_avg, grad_avg,
  // value=-1).sqrt_()
  const V var = kCentered ? o.MulAdd(o.Mul(ga, o.Set(-1.0f)), ga, sq) : sq;
  const V avg = o.Add(o.Sqrt(var), o.Set(s.eps));
  if constexpr (kMomentum) {
    // b = μ·b + g / avg; θ = θ − γ·b           buf.mul_(momentum).addcdiv_(grad, avg);
    // param.add_(buf, -lr)
    buf = o.Add(o.Mul(buf, o.Set(s.momentum)), o.Div(g, avg));
    p = o.MulAdd(o.Set(s.neg_lr), buf, p);
  } else {
    // θ = θ − γ·g / avg                         param.addcdiv_(grad, avg, value=-lr)
    p = o.Add(p, o.Div(o.Mul(o.Set(s.neg_lr), g), avg));
  }
}
