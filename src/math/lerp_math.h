// lerp written once over any Ops (see scalars.h for the rule). Like every *_math.h file this has no
// include guard on purpose: each per-target pass of a src/cpu/*.cc file includes it inside its own
// namespace.

// self ← lerp(self, end, w), rounded as ATen's CPU kernel rounds it.
template <class Ops, class V>
FOPT_HOST_DEVICE inline V Lerp(const Ops& o, V self, V end, const LerpCoef& c) {
  const V diff = o.Sub(end, self);
  return c.from_end ? o.MulAdd(o.Set(c.weight_minus_one), diff, end)
                    : o.MulAdd(o.Set(c.weight), diff, self);
}
