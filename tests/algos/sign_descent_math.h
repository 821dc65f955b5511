// Sign descent (tests/algos/sign_descent.h), one vector (or one lane) at a time, in the reference's
// order (make_sign_descent_golden.py). Included per target; no include guard (see
// src/math/lerp_math.h).

// p: param (f32), g: gradient. The product of ±1 (or 0) and −lr is exact, so the step rounds once,
// as torch's add_(sign, alpha=−lr) does with or without an fma.
template <bool kDecay, class Ops, class V>
FOPT_HOST_DEVICE inline void SignDescentMath(const Ops& o, const test_algos::SignDescentScalars& s,
                                             V& p, V g) {
  // θ = θ·(1 − γλ)                    param.mul_(1 - lr * weight_decay)
  if constexpr (kDecay) p = o.Mul(p, o.Set(s.decay_mul));
  // θ = θ + (−γ)·sgn(±g)              param.add_(grad.sign(), alpha=-lr)
  p = o.Add(p, o.Mul(o.Sign(o.Mul(g, o.Set(s.grad_mul))), o.Set(s.neg_lr)));
}
