// Argument checks of the public step functions (the hyper-parameter rules are in each algorithm's
// descriptor). They run before any buffer is touched, so a rejected call changes
// nothing; each message names the function, the group or segment, the field and its value.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <sstream>
#include <string_view>

#include "fusedopt/error.h"
#include "fusedopt/step.h"

namespace fusedopt {

// Streams its arguments into a fusedopt::Error, prefixed by the function name: every rejection in
// the core goes through here.
template <class... Args>
[[noreturn]] void Fail(std::string_view fn, const Args&... args) {
  std::ostringstream out;
  out << fn << ": ";
  (out << ... << args);
  throw Error(out.str());
}

// A dtype of params and grads: f32, f16 or bf16 (a raw code from a binding may be anything).
// States may also be kQ8.
bool ValidDType(DType t);

// The checks of one segment that do not depend on its algorithm: group index, dtypes, master copy,
// step, grad_scale, (with stochastic rounding) global_offset, and non-null param and grad when
// numel > 0.
void ValidateSegment(std::string_view fn, std::size_t index, const Segment& s,
                     std::size_t num_groups);

// Every state slot in `required` (bit i: state[i]) is non-null, and so is its absmax where the
// states are 8-bit; names[i] is torch's state key.
void ValidateStates(std::string_view fn, std::size_t index, const Segment& s, unsigned required,
                    const std::array<const char*, kMaxStates>& names);

}  // namespace fusedopt
