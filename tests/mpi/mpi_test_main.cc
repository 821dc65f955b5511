// The main of the MPI gtest binaries (tests/mpi): MPI around gtest, for runs under mpirun and plain
// ones (OpenMPI's singleton init: one rank). Every rank runs every test; only rank 0 prints gtest's
// report, the other ranks their failures, and any rank's failure makes every rank exit non-zero, so
// mpirun fails whichever rank it reports.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "fusedopt/communicator.h"
#include "fusedopt/mpi_communicator.h"

namespace fusedopt::mpi {
namespace {

// Prints a non-zero rank's failures (its gtest report is silenced), naming the rank and test. The
// name is kept from OnTestStart: UnitTest::current_test_info() would deadlock in OnTestPartResult,
// which gtest calls holding the lock that current_test_info() takes.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::printf("[rank %d] %s: %s:%d: Failure\n%s\n", rank_, test_.c_str(),
                result.file_name() ? result.file_name() : "", result.line_number(),
                result.message());
    std::fflush(stdout);
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace
}  // namespace fusedopt::mpi

int main(int argc, char** argv) {
  fusedopt::mpi::MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  fusedopt::mpi::MpiCommunicator world;
  if (world.rank() != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new fusedopt::mpi::FailurePrinter(world.rank()));
  }
  // Any rank's failure fails every rank, so the exit status does not depend on which rank
  // mpirun reports.
  const bool failed_here = RUN_ALL_TESTS() != 0;
  std::uint64_t failed = failed_here ? 1 : 0;
  world.AllReduce(&failed, 1, fusedopt::CommType::kU64, fusedopt::ReduceOp::kMax);
  if (failed != 0 && !failed_here && world.rank() == 0) {
    std::printf("[rank 0] FAILED on another rank (see the lines starting with [rank N])\n");
  }
  return failed != 0 ? 1 : 0;
}
