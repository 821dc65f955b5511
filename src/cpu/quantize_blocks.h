// The codecs of one block of an 8-bit state (include/fusedopt/quantize.h), for the loops of every
// algorithm (src/cpu/loop-inl.h): compiled once, in src/cpu/quantize_blocks.cc, for every target
// and AVX3_DL too, and dispatched per block to the target the steps run on.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/core/quantize_tables.h"

namespace fusedopt {

// out[i] = t.map[codes[i]] · absmax for the n <= kQuantBlock elements of one block.
void DequantizeStateBlock(const QuantTables& t, const std::uint8_t* codes, float absmax,
                          std::size_t n, float* out);

// One block of one state: its f32 values, its map, and where its codes and absmax go.
struct StateBlock {
  const QuantTables* t;
  const float* x;
  std::uint8_t* codes;
  float* absmax;
};

// One block (n <= kQuantBlock elements) of each of `count` states: its absmax (max |x|, NaN if any
// x is), and the codes of x · (1 / absmax) on its map (the zero code everywhere where the absmax is
// 0 or not finite): src/core/quantize.cc's Quantize. The states of a block go in one call: their
// searches interleave (src/cpu/quantize-inl.h).
void QuantizeStateBlocks(const StateBlock* blocks, std::size_t count, std::size_t n);

}  // namespace fusedopt
