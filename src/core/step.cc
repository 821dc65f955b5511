// The public step functions: validate everything, compute each segment's coefficients in double,
// then run the kernel over all chunks in one parallel region.

#include "fusedopt/step.h"

#include <string_view>
#include <vector>

#include "src/core/coefficients.h"
#include "src/core/kernels.h"
#include "src/core/parallel.h"
#include "src/core/validate.h"

namespace fusedopt {
namespace {

constexpr StateNames kSgdStates = {"momentum_buffer", "", ""};
constexpr StateNames kAdamStates = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
constexpr StateNames kRmspropStates = {"square_avg", "momentum_buffer", "grad_avg"};
constexpr StateNames kAdagradStates = {"sum", "", ""};

template <class Scalars, class Hyper, class MakeScalars, class RunChunks>
void RunStep(std::string_view fn, std::span<const Hyper> groups, std::span<const Segment> segments,
             const StateNames& state_names, Runtime& runtime, const MakeScalars& make_scalars,
             const RunChunks& run_chunks) {
  ValidateStep(fn, groups, segments, state_names);
  StepPlan<Scalars> plan{ChunkPlan(segments), {}};
  plan.scalars.reserve(segments.size());
  for (const Segment& s : segments) plan.scalars.push_back(make_scalars(groups[s.group], s));
  ParallelForChunks(plan.chunks.num_chunks(), runtime.num_threads(),
                    [&](std::size_t begin, std::size_t end) { run_chunks(plan, begin, end); });
}

}  // namespace

void SgdStep(std::span<const SgdHyper> groups, std::span<const Segment> segments,
             Runtime& runtime) {
  RunStep<SgdScalars>("SgdStep", groups, segments, kSgdStates, runtime, MakeSgdScalars,
                      RunSgdChunks);
}

void AdamStep(std::span<const AdamHyper> groups, std::span<const Segment> segments,
              Runtime& runtime) {
  RunStep<AdamScalars>("AdamStep", groups, segments, kAdamStates, runtime, MakeAdamScalars,
                       RunAdamChunks);
}

void AdamWStep(std::span<const AdamWHyper> groups, std::span<const Segment> segments,
               Runtime& runtime) {
  std::vector<AdamHyper> adam;
  adam.reserve(groups.size());
  for (const AdamWHyper& h : groups) adam.push_back(h.ToAdam());
  RunStep<AdamScalars>("AdamWStep", std::span<const AdamHyper>(adam), segments, kAdamStates,
                       runtime, MakeAdamScalars, RunAdamChunks);
}

void RmspropStep(std::span<const RmspropHyper> groups, std::span<const Segment> segments,
                 Runtime& runtime) {
  RunStep<RmspropScalars>("RmspropStep", groups, segments, kRmspropStates, runtime,
                          MakeRmspropScalars, RunRmspropChunks);
}

void AdagradStep(std::span<const AdagradHyper> groups, std::span<const Segment> segments,
                 Runtime& runtime) {
  RunStep<AdagradScalars>("AdagradStep", groups, segments, kAdagradStates, runtime,
                          MakeAdagradScalars, RunAdagradChunks);
}

unsigned RequiredStates(const SgdHyper& h) { return h.momentum != 0.0 ? 1u : 0u; }
unsigned RequiredStates(const AdamHyper& h) { return h.amsgrad ? 0b111u : 0b011u; }
unsigned RequiredStates(const AdamWHyper& h) { return RequiredStates(h.ToAdam()); }
unsigned RequiredStates(const RmspropHyper& h) {
  return 1u | (h.momentum > 0.0 ? 0b010u : 0u) | (h.centered ? 0b100u : 0u);
}
unsigned RequiredStates(const AdagradHyper& /*h*/) { return 1u; }

}  // namespace fusedopt
