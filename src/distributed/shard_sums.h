// The whole-tensor sums of a ZeRO-1 step (LAMB's and LARS's norms, src/core/step_hooks.h), written
// once for DistributedOptimizer and for Python's fusedopt.distributed (bound in _C): each rank
// packs its pieces' sums by (bucket, tensor), the caller gathers every rank's pack over its own
// transport (a Communicator, torch.distributed), and each tensor's totals are added in the order of
// the flat range (bucket by bucket, rank by rank, one f64 addition at a time): with shards of whole
// chunks, the one-process sums bit for bit (0 + x is x, and a slice's sum is the fold of its
// chunks).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "fusedopt/distributed.h"

namespace fusedopt::distributed {

// A tensor's piece in one rank's shard of one bucket: a segment of that rank's step.
struct ShardPiece {
  std::size_t tensor = 0;
  std::size_t bucket = 0;
  friend bool operator==(const ShardPiece&, const ShardPiece&) = default;
};

// The pieces of `rank`'s shards of `layout`, bucket by bucket, in flat order: the segments of its
// ZeRO-1 step (DistributedOptimizer::SegmentsIn over each shard).
std::vector<ShardPiece> ShardPieces(const ShardLayout& layout, int rank);

// Where one rank's pieces put their sums: a [buckets][tensors][k] f64 array per rank, gathered
// rank by rank into [world][buckets][tensors][k].
class ShardSums {
 public:
  // pieces: in the order of the sums (segment order); each tensor < tensors, bucket < buckets.
  // Throws fusedopt::Error otherwise.
  ShardSums(std::vector<ShardPiece> pieces, std::size_t buckets, std::size_t tensors,
            std::size_t k);

  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  std::size_t k() const { return k_; }
  // f64 values one rank contributes: buckets · tensors · k.
  std::size_t per_rank() const { return buckets_ * tensors_ * k_; }

  // This rank's pack: each piece's k sums (`sums`, piece order) at its (bucket, tensor) of
  // `partial` (per_rank() values), zeros elsewhere.
  void Pack(std::span<const double> sums, std::span<double> partial) const;
  // Every rank's pack (`gathered`: world · per_rank(), rank by rank) added per tensor in the order
  // of the flat range, and each piece's tensor totals written to `sums` (piece order, k each).
  void Add(std::size_t world, std::span<const double> gathered, std::span<double> sums) const;

 private:
  std::vector<ShardPiece> pieces_;
  std::size_t buckets_, tensors_, k_;
};

}  // namespace fusedopt::distributed
