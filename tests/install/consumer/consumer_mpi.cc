// Uses the installed MPI communicator: a one-process MPI run (a singleton, no launcher) whose
// data-parallel step equals the one-process Optimizer's, as on any world size of one.
#include <cstdio>

#include "fusedopt/distributed.h"
#include "fusedopt/mpi_communicator.h"
#include "fusedopt/optimizer.h"

int main(int argc, char** argv) {
  fusedopt::mpi::MpiSession session(&argc, &argv);
  fusedopt::mpi::MpiCommunicator comm;
  const fusedopt::SgdHyper hyper{.lr = 0.1, .momentum = 0.9};
  fusedopt::DistributedOptimizer<fusedopt::SgdHyper> dist({hyper}, {{.numel = 3}}, {}, comm);
  fusedopt::SGD one({hyper}, {{.numel = 3}});
  for (int i = 0; i < 3; ++i)
    dist.params<float>(0)[i] = one.storage().params<float>(0)[i] = 1.0f + i;
  for (int step = 0; step < 2; ++step) {
    for (int i = 0; i < 3; ++i) dist.grads(0)[i] = one.storage().grads<float>(0)[i] = 0.5f - i;
    dist.Step();
    one.Step();
  }
  for (int i = 0; i < 3; ++i) {
    if (dist.params<float>(0)[i] != one.storage().params<float>(0)[i]) {
      std::printf("param %d: %.9g, one process %.9g\n", i, dist.params<float>(0)[i],
                  one.storage().params<float>(0)[i]);
      return 1;
    }
  }
  std::printf("consumer_mpi: fusedopt::mpi on %d rank matches the one-process step\n", comm.size());
  return 0;
}
