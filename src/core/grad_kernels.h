// Entry point of the per-target gradient pass (src/cpu/grad_pass.cc). The plan's segments carry
// the gradient buffer in `param` and its dtype in `grad_dtype`.
#pragma once

#include <cstddef>

#include "src/core/plan.h"

namespace fusedopt {

// Whether chunks [chunk_begin, chunk_end) hold a non-finite element; with a scale, also multiplies
// them by *scale in place.
bool RunGradChunksNonFinite(const ChunkPlan& plan, std::size_t chunk_begin, std::size_t chunk_end,
                            const float* scale);

}  // namespace fusedopt
