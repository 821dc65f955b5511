// SGD with momentum/Nesterov, one vector (or one lane) at a time, in torch.optim's operation order
// (shared/docs/torch-semantics.md §3). Included per target; no include guard (see lerp_math.h).

// p: param (f32), g: gradient, buf: momentum_buffer (unread on the first step). The mode flags are
// template parameters so each combination compiles to a branch-free loop.
template <bool kWeightDecay, bool kMomentum, bool kNesterov, bool kFirstStep, class Ops, class V>
inline void SgdMath(const Ops& o, const SgdScalars& s, V& p, V g, V& buf) {
  V d = o.Mul(g, o.Set(s.grad_mul));  // d = ±g          (maximize)
  if (s.has_weight_decay)
    d = o.MulAdd(o.Set(s.weight_decay), p, d);  // d = d + λθ       grad.add(param, alpha=wd)
  if constexpr (kMomentum) {
    if constexpr (kFirstStep) {
      buf = d;  // b = d           torch.clone(grad)
    } else {
      buf = o.MulAdd(o.Set(s.one_minus_dampening), d,
                     o.Mul(buf, o.Set(s.momentum)));  // b = μb + (1−τ)d
    }
    if constexpr (kNesterov) {
      d = o.MulAdd(o.Set(s.momentum), buf, d);  // d = d + μb
    } else {
      d = buf;  // d = b
    }
  }
  p = o.MulAdd(o.Set(s.neg_lr), d, p);  // θ = θ − γd      param.add_(grad, alpha=-lr)
}
