#include "src/doctor/verdict.h"

#include <iomanip>
#include <sstream>

#include "src/tool_util/report_util.h"

namespace fusedopt::doctor {

using tools::Fixed;

std::string Ms(double ms) {
  if (ms >= 1.0) return Fixed(ms, 2);
  std::ostringstream out;
  out << std::setprecision(3) << ms;
  return out.str();
}

nlohmann::json CountJson(const OpCount& c) {
  return {{"ops", c.ops}, {"passes", c.passes}, {"bytes", c.bytes}};
}

std::string Verdict(const Findings& f) {
  std::ostringstream v;
  const std::string share = Fixed(100.0 * f.share, f.share < 0.1 ? 1 : 0) + " %";
  if (f.already_fused) {
    v << "This run already uses fusedopt: the optimizer is " << share << " of your step ("
      << Ms(f.optimizer_ms) << " ms).";
    if (f.standard_ms) {
      v << " A for-loop optimizer would take about " << Ms(*f.standard_ms)
        << " ms on these shapes (measured here), fusedopt " << Ms(f.fused_ms) << " ms.";
    }
    if (f.share < 0.1)
      v << " The rest of the step is elsewhere (data loading, forward and backward): look there.";
    return v.str();
  }
  v << "The optimizer is " << share << " of your step. Fusing it saves at most " << share
    << " (Amdahl bound " << Fixed(f.amdahl_bound, 2) << "x); fusedopt's step on these shapes takes "
    << Ms(f.fused_ms) << " ms instead of " << Ms(f.optimizer_ms) << " ms, so expect "
    << Fixed(f.predicted_speedup, 2) << "x end to end (a " << Ms(f.predicted_step_ms)
    << " ms step).";
  if (f.fused_ms >= f.optimizer_ms) {
    v << " fusedopt is not faster than your optimizer on these shapes: do not expect a gain.";
  }
  if (f.share < 0.1) {
    v << " The optimizer is not your bottleneck: the step is spent elsewhere (data loading, "
         "forward and backward); profile those first (a --trace shows the split).";
  } else if (f.share >= 0.3) {
    v << " The optimizer is a large part of your step: fusing it is worth it.";
  }
  if (f.standard_gb_per_s >= 0.7 * f.ceiling_gb_per_s) {
    const std::string rate = Fixed(f.standard_gb_per_s, 1) + " GB/s";
    const std::string ceiling = Fixed(f.ceiling_gb_per_s, 1) + " GB/s";
    if (f.standard_gb_per_s <= 1.05 * f.ceiling_gb_per_s) {
      v << " Your optimizer already runs near this machine's bandwidth ceiling (" << rate << " of "
        << ceiling << ")";
    } else {
      // Faster than the ceiling: the times come from a quieter or faster machine than this run.
      v << " Your optimizer's " << rate << " is above the bandwidth ceiling measured here ("
        << ceiling << "; is the machine busier now than when the step was timed?)";
    }
    v << ": fusing helps by moving fewer bytes (" << Fixed(f.fused.passes, 0) << " instead of "
      << Fixed(f.standard.passes, 0) << " passes), not by moving them faster.";
  }
  return v.str();
}

void PrintTable(std::ostream& out, const Findings& f, const std::string& optimizer_source) {
  const auto row = [&](const std::string& name, std::optional<OpCount> c, double ms,
                       std::optional<double> gbps, const std::string& note) {
    out << std::left << std::setw(24) << name << std::right;
    if (c) {
      out << std::setw(8) << c->ops << std::setw(8) << Fixed(c->passes, 1) << std::setw(11)
          << Fixed(static_cast<double>(c->bytes) / 1e6, 1);
    } else {
      out << std::setw(27) << "";
    }
    out << std::setw(10) << (ms >= 0.01 ? Fixed(ms, 3) : Ms(ms)) << std::setw(8)
        << (gbps ? Fixed(*gbps, 1) : "");
    if (!note.empty()) out << "  " << note;
    out << "\n";
  };
  out << std::left << std::setw(24) << "" << std::right << std::setw(8) << "ops" << std::setw(8)
      << "passes" << std::setw(11) << "MB moved" << std::setw(10) << "ms" << std::setw(8) << "GB/s"
      << "\n";
  const double fused_gbps = static_cast<double>(f.fused.bytes) / (f.fused_ms * 1e6);
  const std::string standard_name = f.already_fused ? "standard (for-loop)" : "your optimizer";
  const double standard_ms = f.already_fused ? f.standard_ms.value_or(0.0) : f.optimizer_ms;
  row(standard_name, f.standard, standard_ms,
      static_cast<double>(f.standard.bytes) / (standard_ms * 1e6),
      f.already_fused ? "(measured here)" : "(" + optimizer_source + ")");
  row(f.already_fused ? "fusedopt (measured here)" : "fusedopt", f.fused, f.fused_ms, fused_gbps,
      "");
  row("same_traffic (ceiling)", std::nullopt, f.same_traffic_ms, f.ceiling_gb_per_s,
      "(the fused bytes, trivial math)");
}

}  // namespace fusedopt::doctor
