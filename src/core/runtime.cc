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
  static const std::int64_t mask = [] {
    const std::int64_t detected = hwy::SupportedTargets() & HWY_TARGETS;
    std::int64_t disabled = 0;
    if (const char* env = std::getenv("FOPT_DISABLE_TARGETS")) {
      std::stringstream list(env);
      for (std::string name; std::getline(list, name, ',');) disabled |= TargetBit(name);
    }
    const std::int64_t allowed = detected & ~disabled;
    return allowed != 0 ? allowed : detected;  // never disable everything
  }();
  return mask;
}

// Applies the default restriction once, before the first step.
const std::vector<std::string>& Available() {
  static const std::vector<std::string> names = [] {
    const std::int64_t mask = DefaultMask();
    Restrict(mask);
    std::vector<std::string> out;
    for (std::int64_t bits = mask; bits != 0; bits &= bits - 1)
      out.emplace_back(hwy::TargetName(bits & -bits));
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
  std::int64_t mask = DefaultMask();
  if (!name.empty()) {
    if (std::find(available.begin(), available.end(), name) == available.end()) {
      std::string known;
      for (const std::string& n : available) known += " " + n;
      throw Error("ForceTarget: target '" + name + "' is not available; available:" + known);
    }
    mask = TargetBit(name);
  }
  Restrict(mask);
}

}  // namespace fusedopt
