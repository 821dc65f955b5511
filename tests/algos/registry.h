// The test-only algorithms (tests/algos/<algo>.h, each with its math body, kernel file and golden
// vectors here): tests/kernel_test.cc, tests/golden_test.cc and tests/checkpoint_test.cc (through
// the Optimizer that instances.cc instantiates) run them as they run the product's registry
// (src/algos/registry.h). Adding one is its files, its include below and its line in the list, as
// a product algorithm is its files, its include in the registry and its line in hyper.h.
#pragma once

#include "src/algos/registry.h"
#include "tests/algos/sign_descent.h"

namespace fusedopt::test_algos {

// X(Stem): the descriptor test_algos::Stem and its kernel-sweep data test_algos::Stem##Sweep.
#define FOPT_FOR_EACH_TEST_ALGORITHM(X) X(SignDescent)

#define FOPT_TEST_DESCRIPTOR_ENTRY(Stem) , Stem
using All = algos::DropFirst<void FOPT_FOR_EACH_TEST_ALGORITHM(FOPT_TEST_DESCRIPTOR_ENTRY)>::type;
#undef FOPT_TEST_DESCRIPTOR_ENTRY

}  // namespace fusedopt::test_algos

namespace fusedopt::algos {
// A test algorithm's Hyper struct names its descriptor as the registry's do (algos::DescriptorOf),
// so the engine's templates over it (the Optimizer, its checkpoints: instances.cc) serve it.
template <class Hyper>
concept TestHyper = (test_algos::All::IndexOf<Hyper>() < test_algos::All::kSize);
template <TestHyper Hyper>
struct DescriptorFor<Hyper> {
  using type = test_algos::All::Of<Hyper>;
};
}  // namespace fusedopt::algos
