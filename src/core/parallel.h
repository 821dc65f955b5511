// One parallel region per step: chunk indices [0, num_chunks) are split statically into one
// contiguous range per thread. Which thread runs a chunk never changes what the chunk computes.
#pragma once

#include <cstddef>
#include <functional>

namespace fusedopt {

// Calls body(chunk_begin, chunk_end) once per thread; runs inline (no fork) for a single chunk or
// thread.
void ParallelForChunks(std::size_t num_chunks, int num_threads,
                       const std::function<void(std::size_t, std::size_t)>& body);

}  // namespace fusedopt
