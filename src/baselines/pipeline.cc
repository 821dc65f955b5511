#include "src/baselines/pipeline.h"

#include <cmath>
#include <stdexcept>

#include "fusedopt/grad.h"
#include "src/baselines/elementwise.h"

namespace fusedopt::baselines {
namespace {

TensorRef Ref(const void* data, DType dtype, std::size_t numel) {
  return {const_cast<void*>(data), dtype, numel};
}

}  // namespace

FusedLoop::FusedLoop(Algorithm algorithm, const BenchHyper& hyper,
                     std::span<const Segment> segments, const LoopOptions& options)
    : algorithm_(algorithm),
      hyper_(hyper),
      segments_(segments.begin(), segments.end()),
      options_(options) {}

void FusedLoop::SetStep(std::int64_t step) {
  for (Segment& s : segments_) s.step = step;
}

void FusedLoop::Run(Runtime& runtime) {
  clock_.Start();
  // grad_scale is reset every call: the pre-pass folds the clip factor into it.
  const float inv_scale = options_.scaler ? options_.scaler->inv_scale() : 1.0f;
  for (Segment& s : segments_) s.grad_scale = inv_scale;
  const StepResult result = FusedTrainingStep(
      algorithm_, hyper_, segments_,
      {.scaler = options_.scaler ? &*options_.scaler : nullptr,
       .check_overflow = true,  // the loop always checks, as the standard loop does
       .max_grad_norm = options_.max_norm},
      runtime);
  clock_.LapAt("pre_pass", *result.pre_pass_end);
  clock_.Lap("step");
  if (!result.stepped) ++skipped_;
}

// Fairness of the scratch. torch unscales and clips `.grad` in place. Here the gradient buffers are
// shared by all implementations and must stay as they are, and restoring them between calls would
// be untimed work that leaves them hot in cache (or cold, for the impl that runs next). So the
// first writing pass of a call goes from the shared gradient into this loop's scratch and every
// later pass works in place on the scratch, which the step then reads:
// - grad dtype != param dtype (the acceptance case, bf16 grads of f32 params): (a) is the
//   out-of-place copy torch also makes (.float() / a master grad), and (b)-(f) are in place on it,
//   exactly torch's traffic; nothing is untimed.
// - same dtypes: the first of (b) unscale or (e) clip reads the shared grad and writes the scratch:
//   the bytes torch's in-place pass moves, plus at most a write-allocate of the scratch lines
//   (no untimed work either; slightly against the pipeline, never for it).
// The scratch is allocated once, here, outside the timed region, as a training loop keeps its
// gradient buffers from step to step.
StandardLoop::StandardLoop(Algorithm algorithm, const BenchHyper& hyper,
                           std::span<const Segment> segments, const LoopOptions& options)
    : algorithm_(algorithm),
      hyper_(hyper),
      shared_(segments.begin(), segments.end()),
      step_(segments.begin(), segments.end()),
      options_(options),
      norms_(segments.size(), 0.0f) {
  if (!options_.scaler && !options_.clips()) {
    throw std::invalid_argument("standard_pipeline needs loss scaling or clipping");
  }
  constexpr std::size_t kAlign = 64;
  std::vector<std::size_t> offsets;
  std::size_t bytes = 0;
  for (const Segment& s : shared_) {
    offsets.push_back(bytes);
    bytes += (s.numel * DTypeSize(s.param_dtype) + kAlign - 1) / kAlign * kAlign;
  }
  scratch_.reset(new (std::align_val_t{kAlign}) std::byte[bytes == 0 ? kAlign : bytes]);
  for (std::size_t i = 0; i < step_.size(); ++i) {
    step_[i].grad = scratch_.get() + offsets[i];
    step_[i].grad_dtype = step_[i].param_dtype;
  }
}

void StandardLoop::SetStep(std::int64_t step) {
  for (Segment& s : shared_) s.step = step;
  for (Segment& s : step_) s.step = step;
}

void StandardLoop::Run(const Runtime& runtime) {
  clock_.Start();
  const std::size_t n = shared_.size();
  const auto grad = [&](std::size_t i) {  // the shared gradient, as backward left it
    return Ref(shared_[i].grad, shared_[i].grad_dtype, shared_[i].numel);
  };
  const auto scratch = [&](std::size_t i) {
    return Ref(step_[i].grad, step_[i].grad_dtype, step_[i].numel);
  };
  // Where the gradient lives when a pass starts: the shared buffer until a pass has written the
  // scratch.
  std::vector<bool> in_scratch(n, false);
  const auto current = [&](std::size_t i) { return in_scratch[i] ? scratch(i) : grad(i); };

  // (a) grads = [g.float() for g in grads], into the kept per-tensor buffers.
  bool converted = false;
  for (std::size_t i = 0; i < n; ++i) {
    if (shared_[i].grad_dtype == shared_[i].param_dtype) continue;
    RunConvert(scratch(i), grad(i), runtime);
    in_scratch[i] = true;
    converted = true;
  }
  if (converted) clock_.Lap("convert");

  bool found_inf = false;
  if (options_.scaler) {
    // GradScaler.unscale_(optimizer): grad.mul_(inv_scale) ...
    const float inv_scale = options_.scaler->inv_scale();
    for (std::size_t i = 0; i < n; ++i) {
      RunOp(Op::kMulScalar, scratch(i), current(i), current(i), current(i), inv_scale, runtime);
      in_scratch[i] = true;
    }
    clock_.Lap("unscale");
    // ... and found_inf |= any non-finite element.
    for (std::size_t i = 0; i < n; ++i)
      found_inf = RunNonFiniteCheck(scratch(i), runtime) || found_inf;
    clock_.Lap("inf_check");
  }

  if (options_.clips()) {
    // torch.nn.utils.clip_grad_norm_: norms = [vector_norm(g) for g in grads];
    // total_norm = vector_norm(stack(norms)); clip_coef = max_norm / (total_norm + 1e-6);
    // clip_coef_clamped = clamp(clip_coef, max=1); for g in grads: g.mul_(clip_coef_clamped).
    for (std::size_t i = 0; i < n; ++i) norms_[i] = RunNorm2(current(i), runtime);
    float total_sq = 0.0f;
    for (const float norm : norms_) total_sq += norm * norm;
    const float total_norm = std::sqrt(total_sq);
    clock_.Lap("norm");
    const float coef = ClipCoefficient(total_norm, options_.max_norm);
    for (std::size_t i = 0; i < n; ++i) {
      RunOp(Op::kMulScalar, scratch(i), current(i), current(i), current(i), coef, runtime);
      in_scratch[i] = true;
    }
    clock_.Lap("clip");
  }

  // scaler.step(optimizer): the for-loop step unless the gradients overflowed.
  if (found_inf) {
    ++skipped_;
  } else {
    StandardStep(algorithm_, hyper_, step_, runtime);
  }
  clock_.Lap("step");
  if (options_.scaler) options_.scaler->Update(found_inf);
}

}  // namespace fusedopt::baselines
