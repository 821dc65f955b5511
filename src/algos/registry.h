// Every algorithm of the engine, one descriptor each (src/algos/descriptor.h says what one holds).
// Adding an optimizer: write its descriptor, math body and kernel file, include the descriptor here
// and add its line to FUSEDOPT_FOR_EACH_ALGORITHM (include/fusedopt/hyper.h).
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "fusedopt/hyper.h"
#include "src/algos/adadelta.h"
#include "src/algos/adafactor.h"
#include "src/algos/adagrad.h"
#include "src/algos/adam.h"
#include "src/algos/adamax.h"
#include "src/algos/adamp.h"
#include "src/algos/asgd.h"
#include "src/algos/bert_adam.h"
#include "src/algos/lamb.h"
#include "src/algos/lars.h"
#include "src/algos/lion.h"
#include "src/algos/nadam.h"
#include "src/algos/radam.h"
#include "src/algos/rmsprop.h"
#include "src/algos/rmsproptf.h"
#include "src/algos/rprop.h"
#include "src/algos/sgd.h"

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
    constexpr bool match[] = {std::is_same_v<typename A::Hyper, Hyper>...};
    for (std::size_t i = 0; i < sizeof...(A); ++i) {
      if (match[i]) return i;
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

template <class Hyper>
using DescriptorOf = All::Of<Hyper>;

}  // namespace fusedopt::algos
