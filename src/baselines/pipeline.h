// The training-loop step of `fusedopt bench --loss-scale ... --clip ...`: loss-scale unscaling, the
// overflow check, global-norm clipping and the update, run two ways over the same buffers:
//
// - FusedLoop: what fusedopt does, the core's TrainingStep. Every segment's grad_scale is set to
//   1/loss_scale, the pre-pass reads each gradient once for the overflow flag and the global norm
//   and folds the clip factor into grad_scale, then the fused step applies both as it reads the
//   gradient (skipped on overflow). Gradients are read twice in all, and never written.
// - StandardLoop (`standard_pipeline`): what a PyTorch loop with GradScaler, clip_grad_norm_ and a
//   for-loop optimizer does, as separate vectorized passes per tensor with the ATen-like ops of
//   elementwise.h, one stage after another over all tensors (as torch's foreach loops run):
//     (a) convert  if the grad dtype differs from the param dtype: grad.float() into a per-tensor
//                  buffer of the param dtype (a master-grad copy; read grad, write copy)
//     (b) unscale  grad.mul_(inv_scale)                  (read + write)
//     (c) inf_check  the overflow check                  (read)
//     (d) norm     per-tensor vector_norm, then the norm of the norms   (read)
//     (e) clip     grad.mul_(clip_coef_clamped), even when the factor is 1, as torch does (r + w)
//     (f) step     the `standard` for-loop step (StandardStep), skipped on overflow
//   (b)-(c) run only with loss scaling, (d)-(e) only with clipping.
//
// Each loop owns its LossScaler (the same policy and initial scale), its copy of the segment table
// (so grad_scale and the step counters are its own) and, for StandardLoop, its gradient scratch.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "fusedopt/runtime.h"
#include "fusedopt/scaler.h"
#include "fusedopt/step.h"
#include "src/baselines/standard.h"

namespace fusedopt::baselines {

// Wall time of each pass of the last call, in ms, in the order the passes ran.
using PassTimes = std::vector<std::pair<std::string_view, double>>;

// Times consecutive passes: Start() once per call, Lap(name) after each pass.
class PassClock {
 public:
  void Start() {
    times_.clear();
    last_ = std::chrono::steady_clock::now();
  }
  void Lap(std::string_view name) {
    const auto now = std::chrono::steady_clock::now();
    times_.emplace_back(name, std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }
  // The same, for a pass that ended at `end` (measured by the code that ran it).
  void LapAt(std::string_view name, std::chrono::steady_clock::time_point end) {
    times_.emplace_back(name, std::chrono::duration<double, std::milli>(end - last_).count());
    last_ = end;
  }
  const PassTimes& times() const { return times_; }

 private:
  PassTimes times_;
  std::chrono::steady_clock::time_point last_;
};

// What the training loop does around the update.
struct LoopOptions {
  std::optional<LossScaler> scaler;  // loss scaling: the gradients hold loss · scaler->scale()
  double max_norm = std::numeric_limits<double>::infinity();  // clip_grad_norm_; Inf: no clip
  bool clips() const { return max_norm != std::numeric_limits<double>::infinity(); }
};

class FusedLoop {
 public:
  FusedLoop(Algorithm algorithm, const BenchHyper& hyper, std::span<const Segment> segments,
            const LoopOptions& options);
  // One training step: grad_scale reset, pre-pass, the fused step unless overflow, scaler update.
  void Run(Runtime& runtime);
  void SetStep(std::int64_t step);

  std::int64_t skipped_steps() const { return skipped_; }
  const LoopOptions& options() const { return options_; }
  const PassTimes& pass_ms() const { return clock_.times(); }

 private:
  Algorithm algorithm_;
  const BenchHyper& hyper_;
  std::vector<Segment> segments_;
  LoopOptions options_;
  std::int64_t skipped_ = 0;
  PassClock clock_;
};

class StandardLoop {
 public:
  // Allocates the gradient scratch (64-byte aligned, one buffer per tensor, in the param dtype).
  StandardLoop(Algorithm algorithm, const BenchHyper& hyper, std::span<const Segment> segments,
               const LoopOptions& options);
  void Run(const Runtime& runtime);
  void SetStep(std::int64_t step);

  std::int64_t skipped_steps() const { return skipped_; }
  const LoopOptions& options() const { return options_; }
  const PassTimes& pass_ms() const { return clock_.times(); }

 private:
  struct AlignedFree {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };

  Algorithm algorithm_;
  const BenchHyper& hyper_;
  std::vector<Segment> shared_;  // the segments as given: grads shared with the other impls
  std::vector<Segment> step_;    // the same, with grad = the scratch in the param dtype
  std::unique_ptr<std::byte[], AlignedFree> scratch_;
  LoopOptions options_;
  std::vector<float> norms_;
  std::int64_t skipped_ = 0;
  PassClock clock_;
};

}  // namespace fusedopt::baselines
