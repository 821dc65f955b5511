// The two yardsticks the fused step is measured against, over the very same segments and buffers:
//
// - `standard`: the for-loop torch.optim algorithm (torch/optim/<algo>.py, _single_tensor_<algo>;
//   Lion: lion-pytorch's update_fn; LAMB: tools/lamb_reference.py, global gradient norm included),
//   as its descriptor's StandardStep writes it (src/algos/descriptor.h): per tensor, one elementary
//   op per line of the update, each a full pass over memory, with the temporaries torch allocates
//   (e.g. Adam's `denom`), freshly allocated per tensor as ATen's CPU allocator does.
// - `same_traffic`: one pass that reads and writes exactly the bytes the fused step reads and
//   writes (preceded, for a two-phase step, by a read-only pass over what its reduction reads),
//   with trivial math, run as each of the loops of kAllTrafficLoops (same_traffic.h): the fastest
//   is the memory-bandwidth ceiling of this machine, measured in the same run.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "fusedopt/training_step.h"
#include "src/algos/registry.h"
#include "src/baselines/same_traffic.h"
#include "src/tool_util/algorithm.h"

namespace fusedopt::baselines {

// The algorithm the baselines run, as the tools name it (src/tool_util/algorithm.h).
using tools::Algorithm;

// The traffic floor of a two-phase step's reduction pass (tools::HasReductionPass): the segments
// it reads (tools::ReducesSegment), as it reads them (tools::ReductionReadsOf: the gradient only;
// the param and the gradient; or those and every allocated state). Empty for other algorithms.
class ReductionTraffic {
 public:
  ReductionTraffic(Algorithm a, std::span<const Segment> segments);
  // SameTrafficGradRead or SameTrafficReduce over them, paced as `loop`; nothing when the pass
  // reads nothing.
  void Run(const Runtime& runtime, TrafficLoop loop) const;
  std::size_t bytes() const { return bytes_; }  // what Run moves

 private:
  std::vector<Segment> segments_;  // the segments read, unread states dropped
  bool grad_only_ = false;
  std::size_t bytes_ = 0;
};

// The traffic floor of a factored step (IsFactored), the passes' bytes: the stats pass reads each
// param, its gradient and the states it keeps element-wise (kStateShapes: a vector's variance,
// 1×1 matrices' row_var and col_var), the norm pass reads the gradient of each param that keeps
// small factors (matrices: row_var and col_var, rows + cols values per matrix, left out of the
// bytes) once more, and the update pass reads and writes the param and those element-wise states
// and reads the gradient.
class FactoredTraffic {
 public:
  FactoredTraffic(Algorithm a, std::span<const Segment> segments);
  // SameTrafficReduce (stats), SameTrafficGradRead (norm), SameTrafficStep (update) over them,
  // each paced as `loop`.
  void Run(const Runtime& runtime, TrafficLoop loop) const;
  std::size_t bytes() const { return bytes_; }  // what Run moves

 private:
  std::vector<Segment> passes_;    // the segments, only their element-wise states kept
  std::vector<Segment> matrices_;  // those with small factors (the norm pass)
  std::size_t bytes_ = 0;
};

// Hyper-parameters of every algorithm, one group each (Of<AdamHyper>()); only the one being
// benchmarked is used: the descriptor's BenchHyper() where it has one (settings that make the
// step do its typical work, e.g. a momentum buffer), the Hyper struct's defaults otherwise. LAMB's
// standard step also clips the global gradient norm at `standard.max_grad_norm` 1
// (tools/lamb_reference.py's max_grad_norm, apex's default); the fused step alone does not clip:
// with --clip, its pre-pass does.
struct BenchHyper {
  BenchHyper() {
    algos::All::ForEach([&]<class D>(std::type_identity<D>) {
      if constexpr (requires { D::BenchHyper(); }) Of<typename D::Hyper>() = D::BenchHyper();
    });
  }
  template <class Hyper>
  Hyper& Of() {
    return std::get<Hyper>(groups);
  }
  template <class Hyper>
  const Hyper& Of() const {
    return std::get<Hyper>(groups);
  }

  algos::All::Hypers groups;
  algos::StandardOptions standard;
};

// Which Segment::state slots the algorithm uses under these hyper-parameters.
unsigned BenchRequiredStates(Algorithm a, const BenchHyper& h);

void FusedStep(Algorithm a, const BenchHyper& h, std::span<const Segment> segments,
               Runtime& runtime);
// The core's TrainingStep (fusedopt/training_step.h) for the algorithm: what fusedopt runs around
// the update (pre-pass, skip, clip, step, scaler update).
StepResult FusedTrainingStep(Algorithm a, const BenchHyper& h, std::span<Segment> segments,
                             const TrainingStepOptions& options, Runtime& runtime);
// The descriptor's StandardStep (src/algos/descriptor.h) over the segments, every op one pass.
void StandardStep(Algorithm a, const BenchHyper& h, std::span<const Segment> segments,
                  const Runtime& runtime);
// The floor of the fused pre-pass: one read of every segment's gradient, in the step's chunks, with
// `pace` divisions per vector (TrafficLoop). Returns the sum of all gradient elements (plus the
// pace chains': so the reads cannot be optimized away). A pace below 0 throws
// std::invalid_argument.
float SameTrafficGradRead(std::span<const Segment> segments, const Runtime& runtime, int pace = 0);

}  // namespace fusedopt::baselines
