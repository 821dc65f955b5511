// Notices the timed rounds of a benchmark that other processes disturbed: the rule of
// bench/load_monitor.py (scripts/bench-torch), here for `fusedopt bench` (docs/benchmarks.md,
// "Load"). For a round: the CPU time the rest of the machine took during it (/proc/stat's busy
// time of all CPUs, steal included, minus this process's own from /proc/self/stat, both in clock
// ticks) and the 1-minute load average at its end. A round in which the others took more than
// `share` of the machine (wall time x CPUs), and at least kNoiseTicks, is disturbed: the runner
// throws it away and repeats it, up to a cap. Linux only: elsewhere no round is flagged.
#pragma once

#include <chrono>
#include <cstdint>

namespace fusedopt::tools {

struct RoundLoad {
  double wall_s = 0.0;
  double others_cpu_s = 0.0;  // CPU seconds other processes (and a VM's host) took in the round
  double others_share = 0.0;  // others_cpu_s / (wall_s * cpus)
  double loadavg = 0.0;       // 1-minute load average at the round's end
  bool disturbed = false;
};

class LoadMonitor {
 public:
  static constexpr double kDefaultShare = 0.05;
  // /proc/stat's per-CPU times are sampled at ticks, a process's own are exact sums: a round's
  // difference is off by a tick or so either way, so fewer ticks than this never flag it.
  static constexpr std::int64_t kNoiseTicks = 2;

  // Throws std::invalid_argument unless 0 < share <= 1.
  explicit LoadMonitor(double share = kDefaultShare);
  bool available() const { return available_; }
  int cpus() const { return cpus_; }
  void Begin();
  RoundLoad End() const;

 private:
  double share_;
  bool available_;
  int cpus_ = 1;
  std::chrono::steady_clock::time_point start_;
  std::int64_t start_busy_ = 0;
  std::int64_t start_own_ = 0;
};

}  // namespace fusedopt::tools
