// A training timeline in Chrome's trace-event format (docs/trace-format.md): open the file in
// https://ui.perfetto.dev or chrome://tracing, or hand it to `fusedopt doctor --trace`.
//
//   fusedopt::pt::Timeline timeline;
//   const int pid = timeline.AddProcess("fused", "fusedopt::pt::AdamW");
//   { auto span = timeline.Span(pid, "forward", step); ... }   // a complete event on destruction
//   timeline.Write("trace.json", other_data_json);
//
// Standard library only: spans are kept in memory (a few per step) and written once at the end.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fusedopt::pt {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  // A span that ends (is recorded) when destroyed, or at End().
  class ScopedSpan {
   public:
    ScopedSpan(Timeline* timeline, int pid, std::string name, std::int64_t step);
    ScopedSpan(const ScopedSpan&) = delete;
    ScopedSpan& operator=(const ScopedSpan&) = delete;
    ~ScopedSpan() { End(); }
    // Records the span now; returns its duration in milliseconds (0 when already ended).
    double End();

   private:
    Timeline* timeline_;
    int pid_;
    std::string name_;
    std::int64_t step_;
    Clock::time_point begin_;
    bool ended_ = false;
  };

  struct Event {
    int pid;
    std::string name;
    std::int64_t step;
    double ts_us;  // since the timeline was created
    double dur_us;
    std::optional<bool> warmup;  // set on `step` spans only
  };

  Timeline() : origin_(Clock::now()) {}

  // Registers an optimizer implementation (`impl`: torch, fused, ...) and returns its process id.
  int AddProcess(const std::string& impl, const std::string& label);
  // A span of `name` for `step` on process `pid` (no-op recording when timeline is null, so call
  // sites need no branches: Timeline::Span(nullptr, ...) still measures).
  static ScopedSpan Span(Timeline* timeline, int pid, std::string name, std::int64_t step) {
    return {timeline, pid, std::move(name), step};
  }
  void Record(Event event) { events_.push_back(std::move(event)); }
  // Marks the `step` span of (pid, step) as warm-up or not.
  void SetWarmup(int pid, std::int64_t step, bool warmup);

  const std::vector<Event>& events() const { return events_; }
  double MicrosecondsSinceStart(Clock::time_point t) const;

  // The trace as JSON text; `other_data_json` is a JSON object (text) stored as otherData, to
  // which "fusedopt_trace" and "impls" are added.
  std::string ToJson(const std::string& other_data_json) const;
  // Writes ToJson to `path`; throws std::runtime_error naming the path and the reason if it cannot
  // (also when the disk fills up).
  void Write(const std::string& path, const std::string& other_data_json) const;

 private:
  Clock::time_point origin_;
  std::map<int, std::pair<std::string, std::string>> processes_;  // pid -> (impl, label)
  std::vector<Event> events_;
};

}  // namespace fusedopt::pt
