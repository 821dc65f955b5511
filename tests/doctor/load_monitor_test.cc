// The load monitor of `fusedopt bench` (src/tool_util/load_monitor.h) against a real disturbance: a
// round with a busy-looping child process beside it is flagged, and its count of other processes'
// CPU time holds the child's. Flags are asserted, never timings. (tests/python/test_bench_load.py
// checks the same rule in Python against an independent per-process count, quiet rounds too.)

#include "src/tool_util/load_monitor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <stdexcept>

namespace fusedopt::tools {
namespace {

void BusyFor(std::chrono::milliseconds duration) {
  const auto end = std::chrono::steady_clock::now() + duration;
  volatile unsigned spin = 0;
  while (std::chrono::steady_clock::now() < end) spin = spin + 1;
}

TEST(LoadMonitor, RoundWithABusyProcessBesideItIsFlagged) {
  if (!std::ifstream("/proc/stat")) GTEST_SKIP() << "reads /proc (Linux)";
  LoadMonitor monitor;
  ASSERT_TRUE(monitor.available());
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // spins on one CPU until killed; says when it runs
    const char byte = 1;
    if (write(ready[1], &byte, 1) != 1) _exit(1);
    volatile unsigned spin = 0;
    for (;;) spin = spin + 1;
  }
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  monitor.Begin();
  BusyFor(std::chrono::milliseconds(250));
  const RoundLoad load = monitor.End();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  // The child had one CPU (of at most a few) for the whole round: far above 5 % of the machine.
  EXPECT_TRUE(load.disturbed) << "others " << load.others_cpu_s << " s, share " << load.others_share
                              << " of " << monitor.cpus() << " CPUs";
  EXPECT_GT(load.others_share, LoadMonitor::kDefaultShare);
}

TEST(LoadMonitor, RefusesAShareOutsideZeroToOne) {
  EXPECT_THROW(LoadMonitor(0.0), std::invalid_argument);
  EXPECT_THROW(LoadMonitor(1.5), std::invalid_argument);
}

}  // namespace
}  // namespace fusedopt::tools
