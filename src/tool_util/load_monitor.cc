#include "src/tool_util/load_monitor.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>

namespace fusedopt::tools {
namespace {

struct ProcStat {
  std::int64_t busy = 0;
  int cpus = 0;
};

// Busy ticks of all CPUs since boot and the online CPU count, from /proc/stat; cpus 0 where it
// cannot be read.
ProcStat ReadProcStat() {
  std::ifstream in("/proc/stat");
  ProcStat s;
  std::string line;
  if (!std::getline(in, line)) return s;
  // cpu  user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user)
  std::istringstream fields(line.substr(3));
  std::int64_t v[8] = {};
  for (std::int64_t& x : v) fields >> x;
  if (!fields) return s;
  s.busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
  while (std::getline(in, line))
    if (line.size() > 3 && line.starts_with("cpu") && line[3] >= '0' && line[3] <= '9') ++s.cpus;
  return s;
}

// utime + stime of this process (every thread), in clock ticks; -1 where it cannot be read.
std::int64_t OwnTicks() {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) may hold spaces and parentheses: count fields after the last ')'.
  const std::size_t close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  std::int64_t utime = 0;
  std::int64_t stime = 0;
  for (int k = 3; k <= 15 && fields >> field; ++k) {  // proc(5) numbers fields from 1
    if (k == 14) utime = std::stoll(field);
    if (k == 15) stime = std::stoll(field);
  }
  return fields ? utime + stime : -1;
}

}  // namespace

LoadMonitor::LoadMonitor(double share) : share_(share) {
  if (!(share > 0.0 && share <= 1.0))
    throw std::invalid_argument("disturbed share must be in (0, 1], got " + std::to_string(share));
  const ProcStat s = ReadProcStat();
  available_ = s.cpus > 0 && OwnTicks() >= 0;
  if (available_) cpus_ = s.cpus;
}

void LoadMonitor::Begin() {
  start_busy_ = available_ ? ReadProcStat().busy : 0;
  start_own_ = available_ ? OwnTicks() : 0;
  start_ = std::chrono::steady_clock::now();
}

RoundLoad LoadMonitor::End() const {
  RoundLoad r;
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double loadavg[1] = {0.0};
  if (getloadavg(loadavg, 1) == 1) r.loadavg = loadavg[0];
  if (!available_) return r;
  const std::int64_t others =
      std::max<std::int64_t>(0, (ReadProcStat().busy - start_busy_) - (OwnTicks() - start_own_));
  r.others_cpu_s = static_cast<double>(others) / static_cast<double>(sysconf(_SC_CLK_TCK));
  r.others_share = r.wall_s > 0.0 ? r.others_cpu_s / (r.wall_s * cpus_) : 0.0;
  r.disturbed = others >= kNoiseTicks && r.others_share > share_;
  return r;
}

}  // namespace fusedopt::tools
