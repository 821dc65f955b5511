// Entry points of the per-target gradient passes (src/cpu/grad_pass.cc). A pass reads each plan
// segment's `grad` (grad_dtype) times its grad_scale; the passes that write store into `param`
// (param_dtype), which may be the gradient buffer itself.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusedopt/grad.h"
#include "src/core/plan.h"

namespace fusedopt {

// Number of virtual accumulators of a norm: element k of a piece goes to accumulator k mod 16 on
// every target, so the additions happen in the same order whatever the vector width.
inline constexpr std::size_t kNormAccumulators = 16;

// One chunk's share of a norm (grad.h: NormPartial).
using ChunkNorm = NormPartial;

ChunkNorm RunGradChunkNorm(const ChunkPlan& plan, std::size_t chunk, NormType type);

enum class GradOp {
  kCheck,       // read only
  kScale,       // param = grad · grad_scale
  kAccumulate,  // param += grad · grad_scale (param is f32)
  kClamp,       // param = clamp(grad, -value, value)
};

// Runs op over chunks [chunk_begin, chunk_end); returns whether any gradient element read was +-Inf
// or NaN (before scaling).
bool RunGradChunks(const ChunkPlan& plan, std::size_t chunk_begin, std::size_t chunk_end, GradOp op,
                   float value);

}  // namespace fusedopt
