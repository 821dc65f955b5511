// An algorithm of the registry as the tools name it (`fusedopt bench --optimizer`, the doctor, the
// baselines): the index of its descriptor in algos::All (src/algos/registry.h), parsed from and
// printed as the descriptor's kName, and the traits the tools ask about it. No list of algorithms
// is written here: adding a descriptor to the registry adds it to every tool.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "src/algos/registry.h"

namespace fusedopt::tools {

// An algorithm of the registry: the index of its descriptor in algos::All.
enum class Algorithm : std::size_t {};

template <class A>
constexpr Algorithm AlgorithmOf() {
  return Algorithm{algos::All::IndexOf<typename A::Hyper>()};
}

// f(std::type_identity<A>{}) for the descriptor A of `a`.
template <class F>
decltype(auto) WithDescriptor(Algorithm a, F&& f) {
  return algos::All::Visit(static_cast<std::size_t>(a), f);
}

// Parses a descriptor's kName; throws std::invalid_argument naming them all otherwise.
Algorithm ParseAlgorithm(std::string_view name);
std::string_view AlgorithmName(Algorithm a);
// Every kName in the registry's order, comma-separated: for help texts and messages.
std::string AlgorithmNames();

// Whether the fused step of `a` is two-phase (descriptor algos::TwoPhase): a reduction pass that
// reads (ReductionReadsOf) and writes nothing (per-tensor sums) before the update pass. The traffic
// ceiling and the bytes `fusedopt bench` reports include that pass (baselines::ReductionTraffic).
bool HasReductionPass(Algorithm a);
// What that pass reads (descriptor kReductionReads), and whether it reads segment s at all
// (descriptor ReducesSegment: AdamP skips params of at most one dimension).
algos::ReductionReads ReductionReadsOf(Algorithm a);
bool ReducesSegment(Algorithm a, const Segment& s);

// Whether the fused step of `a` is factored (descriptor kFactored: RunFactoredStep, a stats pass, a
// norm pass over the matrices and the update pass, over tiles).
bool IsFactored(Algorithm a);

// Whether the fused step of `a` takes 8-bit states (Segment::state_dtype kQ8; descriptor
// algos::QuantizableStates: an element-wise update pass, sums per tensor at most), and which of
// its state slots then use the unsigned map (bit i: slot i; the descriptor's kUnsignedMapStates).
bool HasQuantizableStates(Algorithm a);
// Why the states of `a` cannot be 8-bit, for an error message (nullptr where they can).
const char* WhyStatesStayUnquantized(Algorithm a);
unsigned UnsignedMapStatesOf(Algorithm a);

// Whether DistributedOptimizer's ZeRO-1 takes `a` (src/core/step_hooks.h, kZeroOneShards).
bool ShardsWithZeroOne(Algorithm a);

}  // namespace fusedopt::tools
