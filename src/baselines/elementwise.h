// Elementary tensor ops as ATen runs them on the CPU: one op is one pass over memory, vectorized
// for the best SIMD target at run time, computed in f32 and rounded to the tensor's dtype on every
// store, and split over threads only above ATen's grain of 32768 elements. The `standard` baseline
// chains these ops the way a for-loop torch.optim does; it must be a fair opponent, not a strawman.
#pragma once

#include <cstddef>

#include "fusedopt/dtype.h"
#include "fusedopt/runtime.h"
#include "src/algos/descriptor.h"

namespace fusedopt::baselines {

struct TensorRef {
  void* data;
  DType dtype;
  std::size_t numel;
};

enum class Op {
  kMulScalar,   // out = a · s
  kMul,         // out = a · b
  kAddScaled,   // out = a + s·b, one fma      (add_(b, alpha=s), add(b, alpha=s))
  kLerp,        // out = lerp(a, b, s)        (lerp_)
  kAddcmul,     // out = a + (s·b)·c          (addcmul_(b, c, value=s))
  kAddcdiv,     // out = a + (s·b)/c          (addcdiv_(b, c, value=s))
  kSqrt,        // out = √a
  kDivScalar,   // out = a / s
  kAddScalar,   // out = a + s
  kMaximum,     // out = max(a, b)
  kNeg,         // out = −a
  kAbs,         // out = |a|
  kReciprocal,  // out = 1 / a
  kCopy,        // out = a
};

// One op over all elements; b and c are ignored by ops that do not read them. All tensors share
// out's dtype and numel (as in the optimizers' use of these ops).
void RunOp(Op op, TensorRef out, TensorRef a, TensorRef b, TensorRef c, float s,
           const Runtime& runtime);

// The ATen-like ops some standard steps need beyond RunOp (descriptor.h's sgn_, div_, clamp_,
// masked_fill_, rsqrt_), built the same way (one pass, f32 math, rounded to the dtype on store,
// ATen's grain split over threads): out = sgn(a) (Tensor.sgn_: 0 for ±0 and NaN, as torch on the
// CPU), out = a / b (torch.div), out = clamp(a, lo, hi) (clamp_: NaN stays NaN), out = (b cmp t) ?
// v : a (the masked fill x[c.gt(t)] = v) and out = 1 / sqrt(a) (rsqrt_: ATen's vectorized rsqrt
// divides 1 by the IEEE square root).
enum class BaselineOp : int { kSign, kDivide, kClamp, kMaskedFill, kRsqrt };
// The scalars of kClamp (lo, hi) and kMaskedFill (compare, threshold, value), as f32.
struct BaselineArgs {
  float lo = 0.0f;
  float hi = 0.0f;
  algos::Compare compare = algos::Compare::kEq;
  float threshold = 0.0f;
  float value = 0.0f;
};
// out = op(a, b): one pass, split like RunOp.
void RunBaselineOp(BaselineOp op, TensorRef out, TensorRef a, TensorRef b, const Runtime& runtime,
                   const BaselineArgs& args = {});

// The ops of a training loop around the step (GradScaler, clip_grad_norm_, a master-grad copy), one
// pass each, parallel over ATen's grain like RunOp.

// out = a converted to out's dtype (Tensor.copy_ / .float()): read a, write out. Same numel.
void RunConvert(TensorRef out, TensorRef a, const Runtime& runtime);

// True if some element of a is +-Inf or NaN (the check of GradScaler's unscale_, as one read).
bool RunNonFiniteCheck(TensorRef a, const Runtime& runtime);

// torch.linalg.vector_norm(a, 2) as ATen computes it on the CPU: squares summed in f32 vector
// accumulators per grain, the grains' partial sums added in order; one read.
float RunNorm2(TensorRef a, const Runtime& runtime);

}  // namespace fusedopt::baselines
