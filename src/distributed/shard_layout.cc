// ShardLayout (include/fusedopt/distributed.h): the model's flat layout cut into buckets, and each
// bucket into one shard per rank, the same on every rank for the same specs.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fusedopt/distributed.h"
#include "src/core/validate.h"
#include "src/distributed/distributed_common.h"

namespace fusedopt {
namespace {

using distributed::kFn;
using distributed::Mix;

std::size_t RoundUp(std::size_t n, std::size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace

ShardLayout::ShardLayout(std::span<const TensorSpec> tensors, std::size_t num_groups, int ranks_,
                         std::size_t bucket_elements, std::size_t align_, std::size_t tensor_align_)
    : ranks(ranks_), tensor_align(tensor_align_), specs_(tensors.begin(), tensors.end()) {
  if (ranks < 1) Fail(kFn, "invalid world size: ", ranks, " (must be >= 1)");
  if (bucket_elements == 0) Fail(kFn, "invalid bucket size: 0 (must be > 0)");
  if (align_ % 64 != 0) Fail(kFn, "invalid shard_align: ", align_, " (a multiple of 64; 0: auto)");
  if (tensor_align == 0) Fail(kFn, "invalid tensor_align: 0 (must be >= 1)");
  // Group by group, as FlatStorage: the same element indices as a one-process Optimizer.
  offsets.resize(tensors.size());
  for (std::size_t g = 0; g < num_groups; ++g) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].group != g) continue;
      numel = RoundUp(numel, tensor_align);
      offsets[i] = numel;
      numel += tensors[i].numel;
    }
  }
  const auto p = static_cast<std::size_t>(ranks);
  align = align_ != 0 ? align_ : 8 * p * kGrainElements <= numel ? kGrainElements : 256;
  if (align % tensor_align != 0) {
    Fail(kFn, "invalid tensor_align: ", tensor_align, " (must divide the shard alignment, ", align,
         ")");
  }
  const std::size_t full_shard = RoundUp((bucket_elements + p - 1) / p, align);
  while (padded < numel) {
    // The last bucket is only as large as what is left, rounded up per rank.
    const std::size_t left = RoundUp((numel - padded + p - 1) / p, align);
    const Bucket b{.begin = padded, .shard = std::min(full_shard, left), .local = shard_total};
    buckets.push_back(b);
    padded += p * b.shard;
    shard_total += b.shard;
  }
}

std::vector<ShardLayout::Slice> ShardLayout::SlicesIn(std::size_t begin, std::size_t end) const {
  std::vector<Slice> slices;
  for (std::size_t t = 0; t < specs_.size(); ++t) {
    const std::size_t lo = std::max(begin, offsets[t]);
    const std::size_t hi = std::min(end, offsets[t] + specs_[t].numel);
    if (lo < hi) slices.push_back({.tensor = t, .first = lo - offsets[t], .numel = hi - lo});
  }
  std::sort(slices.begin(), slices.end(), [&](const Slice& a, const Slice& b) {
    return offsets[a.tensor] + a.first < offsets[b.tensor] + b.first;
  });
  return slices;
}

std::uint64_t ShardLayout::Hash() const {
  std::uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a's offset basis
  Mix(hash, static_cast<std::uint64_t>(ranks));
  Mix(hash, align);
  Mix(hash, tensor_align);
  Mix(hash, specs_.size());
  for (const TensorSpec& s : specs_) {
    Mix(hash, s.numel);
    Mix(hash, s.group);
    Mix(hash, s.rows);
    Mix(hash, s.cols);
  }
  for (const Bucket& b : buckets) Mix(hash, b.shard);
  return hash;
}

}  // namespace fusedopt
