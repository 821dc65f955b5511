// Entry points of the per-target kernels (src/cpu/<algo>.cc): each updates the pieces of chunks
// [chunk_begin, chunk_end) of a plan on the SIMD target chosen at run time.
#pragma once

#include <cstddef>

#include "src/core/plan.h"
#include "src/math/scalars.h"

namespace fusedopt {

void RunSgdChunks(const StepPlan<SgdScalars>& plan, std::size_t chunk_begin, std::size_t chunk_end);
void RunAdamChunks(const StepPlan<AdamScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end);
void RunRmspropChunks(const StepPlan<RmspropScalars>& plan, std::size_t chunk_begin,
                      std::size_t chunk_end);
void RunAdagradChunks(const StepPlan<AdagradScalars>& plan, std::size_t chunk_begin,
                      std::size_t chunk_end);

}  // namespace fusedopt
