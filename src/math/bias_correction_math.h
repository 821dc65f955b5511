// Division by a bias correction, written once over any Ops (see scalars.h for the rule). Like every
// *_math.h file this has no include guard on purpose: each per-target pass of a src/cpu/*.cc file
// includes it inside its own namespace.

// x / c for a bias correction c: 1 − β^t or its root, one f32 scalar per tensor and step. It rounds
// to exactly 1 once β^t is small enough (Adam's √bc2 at β2 = 0.999 from step 16,628 on, at 0.95
// from step 325; LAMB's bc1 at β1 = 0.9 from step 165), and x / 1 is x, bit for bit: the division
// is then left out. Divisions and square roots are the costliest ops of these steps (AMD Zen 4
// issues one 512-bit `vdivps` per 6 cycles, `vsqrtps` per 10): without this one AdamW runs 1.26x
// faster in cache, LAMB (two of them) 1.56x (docs/benchmarks.md, "Late steps").
template <class Ops, class V>
FOPT_HOST_DEVICE inline V DivByCorrection(const Ops& o, V x, float c) {
  if (c == 1.0f) return x;
  return o.Div(x, o.Set(c));
}
