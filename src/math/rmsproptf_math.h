// RMSpropTF (torch_npu's NpuFusedRMSpropTF, the old timm RMSpropTF: eps inside the sqrt), one
// vector (or one lane) at a time, in the reference's operation order
// (shared/docs/algorithms-more.md §1.4). Included per target; no include guard (see lerp_math.h).

// p: param (f32), g: gradient, sq: square_avg, buf: momentum_buffer, ga: grad_avg.
// Mode flags are template parameters: each combination compiles to a branch-free loop.
// lr_in_momentum is not one: it only moves lr between two products whose other factor is then
// exactly 1 or −1 (RmsproptfScalars::grad_coef, neg_buf_coef).
template <RmsproptfDecay kDecay, bool kCentered, bool kMomentum, class Ops, class V>
FOPT_HOST_DEVICE inline void RmsproptfMath(const Ops& o, const RmsproptfScalars& s, V& p, V g,
                                           V& sq, V& buf, V& ga) {
  // g = g·grad_scale (the loss-scale and clip factors)
  g = o.Mul(g, o.Set(s.grad_mul));
  if constexpr (kDecay == RmsproptfDecay::kDecoupled) {
    // θ = θ − λθ (not scaled by lr)             p.add_(-weight_decay, p)
    p = o.MulAdd(o.Set(s.neg_decay), p, p);
  } else if constexpr (kDecay == RmsproptfDecay::kCoupled) {
    // g = g + λθ                                grad = grad.add(weight_decay, p)
    g = o.MulAdd(o.Set(s.weight_decay), p, g);
  }
  // v = v + (1 − α)(g² − v)                     square_avg.add_(1 - alpha,
  //                                            grad.pow(2) - square_avg)
  sq = o.MulAdd(o.Set(s.one_minus_alpha), o.Sub(o.Mul(g, g), sq), sq);
  V avg;
  if constexpr (kCentered) {
    // ḡ = ḡ + (1 − α)(g − ḡ)                    grad_avg.add_(1 - alpha, grad - grad_avg)
    ga = o.MulAdd(o.Set(s.one_minus_alpha), o.Sub(g, ga), ga);
    // avg = √(v − ḡ² + ε)                       square_avg.addcmul(-1, grad_avg, grad_avg)
    //                                            .add(eps).sqrt_()
    avg = o.Sqrt(o.Add(o.MulAdd(o.Mul(ga, o.Set(-1.0f)), ga, sq), o.Set(s.eps)));
  } else {
    // avg = √(v + ε)                            square_avg.add(eps).sqrt_()
    avg = o.Sqrt(o.Add(sq, o.Set(s.eps)));
  }
  if constexpr (kMomentum) {
    // b = μ·b + c·g / avg                       buf.mul_(momentum).addcdiv_(lr, grad, avg)
    //                                            (lr_in_momentum, c = lr), else
    //                                            .addcdiv_(grad, avg) (c = 1)
    buf = o.Add(o.Mul(buf, o.Set(s.momentum)), o.Div(o.Mul(o.Set(s.grad_coef), g), avg));
    // θ = θ − b  or  θ = θ − γ·b                p.add_(-buf)  or  p.add_(-lr, buf)
    p = o.MulAdd(o.Set(s.neg_buf_coef), buf, p);
  } else {
    // θ = θ − γ·g / avg                         p.addcdiv_(-lr, grad, avg)
    p = o.Add(p, o.Div(o.Mul(o.Set(s.neg_lr), g), avg));
  }
}
