// The two yardsticks the fused step is measured against, over the very same segments and buffers:
//
// - `standard`: the for-loop torch.optim algorithm (torch/optim/<algo>.py, _single_tensor_<algo>;
//   Lion: lion-pytorch's update_fn; LAMB: tools/lamb_reference.py, global gradient norm included):
//   per tensor, one elementary op per line of the update, each a full pass over memory, with the
//   temporaries torch allocates (e.g. Adam's `denom`), freshly allocated per tensor as ATen's CPU
//   allocator does.
// - `same_traffic`: one pass that reads and writes exactly the bytes the fused step reads and
//   writes (preceded, for a two-phase step, by a read-only pass over what its reduction reads),
//   with trivial math: the memory-bandwidth ceiling of this machine, measured in the same run.
#pragma once

#include <span>
#include <string_view>

#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "fusedopt/training_step.h"

namespace fusedopt::bench {

enum class Algorithm { kSgd, kAdam, kAdamW, kRmsprop, kAdagrad, kLion, kLamb };

// Parses "sgd", "adam", "adamw", "rmsprop", "adagrad", "lion" or "lamb"; throws
// std::invalid_argument otherwise.
Algorithm ParseAlgorithm(std::string_view name);
std::string_view AlgorithmName(Algorithm a);

// Whether the fused step of `a` is two-phase: a reduction pass that reads the grad, the param and
// every state and writes nothing (LAMB's per-tensor Σp², Σu²) before the update pass. The traffic
// ceiling and the bytes `fusedopt bench` reports include that pass.
bool HasReductionPass(Algorithm a);

// Hyper-parameters of every algorithm; only the one being benchmarked is used (one group).
struct BenchHyper {
  SgdHyper sgd{.lr = 1e-2, .momentum = 0.9};
  AdamHyper adam{};
  AdamWHyper adamw{};
  RmspropHyper rmsprop{};
  AdagradHyper adagrad{};
  // lion-pytorch's lr 1e-4 and betas; decoupled weight decay 0.1 (lion-pytorch's default is 0; the
  // Lion paper uses 3-10x AdamW's decay at a 3-10x smaller lr). The standard step runs
  // p.mul_(1 - lr*wd) for any wd, as lion-pytorch does.
  LionHyper lion{.weight_decay = 0.1};
  LambHyper lamb{};  // apex FusedLAMB's defaults (weight decay 0.01, AdamW mode)
  // The global gradient clipping of the standard LAMB step (tools/lamb_reference.py's
  // max_grad_norm, apex's default). The fused step alone does not clip: with --clip, its pre-pass
  // does.
  double lamb_max_grad_norm = 1.0;
};

// Which Segment::state slots the algorithm uses under these hyper-parameters.
unsigned BenchRequiredStates(Algorithm a, const BenchHyper& h);

void FusedStep(Algorithm a, const BenchHyper& h, std::span<const Segment> segments,
               Runtime& runtime);
// The core's TrainingStep (fusedopt/training_step.h) for the algorithm: what fusedopt runs around
// the update (pre-pass, skip, clip, step, scaler update).
StepResult FusedTrainingStep(Algorithm a, const BenchHyper& h, std::span<Segment> segments,
                             const TrainingStepOptions& options, Runtime& runtime);
void StandardStep(Algorithm a, const BenchHyper& h, std::span<const Segment> segments,
                  const Runtime& runtime);
void SameTrafficStep(std::span<const Segment> segments, const Runtime& runtime);
// The floor of the fused pre-pass: one read of every segment's gradient, in the step's chunks.
// Returns the sum of all gradient elements (so the reads cannot be optimized away).
float SameTrafficGradRead(std::span<const Segment> segments, const Runtime& runtime);

}  // namespace fusedopt::bench
