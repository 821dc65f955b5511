// 8-bit block-wise optimizer states in bitsandbytes' format (its 8-bit optimizers' state1/state2,
// absmax1/absmax2 and qmap1/qmap2): a state tensor of n elements is n codes (DType::kQ8) and one
// f32 absmax per block of kQuantBlock elements; element i stands for map[code[i]] ·
// absmax[i / kQuantBlock].
//
// The step keeps such states in its one pass: each block is dequantized, updated in f32, its new
// absmax taken and its values quantized again before they are stored (docs/low-bit-states.md).
// Quantization rounds to the nearest code as bitsandbytes' CUDA kernels do, not through the
// lookup table of its CPU path, which maps values under ~2e-5 of the absmax (zero included) to a
// code that is not zero.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace fusedopt {

// Elements per absmax: bitsandbytes' optimizers' block size (since 0.44).
inline constexpr std::size_t kQuantBlock = 256;
// bitsandbytes' default min_8bit_size: smaller tensors keep f32 states (the adapters' policy; the
// step itself quantizes whatever it is given).
inline constexpr std::size_t kMin8bitSize = 4096;

inline constexpr std::size_t NumQuantBlocks(std::size_t numel) {
  return (numel + kQuantBlock - 1) / kQuantBlock;
}

// bitsandbytes' create_dynamic_map: kSigned (its "dynamic": 127 negatives, 0, 127 positives and
// 1.0) for states of either sign, kUnsigned ("udynamic": 0, 254 positives, 1.0) for non-negative
// ones. Which state uses which is its algorithm's choice (the descriptor's kUnsignedMapStates).
enum class QuantMap : std::uint8_t { kSigned = 0, kUnsigned = 1 };

// The map of state slot `slot`'s codes, given the bit set of the slots that use the unsigned one
// (an algorithm's kUnsignedMapStates).
inline constexpr QuantMap SlotMap(unsigned unsigned_map_states, int slot) {
  return (unsigned_map_states >> slot & 1u) != 0 ? QuantMap::kUnsigned : QuantMap::kSigned;
}

// The 256 values of a map, ascending, bit for bit those of bitsandbytes' create_dynamic_map.
const std::array<float, 256>& DynamicMap(QuantMap map);

// The code of one value already scaled by its block's absmax (about [-1, 1]): the nearest map entry
// (a tie goes to the smaller magnitude); on the signed map a negative value never gets the zero
// code (bitsandbytes keeps the sign of a momentum: it takes the nearest negative code instead), and
// on the unsigned map a negative value gets code 0.
std::uint8_t QuantizeValue(float x, QuantMap map);

// Quantizes n values block by block: absmax[b] = max |x| over block b (NaN if the block holds a
// NaN), codes by QuantizeValue(x · f32(1 / absmax[b])): scaled by the reciprocal, as bitsandbytes'
// CUDA kernels scale (__fdividef multiplies by one) and as a vector loop can without a division per
// value; where the reciprocal overflows (absmax < 2^-128: a block of subnormals), by x / absmax[b].
// A block whose absmax is 0 or not finite gets the zero code everywhere: it reads back as zeros, or
// as NaN when its absmax is not finite.
void Quantize(const float* x, std::size_t n, QuantMap map, std::uint8_t* codes, float* absmax);

// Quantize of n values that all equal `value`, without a buffer of them: the codes and absmax a
// fresh state filled with its initial value starts from.
void QuantizeFill(float value, std::size_t n, QuantMap map, std::uint8_t* codes, float* absmax);

// out[i] = map[codes[i]] · absmax[i / kQuantBlock].
void Dequantize(const std::uint8_t* codes, const float* absmax, std::size_t n, QuantMap map,
                float* out);

}  // namespace fusedopt
