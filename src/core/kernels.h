// Entry points of the per-target kernels (src/cpu/<algo>.cc): each updates the pieces of chunks
// [chunk_begin, chunk_end) of a plan on the SIMD target chosen at run time. A two-phase algorithm
// also has a reduction entry point: for one chunk, it writes its sums for each piece of the chunk
// (in piece order, Descriptor::kReductions doubles each).
#pragma once

#include <cstddef>

#include "src/core/plan.h"
#include "src/core/tiles.h"
#include "src/math/scalars.h"

namespace fusedopt {

void RunSgdChunks(const StepPlan<SgdScalars>& plan, std::size_t chunk_begin, std::size_t chunk_end);
void RunAdamChunks(const StepPlan<AdamScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end);
void RunRmspropChunks(const StepPlan<RmspropScalars>& plan, std::size_t chunk_begin,
                      std::size_t chunk_end);
void RunAdagradChunks(const StepPlan<AdagradScalars>& plan, std::size_t chunk_begin,
                      std::size_t chunk_end);
void RunLionChunks(const StepPlan<LionScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end);
void RunAdamaxChunks(const StepPlan<AdamaxScalars>& plan, std::size_t chunk_begin,
                     std::size_t chunk_end);
void RunAdadeltaChunks(const StepPlan<AdadeltaScalars>& plan, std::size_t chunk_begin,
                       std::size_t chunk_end);
void RunRadamChunks(const StepPlan<RadamScalars>& plan, std::size_t chunk_begin,
                    std::size_t chunk_end);
void RunNadamChunks(const StepPlan<NadamScalars>& plan, std::size_t chunk_begin,
                    std::size_t chunk_end);
void RunRmsproptfChunks(const StepPlan<RmsproptfScalars>& plan, std::size_t chunk_begin,
                        std::size_t chunk_end);
void RunAsgdChunks(const StepPlan<AsgdScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end);
void RunRpropChunks(const StepPlan<RpropScalars>& plan, std::size_t chunk_begin,
                    std::size_t chunk_end);
void RunLambReduceChunk(const StepPlan<LambScalars>& plan, std::size_t chunk, double* sums);
void RunLambChunks(const StepPlan<LambScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end);
void RunLarsReduceChunk(const StepPlan<LarsScalars>& plan, std::size_t chunk, double* sums);
void RunLarsChunks(const StepPlan<LarsScalars>& plan, std::size_t chunk_begin,
                   std::size_t chunk_end);
void RunAdampReduceChunk(const StepPlan<AdampScalars>& plan, std::size_t chunk, double* sums);
void RunAdampChunks(const StepPlan<AdampScalars>& plan, std::size_t chunk_begin,
                    std::size_t chunk_end);
void RunBertAdamReduceChunk(const StepPlan<BertAdamScalars>& plan, std::size_t chunk, double* sums);
void RunBertAdamChunks(const StepPlan<BertAdamScalars>& plan, std::size_t chunk_begin,
                       std::size_t chunk_end);
// A factored algorithm runs over tiles (src/core/tiles.h): one pass over tiles [tile_begin,
// tile_end), writing each reduction pass's sums at sums + tile.out.
void RunAdafactorTiles(const TilePlan<AdafactorScalars>& plan, TilePass pass,
                       std::size_t tile_begin, std::size_t tile_end, double* sums);

}  // namespace fusedopt
