// Helpers shared by the core's gtest files: reproducible random numbers, the small-sizes switch of
// the sanitizer run, and a guard that restores the default SIMD target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fusedopt/runtime.h"

namespace fusedopt::test {

// The asan preset sets FOPT_TEST_SMALL: tests shrink their sizes.
inline bool SmallOnly() { return std::getenv("FOPT_TEST_SMALL") != nullptr; }

// splitmix64: fast, reproducible everywhere, and independent of the library's own hash constants.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t Next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint32_t Next32() { return static_cast<std::uint32_t>(Next() >> 32); }
  double Uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(Next() >> 11) * 0x1.0p-53;
  }

 private:
  std::uint64_t state_;
};

// A value in [-1, 1) from (seed, i), the same in every test and program that computes it
// (tests/python/test_checkpoint_interop.py does in numpy): splitmix64's finalizer of
// (seed << 32) + i, its top 24 bits scaled.
inline float HashedValue(unsigned seed, std::size_t i) {
  std::uint64_t z = (std::uint64_t{seed} << 32) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / double(1 << 23) - 1.0);
}

// The targets whose kernels differ: AvailableTargets() without AVX3_DL, which is compiled only for
// the 8-bit states' codecs (src/cpu/quantize_blocks.cc): forced, every other kernel runs its AVX3
// code, so a test of those kernels would run AVX3 twice. The codecs' tests take every target.
inline std::vector<std::string> KernelTargets() {
  std::vector<std::string> targets = AvailableTargets();
  std::erase(targets, std::string("AVX3_DL"));
  return targets;
}

// Restores the default target choice when a test ends.
struct TargetGuard {
  TargetGuard() = default;
  TargetGuard(const TargetGuard&) = delete;
  TargetGuard& operator=(const TargetGuard&) = delete;
  ~TargetGuard() { ForceTarget(""); }
};

}  // namespace fusedopt::test
