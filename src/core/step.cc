// The public step functions, one template over the algorithm descriptors (src/algos/): validate
// everything, compute each segment's coefficients in double, run the reduction pass of a two-phase
// algorithm and finish its coefficients, then run the kernel over all chunks in one parallel
// region.

#include "fusedopt/step.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "fusedopt/convert.h"
#include "fusedopt/rounding.h"
#include "src/algos/registry.h"
#include "src/core/parallel.h"
#include "src/core/step_hooks.h"
#include "src/core/tiles.h"
#include "src/core/validate.h"

namespace fusedopt {
namespace {

// A segment of a factored algorithm: its shape (rows and cols both 0, or both set and dividing
// numel), the state slots of that shape (numel > 0). A segment of numel 0 is left as it is (torch's
// Adafactor divides by numel: an empty param raises ZeroDivisionError there; TrainingStep's
// up-front check runs every segment with numel 0).
template <class A>
void ValidateFactored(std::size_t i, const Segment& s) {
  if ((s.rows == 0) != (s.cols == 0)) {
    Fail(A::kStepName, "segment ", i, ": rows ", s.rows, " and cols ", s.cols,
         " (both 0 for a vector, both set for matrices)");
  }
  if (s.rows > 0 && s.numel % (s.rows * s.cols) != 0) {
    Fail(A::kStepName, "segment ", i, ": rows ", s.rows, " × cols ", s.cols,
         " does not divide numel ", s.numel);
  }
  if (s.numel > 0) ValidateStates(A::kStepName, i, s, A::SegmentStates(s), A::kStates);
}

template <class A>
void ValidateStep(std::span<const typename A::Hyper> groups, std::span<const Segment> segments) {
  if (groups.empty() && !segments.empty())
    Fail(A::kStepName, "no groups given for ", segments.size(), " segments");
  for (std::size_t g = 0; g < groups.size(); ++g) A::Validate({A::kStepName, g}, groups[g]);
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    ValidateSegment(A::kStepName, i, s, groups.size());
    if constexpr (algos::Factored<A>) {
      ValidateFactored<A>(i, s);
    } else if (s.numel > 0) {
      ValidateStates(A::kStepName, i, s, A::RequiredStates(groups[s.group]), A::kStates);
    }
    if constexpr (algos::RowReductions<A>) {
      if (s.rows > 0 && s.numel % s.rows != 0) {
        Fail(A::kStepName, "segment ", i, ": rows ", s.rows, " does not divide numel ", s.numel);
      }
    }
    if constexpr (algos::HasScalarStates<A>) {
      for (std::size_t k = 0; k < A::kScalarStates.size(); ++k) {
        if (s.scalars[k] == nullptr) {
          Fail(A::kStepName, "segment ", i, ": scalars[", k, "] (", A::kScalarStates[k],
               ") is null");
        }
      }
    }
  }
}

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
            Runtime& runtime, std::vector<float>& row_values, const SegmentSumsHook* hook) {
  constexpr std::size_t k = A::kReductions;
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
  std::vector<double> part_sums(first_part.back() * k);
  ParallelForChunks(num_chunks, runtime.num_threads(), [&](std::size_t begin, std::size_t end) {
    for (std::size_t c = begin; c < end; ++c) A::kReduce(plan, c, &part_sums[first_part[c] * k]);
  });
  // Each segment's sums: max(rows, 1) rows of k from first_sum[s].
  std::vector<std::size_t> first_sum(segments.size() + 1, 0);
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const std::size_t length = RowLength<A>(segments[s]);
    const std::size_t rows = length == segments[s].numel ? 1 : segments[s].numel / length;
    first_sum[s + 1] = first_sum[s] + k * rows;
  }
  std::vector<double> sums(first_sum.back(), 0.0);
  std::size_t part = 0;
  for (std::size_t c = 0; c < num_chunks; ++c) {
    plan.chunks.ForEachPiece(c, c + 1, [&](std::size_t s, std::size_t begin, std::size_t end) {
      const auto [row, rows] = PieceRows<A>(segments[s], begin, end);
      for (std::size_t r = 0; r < rows; ++r, ++part) {
        for (std::size_t j = 0; j < k; ++j) {
          sums[first_sum[s] + (row + r) * k + j] += part_sums[part * k + j];
        }
      }
    });
  }
  if constexpr (kSegmentSums<A>) {
    if (hook != nullptr) (*hook)(std::span<double>(sums), k);
  }
  if constexpr (algos::FinishesAll<A>) {
    A::FinishAll(groups, segments, std::span<const double>(sums), std::span(plan.scalars));
  } else if constexpr (algos::RowReductions<A>) {
    std::vector<std::size_t> first_value(segments.size() + 1, 0);
    for (std::size_t s = 0; s < segments.size(); ++s) {
      first_value[s + 1] = first_value[s] + segments[s].rows * A::kRowValues;
    }
    row_values.assign(first_value.back(), 0.0f);
    for (std::size_t s = 0; s < segments.size(); ++s) {
      A::Finish(groups[segments[s].group], segments[s],
                std::span<const double>(&sums[first_sum[s]], first_sum[s + 1] - first_sum[s]),
                plan.scalars[s],
                std::span<float>(row_values.data() + first_value[s],
                                 first_value[s + 1] - first_value[s]));
    }
  } else {
    for (std::size_t s = 0; s < segments.size(); ++s) {
      A::Finish(groups[segments[s].group], segments[s],
                std::span<const double, k>(&sums[first_sum[s]], k), plan.scalars[s]);
    }
  }
}

// Reads n elements of a state buffer of dtype t as f32 (into out).
void LoadFactor(const void* state, DType t, std::span<float> out) {
  if (t == DType::kF32) {
    std::copy_n(static_cast<const float*>(state), out.size(), out.data());
  } else {
    ConvertBuffer(state, t, out.data(), DType::kF32, out.size());
  }
}

// Writes a factor buffer (state[slot] of segment s) back: round to nearest even, or, for a 16-bit
// state of a segment with stochastic_rounding, stochastically with the kernels' noise
// (rounding.h), element k of the factor keyed as global index global_offset + k on the slot's
// stream. A factor has fewer elements than the param, so those indices stay in the segment's own
// range (distinct from other segments', valid by ValidateSegment), and depend on nothing but the
// shapes: the contract of docs/numerics.md.
void StoreFactor(std::span<const float> in, const Segment& s, int slot) {
  void* state = s.state[slot];
  const DType t = s.state_dtype;
  if (t == DType::kF32) {
    std::copy_n(in.data(), in.size(), static_cast<float*>(state));
  } else if (!s.stochastic_rounding) {
    ConvertBuffer(in.data(), DType::kF32, state, t, in.size());
  } else {
    auto* out = static_cast<std::uint16_t*>(state);
    const std::uint32_t stream = RoundingStreamState(slot);
    for (std::size_t k = 0; k < in.size(); ++k) {
      const std::uint32_t noise =
          RoundingNoise(s.rounding_seed, s.step, s.global_offset + k, stream);
      out[k] =
          t == DType::kBF16 ? F32ToBF16Stochastic(in[k], noise) : F32ToF16Stochastic(in[k], noise);
    }
  }
}

// Matrices of one tile each (rows·cols at most this, cols at most kTileColumns) share tiles: a tile
// then covers whole consecutive matrices.
constexpr std::size_t kSmallMatrix = kGrainElements / 2;

// The tiles of one segment: AppendTiles's, except that small matrices (the 3×3 and 1×1 kernels of a
// convolution's [out, in, kh, kw]) are grouped, kGrainElements / (rows·cols) whole matrices per
// tile. A tile's rows then run on through the following matrices: row r of a tile whose first
// matrix is `batch` is row r % rows of matrix batch + r / rows (the param as a stacked batch·rows ×
// cols matrix from `base`), which the kernels and RunFactoredStep read for every tile.
void AppendFactoredTiles(std::uint32_t segment, std::size_t numel, std::size_t rows,
                         std::size_t cols, std::vector<Tile>& tiles) {
  if (rows == 1 && cols == 1) {  // Pointwise: a vector's tiles
    AppendTiles(segment, numel, 0, 0, tiles);
    return;
  }
  if (rows == 0 || numel == 0 || rows * cols > kSmallMatrix || cols > kTileColumns) {
    AppendTiles(segment, numel, rows, cols, tiles);
    return;
  }
  const std::size_t size = rows * cols;
  const std::size_t batch = numel / size;
  const std::size_t per_tile = kGrainElements / size;
  for (std::size_t b = 0; b < batch; b += per_tile) {
    const std::size_t end = std::min(batch, b + per_tile);
    tiles.push_back({.segment = segment,
                     .batch = b,
                     .row_begin = 0,
                     .row_end = (end - b) * rows,
                     .col_begin = 0,
                     .col_end = cols,
                     .stride = cols,
                     .base = b * size});
  }
}

// A param of 1×1 matrices (a [out, in, 1, 1] convolution weight): its factors are element-wise
// (row_var and col_var hold numel values each), so its tiles are a vector's and the kernels lerp
// and store the factors themselves (AdafactorPointwiseUpdate); the host only gives the clamp of
// the row means, f32(eps1), as row_mean[0].
bool Pointwise(const Segment& s) { return s.rows == 1 && s.cols == 1; }

// How many matrices a tile of a segment with `rows` rows per matrix touches (1 unless grouped).
std::size_t TileMatrices(const Tile& t, std::size_t rows) {
  return (t.row_end - 1) / rows - t.row_begin / rows + 1;
}

// The step of a factored algorithm (Adafactor), over tiles: (1) the stats pass (Σp²; a matrix's
// per-row and per-column Σg²; a vector's ΣU²), each segment's sums added tile by tile in order;
// (2) on the host, per segment, alpha and a matrix's new factors (from the old ones in its state
// buffers, into scratch); (3) the norm pass, ΣU² of each matrix from the new factors; (4) the
// clipping coefficient; (5) the update pass; (6) the new factors into the state buffers (rounded
// stochastically where the segment asks, as the kernels' stores in (5)). Every sum
// is in double in an order fixed by the shapes, so the step is bit-identical on any thread count
// and SIMD target; nothing is written before (5), so a rejected call changes nothing.
template <algos::Factored A>
void RunFactoredStep(std::span<const typename A::Hyper> groups, std::span<const Segment> segments,
                     Runtime& runtime) {
  ValidateStep<A>(groups, segments);
  TilePlan<typename A::Scalars> plan{segments, {}, {}};
  plan.scalars.reserve(segments.size());
  std::vector<std::size_t> first_tile(segments.size() + 1, 0);
  // Per segment, its factors' offset in `factors` (batch·rows, then batch·cols) and its row means'
  // in `means` (batch).
  std::vector<std::size_t> first_factor(segments.size() + 1, 0);
  std::vector<std::size_t> first_mean(segments.size() + 1, 0);
  std::vector<float> clamps(segments.size());  // a Pointwise segment's row_mean: f32(eps1)
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    plan.scalars.push_back(A::MakeScalars(groups[s.group], s));
    if (Pointwise(s)) {  // read by every pass
      clamps[i] = static_cast<float>(groups[s.group].eps1);
      plan.scalars.back().row_mean = &clamps[i];
    }
    AppendFactoredTiles(static_cast<std::uint32_t>(i), s.numel, s.rows, s.cols, plan.tiles);
    first_tile[i + 1] = plan.tiles.size();
    const std::size_t batch = s.rows > 0 && !Pointwise(s) ? s.numel / (s.rows * s.cols) : 0;
    first_factor[i + 1] = first_factor[i] + batch * (s.rows + s.cols);
    first_mean[i + 1] = first_mean[i] + batch;
  }
  // Each tile's stats: Σp², then a matrix tile's row sums and the column sums of each matrix it
  // touches, or a vector tile's ΣU².
  std::size_t stats_size = 0;
  for (Tile& t : plan.tiles) {
    t.out = stats_size;
    const std::size_t rows = Pointwise(segments[t.segment]) ? 0 : segments[t.segment].rows;
    stats_size +=
        rows > 0 ? 1 + (t.row_end - t.row_begin) + TileMatrices(t, rows) * (t.col_end - t.col_begin)
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

  std::vector<float> factors(first_factor.back());
  std::vector<float> means(first_mean.back());
  std::vector<double> alpha(segments.size());
  std::vector<double> update_sq(segments.size(), 0.0);
  bool any_matrix = false;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.numel == 0) continue;
    const auto& h = groups[s.group];
    auto& sc = plan.scalars[i];
    double param_sq = 0.0;
    for (std::size_t k = first_tile[i]; k < first_tile[i + 1]; ++k) {
      param_sq += stats[plan.tiles[k].out];
    }
    alpha[i] = A::Alpha(h, s, param_sq);
    if (s.rows == 0 || Pointwise(s)) {
      for (std::size_t k = first_tile[i]; k < first_tile[i + 1]; ++k) {
        update_sq[i] += stats[plan.tiles[k].out + 1];
      }
      continue;
    }
    any_matrix = true;
    const std::size_t batch = s.numel / (s.rows * s.cols);
    std::vector<double> row_sums(batch * s.rows, 0.0);
    std::vector<double> col_sums(batch * s.cols, 0.0);
    for (std::size_t k = first_tile[i]; k < first_tile[i + 1]; ++k) {
      const Tile& t = plan.tiles[k];
      const double* out = &stats[t.out + 1];
      for (std::size_t r = t.row_begin; r < t.row_end; ++r) {
        row_sums[t.batch * s.rows + r] += *out++;
      }
      const std::size_t first = t.batch + t.row_begin / s.rows;
      for (std::size_t m = first; m < first + TileMatrices(t, s.rows); ++m) {
        for (std::size_t c = t.col_begin; c < t.col_end; ++c) col_sums[m * s.cols + c] += *out++;
      }
    }
    const std::span<float> row_var(&factors[first_factor[i]], batch * s.rows);
    const std::span<float> col_var(&factors[first_factor[i] + batch * s.rows], batch * s.cols);
    const std::span<float> row_mean(&means[first_mean[i]], batch);
    LoadFactor(s.state[kAdafactorRowVar], s.state_dtype, row_var);
    LoadFactor(s.state[kAdafactorColVar], s.state_dtype, col_var);
    A::Factors(h, sc, row_sums, col_sums, row_var, col_var, row_mean);
    sc.row_var = row_var.data();
    sc.col_var = col_var.data();
    sc.row_mean = row_mean.data();
  }
  if (any_matrix) {
    std::vector<double> norms(num_tiles, 0.0);
    run(TilePass::kNorm, norms.data());
    for (std::size_t i = 0; i < segments.size(); ++i) {
      if (segments[i].rows == 0 || Pointwise(segments[i])) continue;
      for (std::size_t k = first_tile[i]; k < first_tile[i + 1]; ++k) update_sq[i] += norms[k];
    }
  }
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.numel == 0) continue;
    plan.scalars[i].neg_alpha = A::NegAlpha(groups[s.group], s, alpha[i], update_sq[i]);
  }
  run(TilePass::kUpdate, nullptr);
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.rows == 0 || s.numel == 0 || Pointwise(s)) continue;
    const std::size_t batch = s.numel / (s.rows * s.cols);
    StoreFactor(std::span<const float>(&factors[first_factor[i]], batch * s.rows), s,
                kAdafactorRowVar);
    StoreFactor(std::span<const float>(&factors[first_factor[i] + batch * s.rows], batch * s.cols),
                s, kAdafactorColVar);
  }
}

template <class A>
void RunStepChunks(std::span<const typename A::Hyper> groups, std::span<const Segment> segments,
                   Runtime& runtime, const SegmentSumsHook* hook) {
  ValidateStep<A>(groups, segments);
  StepPlan<typename A::Scalars> plan{ChunkPlan(segments), {}};
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
    // An algorithm whose sums some groups do not use skips the pass when none does (BertAdam
    // without clipping).
    bool reduce = true;
    if constexpr (requires { A::NeedsReduction(groups[0]); }) {
      reduce = std::any_of(groups.begin(), groups.end(),
                           [](const typename A::Hyper& h) { return A::NeedsReduction(h); });
    }
    if (reduce) Reduce<A>(groups, plan, runtime, row_values, hook);
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

}  // namespace

template <class Hyper>
void FusedStep(std::span<const Hyper> groups, std::span<const Segment> segments, Runtime& runtime) {
  RunStep<algos::DescriptorOf<Hyper>>(groups, segments, runtime);
}

template <class Hyper>
void FusedStepWithSums(std::span<const Hyper> groups, std::span<const Segment> segments,
                       Runtime& runtime, const SegmentSumsHook& hook) {
  RunStep<algos::DescriptorOf<Hyper>>(groups, segments, runtime, &hook);
}

template <class Hyper>
unsigned RequiredStates(const Hyper& h) {
  return algos::DescriptorOf<Hyper>::RequiredStates(h);
}

// The algorithms of src/algos/registry.h.
#define FOPT_INSTANTIATE(A)                                                                      \
  template void FusedStep(std::span<const algos::A::Hyper>, std::span<const Segment>, Runtime&); \
  template void FusedStepWithSums(std::span<const algos::A::Hyper>, std::span<const Segment>,    \
                                  Runtime&, const SegmentSumsHook&);                             \
  template unsigned RequiredStates(const algos::A::Hyper&);
FOPT_FOR_EACH_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

void SgdStep(std::span<const SgdHyper> groups, std::span<const Segment> segments,
             Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void AdamStep(std::span<const AdamHyper> groups, std::span<const Segment> segments,
              Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void AdamWStep(std::span<const AdamWHyper> groups, std::span<const Segment> segments,
               Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void RmspropStep(std::span<const RmspropHyper> groups, std::span<const Segment> segments,
                 Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void AdagradStep(std::span<const AdagradHyper> groups, std::span<const Segment> segments,
                 Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void LionStep(std::span<const LionHyper> groups, std::span<const Segment> segments,
              Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void AdamaxStep(std::span<const AdamaxHyper> groups, std::span<const Segment> segments,
                Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void AdadeltaStep(std::span<const AdadeltaHyper> groups, std::span<const Segment> segments,
                  Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void RadamStep(std::span<const RadamHyper> groups, std::span<const Segment> segments,
               Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void NadamStep(std::span<const NadamHyper> groups, std::span<const Segment> segments,
               Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void RmsproptfStep(std::span<const RmsproptfHyper> groups, std::span<const Segment> segments,
                   Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void AsgdStep(std::span<const AsgdHyper> groups, std::span<const Segment> segments,
              Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void RpropStep(std::span<const RpropHyper> groups, std::span<const Segment> segments,
               Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void LambStep(std::span<const LambHyper> groups, std::span<const Segment> segments,
              Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void LarsStep(std::span<const LarsHyper> groups, std::span<const Segment> segments,
              Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void AdampStep(std::span<const AdampHyper> groups, std::span<const Segment> segments,
               Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void BertAdamStep(std::span<const BertAdamHyper> groups, std::span<const Segment> segments,
                  Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}
void AdafactorStep(std::span<const AdafactorHyper> groups, std::span<const Segment> segments,
                   Runtime& runtime) {
  FusedStep(groups, segments, runtime);
}

}  // namespace fusedopt
