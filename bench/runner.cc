#include "bench/runner.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iomanip>
#include <iterator>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/rounds.h"
#include "fusedopt/grad.h"
#include "fusedopt/optimizer.h"
#include "fusedopt/quantize.h"
#include "fusedopt/runtime.h"
#include "src/baselines/elementwise.h"
#include "src/baselines/pipeline.h"
#include "src/baselines/same_traffic.h"
#include "src/baselines/standard.h"
#include "src/tool_util/load_monitor.h"
#include "src/tool_util/model_shapes.h"
#include "src/tool_util/report_util.h"

namespace fusedopt::bench {

using baselines::BenchHyper;
using baselines::BenchRequiredStates;
using baselines::FactoredTraffic;
using baselines::FusedLoop;
using baselines::FusedStep;
using baselines::kAllTrafficLoops;
using baselines::LoopOptions;
using baselines::PassClock;
using baselines::PassTimes;
using baselines::ReductionTraffic;
using baselines::RunConvert;
using baselines::SameTrafficGradRead;
using baselines::SameTrafficStep;
using baselines::StandardLoop;
using baselines::StandardStep;
using baselines::TensorRef;
using baselines::TrafficLoop;
using baselines::TrafficLoopName;
using tools::Algorithm;
using tools::CheckedAdd;
using tools::CheckedMul;
using tools::CheckFitsInMemory;
using tools::Fill;
using tools::FormatCount;
using tools::GetModelShapes;
using tools::HasQuantizableStates;
using tools::IsFactored;
using tools::LoadMonitor;
using tools::Median;
using tools::ModelShapes;
using tools::ParseAlgorithm;
using tools::RoundLoad;
using tools::TensorShape;
using tools::UnsignedMapStatesOf;

namespace {

struct Impl {
  using Passes = std::function<const PassTimes&()>;
  using Report = std::function<void(nlohmann::json&)>;
  Impl(std::string impl_name, std::function<void()> impl_step, Passes impl_passes = {},
       Report impl_report = {})
      : name(std::move(impl_name)),
        step(std::move(impl_step)),
        passes(std::move(impl_passes)),
        report(std::move(impl_report)) {}

  std::string name;
  std::function<void()> step;
  std::vector<double> ms;
  // Training-loop mode only: the passes of the last call, and what the impl adds to its JSON entry
  // (skipped steps, final loss scale).
  Passes passes;
  std::vector<std::pair<std::string, std::vector<double>>> pass_ms;
  Report report;
};

// Largest |z| FillNormal produces: 2·sqrt(3).
constexpr float kMaxNormal = 3.4641017f;

// Deterministic, roughly normal values times sigma: the sum of four uniforms in [0, 1), centred
// and scaled to unit variance (Irwin-Hall), so |value| <= kMaxNormal · sigma.
void FillNormal(void* data, DType dtype, std::size_t n, float sigma, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 1u;
  for (std::size_t i = 0; i < n; ++i) {
    float sum = 0.0f;
    for (int k = 0; k < 4; ++k) {
      x = x * 1664525u + 1013904223u;
      sum += static_cast<float>(x >> 8) * 0x1p-24f;
    }
    StoreFromF32(data, dtype, i, sigma * (sum - 2.0f) * 1.7320508f);
  }
}

float MaxFinite(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return 65504.0f;
    case DType::kBF16:
      return 0x1.FEp127f;
    case DType::kF32:
    case DType::kQ8:  // never a param's or grad's dtype (ParseDType does not take it)
      break;
  }
  return std::numeric_limits<float>::max();
}

// Gradients converted to the param dtype once, before timing: `standard` (step only) reads them
// when the grad dtype differs, as torch's for-loop optimizers need grads of the param's dtype.
class ConvertedGrads {
 public:
  ConvertedGrads(std::span<Segment> segments, const Runtime& runtime) {
    std::size_t bytes = 0;
    std::vector<std::size_t> offsets;
    for (const Segment& s : segments) {
      offsets.push_back(bytes);
      bytes += (s.numel * DTypeSize(s.param_dtype) + 63) / 64 * 64;
    }
    data_.reset(new (std::align_val_t{64}) std::byte[bytes == 0 ? 64 : bytes]);
    for (std::size_t i = 0; i < segments.size(); ++i) {
      Segment& s = segments[i];
      const TensorRef out{data_.get() + offsets[i], s.param_dtype, s.numel};
      RunConvert(out, {const_cast<void*>(s.grad), s.grad_dtype, s.numel}, runtime);
      s.grad = out.data;
      s.grad_dtype = s.param_dtype;
    }
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<std::byte[], Free> data_;
};

// Why `standard` (and `standard_pipeline`) are left out with 8-bit states.
constexpr std::string_view kNoStandardQ8 =
    "no for-loop step keeps 8-bit states (torch.optim keeps them in the param dtype; "
    "scripts/bench-8bit times bitsandbytes' 8-bit CPU step)";

// --state-dtype: true for q8; false for the param dtype (empty, or --dtype's value). Throws
// std::invalid_argument naming the option for another value, or q8 with an algorithm that keeps
// no 8-bit states.
bool ParseStateDTypeOption(const BenchOptions& options, Algorithm algorithm) {
  const std::string& value = options.state_dtype;
  if (value.empty() || value == options.dtype) return false;
  if (value != "q8") {
    throw std::invalid_argument(
        "--state-dtype: unknown value '" + value + "'; known: " + options.dtype +
        " (--dtype: states in the param dtype, the default) or q8 (8-bit block-wise states)");
  }
  if (!HasQuantizableStates(algorithm)) {
    std::string takers;
    for (std::size_t i = 0; i < algos::All::kSize; ++i) {
      if (!HasQuantizableStates(Algorithm{i})) continue;
      if (!takers.empty()) takers += ", ";
      takers += tools::AlgorithmName(Algorithm{i});
    }
    throw std::invalid_argument(
        "--state-dtype q8: --optimizer " + std::string(tools::AlgorithmName(algorithm)) +
        " keeps no 8-bit states (" + tools::WhyStatesStayUnquantized(algorithm) +
        "); these do: " + takers);
  }
  return true;
}

DType ParseDTypeOption(std::string_view option, const std::string& value) {
  DType dtype = DType::kF32;
  if (!ParseDType(value, &dtype)) {
    throw std::invalid_argument(std::string(option) + ": unknown dtype '" + value +
                                "'; known: f32, bf16, f16");
  }
  return dtype;
}

// The traffic variants are timed as impls of their own, "same_traffic/<stores>".
constexpr std::string_view kTrafficPrefix = "same_traffic/";
std::string TrafficImplName(TrafficLoop loop) {
  return std::string(kTrafficPrefix) + TrafficLoopName(loop);
}

// An integer when x is one (the bytes per param of a single tensor), else x.
nlohmann::json JsonNumber(double x) {
  if (x == std::floor(x) && x >= 0.0 && x < 0x1p53) return static_cast<std::uint64_t>(x);
  return x;
}

}  // namespace

nlohmann::json RunBench(const BenchOptions& options, std::ostream& table, std::ostream& progress) {
  const Algorithm algorithm = ParseAlgorithm(options.optimizer);
  const bool factored = IsFactored(algorithm);
  DType dtype = DType::kF32;
  if (!ParseDType(options.dtype, &dtype)) {
    throw std::invalid_argument("unknown dtype '" + options.dtype + "'; known: f32, bf16, f16");
  }
  const std::string grad_dtype_name =
      options.grad_dtype.empty() ? options.dtype : options.grad_dtype;
  const DType grad_dtype = ParseDTypeOption("--grad-dtype", grad_dtype_name);
  const bool q8 = ParseStateDTypeOption(options, algorithm);
  if (options.loss_scale != "none" && options.loss_scale != "static" &&
      options.loss_scale != "dynamic") {
    throw std::invalid_argument("--loss-scale: unknown value '" + options.loss_scale +
                                "'; known: none, static, dynamic");
  }
  if (options.clip && (!std::isfinite(*options.clip) || !(*options.clip > 0.0))) {
    std::ostringstream value;
    value << *options.clip;
    throw std::invalid_argument("--clip: invalid max norm '" + value.str() +
                                "' (a finite number > 0)");
  }
  if (options.rounds < 1)
    throw std::invalid_argument("rounds must be >= 1, got " + std::to_string(options.rounds));
  if (options.warmup < 0)
    throw std::invalid_argument("warmup must be >= 0, got " + std::to_string(options.warmup));
  if (options.first_step < 2) {
    throw std::invalid_argument("first_step must be >= 2, got " +
                                std::to_string(options.first_step));
  }
  if (options.threads < 0 || options.threads > kMaxThreads) {
    throw std::invalid_argument("threads must be 0.." + std::to_string(kMaxThreads) + ", got " +
                                std::to_string(options.threads));
  }

  std::vector<TensorSpec> tensors;
  std::string shapes_name;
  if (!options.shapes.empty()) {
    if (options.numel != 0)
      throw std::invalid_argument("give either --shapes or --numel, not both");
    const ModelShapes& model = GetModelShapes(options.shapes);
    // rows: the size(0) of a tensor of more than one dimension (AdamP's channel rows; the other
    // algorithms ignore it); a factored algorithm's (Adafactor's) rows and cols: its size(-2) and
    // size(-1)
    for (const TensorShape& t : model.tensors) {
      const bool matrix = t.dims.size() > 1;
      if (factored) {
        tensors.push_back({.numel = t.numel,
                           .rows = matrix ? t.dims[t.dims.size() - 2] : 0,
                           .cols = matrix ? t.dims.back() : 0});
      } else {
        tensors.push_back({.numel = t.numel, .rows = matrix ? t.dims[0] : 0});
      }
    }
    shapes_name = options.shapes;
  } else {
    if (options.numel == 0) throw std::invalid_argument("give --shapes MODEL or --numel N (N > 0)");
    tensors.push_back({.numel = options.numel});
    shapes_name = "flat";
  }

  // The training-loop step: loss scaling (GradScaler's default initial scale 2^16) and clipping.
  LoopOptions loop;
  if (options.loss_scale == "dynamic") loop.scaler = LossScaler();
  if (options.loss_scale == "static") loop.scaler = LossScaler::Static(65536.0f);
  if (options.clip) loop.max_norm = *options.clip;
  const bool training_loop = loop.scaler.has_value() || loop.clips();
  const float init_scale = loop.scaler ? loop.scaler->scale() : 1.0f;

  const BenchHyper hyper;
  // The buffers below, checked before they are allocated (--numel comes from the command line):
  // param, grad and states (8-bit: a code, and an absmax per block counted as a byte), grads
  // converted to the param dtype (for `standard`: not with 8-bit states), the loop's copy of the
  // grads.
  const unsigned state_slots = BenchRequiredStates(algorithm, hyper);
  const std::size_t bytes_per_element =
      DTypeSize(dtype) * (1 + (grad_dtype != dtype && !q8 ? 1 : 0)) +
      (q8 ? std::size_t{2} : DTypeSize(dtype)) *
          static_cast<std::size_t>(std::popcount(state_slots)) +
      DTypeSize(grad_dtype) * (training_loop ? 2 : 1);
  const std::string what = options.numel != 0 ? "--numel " + std::to_string(options.numel)
                                              : "--shapes " + options.shapes;
  std::size_t total_numel = 0;
  for (const TensorSpec& t : tensors) total_numel = CheckedAdd(total_numel, t.numel, what);
  CheckFitsInMemory(CheckedMul(total_numel, bytes_per_element, what), what);
  Runtime runtime(options.threads);
  // 8-bit states for every tensor (min_8bit_size 0: the step's format, not the Python classes'
  // policy), starting from zeros quantized with each slot's map, as a fresh 8-bit state does.
  FlatStorage storage(tensors, 1,
                      {.param_dtype = dtype,
                       .grad_dtype = grad_dtype,
                       .state_dtype = q8 ? DType::kQ8 : dtype,
                       .min_8bit_size = 0},
                      state_slots);
  std::vector<Segment> segments(storage.segments().begin(), storage.segments().end());
  std::size_t blocks = 0;  // absmax values per 8-bit state
  for (const Segment& s : segments) {
    for (int slot = 0; slot < kMaxStates && q8; ++slot) {
      if (s.state[slot] == nullptr) continue;
      QuantizeFill(0.0f, s.numel, SlotMap(UnsignedMapStatesOf(algorithm), slot),
                   static_cast<std::uint8_t*>(s.state[slot]), s.absmax[slot]);
    }
    blocks += q8 ? NumQuantBlocks(s.numel) : 0;
  }
  const std::size_t numel = storage.total_numel();
  // Gradients: today's uniform values, or, for the training loop, what backward of loss · scale
  // leaves: roughly normal values of standard deviation sigma (unscaled) times the initial scale.
  // sigma is 1e-3, or more where needed for a global norm (about sigma · sqrt(numel)) of at least
  // twice the clip, so the clip is active; but small enough that the scaled values stay far below
  // the grad dtype's largest value (no step may overflow).
  float sigma = 1e-3f;
  if (loop.clips()) {
    sigma = std::max(
        sigma, static_cast<float>(2.0 * loop.max_norm /
                                  std::sqrt(static_cast<double>(std::max<std::size_t>(numel, 1)))));
  }
  sigma = std::min(sigma, MaxFinite(grad_dtype) / (4.0f * kMaxNormal * init_scale));
  for (std::size_t i = 0; i < segments.size(); ++i) {
    Fill(segments[i].param, dtype, segments[i].numel, 1.0f, static_cast<std::uint32_t>(2 * i));
    void* grad = const_cast<void*>(segments[i].grad);
    if (training_loop) {
      FillNormal(grad, grad_dtype, segments[i].numel, sigma * init_scale,
                 static_cast<std::uint32_t>(2 * i + 1));
    } else {
      Fill(grad, grad_dtype, segments[i].numel, 1e-2f, static_cast<std::uint32_t>(2 * i + 1));
    }
  }
  int num_states = 0;
  for (int slot = 0; slot < kMaxStates; ++slot)
    num_states += segments.empty() || segments[0].state[slot] == nullptr ? 0 : 1;
  // Bytes one fused step moves per element: param read+write, grad read, each state read+write
  // (8-bit states: a code read+write per element, and an f32 absmax read+write per block of
  // kQuantBlock elements: AdamW f32 16.06 B/param at 100 M); the training loop's pre-pass reads the
  // grad once more; a two-phase step's reduction pass reads what ReductionTraffic counts (LAMB: the
  // param, the grad and each state once more).
  const ReductionTraffic reduction_traffic(algorithm, segments);
  // A factored step (Adafactor) counts its passes instead (FactoredTraffic): 32 B/param for an f32
  // vector (stats: param, grad, variance read; update: param and variance read and written, grad
  // read), 24 for a matrix (stats: param, grad; norm: grad; update: param r+w, grad), per element
  // of each tensor; the training loop's pre-pass reads the grad once more.
  std::optional<FactoredTraffic> factored_traffic;
  if (factored) factored_traffic.emplace(algorithm, segments);
  const std::size_t state_size = q8 ? 1 : DTypeSize(dtype);
  const double per_param = 1.0 / static_cast<double>(std::max<std::size_t>(numel, 1));
  // 8-bit states: each state's absmax per param.
  const double absmax_per_param = static_cast<double>(blocks * sizeof(float)) * per_param;
  const double bytes_per_param =
      factored ? static_cast<double>(factored_traffic->bytes()) * per_param +
                     static_cast<double>(training_loop ? DTypeSize(grad_dtype) : 0)
               : static_cast<double>(2 * DTypeSize(dtype) +
                                     DTypeSize(grad_dtype) * (training_loop ? 2 : 1) +
                                     2 * state_size * static_cast<std::size_t>(num_states)) +
                     2.0 * absmax_per_param * num_states +
                     static_cast<double>(reduction_traffic.bytes()) * per_param;
  // The floor of every pass but the update's (reduction, norm: none for most algorithms), then the
  // update's.
  const auto step_traffic = [&](TrafficLoop traffic_loop) {
    if (factored_traffic) return factored_traffic->Run(runtime, traffic_loop);
    reduction_traffic.Run(runtime, traffic_loop);
    SameTrafficStep(segments, runtime, traffic_loop);
  };

  // `standard` steps on grads of the param dtype: a copy made here, untimed, if the dtypes differ.
  // With 8-bit states there is no `standard` (kNoStandardQ8).
  std::vector<Segment> standard_segments = segments;
  std::optional<ConvertedGrads> converted;
  if (grad_dtype != dtype && !q8) converted.emplace(standard_segments, runtime);

  std::optional<FusedLoop> fused_loop;
  std::optional<StandardLoop> standard_loop;
  // One PassClock per traffic variant (training loop): each impl reports its own passes.
  PassClock traffic_clocks[std::size(kAllTrafficLoops)];
  std::vector<Impl> impls;
  if (training_loop) {
    fused_loop.emplace(algorithm, hyper, segments, loop);
    if (!q8) standard_loop.emplace(algorithm, hyper, segments, loop);
    const auto loop_report = [](const auto& l) {
      return [p = &l](nlohmann::json& j) {
        j["skipped_steps"] = p->skipped_steps();
        if (p->options().scaler) j["final_loss_scale"] = p->options().scaler->scale();
      };
    };
    impls.emplace_back(
        "fused", [&] { fused_loop->Run(runtime); },
        [&]() -> const PassTimes& { return fused_loop->pass_ms(); }, loop_report(*fused_loop));
    if (!q8) {
      impls.emplace_back("standard",
                         [&] { StandardStep(algorithm, hyper, standard_segments, runtime); });
      impls.emplace_back(
          "standard_pipeline", [&] { standard_loop->Run(runtime); },
          [&]() -> const PassTimes& { return standard_loop->pass_ms(); },
          loop_report(*standard_loop));
    }
    for (std::size_t v = 0; v < std::size(kAllTrafficLoops); ++v) {
      PassClock* clock = &traffic_clocks[v];
      const TrafficLoop traffic_loop = kAllTrafficLoops[v];
      impls.emplace_back(
          TrafficImplName(traffic_loop),
          [&, clock, traffic_loop] {
            clock->Start();
            SameTrafficGradRead(segments, runtime, traffic_loop.pace);
            clock->Lap("pre_pass");
            step_traffic(traffic_loop);
            clock->Lap("step");
          },
          [clock]() -> const PassTimes& { return clock->times(); });
    }
  } else {
    impls.emplace_back("fused", [&] { FusedStep(algorithm, hyper, segments, runtime); });
    if (!q8) {
      impls.emplace_back("standard",
                         [&] { StandardStep(algorithm, hyper, standard_segments, runtime); });
    }
    for (const TrafficLoop traffic_loop : kAllTrafficLoops) {
      impls.emplace_back(TrafficImplName(traffic_loop),
                         [&, traffic_loop] { step_traffic(traffic_loop); });
    }
  }
  const auto find = [&](std::string_view name) -> Impl* {
    for (Impl& impl : impls) {
      if (impl.name == name) return &impl;
    }
    return nullptr;
  };

  std::int64_t step = options.first_step - 1;
  auto set_step = [&] {
    ++step;
    for (Segment& s : segments) s.step = step;
    for (Segment& s : standard_segments) s.step = step;
    if (fused_loop) fused_loop->SetStep(step);
    if (standard_loop) standard_loop->SetStep(step);
  };

  progress << "fusedopt bench: " << options.optimizer << " on " << shapes_name << " ("
           << tensors.size() << " tensors, " << FormatCount(numel) << " params), " << options.dtype;
  if (grad_dtype != dtype) progress << " (grads " << grad_dtype_name << ")";
  if (q8) progress << ", 8-bit states (q8)";
  if (training_loop) {
    progress << ", loss scale " << options.loss_scale << ", clip ";
    if (loop.clips()) {
      progress << loop.max_norm;
    } else {
      progress << "off";
    }
  }
  progress << ", " << runtime.num_threads() << " threads, target "
           << TargetDescription(ActiveTargetName()) << "\n";
  for (int w = 0; w < options.warmup; ++w) {
    set_step();
    for (Impl& impl : impls) impl.step();
  }
  // A round that other processes disturbed is thrown away and repeated, at most `rounds` times
  // (src/tool_util/load_monitor.h); after that, disturbed rounds are kept and counted.
  LoadMonitor monitor;
  std::vector<RoundLoad> loads;
  int discarded = 0;
  for (int r = 0; r < options.rounds;) {
    set_step();
    // What an impl finds in the caches depends on the impl before it (a model's buffers can be a
    // few times the L3, and `standard` leaves other data there): a plain rotation keeps that
    // predecessor fixed, so each impl got its own cache state. RoundOrder balances it.
    const std::vector<std::size_t> order = RoundOrder(impls.size(), static_cast<std::size_t>(r));
    std::vector<double> round_ms(impls.size());
    std::vector<std::vector<std::pair<std::string, double>>> round_passes(impls.size());
    monitor.Begin();
    for (const std::size_t k : order) {
      Impl& impl = impls[k];
      const auto t0 = std::chrono::steady_clock::now();
      impl.step();
      const auto t1 = std::chrono::steady_clock::now();
      round_ms[k] = std::chrono::duration<double, std::milli>(t1 - t0).count();
      if (impl.passes) {
        for (const auto& [pass, ms] : impl.passes()) round_passes[k].emplace_back(pass, ms);
      }
    }
    const RoundLoad load = monitor.End();
    if (load.disturbed && discarded < options.rounds) {
      ++discarded;
      continue;
    }
    loads.push_back(load);
    for (std::size_t k = 0; k < impls.size(); ++k) {
      Impl& impl = impls[k];
      impl.ms.push_back(round_ms[k]);
      for (const auto& [pass, ms] : round_passes[k]) {
        auto it = std::find_if(impl.pass_ms.begin(), impl.pass_ms.end(),
                               [&pass = pass](const auto& p) { return p.first == pass; });
        if (it == impl.pass_ms.end()) {
          impl.pass_ms.emplace_back(pass, std::vector<double>{});
          it = impl.pass_ms.end() - 1;
        }
        it->second.push_back(ms);
      }
    }
    ++r;
    progress << "\r  round " << r << "/" << options.rounds << " (" << discarded
             << " disturbed thrown away)" << std::flush;
  }
  progress << "\n";

  nlohmann::json report = {{"optimizer", options.optimizer},
                           {"shapes", shapes_name},
                           {"tensors", tensors.size()},
                           {"numel", numel},
                           {"dtype", options.dtype},
                           {"state_dtype", q8 ? "q8" : options.dtype},
                           {"threads", runtime.num_threads()},
                           {"target", ActiveTargetName()},
                           {"rounds", options.rounds},
                           {"first_step", options.first_step},
                           {"bytes_per_param", JsonNumber(bytes_per_param)},
                           {"reduction_pass", reduction_traffic.bytes() > 0 || factored}};
  if (grad_dtype != dtype || training_loop) report["grad_dtype"] = grad_dtype_name;
  if (q8) {
    report["left_out"]["standard"] = kNoStandardQ8;
    if (training_loop) report["left_out"]["standard_pipeline"] = kNoStandardQ8;
  }
  if (training_loop) {
    report["loss_scale"] = options.loss_scale;
    report["loss_scale_init"] = init_scale;
    report["clip"] = loop.clips() ? nlohmann::json(loop.max_norm) : nlohmann::json(nullptr);
    report["state_bytes_per_param"] = storage.state_bytes_per_param();
    // The unscaled gradients as every impl sees them: their global norm and the clip factor.
    std::vector<GradBuffer> grads;
    grads.reserve(segments.size());
    for (const Segment& s : segments)
      grads.push_back({const_cast<void*>(s.grad), s.numel, s.grad_dtype});
    const GradStats stats =
        GradNorm(grads, NormType::kL2, loop.scaler ? loop.scaler->inv_scale() : 1.0f, runtime);
    report["grad_norm"] = stats.norm;
    report["clip_coef"] =
        loop.clips() && !stats.non_finite ? ClipCoefficient(stats.norm, loop.max_norm) : 1.0f;
  }

  // The ceiling is the fastest traffic variant (lowest median), reported as `same_traffic` in the
  // place of the variants; each variant's times stay in the JSON under same_traffic_variants.
  std::size_t best_traffic = impls.size();
  for (std::size_t k = 0; k < impls.size(); ++k) {
    if (!impls[k].name.starts_with(kTrafficPrefix)) continue;
    report["same_traffic_variants"][impls[k].name.substr(kTrafficPrefix.size())] = {
        {"median_ms", Median(impls[k].ms)},
        {"min_ms", *std::min_element(impls[k].ms.begin(), impls[k].ms.end())}};
    if (best_traffic == impls.size() || Median(impls[k].ms) < Median(impls[best_traffic].ms))
      best_traffic = k;
  }
  const std::string traffic_variant = impls[best_traffic].name.substr(kTrafficPrefix.size());
  report["same_traffic_variant"] = traffic_variant;
  impls[best_traffic].name = "same_traffic";
  std::erase_if(impls, [](const Impl& impl) { return impl.name.starts_with(kTrafficPrefix); });

  const double fused_ms = Median(find("fused")->ms);
  const Impl* standard = find("standard");  // none with 8-bit states (kNoStandardQ8)
  const double standard_ms = standard != nullptr ? Median(standard->ms) : 0.0;
  const double traffic_ms = Median(find("same_traffic")->ms);
  const Impl* pipeline = find("standard_pipeline");
  const double pipeline_ms = pipeline != nullptr ? Median(pipeline->ms) : 0.0;
  std::size_t name_width = 14;
  for (const Impl& impl : impls) name_width = std::max(name_width, impl.name.size() + 2);
  table << std::left << std::setw(static_cast<int>(name_width)) << "impl" << std::right
        << std::setw(11) << "median ms" << std::setw(10) << "min ms" << std::setw(10) << "Gparam/s"
        << std::setw(9) << "GB/s";
  if (standard != nullptr) table << std::setw(13) << "vs standard";
  if (pipeline != nullptr) table << std::setw(16) << "vs std_pipeline";
  table << std::setw(17) << "vs same_traffic"
        << "\n";
  for (Impl& impl : impls) {
    const double median = Median(impl.ms);
    const double min = *std::min_element(impl.ms.begin(), impl.ms.end());
    const double gparams = static_cast<double>(numel) / (median * 1e6);
    const double gbps = gparams * bytes_per_param;
    nlohmann::json& entry = report["impls"][impl.name];
    entry = {{"median_ms", median},
             {"min_ms", min},
             {"samples_ms", impl.ms},
             {"gparam_per_s", gparams},
             {"gb_per_s", gbps}};
    for (const auto& [pass, ms] : impl.pass_ms) entry["passes_median_ms"][pass] = Median(ms);
    if (impl.report) impl.report(entry);
    table << std::left << std::setw(static_cast<int>(name_width)) << impl.name << std::right
          << std::fixed << std::setprecision(3) << std::setw(11) << median << std::setw(10) << min
          << std::setw(10) << gparams << std::setprecision(1) << std::setw(9) << gbps
          << std::setprecision(2);
    if (standard != nullptr) table << std::setw(12) << standard_ms / median << "x";
    if (pipeline != nullptr) table << std::setw(15) << pipeline_ms / median << "x";
    table << std::setw(17) << traffic_ms / median << "\n";
  }
  report["bandwidth_fraction"] = traffic_ms / fused_ms;
  report["round_ratio_spread"]["bandwidth_fraction"] =
      RoundRatioSpread(find("same_traffic")->ms, find("fused")->ms);
  table << std::setprecision(2);
  if (standard != nullptr) {
    report["speedup_vs_standard"] = standard_ms / fused_ms;
    report["round_ratio_spread"]["speedup_vs_standard"] =
        RoundRatioSpread(standard->ms, find("fused")->ms);
    table << "speedup_vs_standard = " << standard_ms / fused_ms << "   ";
  }
  report["load"] = LoadReport(loads, discarded);
  if (pipeline != nullptr) {
    report["speedup_vs_standard_pipeline"] = pipeline_ms / fused_ms;
    table << "speedup_vs_standard_pipeline = " << pipeline_ms / fused_ms << "   ";
  }
  table << "bandwidth_fraction = " << traffic_ms / fused_ms << "\n";
  if (report.contains("left_out")) {
    for (const auto& [name, why] : report["left_out"].items())
      table << name << ": left out, " << why.get<std::string>() << "\n";
  }
  table << std::setprecision(3) << "same_traffic: the best of";
  for (const auto& [name, entry] : report["same_traffic_variants"].items())
    table << " " << name << " " << entry["median_ms"].get<double>() << " ms";
  table << " (median): " << traffic_variant << "\n";
  for (const auto& [name, s] : report["round_ratio_spread"].items()) {
    table << std::setprecision(2) << name << " per round: " << s["min"].get<double>() << " ["
          << s["q1"].get<double>() << " " << s["median"].get<double>() << " "
          << s["q3"].get<double>() << "] " << s["max"].get<double>() << "\n";
  }
  const nlohmann::json& load = report["load"];
  table << "rounds: " << load["kept"] << " kept, " << load["discarded"]
        << " thrown away as disturbed, " << load["disturbed_kept"]
        << " disturbed kept; load average " << load["loadavg_min"].get<double>() << "-"
        << load["loadavg_max"].get<double>() << "\n";
  if (training_loop) {
    table << std::setprecision(3);
    for (const Impl& impl : impls) {
      if (impl.pass_ms.empty()) continue;
      table << "  " << impl.name << " passes (median ms):";
      for (const auto& [pass, ms] : impl.pass_ms) table << " " << pass << " " << Median(ms);
      if (impl.report) {
        nlohmann::json extra;
        impl.report(extra);
        table << "; skipped steps " << extra["skipped_steps"].get<std::int64_t>();
      }
      table << "\n";
    }
  }
  return report;
}

}  // namespace fusedopt::bench
