// Whole-model gradient passes that mixed-precision training runs around a step: the overflow check
// (does any gradient hold Inf or NaN?) and the explicit unscale. Each is one read (or read and
// write) of every buffer in one parallel region, with the same chunking as the step.
//
// The fused optimizers do not need UnscaleGrads: a step takes the unscale factor per tensor
// (Segment::grad_scale) and applies it while it reads the gradient, so mixed precision costs one
// read-only check plus the step.
#pragma once

#include <cstddef>
#include <span>

#include "fusedopt/dtype.h"
#include "fusedopt/runtime.h"

namespace fusedopt {

// A gradient buffer of numel contiguous elements.
struct GradBuffer {
  void* data = nullptr;  // only UnscaleGrads writes through it
  std::size_t numel = 0;
  DType dtype = DType::kF32;
};

// True if any element of any buffer is +-Inf or NaN. Reads every buffer once; writes nothing.
bool HasNonFinite(std::span<const GradBuffer> grads, Runtime& runtime = DefaultRuntime());

// grads *= scale in f32 (each element rounded back to its dtype with RNE) and returns whether any
// element was +-Inf or NaN before scaling: torch's _amp_foreach_non_finite_check_and_unscale_.
// scale must be finite.
bool UnscaleGrads(std::span<const GradBuffer> grads, float scale,
                  Runtime& runtime = DefaultRuntime());

}  // namespace fusedopt
