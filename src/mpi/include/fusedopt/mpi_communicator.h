// fusedopt::mpi: the Communicator (include/fusedopt/communicator.h) over MPI's non-blocking
// collectives (the reduce-scatter blocking, measured faster), and an RAII MPI_Init/MPI_Finalize.
// This header does not include <mpi.h> (only mpi_communicator.cc does), so users of the target need
// no MPI include path; an MPI_Comm crosses it by address.
//
// Only the thread that created the session may call into a communicator (MPI_THREAD_FUNNELED). With
// OpenMPI a started collective advances only inside MPI calls: poll Test() between pieces of work
// (shared/docs/distributed.md §6).
#pragma once

#include <cstddef>
#include <memory>

#include "fusedopt/communicator.h"

namespace fusedopt::mpi {

// Initializes MPI (MPI_THREAD_FUNNELED) unless it already is, and finalizes it on destruction if it
// initialized it. Every communicator must be destroyed before the session.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool initialized_here_ = false;
};

// The collectives over a duplicate of an MPI communicator: our traffic can never match the caller's
// messages, and its error handler (MPI_ERRORS_RETURN: a failing MPI call throws fusedopt::Error
// with MPI's message) is ours alone. Constructing and destroying one are collective over the ranks.
class MpiCommunicator final : public Communicator {
 public:
  // comm: the address of an MPI_Comm (a pointer in OpenMPI, an int in MPICH), or null for
  // MPI_COMM_WORLD. Throws fusedopt::Error if MPI is not initialized.
  explicit MpiCommunicator(const void* comm = nullptr);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // The ranks of this communicator on this rank's host (MPI_COMM_TYPE_SHARED), this one included:
  // the processes that share its CPUs (ThreadsPerRank in fusedopt/runtime.h).
  int local_size() const { return local_size_; }

  // MPI counts are ints: an all-reduce or broadcast of more elements than this runs as several
  // calls; a reduce-scatter or all-gather of more per rank throws fusedopt::Error. INT_MAX by
  // default; tests lower it to run the split path on small buffers.
  std::size_t max_count_per_call() const { return max_count_; }
  void set_max_count_per_call(std::size_t count);

 protected:
  std::unique_ptr<CommRequest> DoAllReduce(void* data, std::size_t count, CommType type,
                                           ReduceOp op) override;
  std::unique_ptr<CommRequest> DoReduceScatter(const void* send, void* recv, std::size_t count,
                                               CommType type) override;
  std::unique_ptr<CommRequest> DoAllGather(void* data, std::size_t count, CommType type) override;
  std::unique_ptr<CommRequest> DoBroadcast(void* data, std::size_t count, CommType type,
                                           int root) override;

 private:
  struct Comm;  // holds the MPI_Comm
  std::unique_ptr<Comm> comm_;
  int rank_ = 0;
  int size_ = 1;
  int local_size_ = 1;
  std::size_t max_count_;
};

}  // namespace fusedopt::mpi
