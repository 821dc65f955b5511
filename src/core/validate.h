// Argument checks of the public step functions. They run before any buffer is touched, so a
// rejected call changes nothing; each message names the function, the group or segment, the field
// and its value.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <sstream>
#include <string_view>

#include "fusedopt/error.h"
#include "fusedopt/hyper.h"
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

// One of the DType enumerators (a raw code from a binding may be anything).
bool ValidDType(DType t);

void ValidateHyper(std::string_view fn, std::size_t group, const SgdHyper& h);
void ValidateHyper(std::string_view fn, std::size_t group, const AdamHyper& h);
void ValidateHyper(std::string_view fn, std::size_t group, const RmspropHyper& h);
void ValidateHyper(std::string_view fn, std::size_t group, const AdagradHyper& h);

// Checks every group, then every segment: group index, pointers for numel > 0, the state slots its
// group's RequiredStates() asks for, dtypes, master copy, step, grad_scale and (with stochastic
// rounding) global_offset. torch's state_dict key of each Segment::state slot, for messages.
using StateNames = std::array<const char*, kMaxStates>;

template <class Hyper>
void ValidateStep(std::string_view fn, std::span<const Hyper> groups,
                  std::span<const Segment> segments, const StateNames& state_names);

}  // namespace fusedopt
