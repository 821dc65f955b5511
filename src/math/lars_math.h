// LARS with apex LARC's semantics around torch.optim.SGD (shared/docs/algorithms-more.md §3.2), one
// vector (or one lane) at a time. Both passes read the gradient through LarsGrad, so the gradient
// whose norm the first pass reduces is, bit for bit, the one the second pass scales. Included per
// target; no include guard (see lerp_math.h).

// The gradient as LARC sees it: unscaled (and clipped) as it is read.
template <class Ops, class V>
FOPT_HOST_DEVICE inline V LarsGrad(const Ops& o, const LarsScalars& s, V g) {
  // g = g·grad_scale                            p.grad (after GradScaler.unscale_)
  return o.Mul(g, o.Set(s.grad_mul));
}

// Second pass. p: param (f32), g: LarsGrad's gradient, buf: momentum_buffer (its old value is
// ignored on the first step). kTrust: both norms were non-zero (LARC's branch); the SGD modes as in
// sgd_math.h, with no weight decay of its own (LARC runs SGD with weight_decay = 0).
template <bool kTrust, bool kMomentum, bool kNesterov, class Ops, class V>
FOPT_HOST_DEVICE inline void LarsMath(const Ops& o, const LarsScalars& s, V& p, V g, V& buf) {
  V d = g;
  if constexpr (kTrust) {
    // d = (g + λθ)·ratio, two roundings each   p.grad.data += weight_decay * p.data
    //                                          p.grad.data *= adaptive_lr
    d = o.Mul(o.Add(d, o.Mul(o.Set(s.weight_decay), p)), o.Set(s.ratio));
  }
  if constexpr (kMomentum) {
    // b = d on the first step (no dampening)    torch.clone(grad).detach()
    // b = μb + (1 − τ)d afterwards              buf.mul_(momentum).add_(grad, alpha=1 - dampening)
    const V next = o.MulAdd(o.Set(s.one_minus_dampening), d, o.Mul(buf, o.Set(s.momentum)));
    buf = s.first_step ? d : next;
    // d = d + μb (nesterov) or d = b            grad.add(buf, alpha=momentum)
    if constexpr (kNesterov) {
      d = o.MulAdd(o.Set(s.momentum), buf, d);
    } else {
      d = buf;
    }
  }
  // θ = θ − γd                                  param.add_(grad, alpha=-lr)
  p = o.MulAdd(o.Set(s.neg_lr), d, p);
}
