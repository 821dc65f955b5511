// The definition of TrainingStep (fusedopt/training_step.h), for the files that instantiate it:
// src/core/training_step.cc for every algorithm of hyper.h's list, and a test-only algorithm's
// (tests/algos/instances.cc).
#pragma once

#include <chrono>
#include <cmath>
#include <span>
#include <utility>
#include <vector>

#include "fusedopt/training_step.h"

namespace fusedopt::training_step_detail {

// Its argument checks (src/core/training_step.cc): max_grad_norm, wave_ends and the micro-batch's
// window; each failure throws fusedopt::Error naming TrainingStep.
void CheckOptions(const TrainingStepOptions& options, std::size_t num_segments);
// Adds the micro-batch into its sums; returns whether a gradient held Inf/NaN.
bool Accumulate(const MicroBatch& batch, Runtime& runtime);

}  // namespace fusedopt::training_step_detail

namespace fusedopt {

template <class Hyper>
StepResult TrainingStep(std::span<const Hyper> groups, std::span<Segment> segments,
                        const TrainingStepOptions& options, Runtime& runtime) {
  training_step_detail::CheckOptions(options, segments.size());
  const MicroBatch* batch = options.micro_batch;
  const bool closes = batch == nullptr || batch->window->pending + 1 == batch->window->steps;
  // With a micro-batch, the scaler and the overflow check see each micro-batch as it is added; a
  // window that held Inf/NaN is skipped whole, so the sums are only read again to clip.
  LossScaler* const scaler = batch == nullptr ? options.scaler : nullptr;
  const bool pre_pass = scaler != nullptr || (batch == nullptr && options.check_overflow) ||
                        std::isfinite(options.max_grad_norm);
  if (closes && (pre_pass || options.wave_ends.size() > 1 || batch != nullptr)) {
    // Everything the waves will check, checked before the pre-pass or the first wave writes: the
    // step functions validate before touching a buffer, and with no elements they touch none. (One
    // wave without a pre-pass validates itself.)
    // Each segment's scalar states are copied into scratch: the check must not advance them.
    std::vector<Segment> empty(segments.begin(), segments.end());
    std::vector<float> scratch(empty.size() * kMaxScalars);
    for (std::size_t i = 0; i < empty.size(); ++i) {
      Segment& s = empty[i];
      s.numel = 0;
      for (std::size_t k = 0; k < kMaxScalars; ++k) {
        if (s.scalars[k] == nullptr) continue;
        scratch[i * kMaxScalars + k] = *s.scalars[k];
        s.scalars[k] = &scratch[i * kMaxScalars + k];
      }
    }
    FusedStep(groups, std::span<const Segment>(empty), runtime);
  }

  StepResult result;
  if (batch != nullptr) {
    AccumulationWindow& window = *batch->window;
    result.found_inf = training_step_detail::Accumulate(*batch, runtime);
    if (options.scaler != nullptr) options.scaler->Update(result.found_inf);
    window.found_inf |= result.found_inf;
    if (!closes) {
      ++window.pending;
      return result;
    }
    window.pending = 0;
    if (std::exchange(window.found_inf, false)) return result;
  }
  if (pre_pass) {
    result.pre_pass_begin = std::chrono::steady_clock::now();
    const PrePassResult pre = GradPrePass(segments,
                                          {.max_norm = options.max_grad_norm,
                                           .norm_type = options.norm_type,
                                           .clip_rule = options.clip_rule},
                                          runtime);
    result.pre_pass_end = std::chrono::steady_clock::now();
    result.grad_norm = pre.norm;
    result.clip_coef = pre.clip_coef;
    result.found_inf = pre.non_finite;
    if (pre.non_finite) {
      if (scaler != nullptr) scaler->Update(true);
      return result;
    }
  }
  const std::span<const Segment> all(segments);
  std::size_t begin = 0;
  for (std::size_t end : options.wave_ends) {
    FusedStep(groups, all.subspan(begin, end - begin), runtime);
    begin = end;
  }
  // With no segments the step still validates the groups: callers check hyper-parameters with an
  // empty table before work of their own (the Python drop-in before torch's step on some params).
  if (begin < all.size() || all.empty()) FusedStep(groups, all.subspan(begin), runtime);
  if (scaler != nullptr) scaler->Update(false);
  result.stepped = true;
  return result;
}

}  // namespace fusedopt
