#include "fusedopt/scaler.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "src/core/validate.h"

namespace fusedopt {
namespace {

[[noreturn]] void Reject(std::string_view what, double value, std::string_view rule) {
  Fail("LossScaler", "invalid ", what, ": ", value, " (", rule, ")");
}

void CheckScale(const LossScalerOptions& o, float scale) {
  if (!(scale > 0.0f) || !std::isfinite(scale)) Reject("scale", scale, "must be finite and > 0");
  if (scale < o.min_scale || scale > o.max_scale) {
    Reject("scale", scale, "must lie in [min_scale, max_scale]");
  }
}

}  // namespace

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.init_scale) {
  if (!(options.growth_factor > 1.0) || !std::isfinite(options.growth_factor)) {
    Reject("growth_factor", options.growth_factor, "must be finite and > 1");
  }
  if (!(options.backoff_factor > 0.0 && options.backoff_factor < 1.0)) {
    Reject("backoff_factor", options.backoff_factor, "must lie in (0, 1)");
  }
  if (options.growth_interval < 1) {
    Reject("growth_interval", static_cast<double>(options.growth_interval), "must be >= 1");
  }
  if (!(options.min_scale >= 0.0f) || !(options.max_scale >= options.min_scale)) {
    Reject("min_scale", options.min_scale, "need 0 <= min_scale <= max_scale");
  }
  CheckScale(options_, options.init_scale);
}

LossScaler LossScaler::Static(float scale) {
  return LossScaler({.init_scale = scale, .dynamic = false});
}

float LossScaler::inv_scale() const { return static_cast<float>(1.0 / double{scale_}); }

void LossScaler::Update(bool found_inf) {
  if (!options_.dynamic) return;
  if (found_inf) {
    scale_ =
        std::max(static_cast<float>(double{scale_} * options_.backoff_factor), options_.min_scale);
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ < options_.growth_interval) return;
  const float grown = static_cast<float>(double{scale_} * options_.growth_factor);
  if (std::isfinite(grown)) scale_ = std::min(grown, options_.max_scale);
  growth_tracker_ = 0;
}

void LossScaler::Restore(float scale, std::int64_t growth_tracker) {
  CheckScale(options_, scale);
  if (growth_tracker < 0 || growth_tracker >= options_.growth_interval) {
    Reject("growth_tracker", static_cast<double>(growth_tracker),
           "must lie in [0, growth_interval)");
  }
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

}  // namespace fusedopt
