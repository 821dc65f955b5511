// Every algorithm of the engine, one descriptor each (src/algos/descriptor.h says what one holds).
// Adding an optimizer: write its descriptor, math body and kernel file (the build includes every
// descriptor here) and add its line to FUSEDOPT_FOR_EACH_ALGORITHM (include/fusedopt/hyper.h).
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "fopt_generated/descriptors.h"  // every src/algos/<algo>.h (cmake/FoptIncludeList.cmake)
#include "fusedopt/hyper.h"

namespace fusedopt::algos {

template <class... A>
struct List {
  static constexpr std::size_t kSize = sizeof...(A);
  // Calls f(std::type_identity<A>{}) for each descriptor, in order.
  template <class F>
  static void ForEach(F&& f) {
    (f(std::type_identity<A>{}), ...);
  }
  template <class Hyper>
  static constexpr std::size_t IndexOf() {
    constexpr bool kMatch[] = {std::is_same_v<typename A::Hyper, Hyper>...};
    for (std::size_t i = 0; i < sizeof...(A); ++i) {
      if (kMatch[i]) return i;
    }
    return sizeof...(A);
  }
  // The descriptor of a Hyper struct (each belongs to exactly one algorithm).
  template <class Hyper>
  using Of = std::tuple_element_t<IndexOf<Hyper>(), std::tuple<A...>>;
  // One Hyper struct of each descriptor (std::get<SgdHyper>(hypers)).
  using Hypers = std::tuple<typename A::Hyper...>;
  // f(std::type_identity<D>{}) for D, the descriptor at index i (< kSize): a run-time choice of
  // descriptor. Every f(...) returns the same type.
  template <class F>
  static decltype(auto) Visit(std::size_t i, F&& f) {
    using R = std::common_type_t<decltype(f(std::type_identity<A>{}))...>;
    constexpr R (*kCalls[])(F&) = {[](F& g) -> R { return g(std::type_identity<A>{}); }...};
    return kCalls[i](f);
  }
};

// The descriptors in the order of the public list (include/fusedopt/hyper.h), which names each
// algorithm once: the descriptor of X(Stem, Alias) is algos::Stem.
template <class First, class... A>
struct DropFirst {
  using type = List<A...>;
};
#define FOPT_DESCRIPTOR_ENTRY(Stem, Alias) , Stem
using All = DropFirst<void FUSEDOPT_FOR_EACH_ALGORITHM(FOPT_DESCRIPTOR_ENTRY)>::type;
#undef FOPT_DESCRIPTOR_ENTRY

// The same list for explicit template instantiations, which a type list cannot drive: X(Stem) for
// the descriptor algos::Stem (the checkpoint and distributed layers expand it).
#define FOPT_APPLY_STEM(X, Stem, Alias) X(Stem)
#define FOPT_FOR_EACH_ALGORITHM(X) FUSEDOPT_ALGORITHM_LIST_(FOPT_APPLY_STEM, X)
// Each descriptor steps the Hyper struct of its name (algos::Sgd steps SgdHyper).
#define FOPT_CHECK_HYPER(A) \
  static_assert(std::is_same_v<A::Hyper, A##Hyper>, #A "'s Hyper is not " #A "Hyper");
FOPT_FOR_EACH_ALGORITHM(FOPT_CHECK_HYPER)
#undef FOPT_CHECK_HYPER

// The descriptor of a Hyper struct: the registry's, or that of an algorithm outside it which
// specializes DescriptorFor (the test-only ones: tests/algos/registry.h), so that the engine's
// templates (the Optimizer, its checkpoints) serve both unchanged.
template <class Hyper>
struct DescriptorFor {
  using type = All::Of<Hyper>;
};
template <class Hyper>
using DescriptorOf = typename DescriptorFor<Hyper>::type;

}  // namespace fusedopt::algos
