// SGD with momentum/Nesterov, one vector (or one lane) at a time, in torch.optim's operation order
// (shared/docs/torch-semantics.md §3). Included per target; no include guard (see lerp_math.h).

// p: param (f32), g: gradient, buf: momentum_buffer (its old value is ignored on the first step).
// Mode flags are template parameters, so each combination compiles to a branch-free loop; the first
// step, which comes once per tensor, is a select instead of one more flag.
template <bool kWeightDecay, bool kMomentum, bool kNesterov, class Ops, class V>
FOPT_HOST_DEVICE inline void SgdMath(const Ops& o, const SgdScalars& s, V& p, V g, V& buf) {
  // d = ±g (maximize)
  V d = o.Mul(g, o.Set(s.grad_mul));
  // d = d + λθ                                  grad.add(param, alpha=weight_decay)
  if constexpr (kWeightDecay) d = o.MulAdd(o.Set(s.weight_decay), p, d);
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
