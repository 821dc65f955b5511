// The engine's templates that the library instantiates for the registry's algorithms only,
// instantiated here for every test algorithm (tests/algos/registry.h's list): the Optimizer, its
// TrainingStep, and its checkpoint save and load. With these the generic Optimizer and checkpoint
// tests run a test algorithm as they run the registry's.

#include <string>

#include "fusedopt/checkpoint.h"
#include "fusedopt/optimizer.h"
#include "src/checkpoint/checkpoint_impl.h"
#include "src/optimizer/optimizer_impl.h"
#include "tests/algos/registry.h"

namespace fusedopt {

#define FOPT_INSTANTIATE(Stem)                                                                   \
  template StepResult TrainingStep(std::span<const test_algos::Stem::Hyper>, std::span<Segment>, \
                                   const TrainingStepOptions&, Runtime&);                        \
  template class Optimizer<test_algos::Stem::Hyper>;                                             \
  template struct OptimizerCheckpoint<test_algos::Stem::Hyper>;                                  \
  template void SaveCheckpoint(const Optimizer<test_algos::Stem::Hyper>&, const std::string&,    \
                               const LossScaler*, const CheckpointCounters&);                    \
  template CheckpointCounters LoadCheckpoint(Optimizer<test_algos::Stem::Hyper>&,                \
                                             const std::string&, LossScaler*);
FOPT_FOR_EACH_TEST_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

}  // namespace fusedopt
