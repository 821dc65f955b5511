// Every algorithm of the engine, one descriptor each (src/algos/descriptor.h says what one holds).
// Adding an optimizer: write its descriptor, math body and kernel file, and list it here.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

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

using All = List<Sgd, Adam, AdamW, Rmsprop, Adagrad, Lion, Lamb, Adamax, Adadelta, Radam, Nadam,
                 Asgd, Lars, Rprop, Rmsproptf, Adamp, BertAdam, Adafactor>;

// The same list for explicit template instantiations (X(Sgd) X(Adam) ...), which a type list cannot
// drive: step.cc and training_step.cc expand it.
#define FOPT_FOR_EACH_ALGORITHM(X) \
  X(Sgd)                           \
  X(Adam)                          \
  X(AdamW)                         \
  X(Rmsprop)                       \
  X(Adagrad)                       \
  X(Lion)                          \
  X(Lamb)                          \
  X(Adamax)                        \
  X(Adadelta)                      \
  X(Radam)                         \
  X(Nadam)                         \
  X(Asgd)                          \
  X(Lars)                          \
  X(Rprop)                         \
  X(Rmsproptf)                     \
  X(Adamp)                         \
  X(BertAdam)                      \
  X(Adafactor)
#define FOPT_CHECK_LISTED(A) \
  static_assert(All::IndexOf<A::Hyper>() < All::kSize, #A " is not in All");
FOPT_FOR_EACH_ALGORITHM(FOPT_CHECK_LISTED)
#undef FOPT_CHECK_LISTED
#define FOPT_COUNT(A) +1
static_assert(0 FOPT_FOR_EACH_ALGORITHM(FOPT_COUNT) == All::kSize, "All lists an algorithm more");
#undef FOPT_COUNT

template <class Hyper>
using DescriptorOf = All::Of<Hyper>;

}  // namespace fusedopt::algos
