#include "bench/runner.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <ostream>
#include <stdexcept>
#include <vector>

#include "bench/model_shapes.h"
#include "bench/standard.h"
#include "fusedopt/optimizer.h"

namespace fusedopt::bench {
namespace {

struct Impl {
  std::string name;
  std::function<void()> step;
  std::vector<double> ms;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Deterministic fill in [-scale, scale): the values only need to be ordinary numbers.
void Fill(void* data, DType dtype, std::size_t n, float scale, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 1u;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    StoreFromF32(data, dtype, i, scale * (static_cast<float>(x >> 8) * 0x1p-23f - 1.0f));
  }
}

// 4231976 -> "4,231,976".
std::string FormatCount(std::size_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

}  // namespace

nlohmann::json RunBench(const BenchOptions& options, std::ostream& table, std::ostream& progress) {
  const Algorithm algorithm = ParseAlgorithm(options.optimizer);
  DType dtype = DType::kF32;
  if (!ParseDType(options.dtype, &dtype)) {
    throw std::invalid_argument("unknown dtype '" + options.dtype + "'; known: f32, bf16, f16");
  }
  if (options.rounds < 1)
    throw std::invalid_argument("rounds must be >= 1, got " + std::to_string(options.rounds));
  if (options.warmup < 0)
    throw std::invalid_argument("warmup must be >= 0, got " + std::to_string(options.warmup));
  if (options.threads < 0)
    throw std::invalid_argument("threads must be >= 0, got " + std::to_string(options.threads));

  std::vector<TensorSpec> tensors;
  std::string shapes_name;
  if (!options.shapes.empty()) {
    if (options.numel != 0)
      throw std::invalid_argument("give either --shapes or --numel, not both");
    const ModelShapes& model = GetModelShapes(options.shapes);
    for (const TensorShape& t : model.tensors) tensors.push_back({.numel = t.numel});
    shapes_name = options.shapes;
  } else {
    if (options.numel == 0) throw std::invalid_argument("give --shapes MODEL or --numel N (N > 0)");
    tensors.push_back({.numel = options.numel});
    shapes_name = "flat";
  }

  const BenchHyper hyper;
  Runtime runtime(options.threads);
  FlatStorage storage(tensors, 1, {.param_dtype = dtype, .grad_dtype = dtype, .state_dtype = dtype},
                      BenchRequiredStates(algorithm, hyper));
  std::vector<Segment> segments(storage.segments().begin(), storage.segments().end());
  for (std::size_t i = 0; i < segments.size(); ++i) {
    Fill(segments[i].param, dtype, segments[i].numel, 1.0f, static_cast<std::uint32_t>(2 * i));
    Fill(const_cast<void*>(segments[i].grad), dtype, segments[i].numel, 1e-2f,
         static_cast<std::uint32_t>(2 * i + 1));
  }
  const std::size_t numel = storage.total_numel();
  int num_states = 0;
  for (int slot = 0; slot < kMaxStates; ++slot)
    num_states += segments.empty() || segments[0].state[slot] == nullptr ? 0 : 1;
  // Bytes one fused step moves per element: param read+write, grad read, each state read+write.
  const std::size_t bytes_per_param =
      DTypeSize(dtype) * (2 + 1 + 2 * static_cast<std::size_t>(num_states));

  // Step counts start at 2: SGD's step 1 only copies the gradient into the momentum buffer.
  std::int64_t step = 1;
  auto set_step = [&] {
    ++step;
    for (Segment& s : segments) s.step = step;
  };
  std::vector<Impl> impls;
  impls.push_back({"fused", [&] { FusedStep(algorithm, hyper, segments, runtime); }, {}});
  impls.push_back({"standard", [&] { StandardStep(algorithm, hyper, segments, runtime); }, {}});
  impls.push_back({"same_traffic", [&] { SameTrafficStep(segments, runtime); }, {}});

  progress << "fusedopt bench: " << options.optimizer << " on " << shapes_name << " ("
           << tensors.size() << " tensors, " << FormatCount(numel) << " params), " << options.dtype
           << ", " << runtime.num_threads() << " threads, target " << ActiveTargetName() << "\n";
  for (int w = 0; w < options.warmup; ++w) {
    set_step();
    for (Impl& impl : impls) impl.step();
  }
  for (int r = 0; r < options.rounds; ++r) {
    set_step();
    // Rotate the order so no implementation always runs right after another's cache footprint.
    for (std::size_t k = 0; k < impls.size(); ++k) {
      Impl& impl = impls[(k + static_cast<std::size_t>(r)) % impls.size()];
      const auto t0 = std::chrono::steady_clock::now();
      impl.step();
      const auto t1 = std::chrono::steady_clock::now();
      impl.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    progress << "\r  round " << (r + 1) << "/" << options.rounds << std::flush;
  }
  progress << "\n";

  nlohmann::json report = {{"optimizer", options.optimizer},
                           {"shapes", shapes_name},
                           {"tensors", tensors.size()},
                           {"numel", numel},
                           {"dtype", options.dtype},
                           {"threads", runtime.num_threads()},
                           {"target", ActiveTargetName()},
                           {"rounds", options.rounds},
                           {"bytes_per_param", bytes_per_param}};
  const double standard_ms = Median(impls[1].ms);
  const double traffic_ms = Median(impls[2].ms);
  table << std::left << std::setw(14) << "impl" << std::right << std::setw(11) << "median ms"
        << std::setw(10) << "min ms" << std::setw(10) << "Gparam/s" << std::setw(9) << "GB/s"
        << std::setw(13) << "vs standard" << std::setw(17) << "vs same_traffic"
        << "\n";
  for (const Impl& impl : impls) {
    const double median = Median(impl.ms);
    const double min = *std::min_element(impl.ms.begin(), impl.ms.end());
    const double gparams = static_cast<double>(numel) / (median * 1e6);
    const double gbps = gparams * static_cast<double>(bytes_per_param);
    report["impls"][impl.name] = {{"median_ms", median},
                                  {"min_ms", min},
                                  {"samples_ms", impl.ms},
                                  {"gparam_per_s", gparams},
                                  {"gb_per_s", gbps}};
    table << std::left << std::setw(14) << impl.name << std::right << std::fixed
          << std::setprecision(3) << std::setw(11) << median << std::setw(10) << min
          << std::setw(10) << gparams << std::setprecision(1) << std::setw(9) << gbps
          << std::setprecision(2) << std::setw(12) << standard_ms / median << "x" << std::setw(17)
          << traffic_ms / median << "\n";
  }
  const double fused_ms = Median(impls[0].ms);
  report["speedup_vs_standard"] = standard_ms / fused_ms;
  report["bandwidth_fraction"] = traffic_ms / fused_ms;
  table << "speedup_vs_standard = " << std::setprecision(2) << standard_ms / fused_ms
        << "   bandwidth_fraction = " << traffic_ms / fused_ms << "\n";
  return report;
}

}  // namespace fusedopt::bench
