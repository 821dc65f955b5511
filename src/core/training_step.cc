// TrainingStep (fusedopt/training_step.h): its checks, and its definition (training_step_impl.h)
// instantiated for every algorithm of hyper.h's list.

#include "fusedopt/training_step.h"

#include <string>

#include "fusedopt/error.h"
#include "src/core/training_step_impl.h"
#include "src/core/validate.h"

namespace fusedopt::training_step_detail {
namespace {

constexpr const char* kFn = "TrainingStep";

void CheckWaves(std::span<const std::size_t> wave_ends, std::size_t num_segments) {
  for (std::size_t w = 0; w < wave_ends.size(); ++w) {
    const std::size_t begin = w == 0 ? 0 : wave_ends[w - 1];
    if (wave_ends[w] < begin || wave_ends[w] > num_segments ||
        (w + 1 == wave_ends.size() && wave_ends[w] != num_segments)) {
      Fail(kFn, "invalid wave_ends (must rise to the number of segments, ", num_segments, ")");
    }
  }
}

void CheckWindow(const MicroBatch& batch) {
  if (batch.window == nullptr) Fail(kFn, "micro_batch without a window");
  const AccumulationWindow& w = *batch.window;
  if (w.steps < 1) Fail(kFn, "invalid accumulation steps: ", w.steps, " (must be >= 1)");
  if (w.pending < 0 || w.pending >= w.steps) {
    Fail(kFn, "invalid pending micro-batches: ", w.pending, " (must be in [0, ", w.steps, "))");
  }
  if (!batch.fresh.empty() && batch.fresh.size() != batch.grads.size()) {
    Fail(kFn, batch.fresh.size(), " fresh flags for ", batch.grads.size(), " gradients");
  }
}

}  // namespace

void CheckOptions(const TrainingStepOptions& options, std::size_t num_segments) {
  if (!(options.max_grad_norm >= 0.0)) {
    Fail(kFn, "invalid max_grad_norm: ", options.max_grad_norm,
         " (must be >= 0; Inf: no clipping)");
  }
  CheckWaves(options.wave_ends, num_segments);
  if (options.micro_batch != nullptr) CheckWindow(*options.micro_batch);
}

bool Accumulate(const MicroBatch& batch, Runtime& runtime) {
  const AccumulationWindow& w = *batch.window;
  const float scale = static_cast<float>(double{batch.grad_scale} / static_cast<double>(w.steps));
  if (!batch.fresh.empty())
    return AccumulateGrads(batch.grads, batch.sums, scale, batch.fresh, runtime);
  return AccumulateGrads(batch.grads, batch.sums, scale, w.pending == 0, runtime);
}

}  // namespace fusedopt::training_step_detail

namespace fusedopt {

// Every algorithm of hyper.h's list.
#define FOPT_INSTANTIATE(Stem, Alias)                                                \
  template StepResult TrainingStep(std::span<const Stem##Hyper>, std::span<Segment>, \
                                   const TrainingStepOptions&, Runtime&);
FUSEDOPT_FOR_EACH_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

}  // namespace fusedopt
