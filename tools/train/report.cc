#include "tools/train/report.h"

#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "src/tool_util/report_util.h"

namespace fusedopt::train {

using tools::Fixed;
using tools::TrimmedMean;

namespace {

// Rows of the seeds' table: metric, then one cell per impl, then the change (fused vs torch).
std::vector<std::vector<std::string>> TableRows(const nlohmann::json& report) {
  std::vector<std::string> impls;
  for (const auto& [impl, _] : report["impls"].items()) impls.push_back(impl);
  // torch first: the "before" column.
  std::sort(impls.begin(), impls.end(), [](const std::string& a, const std::string& b) {
    return (a == "torch") > (b == "torch");
  });
  const bool compare = report.contains("speedup");
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"metric"};
  for (const std::string& impl : impls) header.push_back(report["impls"][impl]["label"]);
  if (compare) header.push_back("change");
  rows.push_back(header);
  const auto row = [&](const std::string& metric, const std::string& key, int digits, bool percent,
                       const std::string& change) {
    std::vector<std::string> r = {metric};
    for (const std::string& impl : impls) {
      const double v = report["impls"][impl][key];
      r.push_back(percent ? Percent(v) : Fixed(v, digits));
    }
    if (compare) r.push_back(change);
    rows.push_back(r);
  };
  const auto rel = [&](const std::string& key) {
    if (!compare) return std::string();
    const double t = report["impls"]["torch"][key], f = report["impls"]["fused"][key];
    return (f >= t ? "+" : "") + Percent(f / t - 1.0);
  };
  row("throughput (samples/s)", "samples_per_s", 1, false, rel("samples_per_s"));
  row("step (ms)", "step_ms", 2, false, rel("step_ms"));
  row("optimizer (ms)", "optimizer_ms", 2, false, rel("optimizer_ms"));
  std::string share_change;
  if (compare) {
    const double t = report["impls"]["torch"]["optimizer_share"];
    const double f = report["impls"]["fused"]["optimizer_share"];
    share_change = Fixed(100.0 * (f - t), 1) + " points";
  }
  row("optimizer share of the step", "optimizer_share", 1, true, share_change);
  row("training time (s, " + std::to_string(report["steps"].get<int>()) + " steps)", "total_s", 2,
      false, rel("total_s"));
  row("loss after the last step", "final_loss", 4, false, "");
  if (compare) {
    // With both impls the columns are: metric, torch, fused, change.
    const std::vector<std::string> speedup = {"speedup (step time)", "1.000x",
                                              Fixed(report["speedup"], 3) + "x", ""};
    rows.push_back(speedup);
    std::vector<std::string> bound(rows[0].size(), "");
    bound[0] = "Amdahl bound (optimizer -> 0 ms)";
    bound.back() = Fixed(report["amdahl_bound"], 3) + "x, " +
                   Percent(report["bound_gain_captured"]) + " of its gain captured";
    rows.push_back(bound);
    rows.push_back({"speedup from the optimizer phase alone", "1.000x",
                    Fixed(report["phase_speedup"], 3) + "x",
                    Percent(report["phase_gain_captured"]) + " of the bound's gain"});
  }
  return rows;
}

}  // namespace

Progress::Progress(std::ostream& out, bool enabled, int total)
    : out_(out), enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0), total_(total) {}

void Progress::Update(int done, const std::vector<ImplProgress>& impls) {
  if (!enabled_) return;
  if (!tty_ && done != total_ && done % std::max(1, total_ / 10) != 0) return;
  constexpr int kWidth = 24;
  const int filled = kWidth * done / total_;
  std::ostringstream line;
  line << "[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] " << done
       << "/" << total_;
  for (const auto& [impl, last] : impls) {
    if (last != nullptr) {
      line << "  " << impl << " " << std::fixed << std::setprecision(1) << last->step_ms
           << " ms/step loss " << std::setprecision(4) << last->loss;
    }
  }
  out_ << (tty_ ? "\r" : "") << line.str() << (tty_ && done != total_ ? "" : "\n") << std::flush;
}

nlohmann::json Summarize(const std::string& label, const std::vector<pt::UpdateStats>& timed,
                         const std::vector<double>& losses, std::int64_t samples_per_update) {
  std::vector<double> step, data, forward, backward, optimizer, zero_grad;
  double total_ms = 0.0;
  for (const pt::UpdateStats& s : timed) {
    step.push_back(s.step_ms);
    data.push_back(s.data_ms);
    forward.push_back(s.forward_ms);
    backward.push_back(s.backward_ms);
    optimizer.push_back(s.optimizer_ms);
    zero_grad.push_back(s.zero_grad_ms);
    total_ms += s.step_ms;
  }
  const double step_ms = TrimmedMean(step);
  const double optimizer_ms = TrimmedMean(optimizer);
  return {{"label", label},
          {"samples_per_s", static_cast<double>(samples_per_update) / (step_ms / 1000.0)},
          {"step_ms", step_ms},
          {"optimizer_ms", optimizer_ms},
          {"optimizer_share", optimizer_ms / step_ms},
          {"total_s", total_ms / 1000.0},
          {"phases_ms",
           {{"data", TrimmedMean(data)},
            {"forward", TrimmedMean(forward)},
            {"backward", TrimmedMean(backward)},
            {"optimizer", optimizer_ms},
            {"zero_grad", TrimmedMean(zero_grad)}}},
          {"losses", losses},
          {"final_loss", losses.empty() ? 0.0 : losses.back()}};
}

std::string Percent(double fraction) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << 100.0 * fraction << " %";
  return s.str();
}

void PrintTable(const nlohmann::json& report, std::ostream& out) {
  const std::vector<std::vector<std::string>> rows = TableRows(report);
  std::vector<std::size_t> width(rows[0].size(), 0);
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    for (std::size_t c = 0; c < rows[i].size(); ++c) {
      out << (c == 0 ? std::left : std::right) << std::setw(static_cast<int>(width[c]))
          << rows[i][c] << (c + 1 < rows[i].size() ? "  " : "\n");
    }
    if (i == 0) {
      std::size_t total = 0;
      for (const std::size_t w : width) total += w + 2;
      out << std::string(total - 2, '-') << "\n";
    }
  }
  out << std::left;
}

std::string MarkdownTable(const nlohmann::json& report) {
  const std::vector<std::vector<std::string>> rows = TableRows(report);
  std::ostringstream md;
  md << "**" << report["model"].get<std::string>() << "**, "
     << report["optimizer"].get<std::string>() << ", batch " << report["batch_size"] << ", "
     << report["threads"] << " threads, " << report["dtype"].get<std::string>()
     << ", trimmed means of " << report["steps"] << " steps\n\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    md << "|";
    for (const std::string& cell : rows[i]) md << " " << cell << " |";
    md << "\n";
    if (i == 0) {
      md << "|---|";
      for (std::size_t c = 1; c < rows[i].size(); ++c) md << "--:|";
      md << "\n";
    }
  }
  return md.str();
}

}  // namespace fusedopt::train
