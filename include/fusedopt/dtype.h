// Storage types of parameters, gradients and optimizer state, and the exact conversions between
// them.
//
// Math always runs in f32. Loads from f16/bf16 are exact; stores round to nearest even with our own
// integer code, because Highway 1.0.3's bf16 demotion (and f16 demotion off F16C) truncates. The
// SIMD stores in src/cpu/io-inl.h implement the same bit-level rules; tests check them against
// these functions.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fusedopt {

// kQ8 is for optimizer states only: 8-bit codes of bitsandbytes' dynamic map, one f32 absmax per
// block of kQuantBlock elements beside them (fusedopt/quantize.h). A code cannot be read alone.
enum class DType : std::uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kQ8 = 3 };

inline constexpr std::size_t DTypeSize(DType t) {
  return t == DType::kF32 ? 4 : (t == DType::kQ8 ? 1 : 2);
}

inline constexpr std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kQ8:
      return "q8";
  }
  return "unknown";
}

// Parses "f32", "f16" or "bf16" (the dtypes of params and grads); returns false for anything else.
inline constexpr bool ParseDType(std::string_view name, DType* out) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (name == DTypeName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

// bf16 is the top half of an f32: widening is a shift.
inline float BF16ToF32(std::uint16_t h) { return std::bit_cast<float>(std::uint32_t{h} << 16); }

// f32 -> bf16, round to nearest even. NaN stays a quiet NaN with its sign (plain truncation could
// turn a NaN whose payload lies in the low 16 bits into Inf).
inline std::uint16_t F32ToBF16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// f16 -> f32, exact (normals, subnormals, Inf, NaN).
inline float F16ToF32(std::uint16_t h) {
  const std::uint32_t sign = (std::uint32_t{h} & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
  // Subnormal or zero: mant * 2^-24, exact in f32.
  const float mag = static_cast<float>(mant) * 0x1p-24f;
  return sign ? -mag : mag;
}

// f32 -> f16, round to nearest even; overflow to Inf, NaN to the canonical quiet NaN.
inline std::uint16_t F32ToF16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  std::uint32_t h;
  if (a > 0x7F800000u) {
    h = 0x7E00u;
  } else if (a >=
             0x47800000u) {  // >= 65536: Inf (65520..65535 round up to Inf in the normal branch)
    h = 0x7C00u;
  } else if (a >=
             0x38800000u) {  // f16 normal range: rebias the exponent, round the 13 dropped bits
    h = (a - 0x38000000u + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
  } else {
    // Subnormal or zero: adding 0.5 makes the FPU round |f| to a multiple of 2^-24 (nearest even);
    // the low mantissa bits are then the f16 subnormal.
    h = std::bit_cast<std::uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3F000000u;
  }
  return static_cast<std::uint16_t>(sign | h);
}

// Reads element i of a buffer of the given dtype as f32.
inline float LoadAsF32(const void* data, DType t, std::size_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return F16ToF32(static_cast<const std::uint16_t*>(data)[i]);
    case DType::kBF16:
      return BF16ToF32(static_cast<const std::uint16_t*>(data)[i]);
    case DType::kQ8:  // a code needs its block's absmax (quantize.h: Dequantize)
      break;
  }
  return 0.0f;
}

// Writes f32 value v to element i of a buffer of the given dtype, rounding to nearest even.
inline void StoreFromF32(void* data, DType t, std::size_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(data)[i] = v;
      return;
    case DType::kF16:
      static_cast<std::uint16_t*>(data)[i] = F32ToF16(v);
      return;
    case DType::kBF16:
      static_cast<std::uint16_t*>(data)[i] = F32ToBF16(v);
      return;
    case DType::kQ8:  // a block is quantized as a whole (quantize.h: Quantize)
      return;
  }
}

}  // namespace fusedopt
