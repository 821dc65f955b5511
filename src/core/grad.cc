// The public gradient passes: validate, plan the chunks as a step would, run them in one parallel
// region and OR the per-chunk results.

#include "fusedopt/grad.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string_view>
#include <vector>

#include "fusedopt/error.h"
#include "src/core/grad_kernels.h"
#include "src/core/parallel.h"
#include "src/core/plan.h"
#include "src/core/validate.h"

namespace fusedopt {
namespace {

bool RunGradPass(std::string_view fn, std::span<const GradBuffer> grads, const float* scale,
                 Runtime& runtime) {
  std::vector<Segment> segments(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const GradBuffer& g = grads[i];
    if (!ValidDType(g.dtype) || (g.data == nullptr && g.numel > 0)) {
      std::ostringstream out;
      out << fn << ": grad " << i << ": data is null or dtype code " << static_cast<int>(g.dtype)
          << " is invalid (numel " << g.numel << ")";
      throw Error(out.str());
    }
    segments[i] = {.param = g.data, .numel = g.numel, .grad_dtype = g.dtype};
  }
  const ChunkPlan plan(segments);
  // One flag per chunk, written by whichever thread runs it.
  std::vector<char> found(plan.num_chunks(), 0);
  ParallelForChunks(plan.num_chunks(), runtime.num_threads(),
                    [&](std::size_t begin, std::size_t end) {
                      for (std::size_t c = begin; c < end; ++c) {
                        found[c] = RunGradChunksNonFinite(plan, c, c + 1, scale) ? 1 : 0;
                      }
                    });
  return std::any_of(found.begin(), found.end(), [](char f) { return f != 0; });
}

}  // namespace

bool HasNonFinite(std::span<const GradBuffer> grads, Runtime& runtime) {
  return RunGradPass("HasNonFinite", grads, nullptr, runtime);
}

bool UnscaleGrads(std::span<const GradBuffer> grads, float scale, Runtime& runtime) {
  if (!std::isfinite(scale)) {
    std::ostringstream out;
    out << "UnscaleGrads: invalid scale: " << scale << " (must be finite)";
    throw Error(out.str());
  }
  return RunGradPass("UnscaleGrads", grads, &scale, runtime);
}

}  // namespace fusedopt
