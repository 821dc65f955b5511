#include "src/tool_util/algorithm.h"

#include <stdexcept>
#include <string>

#include "src/core/step_hooks.h"
#include "src/core/step_traits.h"

namespace fusedopt::tools {

Algorithm ParseAlgorithm(std::string_view name) {
  std::size_t found = algos::All::kSize;
  std::size_t i = 0;
  algos::All::ForEach([&](auto d) {
    if (name == decltype(d)::type::kName) found = i;
    ++i;
  });
  if (found == algos::All::kSize) {
    throw std::invalid_argument("unknown optimizer '" + std::string(name) +
                                "'; known: " + AlgorithmNames());
  }
  return Algorithm{found};
}

std::string_view AlgorithmName(Algorithm a) {
  return WithDescriptor(a, [](auto d) -> std::string_view { return decltype(d)::type::kName; });
}

std::string AlgorithmNames() {
  std::string names;
  algos::All::ForEach([&](auto d) {
    if (!names.empty()) names += ", ";
    names += decltype(d)::type::kName;
  });
  return names;
}

bool HasReductionPass(Algorithm a) {
  return WithDescriptor(a, [](auto d) { return algos::TwoPhase<typename decltype(d)::type>; });
}

algos::ReductionReads ReductionReadsOf(Algorithm a) {
  return WithDescriptor(a, [](auto d) {
    using A = typename decltype(d)::type;
    if constexpr (requires { A::kReductionReads; }) {
      return A::kReductionReads;
    } else {
      return algos::ReductionReads::kAll;
    }
  });
}

bool ReducesSegment(Algorithm a, const Segment& s) {
  return WithDescriptor(a, [&](auto d) {
    using A = typename decltype(d)::type;
    if constexpr (requires { A::ReducesSegment(s); }) {
      return A::ReducesSegment(s);
    } else {
      return true;
    }
  });
}

bool IsFactored(Algorithm a) {
  return WithDescriptor(a, [](auto d) { return algos::Factored<typename decltype(d)::type>; });
}

bool HasQuantizableStates(Algorithm a) {
  return WithDescriptor(
      a, [](auto d) { return algos::QuantizableStates<typename decltype(d)::type>; });
}

const char* WhyStatesStayUnquantized(Algorithm a) {
  return WithDescriptor(a, [](auto d) -> const char* {
    using A = typename decltype(d)::type;
    if constexpr (algos::QuantizableStates<A>) {
      return nullptr;
    } else {
      return algos::WhyStatesStayUnquantized<A>();
    }
  });
}

unsigned UnsignedMapStatesOf(Algorithm a) {
  return WithDescriptor(
      a, [](auto d) { return algos::UnsignedMapStates<typename decltype(d)::type>(); });
}

bool ShardsWithZeroOne(Algorithm a) {
  return WithDescriptor(a, [](auto d) { return kZeroOneShards<typename decltype(d)::type>; });
}

}  // namespace fusedopt::tools
