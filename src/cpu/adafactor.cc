// Adafactor kernels, all three passes over tiles (src/core/tiles.h): Io + the math of
// src/math/adafactor_math.h for every dtype combination, compiled for every SIMD target. The
// reduction passes read everything and write nothing but their sums: the stats pass Σp² of the
// param before the decay and, for a factored param, Σg² of each tile row and each tile column (in
// double, each column's rows added in order) or, for a vector, ΣU² with the variance's new value;
// the norm pass ΣU² of a factored param from the new factors; the update pass writes the param and
// a vector's variance, rounded stochastically where the segment asks (docs/numerics.md).

#include "src/algos/adafactor.h"

#include <algorithm>
#include <cstddef>

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/adafactor.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/hwy_ops-inl.h"
#include "src/cpu/io-inl.h"
#include "src/cpu/loop-inl.h"
#include "src/cpu/square_sum-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {
#include "src/math/adafactor_math.h"
#include "src/math/lerp_math.h"

// acc[k + j] += x_j² in double for the lanes j of x (x² of an f32 is exact in double, so each
// column's sum depends only on the order of its rows).
template <class DF>
HWY_INLINE void AddSquares(DF df, hn::Vec<DF> x, double* acc) {
  HWY_ALIGN float lanes[hn::MaxLanes(df)];
  hn::Store(x, df, lanes);
  for (std::size_t j = 0; j < hn::Lanes(df); ++j) {
    const double v = lanes[j];
    acc[j] += v * v;
  }
}

// Where a tile's rows lie. A tile's row r is row r % rows of matrix t.batch + r / rows
// (src/core/factored_step.cc groups small matrices into one tile): its row factor is
// row_var[t.batch·rows + r], its column factors start at col_var[(t.batch + r / rows)·cols], its
// row mean is row_mean[t.batch + r / rows]. 1×1 matrices (AdafactorPointwiseUpdate) run as a
// vector: one row of numel columns, the factors element-wise in state[kAdafactorRowVar] and
// [kAdafactorColVar], row_mean[0] the clamp f32(eps1).
struct TileRows {
  TileRows(const Tile& tile, const AdafactorScalars& s)
      : t(tile),
        rows(s.rows),
        pointwise(s.rows == 1 && s.cols == 1),
        factored(s.rows != 0 && !pointwise),
        mat_row(tile.batch * s.rows) {}

  // The matrix of tile row r (0 for a vector).
  std::size_t Matrix(std::size_t r) const { return factored ? t.batch + r / rows : 0; }

  // Calls f(d, i, c, row) for the vectors of each row of the tile, rows in order: i the element's
  // index in the segment, c its column.
  template <class F>
  HWY_INLINE void ForEach(const F& f) const {
    for (std::size_t r = t.row_begin; r < t.row_end; ++r) {
      const std::size_t row_start = t.base + r * t.stride;
      ForEachVector(t.col_begin, t.col_end,
                    [&](auto d, std::size_t c) HWY_ATTR { f(d, row_start + c, c, r); });
    }
  }

  const Tile& t;
  std::size_t rows;
  bool pointwise;
  bool factored;
  std::size_t mat_row;  // the tile's first row in row_var
};

// The reduction passes of one tile (kStats, kNorm): they store nothing, so they always run with
// the round-to-nearest Buffers.
template <class Buffers>
HWY_NOINLINE FOPT_FLATTEN void AdafactorTile(const Buffers& b, const AdafactorScalars& s,
                                             const Tile& t, TilePass pass, double* stats,
                                             double* norm) {
  const std::size_t width = t.col_end - t.col_begin;
  const TileRows rows(t, s);
  if (pass == TilePass::kStats) {
    SquareSum param_sq;
    if (rows.factored) {
      double* row_sums = stats + 1;
      // the column sums of each matrix the tile touches, one after the other
      double* col_sums = stats + 1 + (t.row_end - t.row_begin);
      const std::size_t first = rows.Matrix(t.row_begin);
      std::fill_n(col_sums, (rows.Matrix(t.row_end - 1) - first + 1) * width, 0.0);
      for (std::size_t r = t.row_begin; r < t.row_end; ++r) {
        SquareSum grad_sq;
        const std::size_t row_start = t.base + r * t.stride;
        double* cols = col_sums + (rows.Matrix(r) - first) * width;
        ForEachVector(t.col_begin, t.col_end, [&](auto d, std::size_t c) HWY_ATTR {
          const HwyOps<decltype(d)> o{d};
          const std::size_t k = c - t.col_begin;
          const auto g = o.Mul(b.Grad(d, row_start + c), o.Set(s.grad_mul));
          param_sq.Add(d, b.param.Load(d, row_start + c), k);
          grad_sq.Add(d, g, k);
          AddSquares(d, g, cols + k);
        });
        row_sums[r - t.row_begin] = grad_sq.Total();
      }
      stats[0] = param_sq.Total();
    } else {
      SquareSum update_sq;
      rows.ForEach([&](auto d, std::size_t i, std::size_t c, std::size_t) HWY_ATTR {
        const HwyOps<decltype(d)> o{d};
        const std::size_t k = c - t.col_begin;
        const auto g = o.Mul(b.Grad(d, i), o.Set(s.grad_mul));
        param_sq.Add(d, b.param.Load(d, i), k);
        if (rows.pointwise) {
          auto r = b.LoadState(d, kAdafactorRowVar, i);
          auto c1 = b.LoadState(d, kAdafactorColVar, i);
          update_sq.Add(d, AdafactorPointwiseUpdate(o, s, g, r, c1, s.row_mean[0]), k);
        } else {
          auto v = b.LoadState(d, kAdafactorVariance, i);
          update_sq.Add(d, AdafactorVectorUpdate(o, s, g, v), k);
        }
      });
      stats[0] = param_sq.Total();
      stats[1] = update_sq.Total();
    }
    return;
  }
  if (pass == TilePass::kNorm) {
    if (!rows.factored) return;
    SquareSum update_sq;
    rows.ForEach([&](auto d, std::size_t i, std::size_t c, std::size_t r) HWY_ATTR {
      const HwyOps<decltype(d)> o{d};
      const std::size_t m = rows.Matrix(r);
      const auto g = o.Mul(b.Grad(d, i), o.Set(s.grad_mul));
      const auto u =
          AdafactorFactoredUpdate(o, s, g, o.Set(s.row_var[rows.mat_row + r]),
                                  hn::LoadU(d, s.col_var + m * s.cols + c), o.Set(s.row_mean[m]));
      update_sq.Add(d, u, c - t.col_begin);
    });
    *norm = update_sq.Total();
  }
}

// The update pass of one tile: writes the param and a vector's variance (a 1×1 matrix's
// element-wise factors). Apart from the reductions so that the stochastic-rounding buffers
// (SegmentBuffers<..., true>) instantiate only the pass that stores.
template <class Buffers>
HWY_NOINLINE FOPT_FLATTEN void AdafactorUpdateTile(const Buffers& b, const AdafactorScalars& s,
                                                   const Tile& t) {
  const TileRows rows(t, s);
  WithFlags(
      [&](auto decay) HWY_ATTR {
        constexpr bool kDecay = decltype(decay)::value;
        if (rows.factored) {
          rows.ForEach([&](auto d, std::size_t i, std::size_t c, std::size_t r) HWY_ATTR {
            const HwyOps<decltype(d)> o{d};
            const std::size_t m = rows.Matrix(r);
            const auto g = o.Mul(b.Grad(d, i), o.Set(s.grad_mul));
            const auto u = AdafactorFactoredUpdate(o, s, g, o.Set(s.row_var[rows.mat_row + r]),
                                                   hn::LoadU(d, s.col_var + m * s.cols + c),
                                                   o.Set(s.row_mean[m]));
            auto p = b.param.Load(d, i);
            AdafactorApply<kDecay>(o, s, p, u);
            b.param.Store(d, p, i);
          });
        } else if (rows.pointwise) {
          rows.ForEach([&](auto d, std::size_t i, std::size_t, std::size_t) HWY_ATTR {
            const HwyOps<decltype(d)> o{d};
            const auto g = o.Mul(b.Grad(d, i), o.Set(s.grad_mul));
            auto r = b.LoadState(d, kAdafactorRowVar, i);
            auto c = b.LoadState(d, kAdafactorColVar, i);
            const auto u = AdafactorPointwiseUpdate(o, s, g, r, c, s.row_mean[0]);
            auto p = b.param.Load(d, i);
            AdafactorApply<kDecay>(o, s, p, u);
            b.param.Store(d, p, i);
            b.StoreState(d, kAdafactorRowVar, r, i);
            b.StoreState(d, kAdafactorColVar, c, i);
          });
        } else {
          rows.ForEach([&](auto d, std::size_t i, std::size_t, std::size_t) HWY_ATTR {
            const HwyOps<decltype(d)> o{d};
            const auto g = o.Mul(b.Grad(d, i), o.Set(s.grad_mul));
            auto v = b.LoadState(d, kAdafactorVariance, i);
            const auto u = AdafactorVectorUpdate(o, s, g, v);
            auto p = b.param.Load(d, i);
            AdafactorApply<kDecay>(o, s, p, u);
            b.param.Store(d, p, i);
            b.StoreState(d, kAdafactorVariance, v, i);
          });
        }
      },
      s.decay);
}

void AdafactorTiles(const TilePlan<AdafactorScalars>& plan, TilePass pass, std::size_t tile_begin,
                    std::size_t tile_end, double* sums) {
  for (std::size_t k = tile_begin; k < tile_end; ++k) {
    const Tile& t = plan.tiles[k];
    const Segment& seg = plan.segments[t.segment];
    const AdafactorScalars& s = plan.scalars[t.segment];
    double* stats = pass == TilePass::kStats ? sums + t.out : nullptr;
    double* norm = pass == TilePass::kNorm ? sums + k : nullptr;
    WithSegmentBuffers(seg, [&](auto buffers) HWY_ATTR {
      using Buffers = typename decltype(buffers)::type;
      if (pass == TilePass::kUpdate) {
        // The noise is keyed from the tile's first element: its lanes then reach
        // global_offset + i for any i of the tile.
        AdafactorUpdateTile(Buffers(seg, t.base + t.row_begin * t.stride + t.col_begin), s, t);
      } else {
        // The reductions store nothing: no loops of their own for stochastic rounding.
        AdafactorTile(typename Buffers::RoundingToNearest(seg), s, t, pass, stats, norm);
      }
    });
  }
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(AdafactorTiles);
void RunAdafactorTiles(const TilePlan<AdafactorScalars>& plan, TilePass pass,
                       std::size_t tile_begin, std::size_t tile_end, double* sums) {
  HWY_DYNAMIC_DISPATCH(AdafactorTiles)(plan, pass, tile_begin, tile_end, sums);
}
}  // namespace fusedopt
#endif
