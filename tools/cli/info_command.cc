// `fusedopt info`: the SIMD targets and the thread count this machine runs; with --bandwidth, the
// machine's STREAM-style read, write and copy bandwidth (src/baselines/same_traffic.h), the numbers
// the benchmark's same_traffic ceiling is to be read against.

#include <cstddef>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "fusedopt/runtime.h"
#include "src/baselines/same_traffic.h"
#include "tools/cli/command.h"

namespace fusedopt::cli {
namespace {

// Arrays far beyond the last-level caches of today's CPUs (tens to hundreds of MiB), so the
// kernels stream from memory: the default of --bandwidth-mib.
constexpr std::size_t kDefaultBandwidthMiB = 256;
constexpr int kBandwidthRounds = 5;

void PrintBandwidth(std::size_t mib) {
  tools::CheckFitsInMemory(2 * (mib << 20), "--bandwidth-mib " + std::to_string(mib));
  const Runtime& runtime = DefaultRuntime();
  const baselines::StreamBandwidth bw =
      baselines::MeasureStreamBandwidth(mib << 20, kBandwidthRounds, runtime);
  const auto regular = static_cast<std::size_t>(baselines::TrafficStores::kRegular);
  const auto stream = static_cast<std::size_t>(baselines::TrafficStores::kStream);
  std::cout << "bandwidth: STREAM-style, " << (bw.array_bytes >> 20) << " MiB f32 arrays, "
            << bw.threads << " threads, best of " << bw.rounds << " (GB/s = 1e9 bytes/s)\n"
            << std::fixed << std::setprecision(1);
  std::cout << "  read   " << std::setw(7) << bw.read_gb_per_s << " GB/s  (sum of one array)\n";
  const auto print = [&](const char* name, const double* gbps, const char* what) {
    const std::size_t best = gbps[stream] > gbps[regular] ? stream : regular;
    std::cout << "  " << name << std::setw(7) << gbps[best] << " GB/s  (" << what << "; "
              << baselines::TrafficStoresName(baselines::TrafficStores::kRegular) << " "
              << gbps[regular] << ", "
              << baselines::TrafficStoresName(baselines::TrafficStores::kStream) << " "
              << gbps[stream] << ")\n";
  };
  print("write  ", bw.write_gb_per_s, "fill of one array");
  print("copy   ", bw.copy_gb_per_s, "bytes read + written");
}

}  // namespace

Command AddInfoCommand(CLI::App& app) {
  CLI::App* info = app.add_subcommand(
      "info", "Print the SIMD targets and thread count; --bandwidth: the memory bandwidth (GB/s)");
  struct Options {
    bool bandwidth = false;
    std::size_t bandwidth_mib = kDefaultBandwidthMiB;
  };
  auto options = std::make_shared<Options>();
  info->add_flag("--bandwidth", options->bandwidth,
                 "Also measure the STREAM-style read, write and copy GB/s (all threads)");
  info->add_option("--bandwidth-mib", options->bandwidth_mib,
                   "Size of each --bandwidth array in MiB (default " +
                       std::to_string(kDefaultBandwidthMiB) + ")")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  return {info, [options] {
            // FOPT_DISABLE_TARGETS is read on the first call: a bad value is an error here.
            return RunCommand("info", [&] {
              const std::string active = TargetDescription(ActiveTargetName());
              std::cout << "active target: " << active << "\navailable targets: ";
              const std::vector<std::string> targets = AvailableTargets();
              for (std::size_t i = 0; i < targets.size(); ++i)
                std::cout << (i > 0 ? ", " : "") << TargetDescription(targets[i]);
              std::cout << "\nthreads: " << DefaultRuntime().num_threads() << "\n";
              if (options->bandwidth) PrintBandwidth(options->bandwidth_mib);
            });
          }};
}

}  // namespace fusedopt::cli
