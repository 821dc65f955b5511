// fusedopt_test_algos: the test-only algorithms (tests/algos/registry.h) bound as fusedopt._C binds
// the registry's (src/python/algorithm_bindings.h): each one's Hyper class, step function and
// `algorithms` entry, from which fusedopt._generic.generic_class builds its fused class
// (tests/python/test_test_algorithms.py). Built with the Python module, next to the build tree's
// fusedopt package.

#include <pybind11/pybind11.h>

#include "src/python/algorithm_bindings.h"
#include "tests/algos/registry.h"

PYBIND11_MODULE(fusedopt_test_algos, m) {
  // The step functions take _C's SegmentTable and return its StepReport: its types first.
  pybind11::module_::import("fusedopt._C");
  m.doc() =
      "fusedopt's test-only algorithms (tests/algos), bound as fusedopt._C binds the registry";
  m.attr("algorithms") = fusedopt::BindAlgorithms<fusedopt::test_algos::All>(m);
}
