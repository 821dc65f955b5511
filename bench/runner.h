// `fusedopt bench`: fused, standard and the same_traffic variants (and, with --loss-scale or
// --clip, standard_pipeline; with 8-bit states neither standard impl) run interleaved in one
// process on the same buffers, warm-up first, then rounds in a balanced order (RoundOrder in
// runner.cc), reported as medians and ratios, the fastest same_traffic variant as the ceiling
// (never asserted in tests: the machine is shared and noisy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace fusedopt::bench {

struct BenchOptions {
  std::string optimizer = "adamw";
  std::string shapes;     // a model name (src/tool_util/model_shapes.h), or empty with numel > 0
  std::size_t numel = 0;  // one flat tensor of this size
  std::string dtype = "f32";  // params and states, as torch keeps states in the param dtype
  std::string grad_dtype;     // gradients; empty: dtype
  // States: empty or dtype (the param dtype, as torch keeps them), or "q8": 8-bit block-wise codes
  // with one f32 absmax per kQuantBlock elements (fusedopt/quantize.h; element-wise algorithms
  // only). With q8 there is no `standard` (nor `standard_pipeline`): no for-loop step keeps 8-bit
  // states; same_traffic moves the 8-bit step's bytes.
  std::string state_dtype;
  // With loss scaling or clipping the impls become a training-loop step (src/baselines/pipeline.h)
  // and `standard_pipeline` joins them.
  std::string loss_scale = "none";  // none, static or dynamic (torch.amp.GradScaler's policy)
  std::optional<double> clip;       // clip_grad_norm_'s max_norm (finite, > 0); unset: no clip
  int threads = 0;                  // 0: OpenMP's default
  int rounds = 15;
  int warmup = 3;
  // The step count of the first (warmup) round, one more each round after it; >= 2: SGD's step 1
  // only copies the gradient into the momentum buffer. Late steps have bias corrections of exactly
  // 1, whose divisions the step leaves out (src/math/bias_correction_math.h).
  std::int64_t first_step = 2;
};

// Runs the benchmark, prints progress to `progress` and the table to `table`, and returns the JSON
// report. Throws std::invalid_argument for bad options, naming the option and the value.
nlohmann::json RunBench(const BenchOptions& options, std::ostream& table, std::ostream& progress);

}  // namespace fusedopt::bench
