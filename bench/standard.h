// The two yardsticks the fused step is measured against, over the very same segments and buffers:
//
// - `standard`: the for-loop torch.optim algorithm (torch/optim/<algo>.py, _single_tensor_<algo>):
// per tensor,
//   one elementary op per line of the update, each a full pass over memory, with the temporaries
//   torch allocates (e.g. Adam's `denom`), freshly allocated per tensor as ATen's CPU allocator
//   does.
// - `same_traffic`: one pass that reads and writes exactly the bytes the fused step reads and
// writes, with
//   trivial math: the memory-bandwidth ceiling of this machine, measured in the same run.
#pragma once

#include <span>
#include <string_view>

#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"

namespace fusedopt::bench {

enum class Algorithm { kSgd, kAdam, kAdamW, kRmsprop, kAdagrad };

// Parses "sgd", "adam", "adamw", "rmsprop" or "adagrad"; throws std::invalid_argument otherwise.
Algorithm ParseAlgorithm(std::string_view name);
std::string_view AlgorithmName(Algorithm a);

// Hyper-parameters of every algorithm; only the one being benchmarked is used (one group).
struct BenchHyper {
  SgdHyper sgd{.lr = 1e-2, .momentum = 0.9};
  AdamHyper adam{};
  AdamWHyper adamw{};
  RmspropHyper rmsprop{};
  AdagradHyper adagrad{};
};

// Which Segment::state slots the algorithm uses under these hyper-parameters.
unsigned BenchRequiredStates(Algorithm a, const BenchHyper& h);

void FusedStep(Algorithm a, const BenchHyper& h, std::span<const Segment> segments,
               Runtime& runtime);
void StandardStep(Algorithm a, const BenchHyper& h, std::span<const Segment> segments,
                  const Runtime& runtime);
void SameTrafficStep(std::span<const Segment> segments, const Runtime& runtime);
// The floor of the fused pre-pass: one read of every segment's gradient, in the step's chunks.
// Returns the sum of all gradient elements (so the reads cannot be optimized away).
float SameTrafficGradRead(std::span<const Segment> segments, const Runtime& runtime);

}  // namespace fusedopt::bench
