// The collectives a data-parallel step needs, behind an interface, so the core never sees MPI:
// fusedopt::mpi::MpiCommunicator (src/mpi, the only place that includes <mpi.h>) implements it over
// a real transport, LocalCommunicator (one rank) for tests and single-process runs.
//
// Every rank must start the same collectives in the same order with the same counts (as MPI
// demands); a started collective owns its buffers until its request completes. All of them work in
// place, on buffers of `count` elements of a CommType:
//
//   AllReduce      data[i] = op over ranks of data[i]                    (count elements)
//   ReduceScatter  recv[i] = Σ over ranks of send[rank·count + i]        (send: count·size)
//   AllGather      data[r·count + i] = rank r's data[r·count + i]        (data: count·size)
//   Broadcast      data[i] = root's data[i]
//
// Bytes sent per rank are counted with the ring algorithms' volumes (shared/docs/distributed.md
// §3): all-reduce 2(P−1)/P·n·b, reduce-scatter and all-gather (P−1)/P·n·b of the whole n-element
// buffer, broadcast (P−1)/P·n·b; a one-rank communicator sends nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace fusedopt {

// The element types collectives carry. Sums and maxima are taken in the type itself (f16/bf16
// gradients are reduced as f32: MPI has no 16-bit float type); kByte only moves bytes (all-gather,
// broadcast).
enum class CommType : std::uint8_t { kF32, kF64, kU64, kByte };
enum class ReduceOp : std::uint8_t { kSum, kMax };

std::size_t CommTypeSize(CommType type);

// A started collective. Test() polls (and, with MPI, drives its progress: OpenMPI advances a
// non-blocking collective only inside MPI calls); Wait() blocks until it is complete. Destroying a
// request that is not complete waits for it.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual bool Test() = 0;
  virtual void Wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Non-blocking collectives (see the top of this file). Throw fusedopt::Error on invalid
  // arguments (a root out of range, an op a type cannot take) before anything is started.
  std::unique_ptr<CommRequest> StartAllReduce(void* data, std::size_t count, CommType type,
                                              ReduceOp op);
  std::unique_ptr<CommRequest> StartReduceScatter(const void* send, void* recv, std::size_t count,
                                                  CommType type);
  std::unique_ptr<CommRequest> StartAllGather(void* data, std::size_t count, CommType type);
  std::unique_ptr<CommRequest> StartBroadcast(void* data, std::size_t count, CommType type,
                                              int root);

  // The same, blocking.
  void AllReduce(void* data, std::size_t count, CommType type, ReduceOp op) {
    StartAllReduce(data, count, type, op)->Wait();
  }
  void ReduceScatter(const void* send, void* recv, std::size_t count, CommType type) {
    StartReduceScatter(send, recv, count, type)->Wait();
  }
  void AllGather(void* data, std::size_t count, CommType type) {
    StartAllGather(data, count, type)->Wait();
  }
  void Broadcast(void* data, std::size_t count, CommType type, int root) {
    StartBroadcast(data, count, type, root)->Wait();
  }

  // Bytes this rank has sent so far (ring volumes, see above), and since when.
  std::uint64_t bytes_sent() const { return bytes_sent_; }
  void reset_bytes_sent() { bytes_sent_ = 0; }

 protected:
  // The transport. Arguments are validated; counts may be 0.
  virtual std::unique_ptr<CommRequest> DoAllReduce(void* data, std::size_t count, CommType type,
                                                   ReduceOp op) = 0;
  virtual std::unique_ptr<CommRequest> DoReduceScatter(const void* send, void* recv,
                                                       std::size_t count, CommType type) = 0;
  virtual std::unique_ptr<CommRequest> DoAllGather(void* data, std::size_t count,
                                                   CommType type) = 0;
  virtual std::unique_ptr<CommRequest> DoBroadcast(void* data, std::size_t count, CommType type,
                                                   int root) = 0;

 private:
  void CountRing(std::size_t count, CommType type, double passes);
  std::uint64_t bytes_sent_ = 0;
};

// One rank: every collective is complete when it starts (a reduce-scatter copies send to recv).
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }

 protected:
  std::unique_ptr<CommRequest> DoAllReduce(void* data, std::size_t count, CommType type,
                                           ReduceOp op) override;
  std::unique_ptr<CommRequest> DoReduceScatter(const void* send, void* recv, std::size_t count,
                                               CommType type) override;
  std::unique_ptr<CommRequest> DoAllGather(void* data, std::size_t count, CommType type) override;
  std::unique_ptr<CommRequest> DoBroadcast(void* data, std::size_t count, CommType type,
                                           int root) override;
};

// A request that is complete when it is made (LocalCommunicator's, and a transport's for count 0).
class CompletedRequest final : public CommRequest {
 public:
  bool Test() override { return true; }
  void Wait() override {}
};

}  // namespace fusedopt
