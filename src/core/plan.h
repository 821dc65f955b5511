// How one step's work is cut up: the segments' element ranges are concatenated into one index
// space, cut into kGrainElements chunks, and each chunk is walked as pieces of the segments it
// overlaps. Chunk edges depend only on the sizes, never on the thread count, so every element is
// computed the same way on any number of threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "fusedopt/runtime.h"
#include "fusedopt/step.h"

namespace fusedopt {

class ChunkPlan {
 public:
  explicit ChunkPlan(std::span<const Segment> segments) : segments_(segments) {
    starts_.reserve(segments.size() + 1);
    std::size_t total = 0;
    for (const Segment& s : segments) {
      starts_.push_back(total);
      total += s.numel;
    }
    starts_.push_back(total);
  }

  std::span<const Segment> segments() const { return segments_; }
  std::size_t total() const { return starts_.back(); }
  std::size_t num_chunks() const { return (total() + kGrainElements - 1) / kGrainElements; }

  // Calls piece(segment_index, begin, end) for each non-empty part of chunks [chunk_begin,
  // chunk_end), with begin/end local to the segment.
  template <class Piece>
  void ForEachPiece(std::size_t chunk_begin, std::size_t chunk_end, const Piece& piece) const {
    const std::size_t lo = chunk_begin * kGrainElements;
    const std::size_t hi = std::min(chunk_end * kGrainElements, total());
    if (lo >= hi) return;
    // Last segment starting at or before lo (empty segments share a start; skip them below).
    std::size_t s =
        static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end() - 1, lo) -
                                 starts_.begin()) -
        1;
    for (; s < segments_.size() && starts_[s] < hi; ++s) {
      const std::size_t seg_lo = std::max(lo, starts_[s]);
      const std::size_t seg_hi = std::min(hi, starts_[s + 1]);
      if (seg_lo < seg_hi) piece(s, seg_lo - starts_[s], seg_hi - starts_[s]);
    }
  }

 private:
  std::span<const Segment> segments_;
  std::vector<std::size_t> starts_;  // starts_[i] = first global index of segment i; back() = total
};

// Everything a kernel needs for one step: the chunking and each segment's coefficients.
template <class Scalars>
struct StepPlan {
  ChunkPlan chunks;
  std::vector<Scalars> scalars;  // one per segment
  // Bit i: 8-bit codes of state slot i use the unsigned map (the descriptor's kUnsignedMapStates).
  unsigned unsigned_map_states = 0;
};

}  // namespace fusedopt
