// AdamP (clovaai's adamp.AdamP, the update torch_npu's NpuFusedAdamP ports; shared/docs/
// algorithms-more.md §1.1), one vector (or one lane) at a time. Both passes call AdampUpdate, so
// the perturbation whose projection sums the first pass reduces is, bit for bit, the one the second
// pass projects and applies. Included per target; no include guard (see lerp_math.h).

// g: the raw gradient (unscaled as it is read), m: exp_avg, v: exp_avg_sq (updated in place);
// returns the perturbation before the projection.
template <bool kNesterov, class Ops, class V>
FOPT_HOST_DEVICE inline V AdampUpdate(const Ops& o, const AdampScalars& s, V g, V& m, V& v) {
  // m = β1·m + (1 − β1)·g                   exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
  m = o.MulAdd(o.Set(s.one_minus_beta1), g, o.Mul(m, o.Set(s.beta1)));
  // v = β2·v + (1 − β2)·g²                  exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 -
  // beta2)
  v = o.MulAdd(o.Mul(o.Set(s.one_minus_beta2), g), g, o.Mul(v, o.Set(s.beta2)));
  // den = √v / √bc2 + ε                     (exp_avg_sq.sqrt() /
  // math.sqrt(bias_correction2)).add_(eps)
  const V den = o.Add(DivByCorrection(o, o.Sqrt(v), s.bias_correction2_sqrt), o.Set(s.eps));
  if constexpr (kNesterov) {
    // u = (β1·m + (1 − β1)·g) / den         (beta1 * exp_avg + (1 - beta1) * grad) / denom
    return o.Div(o.Add(o.Mul(o.Set(s.beta1), m), o.Mul(o.Set(s.one_minus_beta1), g)), den);
  } else {
    // u = m / den                           exp_avg / denom
    return o.Div(m, den);
  }
}

// The projection onto the tangent space of a channel row (or of the whole tensor), whose
// ‖p_r‖ + ε and Σ p̂·u the reduction pass gave: u = u − p̂·Σ p̂·u.
template <class Ops, class V>
FOPT_HOST_DEVICE inline V AdampProject(const Ops& o, V p, V u, float norm_eps, float radial) {
  // p̂ = p / (‖p_r‖ + ε)                    p_n = p.data / view_func(p.data).norm(dim=1)...add_(eps)
  const V unit = o.Div(p, o.Set(norm_eps));
  // u = u − p̂·r                             perturb -= p_n * view_func(p_n * perturb).sum(dim=1)...
  return o.Sub(u, o.Mul(unit, o.Set(radial)));
}

// Second pass, after the projection: the decoupled decay, then the step.
template <bool kDecay, class Ops, class V>
FOPT_HOST_DEVICE inline void AdampApply(const Ops& o, const AdampScalars& s, V& p, V u) {
  // θ = θ·(1 − lr·wd·wd_ratio)               p.data.mul_(1 - lr * weight_decay * wd_ratio)
  if constexpr (kDecay) p = o.Mul(p, o.Set(s.decay_mul));
  // θ = θ − (lr / bc1)·u                     p.data.add_(perturb, alpha=-step_size)
  p = o.MulAdd(o.Set(s.neg_step_size), u, p);
}
