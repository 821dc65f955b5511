// The step of one algorithm, generic over its descriptor (the members descriptor.h lists): validate
// everything, compute each segment's coefficients in double, run the reduction pass of a two-phase
// algorithm and finish its coefficients, then run the kernel over all chunks in one parallel
// region. The algorithms' layer instantiates it once per algorithm (steps.cc there).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "src/core/factored_step.h"
#include "src/core/parallel.h"
#include "src/core/plan.h"
#include "src/core/step_hooks.h"
#include "src/core/step_traits.h"
#include "src/core/validate_step.h"

namespace fusedopt {

// Elements per reduction row of a segment: numel (one row), or numel / rows for an algorithm with
// per-row sums and a segment with rows.
template <class A>
std::size_t RowLength(const Segment& s) {
  if constexpr (algos::RowReductions<A>) {
    if (s.rows > 0) return s.numel / s.rows;
  }
  return s.numel;
}

// The rows a piece [begin, end) of a segment covers (at least one element each): its first row and
// how many (1 without per-row sums).
template <class A>
std::pair<std::size_t, std::size_t> PieceRows(const Segment& s, std::size_t begin,
                                              std::size_t end) {
  const std::size_t length = RowLength<A>(s);
  if (length == s.numel) return {0, 1};
  return {begin / length, (end - 1) / length - begin / length + 1};
}

// The reduction pass of a two-phase algorithm: every chunk's piece sums (per row part, for
// per-row sums) in parallel, then each segment's (row's) sums added up in chunk order (so they do
// not depend on the thread count), then the segment's coefficients finished from them; a per-row
// algorithm's Finish also writes its rows' values into `row_values`.
template <algos::TwoPhase A>
void Reduce(std::span<const typename A::Hyper> groups, StepPlan<typename A::Scalars>& plan,
            Runtime& runtime, std::vector<float>& row_values, const SegmentSumsHook* hook,
            const RowShardsHook* row_shards) {
  constexpr std::size_t kSums = A::kReductions;
  const std::size_t num_chunks = plan.chunks.num_chunks();
  const std::span<const Segment> segments = plan.chunks.segments();
  std::vector<std::size_t> first_part(num_chunks + 1, 0);
  for (std::size_t c = 0; c < num_chunks; ++c) {
    std::size_t parts = 0;
    plan.chunks.ForEachPiece(c, c + 1, [&](std::size_t s, std::size_t begin, std::size_t end) {
      parts += PieceRows<A>(segments[s], begin, end).second;
    });
    first_part[c + 1] = first_part[c] + parts;
  }
  std::vector<double> part_sums(first_part.back() * kSums);
  ParallelForChunks(num_chunks, runtime.num_threads(), [&](std::size_t begin, std::size_t end) {
    for (std::size_t c = begin; c < end; ++c)
      A::kReduce(plan, c, &part_sums[first_part[c] * kSums]);
  });
  // Each segment's sums: max(rows, 1) rows of kSums from first_sum[s].
  std::vector<std::size_t> first_sum(segments.size() + 1, 0);
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const std::size_t length = RowLength<A>(segments[s]);
    const std::size_t rows = length == segments[s].numel ? 1 : segments[s].numel / length;
    first_sum[s + 1] = first_sum[s] + kSums * rows;
  }
  std::vector<double> sums(first_sum.back(), 0.0);
  std::size_t part = 0;
  for (std::size_t c = 0; c < num_chunks; ++c) {
    plan.chunks.ForEachPiece(c, c + 1, [&](std::size_t s, std::size_t begin, std::size_t end) {
      const auto [row, rows] = PieceRows<A>(segments[s], begin, end);
      for (std::size_t r = 0; r < rows; ++r, ++part) {
        for (std::size_t j = 0; j < kSums; ++j) {
          sums[first_sum[s] + (row + r) * kSums + j] += part_sums[part * kSums + j];
        }
      }
    });
  }
  if constexpr (kSumsHook<A>) {
    if (hook != nullptr) (*hook)(std::span<double>(sums), kSums);
  }
  if constexpr (algos::FinishesAll<A>) {
    A::FinishAll(groups, segments, std::span<const double>(sums), std::span(plan.scalars));
  } else if constexpr (algos::RowReductions<A>) {
    // A shard cut between rows is finished as its whole tensor, from the hook's sums of every row
    // of it, and reads the values of its own rows, or the whole layer's.
    const auto cut = [&](std::size_t s) -> const RowShard* {
      return row_shards != nullptr && row_shards->shards[s].whole_rows > 0 ? &row_shards->shards[s]
                                                                           : nullptr;
    };
    std::vector<std::size_t> first_value(segments.size() + 1, 0);
    std::vector<std::size_t> offsets(segments.size() + 1, 0);  // the cut segments' own row sums
    std::size_t whole_size = 0;
    for (std::size_t s = 0; s < segments.size(); ++s) {
      const RowShard* shard = cut(s);
      first_value[s + 1] =
          first_value[s] +
          (shard != nullptr ? shard->whole_rows : segments[s].rows) * A::kRowValues;
      offsets[s + 1] = offsets[s] + (shard != nullptr ? segments[s].rows * kSums : 0);
      whole_size += shard != nullptr ? shard->whole_rows * kSums : 0;
    }
    std::vector<double> whole;
    if (whole_size > 0) {
      std::vector<double> mine(offsets.back());
      for (std::size_t s = 0; s < segments.size(); ++s) {
        std::copy_n(sums.data() + first_sum[s], offsets[s + 1] - offsets[s],
                    mine.data() + offsets[s]);
      }
      whole = row_shards->hook(mine, offsets);
      if (whole.size() != whole_size) {
        Fail(A::kStepName, "the row sums hook returned ", whole.size(), " sums for ", whole_size);
      }
    }
    row_values.assign(first_value.back(), 0.0f);
    std::size_t next_whole = 0;
    for (std::size_t s = 0; s < segments.size(); ++s) {
      auto& scalars = plan.scalars[s];
      const std::span<float> values(row_values.data() + first_value[s],
                                    first_value[s + 1] - first_value[s]);
      const RowShard* shard = cut(s);
      if (shard == nullptr) {
        A::Finish(groups[segments[s].group], segments[s],
                  std::span<const double>(&sums[first_sum[s]], first_sum[s + 1] - first_sum[s]),
                  scalars, values);
        continue;
      }
      Segment whole_tensor = segments[s];
      whole_tensor.numel = shard->whole_numel;
      whole_tensor.rows = shard->whole_rows;
      const std::size_t n = shard->whole_rows * kSums;
      A::Finish(groups[segments[s].group], whole_tensor,
                std::span<const double>(&whole[next_whole], n), scalars, values);
      next_whole += n;
      // Projected per row: this shard's rows start at its first row's values.
      if (scalars.project_row_length != 0 && scalars.project_row_length != whole_tensor.numel) {
        scalars.row_values += shard->first_row * A::kRowValues;
      }
    }
  } else {
    for (std::size_t s = 0; s < segments.size(); ++s) {
      A::Finish(groups[segments[s].group], segments[s],
                std::span<const double, kSums>(&sums[first_sum[s]], kSums), plan.scalars[s]);
    }
  }
}

template <class A>
void RunStepChunks(std::span<const typename A::Hyper> groups, std::span<const Segment> segments,
                   Runtime& runtime, const SegmentSumsHook* hook,
                   const RowShardsHook* row_shards = nullptr) {
  ValidateStep<A>(groups, segments);
  StepPlan<typename A::Scalars> plan{ChunkPlan(segments), {}, algos::UnsignedMapStates<A>()};
  plan.scalars.reserve(segments.size());
  constexpr std::size_t kScalars = algos::NumScalarStates<A>();
  // Per segment, the scalar states this step leaves (stored only once the update has run).
  std::vector<float> next(segments.size() * kScalars);
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if constexpr (kScalars > 0) {
      const std::span<float, kScalars> mine(&next[i * kScalars], kScalars);
      A::NextScalars(groups[s.group], s, mine);
      plan.scalars.push_back(
          A::MakeScalars(groups[s.group], s, std::span<const float, kScalars>(mine)));
    } else {
      plan.scalars.push_back(A::MakeScalars(groups[s.group], s));
    }
  }
  std::vector<float> row_values;  // a per-row algorithm's, read by the update pass
  if constexpr (algos::TwoPhase<A>) {
    // An algorithm whose sums some groups do not use skips the pass when none does
    // (NeedsReduction).
    bool reduce = true;
    if constexpr (requires { A::NeedsReduction(groups[0]); }) {
      reduce = std::any_of(groups.begin(), groups.end(),
                           [](const typename A::Hyper& h) { return A::NeedsReduction(h); });
    }
    if (reduce) Reduce<A>(groups, plan, runtime, row_values, hook, row_shards);
  }
  ParallelForChunks(plan.chunks.num_chunks(), runtime.num_threads(),
                    [&](std::size_t begin, std::size_t end) { A::kRun(plan, begin, end); });
  if constexpr (kScalars > 0) {
    for (std::size_t i = 0; i < segments.size(); ++i) {
      for (std::size_t k = 0; k < kScalars; ++k) *segments[i].scalars[k] = next[i * kScalars + k];
    }
  }
}

template <class A>
void RunStep(std::span<const typename A::Hyper> groups, std::span<const Segment> segments,
             Runtime& runtime, const SegmentSumsHook* hook = nullptr) {
  if constexpr (algos::Factored<A>) {
    RunFactoredStep<A>(groups, segments, runtime);
    return;
  } else {
    RunStepChunks<A>(groups, segments, runtime, hook);
  }
}

}  // namespace fusedopt
