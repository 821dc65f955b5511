// The gtest type list of the Hyper structs of one or more descriptor lists (algos::All, and
// test_algos::All where a test runs the test-only algorithms too), for typed tests over every
// algorithm: TYPED_TEST_SUITE(Suite, test::HyperTypes<algos::All>, ...).
#pragma once

#include <gtest/gtest.h>

#include "src/algos/registry.h"

namespace fusedopt::test {

template <class... Lists>
struct HyperTypesOf;
template <class... A>
struct HyperTypesOf<algos::List<A...>> {
  using type = ::testing::Types<typename A::Hyper...>;
};
template <class... A, class... B, class... Rest>
struct HyperTypesOf<algos::List<A...>, algos::List<B...>, Rest...>
    : HyperTypesOf<algos::List<A..., B...>, Rest...> {};

template <class... Lists>
using HyperTypes = typename HyperTypesOf<Lists...>::type;

}  // namespace fusedopt::test
