// Test-only oracle, one file per algorithm beside this one (tests/reference/<algo>.h): each
// reference's update rule (torch.optim's single-tensor step, shared/docs/torch-semantics.md §3; the
// others from shared/docs/algorithms-more.md: each file names its source) as plain per-element
// loops in double.
// It shares no code with src/math: it is written from the torch docs and code, so a kernel and the
// oracle agreeing means something. Hyper-parameters are used exactly as given (no rounding of
// scalars to f32), so the same functions reproduce torch's float64 path.
//
// Each function performs one step of one tensor in place. `step` is that tensor's step counter
// after the increment, as torch's state['step'] (1 on its first update). State spans a rule does
// not use under the given hyper-parameters may be empty.
//
// Each algorithm's file also holds the cases the generic C++ tests run for it (the kernel sweep,
// the standard step, the scalar math, validation, the Optimizer and the libtorch adapter), so that
// an algorithm's test data lives in one file: those tests name no algorithm.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"

namespace fusedopt::ref {

// torch.maximum: NaN if either input is NaN.
inline double MaximumPropagatingNaN(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return a < b ? b : a;
}

// The cases the generic kernel sweep, standard step and scalar math tests run for the algorithm of
// a Hyper struct: each algorithm's file specializes it (tests/kernel_test.cc, standard_test.cc and
// math_scalar_test.cc say what each of them takes).
template <class Hyper>
struct KernelCases;

// What the libtorch adapter's generic test runs for an algorithm with a generic class (its members:
// tests/torch/generic_test.cc).
template <class Hyper>
struct TorchCase;

// The oracle's state buffers of one tensor, by slot (Segment::state); unused slots empty.
using StateSpans = std::array<std::span<double>, kMaxStates>;

// A param/grad/state dtype combination, with or without an f32 master copy of a 16-bit param.
struct Combo {
  DType param;
  DType grad;
  DType state;
  bool master = false;
};

// One run of DeterminismAcrossTargets (tests/kernel_test.cc): each set of groups on each combo,
// bit for bit equal on the targets of one class (FMA or not), or on every target.
template <class Hyper>
struct AcrossTargets {
  std::vector<std::vector<Hyper>> group_sets;
  std::vector<Combo> combos = {{DType::kF32, DType::kF32, DType::kF32},
                               {DType::kBF16, DType::kBF16, DType::kBF16},
                               {DType::kF16, DType::kF16, DType::kF32, true}};
  bool all_targets_agree = false;
};

// A fixed sign for element index i, mixed by a hash so that SIMD lanes and tails see both: inputs
// that must not change sign from step to step keep it.
inline int ElementSign(std::size_t i) {
  return ((static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull) >> 40 & 1u) != 0 ? -1 : 1;
}

}  // namespace fusedopt::ref
