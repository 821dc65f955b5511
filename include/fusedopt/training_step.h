// One training step over raw buffers: the sequence that runs around the update, written once for
// every front end (fusedopt::Optimizer, the Python package, ...):
//
//   accumulate    with a micro-batch: its gradients added into f32 sums; only the last micro-batch
//                 of a window goes on, with the sums as the gradients
//   pre-pass      one read of the gradients (times their grad_scale) for the non-finite flag and
//                 the global norm, when a loss scaler, an overflow check or clipping asks for it
//   skip          Inf/NaN in the gradients: nothing is updated, the scaler backs off
//   clip          the clip factor folded into every segment's grad_scale (no pass writes grads)
//   step          the algorithm's fused update, wave by wave
//   scaler        updated with the outcome
//
// The pre-pass is GradPrePassPartials + FinishGradPrePass (grad.h); a data-parallel step reduces
// the partials across ranks in between.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>

#include "fusedopt/grad.h"
#include "fusedopt/runtime.h"
#include "fusedopt/scaler.h"
#include "fusedopt/step.h"

namespace fusedopt {

struct StepResult {
  bool stepped = false;    // the params were updated
  bool found_inf = false;  // this call's gradients held Inf/NaN (the step, or the accumulation
                           // window it belongs to, is skipped)
  std::optional<double> grad_norm;  // global norm of the unscaled gradients, when computed
  float clip_coef = 1.0f;           // the clip factor folded into the update
  // When the pre-pass ran, its start and end (for traces such as fusedopt::pt::Timeline).
  std::optional<std::chrono::steady_clock::time_point> pre_pass_begin, pre_pass_end;
};

// Gradient accumulation: an update every `steps` calls, on the mean of the micro-batch gradients.
// The caller keeps it between calls; TrainingStep advances it.
struct AccumulationWindow {
  std::int64_t steps = 1;    // micro-batches per update (>= 1)
  std::int64_t pending = 0;  // micro-batches added since the last update, in [0, steps)
  bool found_inf = false;    // one of them held Inf/NaN: the window's update will be skipped
};

// One micro-batch (TrainingStepOptions::micro_batch). Its gradients are added, times
// grad_scale / steps (rounded once to f32), into their f32 sums: element-wise, the first addition
// to a sum in a window overwrites it. On the last call of the window, the step's segments must
// read those sums (grad = the sum, grad_dtype kF32, grad_scale 1): the update, clipping included,
// runs on them, unless some micro-batch of the window held Inf/NaN.
struct MicroBatch {
  AccumulationWindow* window = nullptr;
  std::span<const GradBuffer> grads;  // this micro-batch's gradients
  std::span<float* const> sums;       // the accumulator of each, numel f32 that overlap no grad
  // Per gradient, whether its sum starts in this micro-batch (is overwritten). Empty: all of them
  // at the window's first micro-batch, none afterwards.
  std::span<const std::uint8_t> fresh = {};
  float grad_scale = 1.0f;  // e.g. a loss scaler's inv_scale
};

struct TrainingStepOptions {
  // Updated with the outcome (Update(found_inf)); its presence also runs the overflow check. The
  // segments' grad_scale must already hold scaler->inv_scale() (times anything else). With a
  // micro-batch: updated with each micro-batch's own outcome, whose grad_scale holds inv_scale.
  LossScaler* scaler = nullptr;
  // Check the gradients for Inf/NaN and skip the step if any, without a scaler (a Python
  // GradScaler keeps its own).
  bool check_overflow = false;
  // Clip the global norm of the gradients times grad_scale to this; Inf: no clipping.
  double max_grad_norm = std::numeric_limits<double>::infinity();
  NormType norm_type = NormType::kL2;
  ClipRule clip_rule = ClipRule::kTorch;
  // Where each wave of segments ends (rising to segments.size()); waves are updated one after the
  // other, so segments that share memory (a param listed twice) see each other's updates in order.
  // Empty: one wave. Everything is validated, and the pre-pass runs, before the first wave writes.
  std::span<const std::size_t> wave_ends = {};
  // Accumulate this micro-batch; step only if it closes the window (see MicroBatch).
  const MicroBatch* micro_batch = nullptr;
};

// Throws fusedopt::Error, having changed nothing (the scaler and the window included), on invalid
// arguments; with a micro-batch that closes its window, the step over the sums is validated before
// the micro-batch is added. Segments' grad_scale may be multiplied by the clip factor.
template <class Hyper>
StepResult TrainingStep(std::span<const Hyper> groups, std::span<Segment> segments,
                        const TrainingStepOptions& options = {},
                        Runtime& runtime = DefaultRuntime());

}  // namespace fusedopt
