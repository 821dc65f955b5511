// fusedopt/checkpoint.h: SaveCheckpoint / LoadCheckpoint of the one-process Optimizer, defined in
// checkpoint_impl.h and instantiated here for every algorithm of the registry.

#include "fusedopt/checkpoint.h"

#include <string>

#include "src/checkpoint/checkpoint_impl.h"

namespace fusedopt {

// Every algorithm: the one-process members (those of sharded runs are checkpoint_distributed.cc's)
// and the one-process entry points.
#define FOPT_INSTANTIATE(Stem, Alias)                                                     \
  template struct OptimizerCheckpoint<Stem##Hyper>;                                       \
  template void SaveCheckpoint(const Optimizer<Stem##Hyper>&, const std::string&,         \
                               const LossScaler*, const CheckpointCounters&);             \
  template CheckpointCounters LoadCheckpoint(Optimizer<Stem##Hyper>&, const std::string&, \
                                             LossScaler*);
FUSEDOPT_FOR_EACH_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

}  // namespace fusedopt
