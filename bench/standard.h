// The two yardsticks the fused step is measured against, over the very same segments and buffers:
//
// - `standard`: the for-loop torch.optim algorithm (torch/optim/<algo>.py, _single_tensor_<algo>;
//   Lion: lion-pytorch's update_fn; LAMB: tools/lamb_reference.py, global gradient norm included),
//   as its descriptor's StandardStep writes it (src/algos/descriptor.h): per tensor, one elementary
//   op per line of the update, each a full pass over memory, with the temporaries torch allocates
//   (e.g. Adam's `denom`), freshly allocated per tensor as ATen's CPU allocator does.
// - `same_traffic`: one pass that reads and writes exactly the bytes the fused step reads and
//   writes (preceded, for a two-phase step, by a read-only pass over what its reduction reads),
//   with trivial math: the memory-bandwidth ceiling of this machine, measured in the same run.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "bench/same_traffic.h"
#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "fusedopt/training_step.h"
#include "src/algos/registry.h"

namespace fusedopt::bench {

// An algorithm of the registry (src/algos/registry.h): the index of its descriptor in algos::All.
enum class Algorithm : std::size_t {};

template <class A>
constexpr Algorithm AlgorithmOf() {
  return Algorithm{algos::All::IndexOf<typename A::Hyper>()};
}

// f(std::type_identity<A>{}) for the descriptor A of `a`.
template <class F>
decltype(auto) WithDescriptor(Algorithm a, F&& f) {
  return algos::All::Visit(static_cast<std::size_t>(a), f);
}

// Parses a descriptor's kName ("sgd", "adam", ..., "lamb"); throws std::invalid_argument naming
// them all otherwise.
Algorithm ParseAlgorithm(std::string_view name);
std::string_view AlgorithmName(Algorithm a);
// Every kName in the registry's order: "sgd, adam, adamw, rmsprop, adagrad, lion, lamb, adamax,
// adadelta, radam, nadam, lars, adamp".
std::string AlgorithmNames();

// Whether the fused step of `a` is two-phase: a reduction pass that reads the grad, the param and
// every state and writes nothing (LAMB's per-tensor Σp², Σu²; LARS's Σp², Σg²) before the update
// pass. The traffic
// ceiling and the bytes `fusedopt bench` reports include that pass.
bool HasReductionPass(Algorithm a);
// Whether that reduction pass reads the gradients only (BertAdam's Σg², descriptor
// kReducesGradOnly): its floor is then one read of every gradient (SameTrafficGradRead), and its
// bytes the gradient's.
bool ReductionReadsGradOnly(Algorithm a);

// Whether the fused step of `a` is factored (descriptor kFactored: Adafactor's RunFactoredStep, a
// stats pass, a norm pass over the matrices and the update pass, over tiles).
bool IsFactored(Algorithm a);

// Whether DistributedOptimizer's ZeRO-1 takes `a` (src/core/step_hooks.h, kZeroOneShards).
bool ShardsWithZeroOne(Algorithm a);

// The traffic floor of a factored step (IsFactored), the passes' bytes: the stats pass reads each
// param, its gradient and the states it keeps element-wise (kStateShapes: a vector's variance,
// 1×1 matrices' row_var and col_var), the norm pass reads the gradient of each param that keeps
// small factors (matrices: row_var and col_var, rows + cols values per matrix, left out of the
// bytes) once more, and the update pass reads and writes the param and those element-wise states
// and reads the gradient.
class FactoredTraffic {
 public:
  FactoredTraffic(Algorithm a, std::span<const Segment> segments);
  // SameTrafficReduce (stats), SameTrafficGradRead (norm), SameTrafficStep (update) over them.
  void Run(const Runtime& runtime, TrafficStores stores) const;
  std::size_t bytes() const { return bytes_; }  // what Run moves

 private:
  std::vector<Segment> passes_;    // the segments, only their element-wise states kept
  std::vector<Segment> matrices_;  // those with small factors (the norm pass)
  std::size_t bytes_ = 0;
};

// Hyper-parameters of every algorithm, one group each (Of<SgdHyper>()); only the one being
// benchmarked is used. The Hyper structs' defaults (torch's, the reference's), except:
// - SGD: lr 1e-2 and momentum 0.9;
// - Lion: lion-pytorch's lr 1e-4 and betas; decoupled weight decay 0.1 (lion-pytorch's default is
//   0; the Lion paper uses 3-10x AdamW's decay at a 3-10x smaller lr). The standard step runs
//   p.mul_(1 - lr*wd) for any wd, as lion-pytorch does;
// - LAMB: apex FusedLAMB's defaults (weight decay 0.01, AdamW mode), and the standard step's
//   global gradient clipping at `standard.max_grad_norm` 1 (tools/lamb_reference.py's
//   max_grad_norm, apex's default). The fused step alone does not clip: with --clip, its pre-pass
//   does;
// - ASGD: t0 -1, so that ax averages (reads and writes ax: ax.add_(param.sub(ax).mul_(mu))) from
//   step 2 on, the doctor's step included. With torch's t0 1e6, ax is a copy of the param for the
//   first million steps, which the fused step writes without reading it (4/5 of the bytes).
// - LARS: SGD's lr 1e-2 and momentum 0.9 (LARC's trust coefficient 0.02 and clip mode).
struct BenchHyper {
  BenchHyper() {
    Of<SgdHyper>() = {.lr = 1e-2, .momentum = 0.9};
    Of<LarsHyper>() = {.lr = 1e-2, .momentum = 0.9};
    Of<LionHyper>().weight_decay = 0.1;
    Of<AsgdHyper>().t0 = -1.0;
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
void SameTrafficStep(std::span<const Segment> segments, const Runtime& runtime);
// The floor of the fused pre-pass: one read of every segment's gradient, in the step's chunks.
// Returns the sum of all gradient elements (so the reads cannot be optimized away).
float SameTrafficGradRead(std::span<const Segment> segments, const Runtime& runtime);

}  // namespace fusedopt::bench
