// The checks every step function runs first, from its algorithm's descriptor (the hyper-parameter
// rules, the state slots its groups need, a factored algorithm's shapes, per-row sums' rows, the
// scalar states): a rejected call throws before any buffer is touched.
#pragma once

#include <cstddef>
#include <span>

#include "fusedopt/step.h"
#include "src/core/step_traits.h"
#include "src/core/validate.h"

namespace fusedopt {

// A segment of a factored algorithm: its shape (rows and cols both 0, or both set and dividing
// numel), the state slots of that shape (numel > 0). A segment of numel 0 is left as it is (torch's
// reference divides by numel: an empty param raises ZeroDivisionError there; TrainingStep's
// up-front check runs every segment with numel 0).
template <class A>
void ValidateFactored(std::size_t i, const Segment& s) {
  if ((s.rows == 0) != (s.cols == 0)) {
    Fail(A::kStepName, "segment ", i, ": rows ", s.rows, " and cols ", s.cols,
         " (both 0 for a vector, both set for matrices)");
  }
  if (s.rows > 0 && s.numel % (s.rows * s.cols) != 0) {
    Fail(A::kStepName, "segment ", i, ": rows ", s.rows, " × cols ", s.cols,
         " does not divide numel ", s.numel);
  }
  if (s.numel > 0) ValidateStates(A::kStepName, i, s, A::SegmentStates(s), A::kStates);
}

template <class A>
void ValidateStep(std::span<const typename A::Hyper> groups, std::span<const Segment> segments) {
  if (groups.empty() && !segments.empty())
    Fail(A::kStepName, "no groups given for ", segments.size(), " segments");
  for (std::size_t g = 0; g < groups.size(); ++g) A::Validate({A::kStepName, g}, groups[g]);
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    ValidateSegment(A::kStepName, i, s, groups.size());
    if (s.state_dtype == DType::kQ8 && !algos::QuantizableStates<A>) {
      Fail(A::kStepName, "segment ", i, ": 8-bit states (state dtype q8) are not for ", A::kName,
           ": ", algos::WhyStatesStayUnquantized<A>());
    }
    if constexpr (algos::Factored<A>) {
      ValidateFactored<A>(i, s);
    } else if (s.numel > 0) {
      ValidateStates(A::kStepName, i, s, A::RequiredStates(groups[s.group]), A::kStates);
    }
    if constexpr (algos::RowReductions<A>) {
      if (s.rows > 0 && s.numel % s.rows != 0) {
        Fail(A::kStepName, "segment ", i, ": rows ", s.rows, " does not divide numel ", s.numel);
      }
    }
    if constexpr (algos::HasScalarStates<A>) {
      for (std::size_t k = 0; k < A::kScalarStates.size(); ++k) {
        if (s.scalars[k] == nullptr) {
          Fail(A::kStepName, "segment ", i, ": scalars[", k, "] (", A::kScalarStates[k],
               ") is null");
        }
      }
    }
  }
}

}  // namespace fusedopt
