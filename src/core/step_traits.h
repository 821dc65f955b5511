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

// An algorithm whose states can be 8-bit block-wise codes (Segment::state_dtype kQ8): one whose
// update is element-wise, so that a block of 256 elements can be updated and quantized on its own.
template <class A>
concept QuantizableStates = !TwoPhase<A> && !Factored<A>;

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
