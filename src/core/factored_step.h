// The step of a factored algorithm (state buffers not shaped like the param: a matrix keeps one
// factor per row and one per column, src/core/tiles.h cuts it into tiles), generic over the
// descriptor; the host-side pieces that do not depend on it are in factored_step.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "src/core/parallel.h"
#include "src/core/step_hooks.h"
#include "src/core/step_traits.h"
#include "src/core/tiles.h"
#include "src/core/validate_step.h"

namespace fusedopt {
namespace factored {

// Reads a state buffer of dtype t as f32 (into out).
void LoadFactor(const void* state, DType t, std::span<float> out);
// Writes a factor buffer (state[slot] of segment s) back, rounded as the kernels round.
void StoreFactor(std::span<const float> in, const Segment& s, int slot);
// The tiles of one segment, small matrices grouped (factored_step.cc says how).
void AppendFactoredTiles(std::uint32_t segment, std::size_t numel, std::size_t rows,
                         std::size_t cols, std::vector<Tile>& tiles);
// A param of 1×1 matrices, whose factors are element-wise.
bool Pointwise(const Segment& s);
// How many matrices a tile of a segment with `rows` rows per matrix touches (1 unless grouped).
std::size_t TileMatrices(const Tile& t, std::size_t rows);

}  // namespace factored

// The step of a factored algorithm, over tiles: (1) the stats pass (Σp²; a matrix's
// per-row and per-column Σg²; a vector's ΣU²), each segment's sums added tile by tile in order;
// (2) on the host, per segment, alpha and a matrix's new factors (from the old ones in its state
// buffers, into scratch); (3) the norm pass, ΣU² of each matrix from the new factors; (4) the
// clipping coefficient; (5) the update pass; (6) the new factors into the state buffers (rounded
// stochastically where the segment asks, as the kernels' stores in (5)). Every sum
// is in double in an order fixed by the shapes, so the step is bit-identical on any thread count
// and SIMD target; nothing is written before (5), so a rejected call changes nothing.
//
// With `shards` (one per segment) and `hook` (FactoredStepOverShards, step_hooks.h), a sharded
// segment's sums are completed over the ranks before they are used, after (1), after the row
// factors' sums of (2) and after (3), and the whole tensor's numel and rows take its shard's.
template <algos::Factored A>
void RunFactoredStep(std::span<const typename A::Hyper> groups, std::span<const Segment> segments,
                     Runtime& runtime, std::span<const FactoredShard> shards = {},
                     const ShardSumsHook* hook = nullptr) {
  ValidateStep<A>(groups, segments);
  const auto sharded = [&](std::size_t i) { return i < shards.size() && shards[i].whole_numel; };
  const auto row_cut = [&](std::size_t i) { return sharded(i) && shards[i].whole_rows > 0; };
  if (!shards.empty() && shards.size() != segments.size()) {
    Fail(A::kStepName, shards.size(), " shards for ", segments.size(), " segments");
  }
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (row_cut(i) && (shards[i].cols < 2 || (s.rows > 0 && s.cols != shards[i].cols) ||
                       s.state[A::kColFactorSlot] == nullptr)) {
      Fail(A::kStepName, "segment ", i, ": a shard of a matrix of ", shards[i].cols,
           " columns (at least 2, those of the segment's rows) needs its column factors");
    }
  }
  TilePlan<typename A::Scalars> plan{segments, {}, {}};
  plan.scalars.reserve(segments.size());
  std::vector<std::size_t> first_tile(segments.size() + 1, 0);
  // Per segment: whether it is a matrix (factors; a row-cut one even with none of its rows here),
  // its batch of matrices, its columns, its factors' offset in `factors` (batch·rows, then
  // batch·cols) and its row means' in `means` (batch).
  std::vector<bool> matrix(segments.size());
  std::vector<std::size_t> batches(segments.size()), cols(segments.size());
  std::vector<std::size_t> first_factor(segments.size() + 1, 0);
  std::vector<std::size_t> first_mean(segments.size() + 1, 0);
  std::vector<float> clamps(segments.size());  // a Pointwise segment's row_mean: f32(eps1)
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    plan.scalars.push_back(A::MakeScalars(groups[s.group], s));
    if (factored::Pointwise(s)) {  // read by every pass
      clamps[i] = static_cast<float>(groups[s.group].eps1);
      plan.scalars.back().row_mean = &clamps[i];
    }
    factored::AppendFactoredTiles(static_cast<std::uint32_t>(i), s.numel, s.rows, s.cols,
                                  plan.tiles);
    first_tile[i + 1] = plan.tiles.size();
    matrix[i] = (s.rows > 0 && !factored::Pointwise(s)) || row_cut(i);
    batches[i] = row_cut(i) ? 1 : matrix[i] ? s.numel / (s.rows * s.cols) : 0;
    cols[i] = row_cut(i) ? shards[i].cols : s.cols;
    first_factor[i + 1] = first_factor[i] + batches[i] * (s.rows + cols[i]);
    first_mean[i + 1] = first_mean[i] + batches[i];
  }
  // The whole tensor's numel and rows (its shard's own where it is whole).
  const auto whole_numel = [&](std::size_t i) {
    return sharded(i) ? shards[i].whole_numel : segments[i].numel;
  };
  const auto whole_rows = [&](std::size_t i) {
    return row_cut(i) ? shards[i].whole_rows : segments[i].rows;
  };
  // hook(values) for the sharded segments' `count(i)` values at `at(i)`, when some segment has any.
  const auto complete = [&](const auto& count, const auto& at) {
    if (hook == nullptr) return;
    std::vector<std::size_t> offsets(segments.size() + 1, 0);
    for (std::size_t i = 0; i < segments.size(); ++i) {
      offsets[i + 1] = offsets[i] + (sharded(i) ? count(i) : 0);
    }
    if (offsets.back() == 0) return;
    std::vector<double> sums(offsets.back());
    for (std::size_t i = 0; i < segments.size(); ++i) {
      for (std::size_t k = offsets[i]; k < offsets[i + 1]; ++k) sums[k] = *at(i, k - offsets[i]);
    }
    (*hook)(sums, offsets);
    for (std::size_t i = 0; i < segments.size(); ++i) {
      for (std::size_t k = offsets[i]; k < offsets[i + 1]; ++k) *at(i, k - offsets[i]) = sums[k];
    }
  };
  // Each tile's stats: Σp², then a matrix tile's row sums and the column sums of each matrix it
  // touches, or a vector tile's ΣU².
  std::size_t stats_size = 0;
  for (Tile& t : plan.tiles) {
    t.out = stats_size;
    const std::size_t rows =
        factored::Pointwise(segments[t.segment]) ? 0 : segments[t.segment].rows;
    stats_size += rows > 0 ? 1 + (t.row_end - t.row_begin) +
                                 factored::TileMatrices(t, rows) * (t.col_end - t.col_begin)
                           : 2;
  }
  const std::size_t num_tiles = plan.tiles.size();
  const auto run = [&](TilePass pass, double* sums) {
    ParallelForChunks(num_tiles, runtime.num_threads(), [&](std::size_t begin, std::size_t end) {
      A::kRunTiles(plan, pass, begin, end, sums);
    });
  };
  std::vector<double> stats(stats_size);
  run(TilePass::kStats, stats.data());

  // Each segment's Σp², a matrix's row and column sums of g², a vector's ΣU².
  std::vector<double> param_sq(segments.size(), 0.0), update_sq(segments.size(), 0.0);
  std::vector<std::vector<double>> row_sums(segments.size()), col_sums(segments.size());
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    for (std::size_t k = first_tile[i]; k < first_tile[i + 1]; ++k) {
      param_sq[i] += stats[plan.tiles[k].out];
    }
    if (!matrix[i]) {
      for (std::size_t k = first_tile[i]; k < first_tile[i + 1]; ++k) {
        update_sq[i] += stats[plan.tiles[k].out + 1];
      }
      continue;
    }
    row_sums[i].assign(batches[i] * s.rows, 0.0);
    col_sums[i].assign(batches[i] * cols[i], 0.0);
    for (std::size_t k = first_tile[i]; k < first_tile[i + 1]; ++k) {
      const Tile& t = plan.tiles[k];
      const double* out = &stats[t.out + 1];
      for (std::size_t r = t.row_begin; r < t.row_end; ++r) {
        row_sums[i][t.batch * s.rows + r] += *out++;
      }
      const std::size_t first = t.batch + t.row_begin / s.rows;
      for (std::size_t m = first; m < first + factored::TileMatrices(t, s.rows); ++m) {
        for (std::size_t c = t.col_begin; c < t.col_end; ++c) col_sums[i][m * s.cols + c] += *out++;
      }
    }
  }
  complete(
      [&](std::size_t i) { return 1 + (row_cut(i) ? cols[i] : 0); },
      [&](std::size_t i, std::size_t k) { return k == 0 ? &param_sq[i] : &col_sums[i][k - 1]; });

  std::vector<float> factors(first_factor.back());
  std::vector<float> means(first_mean.back());
  std::vector<double> row_var_sums(first_mean.back(), 0.0);
  std::vector<double> alpha(segments.size());
  bool any_matrix = false;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.numel == 0 && !row_cut(i)) continue;
    const auto& h = groups[s.group];
    auto& sc = plan.scalars[i];
    alpha[i] = A::Alpha(h, s, whole_numel(i), param_sq[i]);
    if (!matrix[i]) continue;
    any_matrix = true;
    const std::size_t batch = batches[i];
    const std::span<float> row_var(&factors[first_factor[i]], batch * s.rows);
    const std::span<float> col_var(&factors[first_factor[i] + batch * s.rows], batch * cols[i]);
    factored::LoadFactor(s.state[A::kRowFactorSlot], s.state_dtype, row_var);
    factored::LoadFactor(s.state[A::kColFactorSlot], s.state_dtype, col_var);
    A::Factors(h, sc, whole_rows(i), row_sums[i], col_sums[i], row_var, col_var);
    for (std::size_t b = 0; b < batch; ++b) {
      double& sum = row_var_sums[first_mean[i] + b];
      for (std::size_t r = 0; r < s.rows; ++r) sum += row_var[b * s.rows + r];
    }
    sc.row_var = row_var.data();
    sc.col_var = col_var.data();
    sc.row_mean = &means[first_mean[i]];
  }
  complete([&](std::size_t i) { return row_cut(i) ? std::size_t{1} : 0; },
           [&](std::size_t i, std::size_t /*k*/) { return &row_var_sums[first_mean[i]]; });
  for (std::size_t i = 0; i < segments.size(); ++i) {
    for (std::size_t b = first_mean[i]; b < first_mean[i + 1]; ++b) {
      means[b] = A::RowMean(groups[segments[i].group], row_var_sums[b], whole_rows(i));
    }
  }
  if (any_matrix) {
    std::vector<double> norms(num_tiles, 0.0);
    run(TilePass::kNorm, norms.data());
    for (std::size_t i = 0; i < segments.size(); ++i) {
      if (!matrix[i]) continue;
      for (std::size_t k = first_tile[i]; k < first_tile[i + 1]; ++k) update_sq[i] += norms[k];
    }
  }
  complete([](std::size_t /*i*/) { return std::size_t{1}; },
           [&](std::size_t i, std::size_t /*k*/) { return &update_sq[i]; });
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.numel == 0) continue;
    plan.scalars[i].neg_alpha =
        A::NegAlpha(groups[s.group], whole_numel(i), alpha[i], update_sq[i]);
  }
  run(TilePass::kUpdate, nullptr);
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (!matrix[i] || (s.numel == 0 && !row_cut(i))) continue;
    const std::size_t batch = batches[i];
    if (s.rows > 0) {
      factored::StoreFactor(std::span<const float>(&factors[first_factor[i]], batch * s.rows), s,
                            A::kRowFactorSlot);
    }
    factored::StoreFactor(
        std::span<const float>(&factors[first_factor[i] + batch * s.rows], batch * cols[i]), s,
        A::kColFactorSlot);
  }
}

}  // namespace fusedopt
