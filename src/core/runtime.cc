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

// Applies FOPT_DISABLE_TARGETS once, then records what is left: the targets tests and benchmarks
// may force.
const std::vector<std::string>& Available() {
  static const std::vector<std::string> names = [] {
    if (const char* env = std::getenv("FOPT_DISABLE_TARGETS")) {
      std::int64_t disabled = 0;
      std::stringstream list(env);
      for (std::string name; std::getline(list, name, ',');) disabled |= TargetBit(name);
      hwy::DisableTargets(disabled);
    }
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    std::vector<std::string> out;
    for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) out.emplace_back(hwy::TargetName(t));
    return out;
  }();
  return names;
}

}  // namespace

Runtime::Runtime(int num_threads) : num_threads_(0) {
  Available();  // apply FOPT_DISABLE_TARGETS before the first step
  set_num_threads(num_threads);
}

void Runtime::set_num_threads(int num_threads) {
  if (num_threads < 0) throw Error("Runtime: invalid num_threads: " + std::to_string(num_threads));
  num_threads_ = num_threads == 0 ? omp_get_max_threads() : num_threads;
}

Runtime& DefaultRuntime() {
  static Runtime runtime;
  return runtime;
}

std::vector<std::string> AvailableTargets() { return Available(); }

std::string ActiveTargetName() {
  Available();
  const std::int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(targets & -targets);  // the best (lowest-bit) target is the one dispatched
}

void ForceTarget(const std::string& name) {
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  const std::vector<std::string>& available = Available();
  std::int64_t mask = 0;
  if (!name.empty()) {
    if (std::find(available.begin(), available.end(), name) == available.end()) {
      std::string known;
      for (const std::string& n : available) known += " " + n;
      throw Error("ForceTarget: target '" + name + "' is not available; available:" + known);
    }
    mask = TargetBit(name);
  }
  hwy::SetSupportedTargetsForTest(mask);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace fusedopt
