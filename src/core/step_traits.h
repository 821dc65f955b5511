// The kinds of algorithm the engine steps differently, told from what a descriptor declares
// (descriptor.h, in the algorithms' layer, lists the members): the generic step templates of
// src/core branch on these traits, never on an algorithm.
#pragma once

#include <cstddef>

namespace fusedopt::algos {

// A two-phase algorithm: a per-tensor reduction pass before the update (kReductions, kReduce,
// Finish).
template <class A>
concept TwoPhase = requires {
  A::kReductions;
};

// A two-phase algorithm that finishes all segments' coefficients at once (FinishAll).
template <class A>
concept FinishesAll = TwoPhase<A> && requires {
  &A::FinishAll;
};

// A two-phase algorithm whose sums are per channel row (kRowValues; Segment::rows).
template <class A>
concept RowReductions = TwoPhase<A> && requires {
  A::kRowValues;
};

// A factored algorithm (kFactored), stepped over tiles by RunFactoredStep; its descriptor names
// the state slots of a matrix's factors (kRowFactorSlot, kColFactorSlot).
template <class A>
concept Factored = requires {
  A::kFactored;
};

// An element-wise algorithm: each element's update reads nothing but its own values and the
// step's coefficients, so any range of elements can be stepped on its own.
template <class A>
concept ElementWise = !TwoPhase<A> && !Factored<A>;

// An algorithm whose states can be 8-bit block-wise codes (Segment::state_dtype kQ8): one whose
// update pass is element-wise, so that a block of 256 elements can be updated and quantized on its
// own. That includes the two-phase algorithms whose sums are per tensor or across tensors: their
// reduction pass decodes the blocks it reads (ReducePlanChunk) and writes nothing. Not those with
// sums per row of a tensor, which blocks would cut, nor the factored ones.
template <class A>
concept QuantizableStates = !RowReductions<A> && !Factored<A>;

// Why A's states cannot be 8-bit (QuantizableStates false), as error messages say it.
template <class A>
constexpr const char* WhyStatesStayUnquantized() {
  return Factored<A> ? "it keeps factored states"
                     : "its sums are per row of a tensor, which the 8-bit blocks would cut";
}

// Bit i: the 8-bit codes of state slot i use the unsigned map (fusedopt/quantize.h), where the
// descriptor's kUnsignedMapStates says so; the signed map otherwise.
template <class A>
constexpr unsigned UnsignedMapStates() {
  if constexpr (requires { A::kUnsignedMapStates; }) {
    return A::kUnsignedMapStates;
  } else {
    return 0;
  }
}

// An algorithm with per-tensor scalar states (kScalarStates, InitialScalar, NextScalars).
template <class A>
concept HasScalarStates = requires {
  A::kScalarStates;
};

// How many Segment::scalars entries A keeps (0 for most).
template <class A>
constexpr std::size_t NumScalarStates() {
  if constexpr (HasScalarStates<A>) {
    return A::kScalarStates.size();
  } else {
    return 0;
  }
}

}  // namespace fusedopt::algos
