// ASGD, one vector (or one lane) at a time, in torch 2.x's single-tensor operation order
// (torch/optim/asgd.py, _single_tensor_asgd, non-capturable). The host reads the eta and mu the
// previous step left and advances them. Included per target; no include guard (see lerp_math.h).

// p: param (f32), g: gradient, ax: the average. Without kAverage the old ax is not read (the
// caller may pass any value) and becomes a copy of the updated param.
template <bool kWeightDecay, bool kAverage, class Ops, class V>
FOPT_HOST_DEVICE inline void AsgdMath(const Ops& o, const AsgdScalars& s, V& p, V g, V& ax) {
  // g = ±∇ (maximize)                           grad if not maximize else -grad
  g = o.Mul(g, o.Set(s.grad_mul));
  // g = g + λθ                                  grad.add(param, alpha=weight_decay)
  if constexpr (kWeightDecay) g = o.MulAdd(o.Set(s.weight_decay), p, g);
  // θ = θ·(1 − λ_d·η)                           param.mul_(1 - lambd * eta)
  p = o.Mul(p, o.Set(s.decay_mul));
  // θ = θ − η·g                                 param.add_(grad, alpha=-eta)
  p = o.MulAdd(o.Set(s.neg_eta), g, p);
  if constexpr (kAverage) {
    // ax = ax + μ·(θ − ax)                      ax.add_(param.sub(ax).mul_(mu))
    ax = o.Add(ax, o.Mul(o.Sub(p, ax), o.Set(s.mu)));
  } else {
    // ax = θ                                    ax.copy_(param)   (mu == 1)
    ax = p;
  }
}
