// ShardSums (src/distributed/shard_sums.h): the packing, the order of the additions and the
// unpacking of the whole-tensor sums across ZeRO-1 shards.
#include "src/distributed/shard_sums.h"

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "src/core/validate.h"
#include "src/distributed/distributed_common.h"

namespace fusedopt::distributed {

std::vector<ShardPiece> ShardPieces(const ShardLayout& layout, int rank) {
  if (rank < 0 || rank >= layout.ranks) {
    Fail(kFn, "invalid rank: ", rank, " (the layout has ", layout.ranks, ")");
  }
  std::vector<ShardPiece> pieces;
  for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
    const ShardLayout::Bucket& bucket = layout.buckets[b];
    const std::size_t begin = bucket.begin + static_cast<std::size_t>(rank) * bucket.shard;
    for (const ShardLayout::Slice& slice : layout.SlicesIn(begin, begin + bucket.shard)) {
      pieces.push_back({.tensor = slice.tensor, .bucket = b});
    }
  }
  return pieces;
}

ShardSums::ShardSums(std::vector<ShardPiece> pieces, std::size_t buckets, std::size_t tensors,
                     std::size_t k)
    : pieces_(std::move(pieces)), buckets_(buckets), tensors_(tensors), k_(k) {
  for (const ShardPiece& p : pieces_) {
    if (p.tensor >= tensors || p.bucket >= buckets) {
      Fail(kFn, "shard sums: a piece of tensor ", p.tensor, " in bucket ", p.bucket, " (of ",
           tensors, " tensors, ", buckets, " buckets)");
    }
  }
}

void ShardSums::Pack(std::span<const double> sums, std::span<double> partial) const {
  if (sums.size() != pieces_.size() * k_ || partial.size() != per_rank()) {
    Fail(kFn, "shard sums: ", sums.size(), " sums for ", pieces_.size(), " pieces of ", k_,
         ", into ", partial.size(), " values for ", per_rank());
  }
  std::fill(partial.begin(), partial.end(), 0.0);
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    const std::size_t at = (pieces_[i].bucket * tensors_ + pieces_[i].tensor) * k_;
    std::copy_n(sums.begin() + static_cast<std::ptrdiff_t>(i * k_), k_,
                partial.begin() + static_cast<std::ptrdiff_t>(at));
  }
}

void ShardSums::Add(std::size_t world, std::span<const double> gathered,
                    std::span<double> sums) const {
  const std::size_t per_rank = this->per_rank();
  if (gathered.size() != world * per_rank || sums.size() != pieces_.size() * k_) {
    Fail(kFn, "shard sums: ", gathered.size(), " gathered values for ", world, " ranks of ",
         per_rank, ", ", sums.size(), " sums for ", pieces_.size(), " pieces of ", k_);
  }
  // One f64 addition at a time, bucket by bucket and rank by rank: the flat range's order.
  std::vector<double> totals(tensors_ * k_, 0.0);
  for (std::size_t b = 0; b < buckets_; ++b) {
    for (std::size_t r = 0; r < world; ++r) {
      const double* pack = gathered.data() + r * per_rank + b * tensors_ * k_;
      for (std::size_t i = 0; i < tensors_ * k_; ++i) totals[i] += pack[i];
    }
  }
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    std::copy_n(totals.begin() + static_cast<std::ptrdiff_t>(pieces_[i].tensor * k_), k_,
                sums.begin() + static_cast<std::ptrdiff_t>(i * k_));
  }
}

}  // namespace fusedopt::distributed
