#include "src/core/parallel.h"

#include <omp.h>

#include <algorithm>

namespace fusedopt {

void ParallelForChunks(std::size_t num_chunks, int num_threads,
                       const std::function<void(std::size_t, std::size_t)>& body) {
  const auto threads =
      static_cast<int>(std::min<std::size_t>(std::max(num_threads, 1), num_chunks));
  if (threads <= 1) {
    body(0, num_chunks);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const auto t = static_cast<std::size_t>(omp_get_thread_num());
    const auto n = static_cast<std::size_t>(omp_get_num_threads());
    body(num_chunks * t / n, num_chunks * (t + 1) / n);
  }
}

}  // namespace fusedopt
