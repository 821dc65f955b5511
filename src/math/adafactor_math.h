// Adafactor (torch 2.13's _single_tensor_adafactor, shared/docs/algorithms-more.md §2.5), one
// vector (or one lane) at a time. Every pass calls the same function for U, so the update whose
// norm the reduction pass sums is, bit for bit, the one the update pass applies. Included per
// target; no include guard (see lerp_math.h).

// A vector param: the variance after this step's lerp (in place) and U.
//   variance.lerp_(grad * grad, one_minus_beta2_t)
//   update = variance.clone().clamp_(min=eps1 * eps1).rsqrt_().mul_(grad)
// rsqrt_ is fl(1 / sqrtf(x)) with an IEEE sqrt (algorithms-more.md §0); clamp_ keeps a NaN.
template <class Ops, class V>
FOPT_HOST_DEVICE inline V AdafactorVectorUpdate(const Ops& o, const AdafactorScalars& s, V g,
                                                V& variance) {
  variance = Lerp(o, variance, o.Mul(g, g), s.variance_lerp);
  const V clamped = o.Max(variance, o.Set(s.eps1_sq));
  return o.Mul(o.Div(o.Set(1.0f), o.Sqrt(clamped)), g);
}

// A factored param: U from the row factor r, the column factors c and the row mean of the matrix.
//   var_estimate = row_var @ col_var            (one product: the matmul's K is 1)
//   var_estimate.div_(row_var.mean(dim=-2, keepdim=True).clamp_(min=eps1))
//   update = var_estimate.clamp_(min=eps1 * eps1).rsqrt_().mul_(grad)
template <class Ops, class V>
FOPT_HOST_DEVICE inline V AdafactorFactoredUpdate(const Ops& o, const AdafactorScalars& s, V g, V r,
                                                  V c, V row_mean) {
  const V estimate = o.Div(o.Mul(r, c), row_mean);
  const V clamped = o.Max(estimate, o.Set(s.eps1_sq));
  return o.Mul(o.Div(o.Set(1.0f), o.Sqrt(clamped)), g);
}

// A param whose matrices are 1×1 (a [out, in, 1, 1] convolution weight): each element is its own
// row and column, so the factors are element-wise and the kernel updates them itself: r (row_var)
// and c (col_var) after this step's lerp (in place), clamped the row mean r at `eps1` (f32), U.
//   row_mean = torch.norm(grad, dim=-1, keepdim=True).square_().div_(1)   = fl(g·g)
//   row_var.lerp_(row_mean, one_minus_beta2_t); col_var likewise
//   var_estimate = (row_var @ col_var).div_(row_var.mean(dim=-2).clamp_(min=eps1))
template <class Ops, class V>
FOPT_HOST_DEVICE inline V AdafactorPointwiseUpdate(const Ops& o, const AdafactorScalars& s, V g,
                                                   V& r, V& c, float eps1) {
  const V mean_square = o.Mul(g, g);
  r = Lerp(o, r, mean_square, s.variance_lerp);
  c = Lerp(o, c, mean_square, s.variance_lerp);
  return AdafactorFactoredUpdate(o, s, g, r, c, o.Max(r, o.Set(eps1)));
}

// The update pass, after U:
//   if weight_decay != 0: param.mul_(1 - lr * weight_decay)
//   param.add_(update, alpha=-alpha / denom)
template <bool kDecay, class Ops, class V>
FOPT_HOST_DEVICE inline void AdafactorApply(const Ops& o, const AdafactorScalars& s, V& p, V u) {
  if constexpr (kDecay) p = o.Mul(p, o.Set(s.decay_mul));
  p = o.MulAdd(o.Set(s.neg_alpha), u, p);
}
