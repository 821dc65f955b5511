// DequantizeStateBlock and QuantizeStateBlocks (quantize_blocks.h): src/cpu/quantize-inl.h's block
// codecs, per SIMD target. This file (and src/core/runtime.cc, which picks the target) also
// compiles Highway's AVX3_DL target, whose VBMI byte permutes decode a block 3.4x faster than
// AVX3's lookup (quantize-inl.h); the other kernels run their AVX3 code on such a CPU (Highway
// dispatches each file to the best target it compiled), which keeps one more copy of every loop out
// of the build.
#define HWY_WANT_AVX3_DL 1

#include "src/cpu/quantize_blocks.h"

// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/cpu/quantize_blocks.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on
#include "hwy/highway.h"
#include "src/cpu/quantize-inl.h"

HWY_BEFORE_NAMESPACE();
namespace fusedopt::HWY_NAMESPACE {

void DequantizeBlockOf(const QuantTables& t, const std::uint8_t* codes, float absmax, std::size_t n,
                       float* out) {
  DequantizeBlock(t, codes, absmax, n, out);
}

void QuantizeBlocksOf(const StateBlock* blocks, std::size_t count, std::size_t n) {
  QuantizeBlocks(blocks, count, n);
}

}  // namespace fusedopt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusedopt {
HWY_EXPORT(DequantizeBlockOf);
HWY_EXPORT(QuantizeBlocksOf);

void DequantizeStateBlock(const QuantTables& t, const std::uint8_t* codes, float absmax,
                          std::size_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(DequantizeBlockOf)(t, codes, absmax, n, out);
}

void QuantizeStateBlocks(const StateBlock* blocks, std::size_t count, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(QuantizeBlocksOf)(blocks, count, n);
}

}  // namespace fusedopt
#endif  // HWY_ONCE
