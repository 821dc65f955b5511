// Diagnose (doctor.h): the checks, the counts, the timings, the verdict and the distributed plan,
// put together into the report.
#include "src/doctor/doctor.h"

#include <ostream>
#include <string>
#include <vector>

#include "fusedopt/runtime.h"
#include "src/doctor/checks.h"
#include "src/doctor/distributed_plan.h"
#include "src/doctor/measure.h"
#include "src/doctor/verdict.h"
#include "src/tool_util/report_util.h"

namespace fusedopt::doctor {

using tools::Fixed;
using tools::FormatCount;
using tools::Num;

nlohmann::json Diagnose(const DoctorOptions& options, std::ostream& report,
                        std::ostream& progress) {
  const Model m = CheckedModel(options);
  CheckStepOptions(options);
  // Before timing, so that a bad flag fails at once.
  if (!options.ranks.empty()) CheckDistributedOptions(options);
  CheckBuffersFit(m, options);
  const bool already_fused = options.impl == "fused";
  const OpCount standard = CountStandardOps(options);
  const OpCount fused = CountFusedOps(options);
  // Already fused: the traced optimizer time is fusedopt's; time the for-loop here to compare.
  const bool time_standard = !options.optimizer_ms || already_fused;

  progress << "fusedopt doctor: " << options.optimizer << " on " << m.num_tensors << " tensors ("
           << FormatCount(m.numel) << " params), " << options.dtype << ", timing fused, "
           << "same_traffic" << (time_standard ? " and standard" : "") << ", " << options.rounds
           << " rounds\n";
  const Timings t = Measure(m, options, time_standard, progress);

  const std::string source = options.optimizer_ms ? options.optimizer_ms_source : "measured";
  const double optimizer_ms = options.optimizer_ms ? *options.optimizer_ms : *t.standard_ms;
  if (optimizer_ms >= options.step_ms) {
    Bad("optimizer_ms", "measured",
        "the standard optimizer takes " + Num(optimizer_ms) + " ms here, not less than step_ms " +
            Num(options.step_ms) + ": give --optimizer-ms or check --step-ms");
  }
  Findings f{.already_fused = already_fused,
             .share = optimizer_ms / options.step_ms,
             .amdahl_bound = options.step_ms / (options.step_ms - optimizer_ms),
             .optimizer_ms = optimizer_ms,
             .fused_ms = t.fused_ms,
             .predicted_step_ms = options.step_ms - optimizer_ms + t.fused_ms,
             .predicted_speedup = 0.0,
             .standard_gb_per_s = static_cast<double>(standard.bytes) / (optimizer_ms * 1e6),
             .ceiling_gb_per_s = static_cast<double>(fused.bytes) / (t.same_traffic_ms * 1e6),
             .same_traffic_ms = t.same_traffic_ms,
             .standard_ms = t.standard_ms,
             .standard = standard,
             .fused = fused};
  if (already_fused) f.predicted_step_ms = options.step_ms;
  f.predicted_speedup = options.step_ms / f.predicted_step_ms;
  const std::string verdict = Verdict(f);

  nlohmann::json j = {
      {"optimizer", options.optimizer},
      {"dtype", options.dtype},
      {"weight_decay", m.weight_decay},
      {"momentum", options.momentum},
      {"nesterov", options.nesterov},
      {"clip", options.clip ? nlohmann::json(*options.clip) : nlohmann::json(nullptr)},
      {"num_tensors", m.num_tensors},
      {"numel", m.numel},
      {"threads", t.threads},
      {"target", ActiveTargetName()},
      {"rounds", options.rounds},
      {"impl", options.impl.empty() ? nlohmann::json(nullptr) : nlohmann::json(options.impl)},
      {"already_fused", already_fused},
      {"step_ms", options.step_ms},
      {"optimizer_ms", optimizer_ms},
      {"optimizer_ms_source", source},
      {"optimizer_share", f.share},
      {"standard", CountJson(standard)},
      {"fused", CountJson(fused)},
      {"measured",
       {{"fused_ms", t.fused_ms},
        {"same_traffic_ms", t.same_traffic_ms},
        {"standard_ms", t.standard_ms ? nlohmann::json(*t.standard_ms) : nlohmann::json(nullptr)},
        {"ceiling_gb_per_s", f.ceiling_gb_per_s},
        {"fused_gb_per_s", static_cast<double>(fused.bytes) / (t.fused_ms * 1e6)},
        {"standard_gb_per_s", f.standard_gb_per_s}}},
      {"amdahl_bound", f.amdahl_bound},
      {"predicted_step_ms", f.predicted_step_ms},
      {"predicted_speedup", f.predicted_speedup},
      {"predicted_bound_gain_captured",
       already_fused ? nlohmann::json(nullptr)
                     : nlohmann::json((f.predicted_speedup - 1.0) / (f.amdahl_bound - 1.0))},
      {"verdict", verdict}};
  if (options.trace_fused_step_ms && !already_fused) {
    j["trace_fused"] = {{"step_ms", *options.trace_fused_step_ms},
                        {"measured_speedup", options.step_ms / *options.trace_fused_step_ms}};
  }

  report << "fusedopt doctor: " << options.optimizer << " on " << m.num_tensors << " tensors ("
         << FormatCount(m.numel) << " params), " << options.dtype << ", " << t.threads
         << " threads, target " << TargetDescription(ActiveTargetName());
  if (!options.impl.empty()) report << "; traced impl " << options.impl;
  report << "\n";
  PrintTable(report, f, source);
  if (options.impl == "foreach" || options.impl == "torch_fused") {
    report << "(the counts model the for-loop optimizer; " << options.impl
           << " makes fewer launches over the same or fewer bytes: its time is the trace's)\n";
  }
  report << "step " << Ms(options.step_ms) << " ms, optimizer " << Ms(optimizer_ms) << " ms ("
         << Fixed(100.0 * f.share, 1) << " %, " << source << "); Amdahl bound "
         << Fixed(f.amdahl_bound, 3) << "x; predicted step " << Ms(f.predicted_step_ms)
         << " ms, speedup " << Fixed(f.predicted_speedup, 3) << "x";
  if (!already_fused) {
    report << " (" << Fixed(100.0 * j["predicted_bound_gain_captured"].get<double>(), 0)
           << " % of the bound)";
  }
  report << "\n";
  if (j.contains("trace_fused")) {
    report << "the trace's fused run: step " << Ms(*options.trace_fused_step_ms)
           << " ms, measured speedup "
           << Fixed(j["trace_fused"]["measured_speedup"].get<double>(), 3) << "x\n";
  }
  report << "verdict: " << verdict << "\n";
  if (!options.ranks.empty()) {
    // The rest of the step (forward, backward, data) is the measured step without its optimizer.
    const std::vector<DistributedRow> plan =
        PlanDistributed(options, t.fused_ms, options.step_ms - optimizer_ms);
    PrintDistributedPlan(report, options, plan);
    j["distributed"] = DistributedJson(plan);
    j["distributed_model"] = DistributedModelJson(options);
  }
  return j;
}

}  // namespace fusedopt::doctor
