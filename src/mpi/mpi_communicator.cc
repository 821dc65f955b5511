// The MPI transport of Communicator: each collective is one non-blocking MPI call (or a few, when a
// count exceeds what one MPI call takes), and one MpiRequest owns their requests; the
// reduce-scatter is blocking (DoReduceScatter says why).

#include "fusedopt/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "fusedopt/error.h"

namespace fusedopt::mpi {
namespace {

// A failed MPI call (the communicator returns errors instead of aborting: MPI_ERRORS_RETURN) as a
// fusedopt::Error with MPI's own text.
void Check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) length = 0;
  throw Error(std::string("MpiCommunicator: ") + call + " failed: " + std::string(text, length));
}

bool Finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

MPI_Datatype Datatype(CommType type) {
  switch (type) {
    case CommType::kF32:
      return MPI_FLOAT;
    case CommType::kF64:
      return MPI_DOUBLE;
    case CommType::kU64:
      return MPI_UINT64_T;
    case CommType::kByte:
      return MPI_BYTE;
  }
  throw Error("MpiCommunicator: invalid CommType " + std::to_string(static_cast<int>(type)));
}

// The MPI requests of one collective; complete when all of them are.
class MpiRequest final : public CommRequest {
 public:
  // Destroying a request that is not complete waits: MPI still owns the buffers until then. Errors
  // cannot be thrown here, and after MPI_Finalize no MPI call is allowed.
  ~MpiRequest() override {
    if (!Finalized()) MPI_Waitall(Count(), requests_.data(), MPI_STATUSES_IGNORE);
  }
  bool Test() override {
    int done = 0;
    Check(MPI_Testall(Count(), requests_.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    return done != 0;
  }
  void Wait() override {
    Check(MPI_Waitall(Count(), requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }
  // A slot for the next call to fill; null until it does (a failed call leaves nothing to wait
  // for).
  MPI_Request* Add() { return &requests_.emplace_back(MPI_REQUEST_NULL); }

 private:
  int Count() { return static_cast<int>(requests_.size()); }
  std::vector<MPI_Request> requests_;
};

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;  // someone else's MPI (mpi4py, the application): theirs to finalize
  if (Finalized()) throw Error("MpiSession: MPI was already finalized and cannot be restarted");
  // FUNNELED: the core's OpenMP threads never call MPI, only the thread that drives the steps.
  int provided = 0;
  Check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  initialized_here_ = true;
}

MpiSession::~MpiSession() {
  if (initialized_here_) MPI_Finalize();
}

struct MpiCommunicator::Comm {
  explicit Comm(MPI_Comm parent) {
    Check(MPI_Comm_dup(parent, &comm), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  }
  ~Comm() {
    if (!Finalized()) MPI_Comm_free(&comm);
  }
  MPI_Comm comm = MPI_COMM_NULL;
};

namespace {
MPI_Comm ParentComm(const void* comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized || Finalized()) {
    throw Error("MpiCommunicator: MPI is not initialized (create an MpiSession first)");
  }
  return comm == nullptr ? MPI_COMM_WORLD : *static_cast<const MPI_Comm*>(comm);
}
}  // namespace

MpiCommunicator::MpiCommunicator(const void* comm)
    : comm_(std::make_unique<Comm>(ParentComm(comm))), max_count_(INT_MAX) {
  Check(MPI_Comm_rank(comm_->comm, &rank_), "MPI_Comm_rank");
  Check(MPI_Comm_size(comm_->comm, &size_), "MPI_Comm_size");
  MPI_Comm local = MPI_COMM_NULL;
  Check(MPI_Comm_split_type(comm_->comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
        "MPI_Comm_split_type");
  const int rc = MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
  Check(rc, "MPI_Comm_size");
}

MpiCommunicator::~MpiCommunicator() = default;

void MpiCommunicator::set_max_count_per_call(std::size_t count) {
  if (count == 0 || count > INT_MAX) {
    throw Error("MpiCommunicator: invalid max_count_per_call " + std::to_string(count) +
                " (must be in [1, INT_MAX])");
  }
  max_count_ = count;
}

std::unique_ptr<CommRequest> MpiCommunicator::DoAllReduce(void* data, std::size_t count,
                                                          CommType type, ReduceOp op) {
  if (count == 0) return std::make_unique<CompletedRequest>();
  const MPI_Op mpi_op = op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
  const std::size_t elem = CommTypeSize(type);
  auto request = std::make_unique<MpiRequest>();
  // Element-wise, so pieces of at most max_count_ elements reduce exactly as one call would.
  for (std::size_t begin = 0; begin < count; begin += max_count_) {
    const int n = static_cast<int>(std::min(max_count_, count - begin));
    Check(MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(data) + begin * elem, n, Datatype(type),
                         mpi_op, comm_->comm, request->Add()),
          "MPI_Iallreduce");
  }
  return request;
}

std::unique_ptr<CommRequest> MpiCommunicator::DoReduceScatter(const void* send, void* recv,
                                                              std::size_t count, CommType type) {
  if (count == 0) return std::make_unique<CompletedRequest>();
  // The blocks of all ranks are strided by count: pieces would need derived datatypes, which
  // MPI_SUM does not take.
  if (count > max_count_) {
    throw Error("MpiCommunicator::ReduceScatter: count " + std::to_string(count) + " exceeds the " +
                std::to_string(max_count_) + " elements per rank one MPI call takes");
  }
  // MPI forbids aliased buffers. send == recv (as LocalCommunicator allows) is MPI_IN_PLACE: the
  // input is the whole buffer and the result lands in its first count elements.
  const std::size_t bytes = count * CommTypeSize(type);
  const auto s = reinterpret_cast<std::uintptr_t>(send);
  const auto r = reinterpret_cast<std::uintptr_t>(recv);
  if (send != recv && r < s + bytes * static_cast<std::size_t>(size_) && s < r + bytes) {
    throw Error(
        "MpiCommunicator::ReduceScatter: recv overlaps send (pass send == recv to reduce "
        "in place)");
  }
  // Blocking, complete when it returns: OpenMPI 4.1's non-blocking reduce-scatter (libnbc) was
  // 2-3x slower than the blocking one (tuned) for a 17 MB bucket on 2 ranks of one host (24-59
  // against 12-23 ms), more than the overlap it could buy.
  Check(MPI_Reduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                                 Datatype(type), MPI_SUM, comm_->comm),
        "MPI_Reduce_scatter_block");
  return std::make_unique<CompletedRequest>();
}

std::unique_ptr<CommRequest> MpiCommunicator::DoAllGather(void* data, std::size_t count,
                                                          CommType type) {
  if (count == 0) return std::make_unique<CompletedRequest>();
  if (count > max_count_) {  // strided blocks again (see DoReduceScatter)
    throw Error("MpiCommunicator::AllGather: count " + std::to_string(count) + " exceeds the " +
                std::to_string(max_count_) + " elements per rank one MPI call takes");
  }
  auto request = std::make_unique<MpiRequest>();
  // In place: rank r's block is already at data + r·count.
  Check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, static_cast<int>(count),
                       Datatype(type), comm_->comm, request->Add()),
        "MPI_Iallgather");
  return request;
}

std::unique_ptr<CommRequest> MpiCommunicator::DoBroadcast(void* data, std::size_t count,
                                                          CommType type, int root) {
  if (count == 0) return std::make_unique<CompletedRequest>();
  const std::size_t elem = CommTypeSize(type);
  auto request = std::make_unique<MpiRequest>();
  for (std::size_t begin = 0; begin < count; begin += max_count_) {
    const int n = static_cast<int>(std::min(max_count_, count - begin));
    Check(MPI_Ibcast(static_cast<char*>(data) + begin * elem, n, Datatype(type), root, comm_->comm,
                     request->Add()),
          "MPI_Ibcast");
  }
  return request;
}

}  // namespace fusedopt::mpi
