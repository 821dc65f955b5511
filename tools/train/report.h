// The reports of `fusedopt train` (run.h): the progress bar, each impl's summary (JSON), the
// seeds' table as text and as Markdown.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fusedopt/pt/trainer.h"

namespace fusedopt::train {

// What the progress bar shows of one impl: its name and its last timed update (none yet: null).
struct ImplProgress {
  std::string impl;
  const pt::UpdateStats* last = nullptr;
};

// A one-line bar on a terminal; on a pipe, a line every 10 %.
class Progress {
 public:
  Progress(std::ostream& out, bool enabled, int total);
  void Update(int done, const std::vector<ImplProgress>& impls);

 private:
  std::ostream& out_;
  bool enabled_, tty_;
  int total_;
};

// One impl's report: its label, throughput, the trimmed means of its step and of each phase
// (pt::UpdateStats), the optimizer's share and its losses.
nlohmann::json Summarize(const std::string& label, const std::vector<pt::UpdateStats>& timed,
                         const std::vector<double>& losses, std::int64_t samples_per_update);

// "12.3 %".
std::string Percent(double fraction);

// The seeds' table (throughput, optimizer time and share, training time; with both impls the
// change, the speedup and the Amdahl bound), as text and as Markdown (for --markdown / the
// --compare report file).
void PrintTable(const nlohmann::json& report, std::ostream& out);
std::string MarkdownTable(const nlohmann::json& report);

}  // namespace fusedopt::train
