#include "fusedopt/communicator.h"

#include <cstring>
#include <string>

#include "fusedopt/error.h"

namespace fusedopt {

std::size_t CommTypeSize(CommType type) {
  switch (type) {
    case CommType::kF32:
      return 4;
    case CommType::kF64:
    case CommType::kU64:
      return 8;
    case CommType::kByte:
      return 1;
  }
  throw Error("Communicator: invalid CommType " + std::to_string(static_cast<int>(type)));
}

void Communicator::CountRing(std::size_t count, CommType type, double passes) {
  const double p = size();
  bytes_sent_ += static_cast<std::uint64_t>(passes * (p - 1.0) / p *
                                            static_cast<double>(count * CommTypeSize(type)));
}

std::unique_ptr<CommRequest> Communicator::StartAllReduce(void* data, std::size_t count,
                                                          CommType type, ReduceOp op) {
  if (type == CommType::kByte) {
    throw Error("Communicator::AllReduce: CommType kByte cannot be reduced (bytes only move)");
  }
  if (type == CommType::kU64 && op == ReduceOp::kSum) {
    throw Error("Communicator::AllReduce: kU64 takes kMax only");
  }
  std::unique_ptr<CommRequest> request = DoAllReduce(data, count, type, op);
  CountRing(count, type, 2.0);  // once the transport took it
  return request;
}

std::unique_ptr<CommRequest> Communicator::StartReduceScatter(const void* send, void* recv,
                                                              std::size_t count, CommType type) {
  if (type != CommType::kF32 && type != CommType::kF64) {
    throw Error("Communicator::ReduceScatter: sums f32 or f64 only");
  }
  std::unique_ptr<CommRequest> request = DoReduceScatter(send, recv, count, type);
  CountRing(count * static_cast<std::size_t>(size()), type, 1.0);  // once the transport took it
  return request;
}

std::unique_ptr<CommRequest> Communicator::StartAllGather(void* data, std::size_t count,
                                                          CommType type) {
  std::unique_ptr<CommRequest> request = DoAllGather(data, count, type);
  CountRing(count * static_cast<std::size_t>(size()), type, 1.0);  // once the transport took it
  return request;
}

std::unique_ptr<CommRequest> Communicator::StartBroadcast(void* data, std::size_t count,
                                                          CommType type, int root) {
  if (root < 0 || root >= size()) {
    throw Error("Communicator::Broadcast: invalid root " + std::to_string(root) + " (" +
                std::to_string(size()) + " ranks)");
  }
  std::unique_ptr<CommRequest> request = DoBroadcast(data, count, type, root);
  CountRing(count, type, 1.0);  // once the transport took it
  return request;
}

std::unique_ptr<CommRequest> LocalCommunicator::DoAllReduce(void*, std::size_t, CommType,
                                                            ReduceOp) {
  return std::make_unique<CompletedRequest>();
}

std::unique_ptr<CommRequest> LocalCommunicator::DoReduceScatter(const void* send, void* recv,
                                                                std::size_t count, CommType type) {
  if (count > 0 && send != recv) std::memmove(recv, send, count * CommTypeSize(type));
  return std::make_unique<CompletedRequest>();
}

std::unique_ptr<CommRequest> LocalCommunicator::DoAllGather(void*, std::size_t, CommType) {
  return std::make_unique<CompletedRequest>();
}

std::unique_ptr<CommRequest> LocalCommunicator::DoBroadcast(void*, std::size_t, CommType, int) {
  return std::make_unique<CompletedRequest>();
}

}  // namespace fusedopt
