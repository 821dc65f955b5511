// `fusedopt bench`: fused, standard and same_traffic run interleaved in one process on the same
// buffers, warm-up first, then rounds whose order rotates, reported as medians and ratios (never
// asserted in tests: the machine is shared and noisy).
#pragma once

#include <cstddef>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

namespace fusedopt::bench {

struct BenchOptions {
  std::string optimizer = "adamw";
  std::string shapes;         // a model name (model_shapes.h), or empty with numel > 0
  std::size_t numel = 0;      // one flat tensor of this size
  std::string dtype = "f32";  // params, grads and states, as torch keeps states in the param dtype
  int threads = 0;            // 0: OpenMP's default
  int rounds = 15;
  int warmup = 3;
};

// Runs the benchmark, prints progress to `progress` and the table to `table`, and returns the JSON
// report. Throws std::invalid_argument for bad options.
nlohmann::json RunBench(const BenchOptions& options, std::ostream& table, std::ostream& progress);

}  // namespace fusedopt::bench
