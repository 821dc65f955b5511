// Loss scaling for f16/bf16 training: the loss is multiplied by scale() before backward so small
// gradients survive in 16 bits, and the step divides it out again (Segment::grad_scale =
// inv_scale(), folded into the update; GradPrePass reports overflow). A step whose gradients
// overflowed is skipped, and Update() adapts the scale with torch.amp.GradScaler's policy:
//
//   overflow:     scale *= backoff_factor, growth tracker reset
//   otherwise:    after growth_interval consecutive good steps, scale *= growth_factor (only if the
//                 result is finite), tracker reset
//
// plus optional bounds [min_scale, max_scale]. A static scaler keeps its scale; overflowing steps
// are still skipped.
#pragma once

#include <cstdint>
#include <limits>

namespace fusedopt {

struct LossScalerOptions {
  float init_scale = 65536.0f;  // 2^16, torch's default
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  float min_scale = 0.0f;  // bounds on the dynamic scale (not in torch; defaults leave it free)
  float max_scale = std::numeric_limits<float>::infinity();
  bool dynamic = true;  // false: a static scale
};

class LossScaler {
 public:
  // Throws fusedopt::Error (naming the option and its value) for a non-positive or non-finite
  // init_scale, growth_factor <= 1, backoff_factor outside (0, 1), growth_interval < 1, or bounds
  // that exclude init_scale.
  explicit LossScaler(const LossScalerOptions& options = {});
  static LossScaler Static(float scale);

  float scale() const { return scale_; }
  // 1/scale rounded to f32 from double, as torch's GradScaler computes it: the grad_scale to give
  // the step.
  float inv_scale() const;
  std::int64_t growth_tracker() const { return growth_tracker_; }
  const LossScalerOptions& options() const { return options_; }

  // Call once per step with whether its gradients overflowed.
  void Update(bool found_inf);

  // For checkpoints: restores what scale() and growth_tracker() returned (validated like the
  // options).
  void Restore(float scale, std::int64_t growth_tracker);

 private:
  LossScalerOptions options_;
  float scale_;
  std::int64_t growth_tracker_ = 0;
};

}  // namespace fusedopt
