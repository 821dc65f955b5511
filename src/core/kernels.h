// The per-target kernels' entry points, in general: each algorithm's descriptor header (the
// algorithms layer, above this one) declares its own, over its Scalars, and its kernel file defines
// them on the SIMD target chosen at run time. The update pass updates the pieces of chunks
// [chunk_begin, chunk_end) of a plan; a two-phase algorithm's reduction writes, for one chunk, its
// sums for each piece of the chunk (in piece order, Descriptor::kReductions doubles each).
#pragma once

#include <cstddef>

#include "src/core/plan.h"
#include "src/core/tiles.h"
#include "src/math/scalars.h"

namespace fusedopt {

// The shapes of the entry points: the update pass, a two-phase algorithm's reduction, and a
// factored algorithm's pass over tiles [tile_begin, tile_end) (src/core/tiles.h), which writes each
// reduction pass's sums at sums + tile.out.
template <class Scalars>
using ChunksKernel = void (*)(const StepPlan<Scalars>& plan, std::size_t chunk_begin,
                              std::size_t chunk_end);
template <class Scalars>
using ReduceKernel = void (*)(const StepPlan<Scalars>& plan, std::size_t chunk, double* sums);
template <class Scalars>
using TilesKernel = void (*)(const TilePlan<Scalars>& plan, TilePass pass, std::size_t tile_begin,
                             std::size_t tile_end, double* sums);

}  // namespace fusedopt
