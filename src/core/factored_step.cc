// The host-side pieces of the factored step (factored_step.h) that do not depend on the algorithm.

#include "src/core/factored_step.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fusedopt/convert.h"
#include "fusedopt/rounding.h"

namespace fusedopt::factored {

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
          RoundingNoise(s.rounding_seed, NoiseStep(s), s.global_offset + k, stream);
      out[k] =
          t == DType::kBF16 ? F32ToBF16Stochastic(in[k], noise) : F32ToF16Stochastic(in[k], noise);
    }
  }
}

// Matrices of one tile each (rows·cols at most this, cols at most kTileColumns) share tiles: a tile
// then covers whole consecutive matrices.
static constexpr std::size_t kSmallMatrix = kGrainElements / 2;

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
// and store the factors themselves (the math body's pointwise update); the host only gives the
// clamp of the row means, f32(eps1), as row_mean[0].
bool Pointwise(const Segment& s) { return s.rows == 1 && s.cols == 1; }

// How many matrices a tile of a segment with `rows` rows per matrix touches (1 unless grouped).
std::size_t TileMatrices(const Tile& t, std::size_t rows) {
  return (t.row_end - 1) / rows - t.row_begin / rows + 1;
}

}  // namespace fusedopt::factored
