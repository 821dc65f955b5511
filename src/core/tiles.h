// How a factored algorithm's step (a descriptor with kFactored) cuts its work: each param into
// tiles, rectangles of one of its matrices (rows [row_begin, row_end) × columns [col_begin,
// col_end) of a row-major matrix of `stride` columns), so that a tile's column sums of g² are sums
// over its rows and a matrix's come from its tiles in a fixed order. A vector param is one row of
// numel columns. Tile edges depend only on the shapes, never on the thread count, so every sum is
// the same on any number of threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fusedopt/runtime.h"
#include "fusedopt/step.h"

namespace fusedopt {

struct Tile {
  std::uint32_t segment = 0;
  std::size_t batch = 0;  // the matrix's index in the param's batch (0 for a vector)
  std::size_t row_begin = 0, row_end = 1;
  std::size_t col_begin = 0, col_end = 0;
  std::size_t stride = 0;  // the matrix's row length (cols; numel for a vector)
  std::size_t base = 0;    // index of the matrix's first element in the segment
  std::size_t out = 0;     // first double of the tile's sums in a reduction pass's output
};

// At most this many columns per tile: a tile's column sums are written out (8 bytes per column),
// so a tile spans several rows of a wide matrix.
inline constexpr std::size_t kTileColumns = 4096;

// The tiles of one segment, appended to `tiles`, for a segment of `rows` × `cols` matrices (rows 0:
// a vector of numel elements). Tiles of kGrainElements elements or fewer: whole rows of up to
// kTileColumns columns, as many rows as fit.
inline void AppendTiles(std::uint32_t segment, std::size_t numel, std::size_t rows,
                        std::size_t cols, std::vector<Tile>& tiles) {
  if (numel == 0) return;
  if (rows == 0) {
    for (std::size_t c = 0; c < numel; c += kGrainElements) {
      tiles.push_back({.segment = segment,
                       .col_begin = c,
                       .col_end = std::min(numel, c + kGrainElements),
                       .stride = numel});
    }
    return;
  }
  const std::size_t width = std::min(cols, kTileColumns);
  const std::size_t height = std::min(rows, std::max<std::size_t>(1, kGrainElements / width));
  const std::size_t batch = numel / (rows * cols);
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t r = 0; r < rows; r += height) {
      for (std::size_t c = 0; c < cols; c += width) {
        tiles.push_back({.segment = segment,
                         .batch = b,
                         .row_begin = r,
                         .row_end = std::min(rows, r + height),
                         .col_begin = c,
                         .col_end = std::min(cols, c + width),
                         .stride = cols,
                         .base = b * rows * cols});
      }
    }
  }
}

enum class TilePass {
  kStats,   // Σp² (all); per tile row Σg² and per tile column Σg² (matrices); ΣU² (vectors)
  kNorm,    // ΣU² from the new factors (matrices)
  kUpdate,  // the update: param, and a vector's variance
};

// Everything a factored kernel needs for one pass: the segments, their coefficients, the tiles.
template <class Scalars>
struct TilePlan {
  std::span<const Segment> segments;
  std::vector<Scalars> scalars;  // one per segment
  std::vector<Tile> tiles;
};

}  // namespace fusedopt
