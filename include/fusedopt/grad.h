// Whole-model gradient passes that a training loop runs around a step: the overflow check, the
// global gradient norm and clipping, the explicit unscale, and gradient accumulation. Each is one
// read (or read and write) of every buffer in one parallel region, with the same chunking as the
// step.
//
// The fused path needs few of them: `GradPrePass` reads every gradient once for the non-finite flag
// and the global norm, then folds the clip coefficient into each segment's grad_scale, which the
// step applies as it reads the gradient (together with 1/loss_scale). Unscale, overflow check,
// clip and update thus cost one read of the gradients plus the update pass, instead of five or
// more passes; no gradient is written.
//
// Norms are deterministic: the elements are cut into the step's fixed chunks, each chunk sums into
// 16 virtual accumulators (element k of a piece into accumulator k mod 16) in double, combined by a
// fixed tree, and the chunk sums are added in chunk order. The result is bit-identical for every
// thread count and SIMD target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"

namespace fusedopt {

// A gradient buffer of numel contiguous elements.
struct GradBuffer {
  void* data = nullptr;  // written only by the passes that say so
  std::size_t numel = 0;
  DType dtype = DType::kF32;
};

// The vector norms torch.nn.utils.clip_grad_norm_ offers most: norm_type 1, 2 and inf.
enum class NormType : std::uint8_t { kL1 = 1, kL2 = 2, kInf = 0 };

struct GradStats {
  bool non_finite = false;  // some element is +-Inf or NaN
  double norm = 0.0;        // +Inf or NaN when non_finite
};

// True if any element of any buffer is +-Inf or NaN. Reads every buffer once; writes nothing.
bool HasNonFinite(std::span<const GradBuffer> grads, Runtime& runtime = DefaultRuntime());

// The global norm of all elements of all buffers, each read as f32(element * scale) (the gradient a
// step given grad_scale = scale sees), and whether any such value is non-finite. One read. scale
// must be finite.
GradStats GradNorm(std::span<const GradBuffer> grads, NormType type = NormType::kL2,
                   float scale = 1.0f, Runtime& runtime = DefaultRuntime());

// torch.nn.utils.clip_grad_norm_'s factor, computed in f32 as torch does for f32 gradients:
// min(1, max_norm / (norm + 1e-6)); NaN when norm is NaN, 0 when it is Inf.
float ClipCoefficient(double norm, double max_norm);

// How a global norm turns into the factor that scales the gradients.
enum class ClipRule : std::uint8_t {
  kTorch,         // ClipCoefficient: torch.nn.utils.clip_grad_norm_
  kMaxNormRatio,  // MaxNormRatioCoefficient: apex FusedLAMB's max_grad_norm
  kLamb = kMaxNormRatio,
};

// apex FusedLAMB's global clipping as a factor: f32(max_norm) / f32(norm) when norm > max_norm,
// else 1 (apex divides the gradients by norm / max_norm: at most 1 ulp from multiplying by this).
// max_norm = 0 gives 0 for any non-zero norm, as apex's division by an infinite ratio does.
float MaxNormRatioCoefficient(double norm, double max_norm);
// The same, under the name of the optimizer whose rule it is (ClipRule::kLamb).
inline float LambClipCoefficient(double norm, double max_norm) {
  return MaxNormRatioCoefficient(norm, max_norm);
}

// torch.nn.utils.clip_grad_norm_: computes the global norm (one read) and multiplies every element
// by ClipCoefficient (one read and write, skipped when the factor is exactly 1). Returns the norm.
// With error_if_nonfinite, a non-finite norm throws fusedopt::Error and changes nothing.
// max_norm must be >= 0 (Inf: never clip).
double ClipGradNorm(std::span<const GradBuffer> grads, double max_norm,
                    NormType type = NormType::kL2, bool error_if_nonfinite = false,
                    Runtime& runtime = DefaultRuntime());

// torch.nn.utils.clip_grad_value_: clamps every element to [-clip_value, clip_value] in place
// (NaN stays NaN). clip_value must be >= 0 and not NaN.
void ClipGradValue(std::span<const GradBuffer> grads, double clip_value,
                   Runtime& runtime = DefaultRuntime());

// grads *= scale in f32 (each element rounded back to its dtype with RNE) and returns whether any
// element was +-Inf or NaN before scaling: torch's _amp_foreach_non_finite_check_and_unscale_.
// scale must be finite.
bool UnscaleGrads(std::span<const GradBuffer> grads, float scale,
                  Runtime& runtime = DefaultRuntime());

// Gradient accumulation: accumulators[i] = (overwrite ? 0 : accumulators[i]) + grads[i] * scale,
// element-wise in f32 (the product and the sum each rounded once, on every target). Accumulators
// are f32 buffers of grads[i].numel elements that overlap no gradient. Returns whether any
// gradient element was non-finite (the accumulator then holds it too).
bool AccumulateGrads(std::span<const GradBuffer> grads, std::span<float* const> accumulators,
                     float scale, bool overwrite, Runtime& runtime = DefaultRuntime());
// The same with a choice per gradient: accumulator i is overwritten where overwrite[i] != 0 (one
// flag per gradient; everything is validated before any accumulator is written).
bool AccumulateGrads(std::span<const GradBuffer> grads, std::span<float* const> accumulators,
                     float scale, std::span<const std::uint8_t> overwrite,
                     Runtime& runtime = DefaultRuntime());

// The fused pre-pass of a step.
struct PrePassOptions {
  double max_norm = std::numeric_limits<double>::infinity();  // Inf: no clipping
  NormType norm_type = NormType::kL2;
  ClipRule clip_rule = ClipRule::kTorch;
};
struct PrePassResult {
  bool non_finite =
      false;          // skip the step: some gradient element (times its grad_scale) is not finite
  double norm = 0.0;  // global norm of the gradients times their grad_scale
  float clip_coef = 1.0f;  // the clip_rule's factor, already folded into grad_scale
};

// Reads every segment's gradient once (as grad · grad_scale, i.e. unscaled) for the non-finite flag
// and the global norm. If all is finite, multiplies every segment's grad_scale by the clip
// coefficient, so the step that follows reads clipped gradients; otherwise leaves the segments
// unchanged, and the caller skips the step. Validates grads, dtypes, grad_scale and options first
// (fusedopt::Error, nothing changed). It is the two halves below, one after the other.
PrePassResult GradPrePass(std::span<Segment> segments, const PrePassOptions& options = {},
                          Runtime& runtime = DefaultRuntime());

// One fixed chunk's share of the global norm (the chunks of the step's plan: kGrainElements of
// the segments' concatenated elements each): the sum of x² or |x| in double, and the largest |x|
// as f32 bits (integer max also orders NaN above Inf). A NaN or Inf element makes the sum
// non-finite, so the partials carry the overflow check too.
struct NormPartial {
  double sum = 0.0;
  std::uint32_t max_abs_bits = 0;
};

// The local half: validates like GradPrePass and returns the partial of every chunk, in chunk
// order. A data-parallel step reduces these across ranks (element-wise, in rank order) before the
// finish, so every rank finishes with the same norm.
std::vector<NormPartial> GradPrePassPartials(std::span<const Segment> segments,
                                             const PrePassOptions& options = {},
                                             Runtime& runtime = DefaultRuntime());

// The finish: combines the partials in their order (sums added one after the other, maxima
// taken), turns the norm into the clip factor of options.clip_rule and, when everything is
// finite, folds it into every segment's grad_scale.
PrePassResult FinishGradPrePass(std::span<const NormPartial> partials, std::span<Segment> segments,
                                const PrePassOptions& options = {});

}  // namespace fusedopt
