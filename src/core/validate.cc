#include "src/core/validate.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "fusedopt/error.h"

namespace fusedopt {

bool ValidDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

void ValidateSegment(std::string_view fn, std::size_t i, const Segment& s, std::size_t num_groups) {
  if (s.group >= num_groups) {
    Fail(fn, "segment ", i, ": group ", s.group, " out of range (", num_groups, " groups)");
  }
  for (DType t : {s.param_dtype, s.grad_dtype}) {
    if (!ValidDType(t)) Fail(fn, "segment ", i, ": invalid dtype code ", static_cast<int>(t));
  }
  if (!ValidDType(s.state_dtype) && s.state_dtype != DType::kQ8) {
    Fail(fn, "segment ", i, ": invalid state dtype code ", static_cast<int>(s.state_dtype));
  }
  if (s.master != nullptr && s.param_dtype == DType::kF32) {
    Fail(fn, "segment ", i, ": a master copy needs an f16 or bf16 param (param dtype is f32)");
  }
  if (s.step < 1) Fail(fn, "segment ", i, ": invalid step: ", s.step, " (must be >= 1)");
  if (s.rounding_step < 0) {
    Fail(fn, "segment ", i, ": invalid rounding_step: ", s.rounding_step, " (must be >= 0)");
  }
  if (!std::isfinite(s.grad_scale)) {
    Fail(fn, "segment ", i, ": invalid grad_scale: ", s.grad_scale, " (must be finite)");
  }
  if (s.stochastic_rounding &&
      s.global_offset > std::numeric_limits<std::uint64_t>::max() - s.numel) {
    Fail(fn, "segment ", i, ": invalid global_offset: ", s.global_offset,
         " (global_offset + numel = ", s.global_offset, " + ", s.numel, " exceeds 2^64 - 1)");
  }
  if (s.numel == 0) return;
  if (s.param == nullptr) Fail(fn, "segment ", i, ": param is null but numel is ", s.numel);
  if (s.grad == nullptr) Fail(fn, "segment ", i, ": grad is null but numel is ", s.numel);
}

void ValidateStates(std::string_view fn, std::size_t i, const Segment& s, unsigned required,
                    const std::array<const char*, kMaxStates>& names) {
  for (int slot = 0; slot < kMaxStates; ++slot) {
    if ((required >> slot & 1u) == 0) continue;
    if (s.state[slot] == nullptr) {
      Fail(fn, "segment ", i, ": state[", slot, "] (", names[slot], ") is null but numel is ",
           s.numel);
    }
    if (s.state_dtype == DType::kQ8 && s.absmax[slot] == nullptr) {
      Fail(fn, "segment ", i, ": absmax[", slot, "] (", names[slot],
           ") is null but its state is 8-bit (state dtype q8)");
    }
  }
}

}  // namespace fusedopt
