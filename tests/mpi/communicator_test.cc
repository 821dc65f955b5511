// MpiCommunicator (src/mpi) under mpirun: every collective against what each rank computes on its
// own, since rank r's contribution is a known function of (r, i). The values are small multiples of
// 1/8, so sums are exact in any order and results compare bitwise. Also run as a plain process
// (MPI's singleton init, one rank).
//
// Every rank runs every test, in order (collectives must match across ranks): tests never return
// early between collectives. The main (mpi_test_main.cc) makes any rank's failure fail the run.

#include "fusedopt/communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "fusedopt/error.h"
#include "fusedopt/mpi_communicator.h"
#include "fusedopt/runtime.h"

namespace fusedopt::mpi {
namespace {

// Rank r's element i: multiples of 1/8 in [-4, 8], so the rank holding the maximum varies with i.
double Value(int r, std::size_t i) {
  return static_cast<double>((static_cast<std::size_t>(r) * 31 + i * 7) % 97) / 8.0 - 4.0;
}
// Wide unsigned values: a maximum taken through a double would lose their low bits.
std::uint64_t Value64(int r, std::size_t i) {
  return 0xF000000000000000ull ^ (static_cast<std::uint64_t>(r + 1) * 0x9E3779B97F4A7C15ull *
                                  static_cast<std::uint64_t>(i + 1));
}
unsigned char Byte(int r, std::size_t i) {
  return static_cast<unsigned char>(static_cast<std::size_t>(r) * 101 + i * 13 + 1);
}

// A fresh communicator per test (its own bytes_sent), over MPI_COMM_WORLD.
class Mpi : public ::testing::Test {
 protected:
  MpiCommunicator comm;
  const int rank = comm.rank();
  const int size = comm.size();

  template <typename T>
  std::vector<T> Filled(int r, std::size_t n) const {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(Value(r, i));
    return v;
  }
  double Sum(std::size_t i) const {
    double s = 0;
    for (int r = 0; r < size; ++r) s += Value(r, i);
    return s;
  }
};

TEST_F(Mpi, AllReduceSumF32AndF64) {
  const std::size_t n = 1003;
  std::vector<float> f = Filled<float>(rank, n);
  std::vector<double> d = Filled<double>(rank, n);
  comm.AllReduce(f.data(), n, CommType::kF32, ReduceOp::kSum);
  comm.AllReduce(d.data(), n, CommType::kF64, ReduceOp::kSum);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(f[i], static_cast<float>(Sum(i))) << "i " << i;
    EXPECT_EQ(d[i], Sum(i)) << "i " << i;
  }
}

TEST_F(Mpi, AllReduceMaxF64AndU64) {
  const std::size_t n = 517;
  std::vector<double> d = Filled<double>(rank, n);
  std::vector<std::uint64_t> u(n);
  for (std::size_t i = 0; i < n; ++i) u[i] = Value64(rank, i);
  comm.AllReduce(d.data(), n, CommType::kF64, ReduceOp::kMax);
  comm.AllReduce(u.data(), n, CommType::kU64, ReduceOp::kMax);
  for (std::size_t i = 0; i < n; ++i) {
    double max_d = Value(0, i);
    std::uint64_t max_u = Value64(0, i);
    for (int r = 1; r < size; ++r) {
      max_d = std::max(max_d, Value(r, i));
      max_u = std::max(max_u, Value64(r, i));
    }
    EXPECT_EQ(d[i], max_d) << "i " << i;
    EXPECT_EQ(u[i], max_u) << "i " << i;
  }
}

TEST_F(Mpi, ReduceScatterSumsThisRanksBlock) {
  const std::size_t n = 301;  // per rank
  const std::vector<float> send = Filled<float>(rank, n * size);
  std::vector<float> recv(n, -1.0f);
  comm.ReduceScatter(send.data(), recv.data(), n, CommType::kF32);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(recv[i], static_cast<float>(Sum(rank * n + i))) << "i " << i;
  }
  // In place (send == recv): the result lands in the first n elements.
  std::vector<double> buf = Filled<double>(rank, n * size);
  comm.ReduceScatter(buf.data(), buf.data(), n, CommType::kF64);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(buf[i], Sum(rank * n + i)) << "i " << i;
}

TEST_F(Mpi, ReduceScatterRefusesOverlappingBuffers) {
  std::vector<double> buf(4 * size + 4);
  EXPECT_THROW(comm.StartReduceScatter(buf.data(), buf.data() + 1, 4, CommType::kF64), Error);
  double one = 1;  // nothing was started: the next collective matches across ranks
  comm.AllReduce(&one, 1, CommType::kF64, ReduceOp::kSum);
  EXPECT_EQ(one, size);
}

TEST_F(Mpi, AllGatherInPlaceBytesAndF32) {
  const std::size_t n = 37;  // per rank; odd, so blocks start off any alignment
  std::vector<unsigned char> bytes(n * size, 0xAA);
  std::vector<float> f(n * size, -100.0f);
  for (std::size_t i = 0; i < n; ++i) {
    bytes[rank * n + i] = Byte(rank, i);
    f[rank * n + i] = static_cast<float>(Value(rank, i));
  }
  comm.AllGather(bytes.data(), n, CommType::kByte);
  comm.AllGather(f.data(), n, CommType::kF32);
  for (int r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(bytes[r * n + i], Byte(r, i)) << "block " << r << " i " << i;
      EXPECT_EQ(f[r * n + i], static_cast<float>(Value(r, i))) << "block " << r << " i " << i;
    }
  }
}

TEST_F(Mpi, BroadcastFromEveryRoot) {
  const std::size_t n = 129;
  for (int root : {size > 1 ? 1 : 0, 0}) {
    std::vector<double> d(n, -1.0);
    if (rank == root) d = Filled<double>(root, n);
    comm.Broadcast(d.data(), n, CommType::kF64, root);
    EXPECT_EQ(d, Filled<double>(root, n)) << "root " << root;
  }
}

TEST_F(Mpi, NonBlockingCollectivesCompleteUnderTest) {
  const std::size_t n = 4096;
  std::vector<double> d = Filled<double>(rank, n);
  std::vector<float> g(n * size, -100.0f);
  for (std::size_t i = 0; i < n; ++i) g[rank * n + i] = static_cast<float>(Value(rank, i));
  auto reduce = comm.StartAllReduce(d.data(), n, CommType::kF64, ReduceOp::kSum);
  auto gather = comm.StartAllGather(g.data(), n, CommType::kF32);
  // OpenMPI progresses both only inside MPI calls: polling must drive them to completion.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool done = false;
  long polls = 0;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    const bool reduced = reduce->Test();  // both polled every round
    const bool gathered = gather->Test();
    done = reduced && gathered;
    ++polls;
  }
  EXPECT_TRUE(done) << "not complete after " << polls << " polls";
  reduce->Wait();
  gather->Wait();
  EXPECT_TRUE(reduce->Test());
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(d[i], Sum(i)) << "i " << i;
  for (int r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(g[r * n + i], static_cast<float>(Value(r, i))) << "block " << r << " i " << i;
    }
  }
}

TEST_F(Mpi, CountZeroIsCompleteAtOnce) {
  EXPECT_TRUE(comm.StartAllReduce(nullptr, 0, CommType::kF32, ReduceOp::kSum)->Test());
  EXPECT_TRUE(comm.StartReduceScatter(nullptr, nullptr, 0, CommType::kF64)->Test());
  EXPECT_TRUE(comm.StartAllGather(nullptr, 0, CommType::kByte)->Test());
  EXPECT_TRUE(comm.StartBroadcast(nullptr, 0, CommType::kU64, 0)->Test());
  EXPECT_EQ(comm.bytes_sent(), 0u);
}

// Ring volumes (communicator.h): n·b bytes in all, P ranks. n = 6000 divides by P = 1, 2, 3.
TEST_F(Mpi, BytesSentFollowsTheRingFormulas) {
  const std::uint64_t n = 6000;
  const std::uint64_t p = static_cast<std::uint64_t>(size);
  std::vector<float> f(n);
  comm.AllReduce(f.data(), n, CommType::kF32, ReduceOp::kSum);
  EXPECT_EQ(comm.bytes_sent(), 2 * (p - 1) * n * 4 / p);
  comm.reset_bytes_sent();
  std::vector<double> recv(n / p);
  comm.ReduceScatter(std::vector<double>(n).data(), recv.data(), n / p, CommType::kF64);
  EXPECT_EQ(comm.bytes_sent(), (p - 1) * n * 8 / p);
  comm.reset_bytes_sent();
  comm.AllGather(f.data(), n / p, CommType::kF32);
  EXPECT_EQ(comm.bytes_sent(), (p - 1) * n * 4 / p);
  comm.reset_bytes_sent();
  comm.Broadcast(f.data(), n, CommType::kF32, 0);
  EXPECT_EQ(comm.bytes_sent(), (p - 1) * n * 4 / p);
}

TEST_F(Mpi, InvalidRootThrowsAndStartsNothing) {
  double x = rank == 0 ? 42.0 : 0.0;
  EXPECT_THROW(comm.StartBroadcast(&x, 1, CommType::kF64, size), Error);
  EXPECT_THROW(comm.StartBroadcast(&x, 1, CommType::kF64, -1), Error);
  EXPECT_EQ(comm.bytes_sent(), 0u);
  comm.Broadcast(&x, 1, CommType::kF64, 0);
  EXPECT_EQ(x, 42.0);
}

// Counts above one MPI call's limit (INT_MAX, lowered here): all-reduce and broadcast run in
// pieces; reduce-scatter and all-gather refuse before starting anything.
TEST_F(Mpi, CountsAboveTheCallLimit) {
  comm.set_max_count_per_call(7);
  const std::size_t n = 50;  // 7 pieces, the last one short
  std::vector<double> d = Filled<double>(rank, n);
  std::vector<float> b(n, -1.0f);
  if (rank == 0) b = Filled<float>(0, n);
  auto reduce = comm.StartAllReduce(d.data(), n, CommType::kF64, ReduceOp::kSum);
  auto bcast = comm.StartBroadcast(b.data(), n, CommType::kF32, 0);
  reduce->Wait();
  bcast->Wait();
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(d[i], Sum(i)) << "i " << i;
  EXPECT_EQ(b, Filled<float>(0, n));

  std::vector<double> big(std::size_t{8} * size);
  EXPECT_THROW(comm.StartReduceScatter(big.data(), big.data(), 8, CommType::kF64), Error);
  EXPECT_THROW(comm.StartAllGather(big.data(), 8, CommType::kF64), Error);
  EXPECT_THROW(comm.set_max_count_per_call(0), Error);
  comm.ReduceScatter(big.data(), big.data(), 7, CommType::kF64);  // at the limit: one call
}

// mpirun starts every rank of these runs on this host: all of them share its CPUs. The local rank
// counts, all-gathered, agree (a rank counting only itself would start a thread per CPU).
TEST_F(Mpi, LocalSizeCountsTheRanksOnThisHost) {
  EXPECT_EQ(comm.local_size(), comm.size());
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(comm.size()));
  sizes[static_cast<std::size_t>(comm.rank())] = static_cast<std::uint64_t>(comm.local_size());
  comm.AllGather(sizes.data(), 1, CommType::kU64);
  EXPECT_TRUE(std::all_of(sizes.begin(), sizes.end(), [&](std::uint64_t s) {
    return s == static_cast<std::uint64_t>(comm.size());
  }));
}

// The threads each rank steps with: an explicit request, then OMP_NUM_THREADS as OpenMP reads it,
// then the CPUs divided among the host's ranks, never below 1.
TEST(ThreadsPerRank, RequestThenOmpNumThreadsThenTheCpusShared) {
  EXPECT_EQ(ChooseThreadsPerRank(3, "2", 8, 2).threads, 3);
  EXPECT_EQ(ChooseThreadsPerRank(3, "2", 8, 2).reason, "requested");
  EXPECT_EQ(ChooseThreadsPerRank(0, "2", 8, 4).threads, 2);
  EXPECT_EQ(ChooseThreadsPerRank(0, "2", 8, 4).reason, "OMP_NUM_THREADS=2");
  EXPECT_EQ(ChooseThreadsPerRank(0, "4,2", 8, 4).threads, 4);    // the outer level of a nested list
  EXPECT_EQ(ChooseThreadsPerRank(0, nullptr, 2, 2).threads, 1);  // the 2 cores, 2 ranks
  EXPECT_EQ(ChooseThreadsPerRank(0, nullptr, 2, 2).reason,
            "2 CPU(s) shared by 2 rank(s) on this host");
  EXPECT_EQ(ChooseThreadsPerRank(0, nullptr, 16, 3).threads, 5);
  EXPECT_EQ(ChooseThreadsPerRank(0, nullptr, 2, 4).threads, 1);  // more ranks than CPUs
  EXPECT_EQ(ChooseThreadsPerRank(0, nullptr, 8, 1).threads, 8);
  for (const char* ignored : {"", "0", "-2", "two", "2x"}) {  // not a thread count: as if unset
    EXPECT_EQ(ChooseThreadsPerRank(0, ignored, 8, 2).threads, 4) << ignored;
  }
  EXPECT_THROW(ChooseThreadsPerRank(0, nullptr, 0, 2), Error);
  EXPECT_THROW(ChooseThreadsPerRank(0, nullptr, 8, 0), Error);
}

}  // namespace
}  // namespace fusedopt::mpi
