// The targets compiled here are those steps may be dispatched to: src/cpu/quantize_blocks.cc's,
// which add AVX3_DL to every other kernel's (CompanionsOf).
#define HWY_WANT_AVX3_DL 1

#include "fusedopt/runtime.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "fusedopt/error.h"
#include "hwy/highway.h"
#include "hwy/targets.h"

namespace fusedopt {
namespace {

// Bit of the compiled target with this name (as hwy::TargetName spells it), or 0.
std::int64_t TargetBit(const std::string& name) {
  for (int shift = 0; shift < 64; ++shift) {
    const std::int64_t bit = std::int64_t{1} << shift;
    if ((HWY_TARGETS & bit) != 0 && name == hwy::TargetName(bit)) return bit;
  }
  return 0;
}

// The names of the compiled targets, best first: the names FOPT_DISABLE_TARGETS accepts.
std::string CompiledTargetNames() {
  std::string names;
  for (std::int64_t bits = HWY_TARGETS; bits != 0; bits &= bits - 1)
    names += (names.empty() ? "" : ", ") + std::string(hwy::TargetName(bits & -bits));
  return names;
}

// The targets named in FOPT_DISABLE_TARGETS (comma-separated, blanks around names ignored). An
// unknown name is an error rather than ignored: a typo would otherwise silently test the wrong
// target.
std::int64_t DisabledTargets() {
  const char* env = std::getenv("FOPT_DISABLE_TARGETS");
  if (env == nullptr) return 0;
  std::int64_t disabled = 0;
  std::stringstream list(env);
  for (std::string name; std::getline(list, name, ',');) {
    const std::size_t first = name.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    name = name.substr(first, name.find_last_not_of(" \t") - first + 1);
    const std::int64_t bit = TargetBit(name);
    if (bit == 0) {
      throw Error("FOPT_DISABLE_TARGETS: unknown target '" + name +
                  "'; valid names: " + CompiledTargetNames());
    }
    disabled |= bit;
  }
  return disabled;
}

// AVX3_DL is compiled only for the 8-bit states' codecs (src/cpu/quantize_blocks.cc); every other
// kernel runs its AVX3 code there (each file dispatches to the best target it compiled, and falls
// to SCALAR where the mask holds none). So AVX3_DL goes with AVX3: forcing it keeps AVX3, and a
// mask without AVX3 drops it.
std::int64_t CompanionsOf(std::int64_t mask) {
  if ((mask & HWY_AVX3) == 0) return mask & ~std::int64_t{HWY_AVX3_DL};
  return mask;
}

// Dispatch uses hwy's test mock (SetSupportedTargetsForTest) for every restriction: in
// Highway 1.0.3 each call of SupportedTargets() re-chooses the target from the unmasked CPU set,
// silently undoing DisableTargets.
void Restrict(std::int64_t mask) {
  hwy::SetSupportedTargetsForTest(mask);
  hwy::GetChosenTarget().Update(mask);
}

// The targets steps may use: compiled, supported by this CPU, and not listed in
// FOPT_DISABLE_TARGETS.
std::int64_t DefaultMask() {
  static const std::int64_t kMask = [] {
    const std::int64_t detected = hwy::SupportedTargets() & HWY_TARGETS;
    // A throw leaves the static uninitialized: the next call reads the variable again.
    const std::int64_t allowed = CompanionsOf(detected & ~DisabledTargets());
    return allowed != 0 ? allowed : detected;  // never disable everything
  }();
  return kMask;
}

// Applies the default restriction once, before the first step.
const std::vector<std::string>& Available() {
  static const std::vector<std::string> kNames = [] {
    const std::int64_t mask = DefaultMask();
    Restrict(mask);
    std::vector<std::string> out;
    for (std::int64_t bits = mask; bits != 0; bits &= bits - 1)
      out.emplace_back(hwy::TargetName(bits & -bits));
    return out;
  }();
  return kNames;
}

}  // namespace

Runtime::Runtime(int num_threads) : num_threads_(0) {
  Available();  // apply FOPT_DISABLE_TARGETS before the first step
  set_num_threads(num_threads);
}

void Runtime::set_num_threads(int num_threads) {
  if (num_threads < 0 || num_threads > kMaxThreads) {
    throw Error("Runtime: invalid num_threads: " + std::to_string(num_threads) + " (must be 0.." +
                std::to_string(kMaxThreads) + ")");
  }
  num_threads_ = num_threads == 0 ? omp_get_max_threads() : num_threads;
}

Runtime& DefaultRuntime() {
  static Runtime runtime;
  return runtime;
}

ThreadChoice ChooseThreadsPerRank(int requested, const char* omp_num_threads, int cpus,
                                  int local_ranks) {
  if (cpus < 1 || local_ranks < 1) {
    throw Error("ChooseThreadsPerRank: invalid counts: cpus " + std::to_string(cpus) +
                ", local_ranks " + std::to_string(local_ranks) + " (each must be >= 1)");
  }
  if (requested > 0) return {requested, "requested"};
  if (omp_num_threads != nullptr) {
    // OpenMP's reading: the first number of a list ("4,2" nests); anything else is ignored.
    char* end = nullptr;
    const long n = std::strtol(omp_num_threads, &end, 10);
    if (end != omp_num_threads && n > 0 && n <= kMaxThreads && (*end == '\0' || *end == ',')) {
      return {static_cast<int>(n), "OMP_NUM_THREADS=" + std::string(omp_num_threads)};
    }
  }
  return {std::max(1, cpus / local_ranks), std::to_string(cpus) + " CPU(s) shared by " +
                                               std::to_string(local_ranks) +
                                               " rank(s) on this host"};
}

ThreadChoice ThreadsPerRank(int requested, int local_ranks) {
  return ChooseThreadsPerRank(requested, std::getenv("OMP_NUM_THREADS"), omp_get_num_procs(),
                              local_ranks);
}

std::vector<std::string> AvailableTargets() { return Available(); }

std::string ActiveTargetName() {
  Available();
  const std::int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(targets & -targets);  // the best (lowest-bit) target is the one dispatched
}

std::string TargetDescription(const std::string& name) {
  // Highway numbers its x86 levels; the docs and CPU vendors say AVX-512.
  if (name.starts_with("AVX3")) return name + " (AVX-512)";
  return name;
}

void ForceTarget(const std::string& name) {
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  const std::vector<std::string>& available = Available();
  std::int64_t mask = DefaultMask();
  if (!name.empty()) {
    if (std::find(available.begin(), available.end(), name) == available.end()) {
      std::string known;
      for (const std::string& n : available) known += " " + n;
      throw Error("ForceTarget: target '" + name + "' is not available; available:" + known);
    }
    mask = TargetBit(name);
    if (mask == HWY_AVX3_DL) mask |= HWY_AVX3;  // (CompanionsOf)
  }
  Restrict(mask);
}

}  // namespace fusedopt
