#include "src/doctor/measure.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "fusedopt/optimizer.h"
#include "fusedopt/runtime.h"
#include "src/baselines/pipeline.h"
#include "src/baselines/same_traffic.h"
#include "src/baselines/standard.h"
#include "src/tool_util/report_util.h"

namespace fusedopt::doctor {

using baselines::BenchHyper;
using baselines::BenchRequiredStates;
using baselines::FactoredTraffic;
using baselines::FusedLoop;
using baselines::FusedStep;
using baselines::LoopOptions;
using baselines::ReductionTraffic;
using baselines::SameTrafficGradRead;
using baselines::SameTrafficStep;
using baselines::StandardLoop;
using baselines::StandardStep;
using baselines::TrafficLoop;
using tools::Fill;
using tools::IsFactored;
using tools::Median;

Timings Measure(const Model& m, const DoctorOptions& o, bool time_standard,
                std::ostream& progress) {
  const BenchHyper hyper = MakeHyper(m, o);
  Runtime runtime(o.threads);
  std::vector<TensorSpec> tensors;
  for (std::size_t n : o.numels) tensors.push_back({.numel = n});
  FlatStorage storage(tensors, 1,
                      {.param_dtype = m.dtype, .grad_dtype = m.dtype, .state_dtype = m.dtype},
                      BenchRequiredStates(m.algorithm, hyper));
  std::vector<Segment> segments(storage.segments().begin(), storage.segments().end());
  for (std::size_t i = 0; i < segments.size(); ++i) {
    Fill(segments[i].param, m.dtype, segments[i].numel, 1.0f, static_cast<std::uint32_t>(2 * i));
    Fill(const_cast<void*>(segments[i].grad), m.dtype, segments[i].numel, 1e-2f,
         static_cast<std::uint32_t>(2 * i + 1));
  }
  std::vector<Segment> standard_segments = segments;

  std::optional<FusedLoop> fused_loop;
  std::optional<StandardLoop> standard_loop;
  if (o.clip) {
    const LoopOptions loop{.scaler = std::nullopt, .max_norm = *o.clip};
    fused_loop.emplace(m.algorithm, hyper, segments, loop);
    standard_loop.emplace(m.algorithm, hyper, segments, loop);
  }
  struct Timed {
    std::string name;
    std::function<void()> run;
    std::vector<double> ms;
  };
  std::vector<Timed> impls;
  impls.push_back({"fused",
                   [&] {
                     if (fused_loop) return fused_loop->Run(runtime);
                     FusedStep(m.algorithm, hyper, segments, runtime);
                   },
                   {}});
  const ReductionTraffic reduction(m.algorithm, segments);
  std::optional<FactoredTraffic> factored;
  if (IsFactored(m.algorithm)) factored.emplace(m.algorithm, segments);
  // The ceiling: the fastest of the traffic loops (kAllTrafficLoops), as `fusedopt bench` takes it.
  for (const TrafficLoop loop : baselines::kAllTrafficLoops) {
    impls.push_back({"same_traffic",
                     [&, loop] {
                       if (o.clip) SameTrafficGradRead(segments, runtime, loop.pace);
                       if (factored) return factored->Run(runtime, loop);
                       reduction.Run(runtime, loop);
                       SameTrafficStep(segments, runtime, loop);
                     },
                     {}});
  }
  if (time_standard) {
    impls.push_back({"standard",
                     [&] {
                       if (standard_loop) return standard_loop->Run(runtime);
                       StandardStep(m.algorithm, hyper, standard_segments, runtime);
                     },
                     {}});
  }
  // Step counts start at 2: steady state (SGD's first step only copies the grad into its buffer).
  std::int64_t step = 1;
  const auto next_step = [&] {
    ++step;
    for (Segment& s : segments) s.step = step;
    for (Segment& s : standard_segments) s.step = step;
    if (fused_loop) fused_loop->SetStep(step);
    if (standard_loop) standard_loop->SetStep(step);
  };
  constexpr int kWarmup = 2;
  for (int w = 0; w < kWarmup; ++w) {
    next_step();
    for (Timed& t : impls) t.run();
  }
  for (int r = 0; r < o.rounds; ++r) {
    next_step();
    // Rotate the order so no implementation always runs right after another's cache footprint.
    for (std::size_t k = 0; k < impls.size(); ++k) {
      Timed& t = impls[(k + static_cast<std::size_t>(r)) % impls.size()];
      const auto t0 = std::chrono::steady_clock::now();
      t.run();
      const auto t1 = std::chrono::steady_clock::now();
      t.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    progress << "\r  round " << (r + 1) << "/" << o.rounds << std::flush;
  }
  progress << "\n";
  Timings out;
  out.fused_ms = Median(impls[0].ms);
  out.same_traffic_ms = Median(impls[1].ms);
  for (const Timed& t : impls) {
    if (t.name == "same_traffic") out.same_traffic_ms = std::min(out.same_traffic_ms, Median(t.ms));
  }
  if (time_standard) out.standard_ms = Median(impls.back().ms);
  out.threads = runtime.num_threads();
  return out;
}

}  // namespace fusedopt::doctor
