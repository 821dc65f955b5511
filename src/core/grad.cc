// The public gradient passes: validate, plan the chunks as a step would, run them in one parallel
// region, then combine the per-chunk results in chunk order (so nothing depends on threads).

#include "fusedopt/grad.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "fusedopt/error.h"
#include "src/core/grad_kernels.h"
#include "src/core/parallel.h"
#include "src/core/plan.h"
#include "src/core/validate.h"

namespace fusedopt {
namespace {

void CheckFinite(std::string_view fn, std::string_view name, double value) {
  if (!std::isfinite(value)) Fail(fn, "invalid ", name, ": ", value, " (must be finite)");
}

// Segments that read each buffer (times scale) and, for the writing passes, write it back in place.
std::vector<Segment> GradSegments(std::string_view fn, std::span<const GradBuffer> grads,
                                  float scale) {
  std::vector<Segment> segments(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const GradBuffer& g = grads[i];
    if (!ValidDType(g.dtype))
      Fail(fn, "grad ", i, ": invalid dtype code ", static_cast<int>(g.dtype));
    if (g.data == nullptr && g.numel > 0)
      Fail(fn, "grad ", i, ": data is null (numel ", g.numel, ")");
    segments[i] = {.param = g.data,
                   .grad = g.data,
                   .numel = g.numel,
                   .param_dtype = g.dtype,
                   .grad_dtype = g.dtype,
                   .grad_scale = scale};
  }
  return segments;
}

// Runs op over every chunk in one parallel region; true if any chunk read a non-finite element.
bool RunElementwise(std::span<const Segment> segments, GradOp op, float value, Runtime& runtime) {
  const ChunkPlan plan(segments);
  std::vector<char> found(plan.num_chunks(), 0);  // one flag per chunk, written by its thread
  ParallelForChunks(plan.num_chunks(), runtime.num_threads(),
                    [&](std::size_t begin, std::size_t end) {
                      for (std::size_t c = begin; c < end; ++c) {
                        found[c] = RunGradChunks(plan, c, c + 1, op, value) ? 1 : 0;
                      }
                    });
  return std::any_of(found.begin(), found.end(), [](char f) { return f != 0; });
}

// The per-chunk partials of the norm of all segments' grad · grad_scale, computed in parallel.
std::vector<NormPartial> NormPartials(std::span<const Segment> segments, NormType type,
                                      Runtime& runtime) {
  const ChunkPlan plan(segments);
  std::vector<NormPartial> partial(plan.num_chunks());
  ParallelForChunks(plan.num_chunks(), runtime.num_threads(),
                    [&](std::size_t begin, std::size_t end) {
                      for (std::size_t c = begin; c < end; ++c) {
                        partial[c] = RunGradChunkNorm(plan, c, type);
                      }
                    });
  return partial;
}

// The partials combined in their order.
GradStats CombineNorm(std::span<const NormPartial> partials, NormType type) {
  GradStats stats;
  if (type == NormType::kInf) {
    std::uint32_t bits = 0;
    for (const NormPartial& p : partials) bits = std::max(bits, p.max_abs_bits);
    stats.norm = std::bit_cast<float>(bits);
  } else {
    double sum = 0.0;
    for (const NormPartial& p : partials) sum += p.sum;
    stats.norm = type == NormType::kL2 ? std::sqrt(sum) : sum;
  }
  // Squares and magnitudes of f32 values cannot overflow a double sum, so only non-finite input
  // makes the norm non-finite.
  stats.non_finite = !std::isfinite(stats.norm);
  return stats;
}

GradStats RunNorm(std::span<const Segment> segments, NormType type, Runtime& runtime) {
  return CombineNorm(NormPartials(segments, type, runtime), type);
}

void CheckNormType(std::string_view fn, NormType type) {
  if (type != NormType::kL1 && type != NormType::kL2 && type != NormType::kInf) {
    Fail(fn, "invalid norm type code ", static_cast<int>(type), " (1, 2 or 0 for inf)");
  }
}

void CheckMaxNorm(std::string_view fn, double max_norm) {
  if (!(max_norm >= 0.0))
    Fail(fn, "invalid max_norm: ", max_norm, " (must be >= 0; Inf: no clipping)");
}

}  // namespace

bool HasNonFinite(std::span<const GradBuffer> grads, Runtime& runtime) {
  return RunElementwise(GradSegments("HasNonFinite", grads, 1.0f), GradOp::kCheck, 0.0f, runtime);
}

GradStats GradNorm(std::span<const GradBuffer> grads, NormType type, float scale,
                   Runtime& runtime) {
  CheckNormType("GradNorm", type);
  CheckFinite("GradNorm", "scale", scale);
  return RunNorm(GradSegments("GradNorm", grads, scale), type, runtime);
}

float ClipCoefficient(double norm, double max_norm) {
  // torch: clip_coef = max_norm / (total_norm + 1e-6) on an f32 tensor, where `scalar / tensor` is
  // tensor.reciprocal() * scalar; then clamp(max=1), which keeps NaN.
  const float denominator = static_cast<float>(norm) + 1e-6f;
  const float coef = (1.0f / denominator) * static_cast<float>(max_norm);
  return coef > 1.0f ? 1.0f : coef;
}

float MaxNormRatioCoefficient(double norm, double max_norm) {
  if (!(norm > max_norm)) return std::isnan(norm) ? static_cast<float>(norm) : 1.0f;
  const float coef = static_cast<float>(max_norm) / static_cast<float>(norm);
  // Both rounded to Inf (or to 0) in f32: their ratio, in (0, 1), still has a value.
  return std::isnan(coef) ? static_cast<float>(max_norm / norm) : coef;
}

double ClipGradNorm(std::span<const GradBuffer> grads, double max_norm, NormType type,
                    bool error_if_nonfinite, Runtime& runtime) {
  CheckNormType("ClipGradNorm", type);
  CheckMaxNorm("ClipGradNorm", max_norm);
  std::vector<Segment> segments = GradSegments("ClipGradNorm", grads, 1.0f);
  const GradStats stats = RunNorm(segments, type, runtime);
  if (stats.non_finite && error_if_nonfinite) {
    Fail("ClipGradNorm", "the total norm of the gradients is non-finite (", stats.norm,
         "), so it cannot be clipped");
  }
  const float coef = ClipCoefficient(stats.norm, max_norm);
  if (coef != 1.0f) {
    for (Segment& s : segments) s.grad_scale = coef;
    RunElementwise(segments, GradOp::kScale, 0.0f, runtime);
  }
  return stats.norm;
}

void ClipGradValue(std::span<const GradBuffer> grads, double clip_value, Runtime& runtime) {
  if (!(clip_value >= 0.0))
    Fail("ClipGradValue", "invalid clip_value: ", clip_value, " (must be >= 0)");
  RunElementwise(GradSegments("ClipGradValue", grads, 1.0f), GradOp::kClamp,
                 static_cast<float>(clip_value), runtime);
}

bool UnscaleGrads(std::span<const GradBuffer> grads, float scale, Runtime& runtime) {
  CheckFinite("UnscaleGrads", "scale", scale);
  return RunElementwise(GradSegments("UnscaleGrads", grads, scale), GradOp::kScale, 0.0f, runtime);
}

namespace {

// The segments of an accumulation: each gradient read times scale, its accumulator as the "param"
// written. Validates everything first.
std::vector<Segment> AccumulationSegments(std::span<const GradBuffer> grads,
                                          std::span<float* const> accumulators, float scale) {
  constexpr std::string_view kFn = "AccumulateGrads";
  CheckFinite(kFn, "scale", scale);
  if (accumulators.size() != grads.size()) {
    Fail(kFn, accumulators.size(), " accumulators for ", grads.size(), " gradients");
  }
  std::vector<Segment> segments = GradSegments(kFn, grads, scale);
  for (std::size_t i = 0; i < segments.size(); ++i) {
    if (accumulators[i] == nullptr && segments[i].numel > 0)
      Fail(kFn, "accumulator ", i, " is null");
    segments[i].param = accumulators[i];
    segments[i].param_dtype = DType::kF32;
  }
  return segments;
}

}  // namespace

bool AccumulateGrads(std::span<const GradBuffer> grads, std::span<float* const> accumulators,
                     float scale, bool overwrite, Runtime& runtime) {
  return RunElementwise(AccumulationSegments(grads, accumulators, scale),
                        overwrite ? GradOp::kScale : GradOp::kAccumulate, 0.0f, runtime);
}

bool AccumulateGrads(std::span<const GradBuffer> grads, std::span<float* const> accumulators,
                     float scale, std::span<const std::uint8_t> overwrite, Runtime& runtime) {
  if (overwrite.size() != grads.size()) {
    Fail("AccumulateGrads", overwrite.size(), " overwrite flags for ", grads.size(), " gradients");
  }
  const std::vector<Segment> segments = AccumulationSegments(grads, accumulators, scale);
  std::vector<Segment> fresh, added;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    (overwrite[i] != 0 ? fresh : added).push_back(segments[i]);
  }
  bool non_finite = false;
  if (!fresh.empty()) non_finite |= RunElementwise(fresh, GradOp::kScale, 0.0f, runtime);
  if (!added.empty()) non_finite |= RunElementwise(added, GradOp::kAccumulate, 0.0f, runtime);
  return non_finite;
}

std::vector<NormPartial> GradPrePassPartials(std::span<const Segment> segments,
                                             const PrePassOptions& options, Runtime& runtime) {
  constexpr std::string_view kFn = "GradPrePass";
  CheckNormType(kFn, options.norm_type);
  CheckMaxNorm(kFn, options.max_norm);
  if (options.clip_rule != ClipRule::kTorch && options.clip_rule != ClipRule::kMaxNormRatio)
    Fail(kFn, "invalid clip rule code ", static_cast<int>(options.clip_rule));
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (!ValidDType(s.grad_dtype)) {
      Fail(kFn, "segment ", i, ": invalid grad dtype code ", static_cast<int>(s.grad_dtype));
    }
    if (s.grad == nullptr && s.numel > 0)
      Fail(kFn, "segment ", i, ": grad is null (numel ", s.numel, ")");
    if (!std::isfinite(s.grad_scale)) {
      Fail(kFn, "segment ", i, ": invalid grad_scale: ", s.grad_scale, " (must be finite)");
    }
  }
  return NormPartials(segments, options.norm_type, runtime);
}

PrePassResult FinishGradPrePass(std::span<const NormPartial> partials, std::span<Segment> segments,
                                const PrePassOptions& options) {
  const GradStats stats = CombineNorm(partials, options.norm_type);
  PrePassResult result{.non_finite = stats.non_finite, .norm = stats.norm};
  if (stats.non_finite) return result;
  result.clip_coef = options.clip_rule == ClipRule::kMaxNormRatio
                         ? MaxNormRatioCoefficient(stats.norm, options.max_norm)
                         : ClipCoefficient(stats.norm, options.max_norm);
  if (result.clip_coef != 1.0f) {
    for (Segment& s : segments) s.grad_scale *= result.clip_coef;
  }
  return result;
}

PrePassResult GradPrePass(std::span<Segment> segments, const PrePassOptions& options,
                          Runtime& runtime) {
  const std::vector<NormPartial> partials = GradPrePassPartials(segments, options, runtime);
  return FinishGradPrePass(partials, segments, options);
}

}  // namespace fusedopt
